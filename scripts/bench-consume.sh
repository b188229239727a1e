#!/usr/bin/env bash
# One consumer draining one queue, against the disk and the producer, in one sitting (issue 22,
# item 6).
#
# 1. builds the binaries (release) unless --bin is given;
# 2. measures fio: 1 MiB O_DIRECT sequential write, io_uring, iodepth 8, 1 GiB into fresh
#    space on the disk of the data directory (installing fio with apt-get when missing);
# 3. for each build (--bin, repeatable; default the tree's release build), with its own name
#    server and broker (async flush) over a fresh data directory:
#    - the 1-producer rate: `shardmq-perf produce --batch 1000 --producers 1 --queues 1`;
#    - warm drain: N 1 KiB messages are written to a 1-queue topic (4 producers x batch 128,
#      untimed), then `shardmq-perf consume --from first --consumers 1` drains them with a new
#      group at once (the newest 64 MiB are still in the broker's write ring);
#    - cold drain: the broker is stopped gracefully and started again on the same data
#      directory (nothing in its write ring), and a new group drains the same N messages;
#    with each broker thread's CPU seconds during each drain;
# 4. prints a table of body MB/s (10^6 bytes) and the ratios to fio and to the 1-producer rate.
#
# Usage: scripts/bench-consume.sh [--bin DIR]... [--messages N] [--seconds S] [--runs N]
#                                 [--dir PARENT] [--profile DIR] [--broker-args "ARGS"]
#   --bin DIR           folder holding shardmq-namesrv, shardmq-broker and shardmq-perf; give it
#                       twice to compare two builds (they run in turns); default: this tree's
#   --messages N        backlog to drain (default 2000000: about 2 GB of 1 KiB bodies)
#   --seconds S         length of the produce run (default 10)
#   --runs N            turns per build (default 1); every run is printed
#   --dir PARENT        where the data directories go (default $TMPDIR, else /work, else
#                       target/); on the disk to measure, not tmpfs; needs ~2.5 x N KiB free
#   --profile DIR       also `perf record -a -g` each drain into DIR/<build>-<run>-<drain>.data
#   --broker-args ARGS  extra broker flags, e.g. "--readahead-bytes 0"
# Removes its processes and temporary data on exit. Heavy (a few minutes per build and run);
# not part of scripts/test.sh.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

bins=()
messages=2000000
seconds=10
runs=1
parent=""
profile_dir=""
broker_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bins+=("$(cd "$2" && pwd)"); shift 2 ;;
    --messages) messages="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --dir) parent="$2"; shift 2 ;;
    --profile) profile_dir="$2"; shift 2 ;;
    --broker-args) broker_args="$2"; shift 2 ;;
    -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-consume: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

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
  echo "bench-consume: $parent is on tmpfs; O_DIRECT there measures memory, not a disk. Pass --dir on a real disk." >&2
  exit 2
fi
# fio's 1 GiB, the backlog (about 1.1 KiB a message) and the produce run (about 300 MB/s).
needed_kib=$(( (1 << 20) + messages * 11 / 10 + seconds * 300 * 1024 ))
available_kib="$(df -Pk "$parent" | awk 'NR == 2 {print $4}')"
if [ "$available_kib" -lt "$needed_kib" ]; then
  echo "bench-consume: $parent has $((available_kib >> 20)) GiB free, the runs need about $((needed_kib >> 20)) GiB" >&2
  exit 2
fi
work_dir="$(mktemp -d "$parent/shardmq-bench-consume.XXXXXX")"
pids=()
cleanup() {
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$work_dir"
}
trap cleanup EXIT
# shellcheck source=lib/thread-cpu.sh
. "$repo_root/scripts/lib/thread-cpu.sh"

