#!/usr/bin/env bash
# Storage engine benchmark against the disk's own baseline.
#
# 1. builds `shardmq-perf` (release);
# 2. measures the disk under the data directory with fio: O_DIRECT sequential write (1 MiB
#    blocks) and the latency of fdatasync after 4 KiB O_DIRECT writes;
# 3. runs `shardmq-perf store` for the scenarios below on the same disk, sizing each run to
#    about --seconds (from a short probe run), at most --max-messages;
# 4. prints the machine, the fio baseline and a markdown table of medians over --runs runs.
#
# Usage: scripts/bench-store.sh [--dir PARENT] [--runs N] [--seconds S] [--max-messages N]
#                               [--cpu N] [--raw FILE]
#   --dir PARENT      where to make the temporary data directory (default: $TMPDIR, else /work,
#                     else the repository's target/); it must be on the disk to measure, not tmpfs
#   --runs N          runs per measurement; medians are reported (default 3)
#   --seconds S       target length of one store run (default 20)
#   --max-messages N  cap on messages per store run (default 500000)
#   --cpu N           CPU to pin the store's executor to (default 0); pick an idle one
#   --raw FILE        also copy every run's JSON (fio and store) to FILE
# Installs fio with apt-get when it is missing (root only). Removes its temporary data on exit.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

parent=""
runs=3
target_seconds=20
max_messages=500000
cpu=0
raw_out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) parent="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --seconds) target_seconds="$2"; shift 2 ;;
    --max-messages) max_messages="$2"; shift 2 ;;
    --cpu) cpu="$2"; shift 2 ;;
    --raw) raw_out="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-store: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Message size and the scenarios: "label|shardmq-perf store arguments".
message_bytes=1024
scenarios=(
  "async, batch 64, 64 producers|--flush async --batch 64 --producers 64"
  "async, batch 32, 4 producers|--flush async --batch 32 --producers 4"
  "async, batch 1, 1 producer|--flush async --batch 1 --producers 1"
  "sync, batch 1, 1 producer|--flush sync --batch 1 --producers 1"
  "sync, batch 1, 16 producers|--flush sync --batch 1 --producers 16"
  "sync, batch 32|--flush sync --batch 32 --producers 1"
)
# Messages in the probe run that sizes each scenario (small: a sync probe takes ~1 s).
probe_messages=2000
min_messages=2000

step() { printf '==> %s\n' "$*" >&2; }

if [ -z "$parent" ]; then
  if [ -n "${TMPDIR:-}" ]; then
    parent="$TMPDIR"
  elif [ -d /work ] && [ -w /work ]; then
    parent=/work
  else
    parent="$repo_root/target"
  fi
fi
mkdir -p "$parent"
if [ "$(stat -f -c %T "$parent")" = tmpfs ]; then
  echo "bench-store: $parent is on tmpfs; O_DIRECT there measures memory, not a disk. Pass --dir on a real disk." >&2
  exit 2
fi
work_dir="$(mktemp -d "$parent/shardmq-bench-store.XXXXXX")"
cleanup() { rm -rf "$work_dir"; }
trap cleanup EXIT

step "building shardmq-perf (release)"
cargo build --release --locked -p shardmq-perf >&2
perf_bin="$repo_root/target/release/shardmq-perf"
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
  perf_bin="$CARGO_TARGET_DIR/release/shardmq-perf"
fi

if ! command -v fio >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "installing fio"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >&2
  else
    echo "bench-store: fio is missing; install it (e.g. apt-get install fio)" >&2
    exit 1
  fi
fi

fio_engine=io_uring
if ! fio --name=probe --rw=write --bs=4k --direct=1 --size=64k --ioengine=io_uring \
    --filename="$work_dir/fio-probe.dat" --output=/dev/null >/dev/null 2>&1; then
  fio_engine=libaio
fi
rm -f "$work_dir/fio-probe.dat"

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
results="$work_dir/results.jsonl"
: >"$results"

# Appends one fio JSON result, tagged, to the results file.
record_fio() {
  local kind="$1" file="$2"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[2])); print(json.dumps({"fio": sys.argv[1], "result": r["jobs"][0]}))' \
    "$kind" "$file" >>"$results"
}

for run in $(seq 1 "$runs"); do
  step "fio sequential O_DIRECT write, 1 MiB blocks, 1 GiB ($fio_engine), run $run/$runs"
  fio --name=seqwrite --rw=write --bs=1m --direct=1 --size=1g --ioengine="$fio_engine" \
    --iodepth=1 --filename="$work_dir/fio.dat" --output-format=json --output="$work_dir/fio.json" >&2
  record_fio seqwrite "$work_dir/fio.json"
  rm -f "$work_dir/fio.dat"
  step "fio 4 KiB O_DIRECT write + fdatasync, run $run/$runs"
  fio --name=fdatasync --rw=write --bs=4k --direct=1 --fdatasync=1 --size=16m --runtime=20 \
    --ioengine=sync --filename="$work_dir/fio.dat" --output-format=json \
    --output="$work_dir/fio.json" >&2
  record_fio fdatasync "$work_dir/fio.json"
  rm -f "$work_dir/fio.dat"
