#!/usr/bin/env bash
# Compares two builds of ShardMQ in one sitting: the storage engine alone and one producer
# through a whole broker, the two builds run in turns so that the machine's mood falls on both.
#
# Usage: scripts/bench-ab.sh A_BIN_DIR B_BIN_DIR [--runs N] [--seconds S] [--dir PARENT]
#   A_BIN_DIR, B_BIN_DIR  folders holding shardmq-namesrv, shardmq-broker and shardmq-perf
#                         (copy target/release/ aside before changing the code)
#   --runs N              turns per build (default 3); medians are printed
#   --seconds S           length of each produce run (default 10)
#   --dir PARENT          where the data directories go (default /work, else target/); a disk
#
# Scenarios (1 KiB messages, async flush): `shardmq-perf store` with 64 producers x batch 64 and
# 300,000 messages; `shardmq-perf produce` with 1 producer x batch 1000 on 1 queue against a
# fresh name server and broker (and the producer's CPU per message, `client_cpu_us_per_msg`,
# from builds that report it). Also prints fio's 1 MiB O_DIRECT sequential write once (when fio
# is installed) so the figures can be read as ratios. Not part of scripts/test.sh.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ $# -lt 2 ]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
a_bin="$(cd "$1" && pwd)"
b_bin="$(cd "$2" && pwd)"
shift 2
runs=3
seconds=10
parent=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --dir) parent="$2"; shift 2 ;;
    *) echo "bench-ab: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$parent" ]; then
  if [ -d /work ] && [ -w /work ]; then parent=/work; else parent="$repo_root/target"; fi
fi
work="$(mktemp -d "$parent/shardmq-bench-ab.XXXXXX")"
pids=()
cleanup() {
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

wait_listening() {
  local name="$1" file="$2"
  for _ in $(seq 1 300); do
    if grep -q "^$name listening on " "$file" 2>/dev/null; then
      grep -m1 "^$name listening on " "$file" | awk '{print $NF}'
      return 0
    fi
    sleep 0.1
  done
  echo "bench-ab: $name did not start" >&2
  return 1
}

# One store run and one produce run of the build in $1; appends JSON lines tagged $2.
run_build() {
  local bin="$1" tag="$2" dir="$work/$2"
  rm -rf "$dir" && mkdir -p "$dir"
  "$bin/shardmq-perf" store --data-dir "$dir/store" --messages 300000 --size 1024 \
    --flush async --batch 64 --producers 64 --cpu 0 --json | tail -n 1 |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"build": sys.argv[1], "kind": "store", "mb": r["stored_mb_per_sec"]}))' "$tag" >>"$work/results.jsonl"
  rm -rf "$dir/store"
  "$bin/shardmq-namesrv" --listen 127.0.0.1:0 >"$dir/ns.out" 2>"$dir/ns.log" &
  pids=("$!")
  local ns
  ns="$(wait_listening shardmq-namesrv "$dir/ns.out")"
  "$bin/shardmq-broker" --namesrv "$ns" --listen 127.0.0.1:0 --data-dir "$dir/broker" \
    --flush async >"$dir/b.out" 2>"$dir/b.log" &
  pids+=("$!")
  wait_listening shardmq-broker "$dir/b.out" >/dev/null
  "$bin/shardmq-perf" produce --namesrv "$ns" --topic ab --size 1024 --batch 1000 \
    --producers 1 --queues 1 --duration "$seconds" --json 2>/dev/null | tail -n 1 |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"build": sys.argv[1], "kind": "produce", "mb": r["mb_per_sec"], "p50": r["p50_us"], "cpu": r.get("client_cpu_us_per_msg")}))' "$tag" >>"$work/results.jsonl"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
}

fio_mb=""
if command -v fio >/dev/null 2>&1; then
  fio --name=seqwrite --rw=write --bs=1m --direct=1 --size=1g --ioengine=io_uring --iodepth=8 \
    --filename="$work/fio.dat" --output-format=json --output="$work/fio.json" >/dev/null 2>&1 &&
    fio_mb="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw"] * 1024 / 1e6)' "$work/fio.json")"
  rm -f "$work/fio.dat"
fi
: >"$work/results.jsonl"
for run in $(seq 1 "$runs"); do
  echo "==> turn $run/$runs: A" >&2
  run_build "$a_bin" A
  echo "==> turn $run/$runs: B" >&2
  run_build "$b_bin" B
done
python3 - "$work/results.jsonl" "$fio_mb" "$a_bin" "$b_bin" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
fio = float(sys.argv[2]) if sys.argv[2] else None
print(f"A = {sys.argv[3]}\nB = {sys.argv[4]}")
if fio:
    print(f"fio O_DIRECT 1 MiB sequential write (iodepth 8): {fio:.0f} MB/s")
for kind, label in [("store", "store 64 x batch 64, stored MB/s"), ("produce", "produce 1 x batch 1000, body MB/s")]:
    a = [r["mb"] for r in rows if r["build"] == "A" and r["kind"] == kind]
    b = [r["mb"] for r in rows if r["build"] == "B" and r["kind"] == kind]
    ma, mb = statistics.median(a), statistics.median(b)
    ratio = f", B/A {mb / ma:.2f}" if ma else ""
    fio_part = f", B / fio {mb / fio:.2f}" if fio else ""
    print(f"{label}: A median {ma:.0f} ({', '.join(f'{x:.0f}' for x in a)}); B median {mb:.0f} ({', '.join(f'{x:.0f}' for x in b)}){ratio}{fio_part}")
# The producer's CPU per message (user + system), from builds whose shardmq-perf reports it.
cpu = {build: [r["cpu"] for r in rows if r["build"] == build and r["kind"] == "produce" and r.get("cpu") is not None] for build in "AB"}
if cpu["A"] or cpu["B"]:
    shown = lambda xs: f"median {statistics.median(xs):.2f} ({', '.join(f'{x:.2f}' for x in xs)})" if xs else "not reported"
    print(f"produce 1 x batch 1000, client CPU us per message: A {shown(cpu['A'])}; B {shown(cpu['B'])}")
PY
