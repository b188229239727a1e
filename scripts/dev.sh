#!/usr/bin/env bash
# Starts a local development cluster: one name server and one broker on loopback, data under
# ./data, built in release mode, and the web console beside them (docs/console.md). Prints the
# addresses and what to try next; Ctrl-C stops all three (gracefully: the broker flushes and
# persists before it exits).
#
# Usage: scripts/dev.sh            (from any directory)
# Env:   SHARDMQ_NAMESRV (default 127.0.0.1:9876), SHARDMQ_BROKER (default 127.0.0.1:10911),
#        SHARDMQ_DATA (default ./data), SHARDMQ_FLUSH (async|sync, default async),
#        SHARDMQ_CONSOLE (the web console's address, default 127.0.0.1:8080),
#        SHARDMQ_ACL=1 (access control on: both servers enforce $SHARDMQ_DATA/acl.toml, made
#        with two accounts when it does not exist; docs/acl.md)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

namesrv_addr="${SHARDMQ_NAMESRV:-127.0.0.1:9876}"
broker_addr="${SHARDMQ_BROKER:-127.0.0.1:10911}"
data_dir="${SHARDMQ_DATA:-$repo_root/data}"
flush="${SHARDMQ_FLUSH:-async}"
acl="${SHARDMQ_ACL:-0}"
console_addr="${SHARDMQ_CONSOLE:-127.0.0.1:8080}"

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

namesrv_acl=()
broker_acl=()
cli_credentials=""
acl_note="off"
if [ "$acl" = 1 ]; then
  acl_file="$data_dir/acl.toml"
  if [ ! -f "$acl_file" ]; then
    cat >"$acl_file" <<'TOML'
# Made by scripts/dev.sh (SHARDMQ_ACL=1). Edit it, or use `shardmq acl add|update|remove`;
# the servers reload it within 500 ms. Nothing is trusted by address.

# The brokers' own account (registration, replication) and the operator's.
[[accounts]]
access_key = "dev-admin"
secret_key = "dev-admin-secret"
admin = true

# An application: publishes and subscribes to every topic, in every group (PUB on a group is
# what a transactional producer group needs to end its transactions).
[[accounts]]
access_key = "dev-app"
secret_key = "dev-app-secret"
default_topic_perm = "PUB|SUB"
default_group_perm = "PUB|SUB"
TOML
  fi
  namesrv_acl=(--acl-file "$acl_file")
  broker_acl=(--acl-file "$acl_file" --access-key dev-admin --secret-key dev-admin-secret)
  cli_credentials=" --access-key dev-app --secret-key dev-app-secret"
  acl_note="on ($acl_file)"
fi

target/release/shardmq-namesrv --listen "$namesrv_addr" "${namesrv_acl[@]}" \
  >"$logs/namesrv.out" 2>"$logs/namesrv.log" &
pids+=($!)
wait_listening namesrv "$logs/namesrv.out" "${pids[-1]}"

target/release/shardmq-broker --namesrv "$namesrv_addr" --listen "$broker_addr" \
  --data-dir "$data_dir/broker" --flush "$flush" --auto-create-topics --enable-property-filter \
  "${broker_acl[@]}" \
  >"$logs/broker.out" 2>"$logs/broker.log" &
pids+=($!)
wait_listening broker "$logs/broker.out" "${pids[-1]}"

# The console runs without an account: with access control on, each browser logs in.
target/release/shardmq --namesrv "$namesrv_addr" console --listen "$console_addr" \
  >"$logs/console.out" 2>"$logs/console.log" &
pids+=($!)
wait_listening console "$logs/console.out" "${pids[-1]}"
console_url="$(sed -n 's/^console listening on //p' "$logs/console.out")"
console_note=""
if [ "$acl" = 1 ]; then
  console_note="   (log in as dev-admin / dev-admin-secret)"
fi

cat <<TXT

ShardMQ dev cluster is up
  name server  $namesrv_addr
  broker       $broker_addr   (data: $data_dir/broker, flush: $flush, topics auto-created, SQL92 filters on)
  access control $acl_note
  web console  $console_url$console_note
  logs         $logs/

Try, in another terminal:
  target/release/shardmq --namesrv $namesrv_addr$cli_credentials send TestTopic --body "hello" --count 3
  target/release/shardmq --namesrv $namesrv_addr$cli_credentials consume TestTopic --group demo --from first --count 3
  target/release/shardmq --namesrv $namesrv_addr$cli_credentials topic list
  target/release/shardmq-broker verify --data-dir $data_dir/broker   (after stopping)

Ctrl-C stops all three.
TXT
wait "${pids[@]}"