done

# Runs one store benchmark in a fresh data directory; prints its JSON line.
run_store() {
  local messages="$1"; shift
  rm -rf "$work_dir/store"
  "$perf_bin" store --data-dir "$work_dir/store" --messages "$messages" --size "$message_bytes" \
    --cpu "$cpu" --json "$@" | tail -n 1
  rm -rf "$work_dir/store"
}

for scenario in "${scenarios[@]}"; do
  label="${scenario%%|*}"
  read -r -a args <<<"${scenario#*|}"
  probe_rate="$(run_store "$probe_messages" "${args[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["msgs_per_sec"])')"
  messages="$(python3 -c 'import sys; rate, secs, low, high = map(float, sys.argv[1:]); print(int(min(high, max(low, rate * secs))) // 1000 * 1000 or int(low))' \
    "$probe_rate" "$target_seconds" "$min_messages" "$max_messages")"
  for run in $(seq 1 "$runs"); do
    step "store: $label, $messages messages, run $run/$runs"
    run_store "$messages" "${args[@]}" |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"store": sys.argv[1], "result": r}))' "$label" >>"$results"
  done
done

if [ -n "$raw_out" ]; then
  cp "$results" "$raw_out"
fi

device="$(df --output=source "$work_dir" | tail -n 1)"
export BENCH_CORES="$(nproc)"
export BENCH_KERNEL="$(uname -r)"
export BENCH_DEVICE="$device"
export BENCH_FS="$(df --output=fstype "$work_dir" | tail -n 1)"
export BENCH_DISK="$(lsblk -ndo NAME,SIZE,ROTA,MODEL "$device" 2>/dev/null | tr -s ' ' || echo unknown)"
export BENCH_FIO_ENGINE="$fio_engine"
export BENCH_RUNS="$runs"
export BENCH_CPU="$cpu"
export BENCH_LOAD="$load_before -> $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" "${scenarios[@]}" <<'PY'
import json, os, statistics, sys

rows = [json.loads(line) for line in open(sys.argv[1])]
labels = [s.split("|", 1)[0] for s in sys.argv[2:]]
median = statistics.median

seq = [r["result"] for r in rows if r.get("fio") == "seqwrite"]
sync = [r["result"] for r in rows if r.get("fio") == "fdatasync"]
seq_mib = median(job["write"]["bw"] / 1024 for job in seq)  # fio reports KiB/s
sync_lat = [job["sync"]["lat_ns"]["percentile"] for job in sync]
fdatasync_p50_us = median(p["50.000000"] / 1000 for p in sync_lat)
fdatasync_p99_us = median(p["99.000000"] / 1000 for p in sync_lat)

env = os.environ
print(f"Machine: {env['BENCH_CORES']} cores, kernel {env['BENCH_KERNEL']}, "
      f"disk {env['BENCH_DISK']} ({env['BENCH_DEVICE']}, {env['BENCH_FS']}).")
print(f"Store executor pinned to CPU {env['BENCH_CPU']}; medians of {env['BENCH_RUNS']} runs each; "
      f"load average (1/5/15 min) before -> after: {env['BENCH_LOAD']}.")
print()
print(f"fio baseline: sequential O_DIRECT write (1 MiB, iodepth 1, {env['BENCH_FIO_ENGINE']}) "
      f"{seq_mib:.0f} MiB/s; 4 KiB O_DIRECT write + fdatasync: fdatasync p50 "
      f"{fdatasync_p50_us:.0f} µs, p99 {fdatasync_p99_us:.0f} µs.")
print()
print("| scenario | messages | msgs/s | payload MiB/s | stored MiB/s | stored ÷ fio | "
      "p50 µs | p99 µs | p99.9 µs | max µs | p99 ÷ fdatasync p99 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for label in labels:
    results = [r["result"] for r in rows if r.get("store") == label]
    if not results:
        continue
    m = {key: median(r[key] for r in results)
         for key in ["messages", "msgs_per_sec", "mb_per_sec", "stored_mb_per_sec",
                     "p50_us", "p99_us", "p999_us", "max_us"]}
    is_sync = results[0]["flush"] == "sync"
    sync_ratio = f"{m['p99_us'] / fdatasync_p99_us:.1f}" if is_sync else "–"
    print(f"| {label} | {m['messages']:.0f} | {m['msgs_per_sec']:.0f} | {m['mb_per_sec']:.1f} | "
          f"{m['stored_mb_per_sec']:.1f} | {m['stored_mb_per_sec'] / seq_mib:.2f} | "
          f"{m['p50_us']:.1f} | {m['p99_us']:.1f} | {m['p999_us']:.1f} | {m['max_us']:.0f} | "
          f"{sync_ratio} |")
PY
