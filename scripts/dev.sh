#!/usr/bin/env bash
# Starts a local development cluster: one name server and one broker on loopback, data under
# ./data, built in release mode. Prints the addresses and what to try next; Ctrl-C stops both
# (gracefully: the broker flushes and persists before it exits).
#
# Usage: scripts/dev.sh            (from any directory)
# Env:   SHARDMQ_NAMESRV (default 127.0.0.1:9876), SHARDMQ_BROKER (default 127.0.0.1:10911),
#        SHARDMQ_DATA (default ./data), SHARDMQ_FLUSH (async|sync, default async)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

namesrv_addr="${SHARDMQ_NAMESRV:-127.0.0.1:9876}"
broker_addr="${SHARDMQ_BROKER:-127.0.0.1:10911}"
data_dir="${SHARDMQ_DATA:-$repo_root/data}"
flush="${SHARDMQ_FLUSH:-async}"

echo "==> building (release)"
cargo build --release --bins --locked

mkdir -p "$data_dir"
logs="$data_dir/logs"
mkdir -p "$logs"
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

# Waits until a process prints its "listening on" line, or fails with its log.
wait_listening() {
  local name="$1" out="$2" pid="$3"
  for _ in $(seq 1 300); do
    if grep -q "listening on" "$out" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name failed to start; its log:" >&2
      cat "$logs/$name.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "$name did not start within 30 s; see $logs/$name.log" >&2
  exit 1
}

target/release/shardmq-namesrv --listen "$namesrv_addr" >"$logs/namesrv.out" 2>"$logs/namesrv.log" &
pids+=($!)
wait_listening namesrv "$logs/namesrv.out" "${pids[-1]}"

target/release/shardmq-broker --namesrv "$namesrv_addr" --listen "$broker_addr" \
  --data-dir "$data_dir/broker" --flush "$flush" --auto-create-topics --enable-property-filter \
  >"$logs/broker.out" 2>"$logs/broker.log" &
pids+=($!)
wait_listening broker "$logs/broker.out" "${pids[-1]}"

cat <<TXT

ShardMQ dev cluster is up
  name server  $namesrv_addr
  broker       $broker_addr   (data: $data_dir/broker, flush: $flush, topics auto-created, SQL92 filters on)
  logs         $logs/

Try, in another terminal:
  target/release/shardmq --namesrv $namesrv_addr send TestTopic --body "hello" --count 3
  target/release/shardmq --namesrv $namesrv_addr consume TestTopic --group demo --from first --count 3
  target/release/shardmq --namesrv $namesrv_addr topic list
  target/release/shardmq-broker verify --data-dir $data_dir/broker   (after stopping)

Ctrl-C stops both.
TXT
wait "${pids[@]}"
