#!/usr/bin/env bash
# TLS against plain, produce and consume, in one sitting (docs/performance.md, "TLS against
# plain"). One fresh name server and broker (--flush async --storage-cores 0 --network-cores 0,
# TLS permissive so the same broker serves both), then ROUNDS rounds alternating plain and TLS
# clients pinned to core 1 (the name server is permissive too): produce 1 KiB x batch 1000 and x batch 32 into a topic of one
# queue, and a drain of that topic by a new group. Prints one line per run: scenario, mode,
# msgs/s, broker CPU µs a message (from /proc/<pid>/stat over the run).
# Writes about 0.5 GB a round into a temporary directory. Needs a release build: cargo build --release --workspace --bins --locked
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
bin=target/release
work=$(mktemp -d)
trap 'kill $broker_pid $namesrv_pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
scripts/make-certs.sh "$work/certs" >/dev/null
certs=$work/certs

"$bin/shardmq-namesrv" --listen 127.0.0.1:0 \
  --tls-mode permissive --tls-cert "$certs/server.pem" --tls-key "$certs/server.key" \
  >"$work/namesrv.out" 2>"$work/namesrv.log" &
namesrv_pid=$!
until grep -q "listening on" "$work/namesrv.out" 2>/dev/null; do sleep 0.1; done
namesrv=$(sed -n 's/.*listening on //p' "$work/namesrv.out")
"$bin/shardmq-broker" --listen 127.0.0.1:0 --namesrv "$namesrv" --data-dir "$work/broker" \
  --flush async --storage-cores 0 --network-cores 0 \
  --tls-mode permissive --tls-cert "$certs/server.pem" --tls-key "$certs/server.key" \
  >"$work/broker.out" 2>"$work/broker.log" &
broker_pid=$!
until grep -q "listening on" "$work/broker.out" 2>/dev/null; do sleep 0.1; done
broker=$(sed -n 's/.*listening on //p' "$work/broker.out")

cpu_ticks() { awk '{print $14 + $15}' "/proc/$broker_pid/stat"; }
hz=$(getconf CLK_TCK)

# run NAME MODE MESSAGES ARGS...: one perf run, its line.
run() {
  local name=$1 mode=$2 messages=$3
  shift 3
  local tls=()
  [ "$mode" = tls ] && tls=(--tls-ca "$certs/ca.pem")
  local before after rate
  before=$(cpu_ticks)
  rate=$(taskset -c 1 "$bin/shardmq-perf" "$@" --namesrv "$namesrv" --messages "$messages" \
    --quiet --json "${tls[@]}" | tail -1 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["msgs_per_sec"]))')
  after=$(cpu_ticks)
  python3 -c "print(f'$name $mode {int($rate):>10,} msgs/s  broker {($after-$before)/$hz*1e6/$messages:.2f} µs/msg')"
}

for topic in P1000 P32; do
  "$bin/shardmq" --namesrv "$namesrv" topic create "$topic" --queues 1 --broker "$broker" >/dev/null
done
sleep 1
for round in $(seq 1 "$rounds"); do
  for mode in plain tls; do
    run "produce-batch-1000" $mode 300000 produce --topic P1000 --size 1024 --batch 1000 --producers 1
    run "produce-batch-32  " $mode 96000 produce --topic P32 --size 1024 --batch 32 --producers 1
    run "consume           " $mode 300000 consume --topic P1000 --from first --consumers 1
  done
done