if [ ${#bins[@]} -eq 0 ]; then
  step "building (release)"
  cargo build --release --locked --bins >&2
  target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
  case "$target_dir" in /*) ;; *) target_dir="$repo_root/$target_dir" ;; esac
  bins=("$target_dir/release")
fi
if [ -n "$profile_dir" ]; then
  mkdir -p "$profile_dir"
  profile_dir="$(cd "$profile_dir" && pwd)"
fi

if ! command -v fio >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "installing fio"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >&2
  else
    echo "bench-consume: fio is missing; install it (e.g. apt-get install fio)" >&2
    exit 1
  fi
fi

results="$work_dir/results.jsonl"
: >"$results"
# Appends {"build": B, "run": R, "kind": K, "result": <json from stdin>} to the results.
record() {
  python3 -c 'import json,sys; print(json.dumps({"build": sys.argv[1], "run": int(sys.argv[2]), "kind": sys.argv[3], "result": json.loads(sys.stdin.read())}))' \
    "$1" "$2" "$3" >>"$results"
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
step "fio: 1 MiB O_DIRECT sequential write, io_uring, iodepth 8, 1 GiB into fresh space"
fio --name=seqwrite --rw=write --bs=1m --direct=1 --size=1g --ioengine=io_uring --iodepth=8 \
  --filename="$work_dir/fio.dat" --output-format=json --output="$work_dir/fio.json" >&2
rm -f "$work_dir/fio.dat"
fio_mb="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw_bytes"] / 1e6)' "$work_dir/fio.json")"
step "fio: $fio_mb MB/s"

# Waits for "<name> listening on ADDR" in FILE; prints ADDR.
listening_addr() {
  local name="$1" file="$2" pid="$3"
  for _ in $(seq 1 600); do
    local line
    line="$(grep -m1 "^$name listening on " "$file" 2>/dev/null || true)"
    if [ -n "$line" ]; then
      echo "${line##* }"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "bench-consume: $name exited; its log:" >&2
      cat "${file%.out}.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "bench-consume: $name did not start within 60 s" >&2
  return 1
}

namesrv_pid=""
broker_pid=""
namesrv_addr=""
broker_addr=""
# Starts the broker of build $1 on data directory $2 at address $3 (127.0.0.1:0 the first time).
start_broker() {
  local bin="$1" dir="$2" listen="$3"
  # shellcheck disable=SC2086
  # Retention must not delete the backlog under the drain on a shared disk that is already
  # fuller than the default disk_max_used_ratio (0.75).
  "$bin/shardmq-broker" --namesrv "$namesrv_addr" --listen "$listen" --data-dir "$dir/broker" \
    --flush async --disk-max-used-ratio 0.9 $broker_args >>"$dir/broker.out" 2>>"$dir/broker.log" &
  broker_pid="$!"
  pids=("$namesrv_pid" "$broker_pid")
  broker_addr="$(listening_addr shardmq-broker "$dir/broker.out" "$broker_pid")"
}

# Stops the broker of directory $1 gracefully; with $2 (build) and $3 (run.kind), records
# what its read-ahead did (the store logs it as it closes).
stop_broker() {
  kill -TERM "$broker_pid" 2>/dev/null || true
  wait "$broker_pid" 2>/dev/null || true
  pids=("$namesrv_pid")
  # The next start appends to the same file: only its own line may be found.
  : >"$1/broker.out"
  if [ $# -ge 3 ]; then
    local line
    line="$(grep "read-ahead since the store opened" "$1/broker.log" | tail -n 1 || true)"
    : >"$1/broker.log"
    python3 -c 'import json,re,sys; print(json.dumps(dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", sys.argv[1]))))' \
      "$line" | record "$2" "${3%%.*}" "${3#*.}-read-ahead"
  fi
}

# Runs a drain (shardmq-perf consume with the given arguments) recording the broker's thread
# CPU beside it, and a profile when asked; $1 build, $2 run, $3 kind.
drain() {
  local build="$1" run="$2" kind="$3"; shift 3
  local before after profiler=""
  before="$(thread_cpu "$broker_pid")"
  if [ -n "$profile_dir" ]; then
    perf record -a -g -o "$profile_dir/$build-$run-$kind.data" >/dev/null 2>&1 &
    profiler="$!"
  fi
  "$bin/shardmq-perf" consume --namesrv "$namesrv_addr" --size 1024 --consumers 1 --json \
    --quiet "$@" | tail -n 1 | record "$build" "$run" "$kind"
  if [ -n "$profiler" ]; then
    kill -INT "$profiler" 2>/dev/null || true
    wait "$profiler" 2>/dev/null || true
  fi
  after="$(thread_cpu "$broker_pid")"
  python3 - "$before" "$after" <<'PY' | record "$build" "$run" "$kind-broker-cpu"
import json, sys
parse = lambda text: {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.strip()}
before, after = parse(sys.argv[1]), parse(sys.argv[2])
print(json.dumps({name: round(after[name] - before.get(name, 0.0), 2) for name in after if after[name] - before.get(name, 0.0) >= 0.05}))
PY
}

for run in $(seq 1 "$runs"); do
  for index in "${!bins[@]}"; do
    bin="${bins[$index]}"
    build="$index"
    dir="$work_dir/b$index-r$run"
    mkdir -p "$dir"
    "$bin/shardmq-namesrv" --listen 127.0.0.1:0 >"$dir/namesrv.out" 2>"$dir/namesrv.log" &
    namesrv_pid="$!"
    pids=("$namesrv_pid")
    namesrv_addr="$(listening_addr shardmq-namesrv "$dir/namesrv.out" "$namesrv_pid")"
    start_broker "$bin" "$dir" 127.0.0.1:0

    step "build $index ($bin), run $run: 1 producer x batch 1000, 1 queue, $seconds s"
    "$bin/shardmq-perf" produce --namesrv "$namesrv_addr" --topic produce1 --size 1024 \
      --batch 1000 --producers 1 --queues 1 --duration "$seconds" --json --quiet |
      tail -n 1 | record "$build" "$run" produce

    step "build $index, run $run: filling one queue with $messages messages (untimed)"
    "$bin/shardmq-perf" produce --namesrv "$namesrv_addr" --topic drain1 --size 1024 \
      --batch 128 --producers 4 --queues 1 --messages "$messages" --json --quiet |
      tail -n 1 | record "$build" "$run" fill
    step "build $index, run $run: warm drain by a new group"
    drain "$build" "$run" warm --topic drain1 --from first

    step "build $index, run $run: restarting the broker on the same data directory"
    stop_broker "$dir" "$build" "$run.warm"
    start_broker "$bin" "$dir" "$broker_addr"
    step "build $index, run $run: cold drain by a new group"
    drain "$build" "$run" cold --topic drain1 --from first

    stop_broker "$dir" "$build" "$run.cold"
    kill -TERM "$namesrv_pid" 2>/dev/null || true
    wait "$namesrv_pid" 2>/dev/null || true
    pids=()
    rm -rf "$dir"
  done
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$results" "$fio_mb" "$load_before" "$load_after" "${bins[@]}" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
fio = float(sys.argv[2])
builds = sys.argv[5:]
print(f"machine: {open('/proc/cpuinfo').read().count('processor')} cores; load average before {sys.argv[3]}, after {sys.argv[4]}")
print(f"fio 1 MiB O_DIRECT sequential write, io_uring, iodepth 8, fresh space: {fio:.0f} MB/s")
for index, path in enumerate(builds):
    print(f"build {index}: {path}")
print()
print("| build | run | 1-producer MB/s | warm drain MB/s | cold drain MB/s | warm / fio | cold / fio | warm / producer | cold / producer |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
def rate(build, run, kind):
    found = [r["result"] for r in rows if r["build"] == build and r["run"] == run and r["kind"] == kind]
    if not found:
        return None
    result = found[-1]
    return result["mb_per_sec"] * (1 << 20) / 1e6
for run in sorted({r["run"] for r in rows}):
    for build in sorted({r["build"] for r in rows}):
        p, w, c = (rate(build, run, kind) for kind in ("produce", "warm", "cold"))
        ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"
        show = lambda x: f"{x:.0f}" if x else "-"
        print(f"| {build} | {run} | {show(p)} | {show(w)} | {show(c)} | {ratio(w, fio)} | {ratio(c, fio)} | {ratio(w, p)} | {ratio(c, p)} |")
print()
for row in rows:
    if row["kind"] in ("warm", "cold"):
        r = row["result"]
        print(f"build {row['build']} run {row['run']} {row['kind']}: {r['messages']} messages in {r['elapsed_s']} s, lost {r.get('lost')}, duplicates {r.get('duplicates')}")
    elif row["kind"].endswith("read-ahead"):
        stats = ", ".join(f"{name} {value}" for name, value in row["result"].items() if name not in ("end_offset",))
        print(f"build {row['build']} run {row['run']} {row['kind']} (produce and drain since the broker started): {stats or 'none logged'}")
    elif row["kind"].endswith("broker-cpu"):
        cpu = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in sorted(row["result"].items()))
        print(f"build {row['build']} run {row['run']} {row['kind']}: {cpu}")
PY
