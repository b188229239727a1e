#!/usr/bin/env bash
# Starts a local controlled group (docs/replication.md, "Automatic failover"): three name
# servers, each running a controller (one Raft group), and three brokers of broker-a in
# `--broker-role auto`: the controller makes one master and the others in-sync slaves, and
# replaces the master when it dies. Data under ./data/ha, built in release mode. Ctrl-C stops
# everything.
#
# Usage: scripts/dev-ha.sh            (from any directory)
# Env:   SHARDMQ_DATA (default ./data/ha)
#
# Name servers 127.0.0.1:9876, :9886, :9896; controllers :9878, :9888, :9898; brokers
# :10911, :10921, :10931 (HA :10912, :10922, :10932). Try:
#   target/release/shardmq controller status --controller 127.0.0.1:9878
#   target/release/shardmq --namesrv 127.0.0.1:9876,127.0.0.1:9886 send TopicTest --body hi
#   kill -9 <the master's pid>; shardmq controller status again: another broker is master.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

data_dir="${SHARDMQ_DATA:-$repo_root/data/ha}"
echo "==> building (release)"
cargo build --release --bins --locked

mkdir -p "$data_dir/logs"
logs="$data_dir/logs"
pids=()
stop() {
  trap - INT TERM EXIT
  if [ ${#pids[@]} -gt 0 ]; then
    echo
    echo "==> stopping"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
}
trap stop INT TERM EXIT

wait_for() {
  local file="$1" text="$2"
  for _ in $(seq 1 300); do
    grep -q "$text" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out waiting for \"$text\" in $file" >&2
  exit 1
}

namesrvs="127.0.0.1:9876,127.0.0.1:9886,127.0.0.1:9896"
controllers="127.0.0.1:9878,127.0.0.1:9888,127.0.0.1:9898"
peers="1=127.0.0.1:9878,2=127.0.0.1:9888,3=127.0.0.1:9898"
for i in 1 2 3; do
  port=$((9866 + 10 * i))
  target/release/shardmq-namesrv --listen "127.0.0.1:$port" --controller \
    --controller-listen "127.0.0.1:$((port + 2))" --controller-peers "$peers" \
    --controller-id "$i" --controller-data-dir "$data_dir/controller-$i" \
    >"$logs/namesrv-$i.out" 2>"$logs/namesrv-$i.log" &
  pids+=($!)
done
for i in 1 2 3; do wait_for "$logs/namesrv-$i.out" "listening on"; done

for i in 1 2 3; do
  port=$((10901 + 10 * i))
  target/release/shardmq-broker --namesrv "$namesrvs" --listen "127.0.0.1:$port" \
    --ha-listen "127.0.0.1:$((port + 1))" --broker-role auto --broker-id "$i" \
    --controller "$controllers" --data-dir "$data_dir/broker-$i" --auto-create-topics \
    >"$logs/broker-$i.out" 2>"$logs/broker-$i.log" &
  pids+=($!)
done
for i in 1 2 3; do wait_for "$logs/broker-$i.out" "listening on"; done
sleep 2
target/release/shardmq controller status --controller "$controllers"
cat <<EOF

Controlled group running (logs in $logs). Try:
  target/release/shardmq --namesrv $namesrvs send TopicTest --body hello
  target/release/shardmq controller status --controller $controllers
  kill -9 \$(pgrep -f 'broker-id <master id> ')   # then ask the controller again
Ctrl-C stops everything.
EOF
wait
