#!/usr/bin/env bash
# SQL92 filtered drains against an unfiltered one, in one sitting (docs/performance.md, "SQL92
# filtered drains"). One fresh name server and broker (--flush async --storage-cores 0
# --network-cores 0 --enable-property-filter), then ROUNDS rounds of three drains, each of a
# fresh topic of one queue filled with BACKLOG 1 KiB messages (property perf_pct = n mod 100):
# unfiltered, `perf_pct < 10` and `perf_pct < 90` (shardmq-perf consume --match-percent). The
# client is pinned to core 1. Prints per run: the scenario, messages delivered and lost, the
# drain's time (from the group's start to the last message), the backlog scanned per second
# (BACKLOG / that time) and the messages delivered per second.
# Needs a release build: cargo build --release --workspace --bins --locked
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
backlog=${BACKLOG:-500000}
bin=target/release
work=$(mktemp -d)
trap 'kill $broker_pid $namesrv_pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

"$bin/shardmq-namesrv" --listen 127.0.0.1:0 >"$work/namesrv.out" 2>"$work/namesrv.log" &
namesrv_pid=$!
until grep -q "listening on" "$work/namesrv.out" 2>/dev/null; do sleep 0.1; done
namesrv=$(sed -n 's/.*listening on //p' "$work/namesrv.out")
"$bin/shardmq-broker" --listen 127.0.0.1:0 --namesrv "$namesrv" --data-dir "$work/broker" \
  --flush async --storage-cores 0 --network-cores 0 --enable-property-filter \
  >"$work/broker.out" 2>"$work/broker.log" &
broker_pid=$!
until grep -q "listening on" "$work/broker.out" 2>/dev/null; do sleep 0.1; done
sleep 1

cpu_ticks() { awk '{print $14 + $15}' "/proc/$broker_pid/stat"; }
hz=$(getconf CLK_TCK)

# run NAME TOPIC [--match-percent P]: fill TOPIC with the backlog (not timed), drain it through
# a new group, print one line.
run() {
  local name=$1 topic=$2
  shift 2
  local out
  out=$(taskset -c 1 "$bin/shardmq-perf" consume --namesrv "$namesrv" --topic "$topic" --queues 1 \
    --size 1024 --backlog "$backlog" --fill-producers 1 --fill-batch 1000 --idle-timeout 5 \
    --quiet --json "$@" | tail -1)
  python3 - "$name" "$out" <<'PY'
import json, sys
name, r = sys.argv[1], json.loads(sys.argv[2])
scanned = r["backlog"] / r["elapsed_s"]
print(f"{name} delivered {r['messages']:>9,} lost {r['lost']} in {r['elapsed_s']:.3f} s:"
      f" backlog scanned {scanned:>12,.0f} msgs/s, delivered {r['msgs_per_sec']:>12,.0f} msgs/s")
PY
}

for round in $(seq 1 "$rounds"); do
  run "unfiltered" "U$round"
  run "match-10% " "S10x$round" --match-percent 10
  run "match-90% " "S90x$round" --match-percent 90
done
