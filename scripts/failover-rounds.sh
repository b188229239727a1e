#!/usr/bin/env bash
# Repeats the master kill of a controlled group (docs/replication.md, "Automatic failover")
# and records, per round: how long until the controller named a new master, how long until a
# send was acknowledged again, and what a producer running across the kill lost.
#
# One group for all rounds: three name servers with controllers, three brokers in
# `--broker-role auto` (sync replication to the SyncStateSet, async flush). Each round:
#   1. `shardmq-perf produce --producers 2 --duration D --verify` runs in the background (it
#      reads its messages back at the end and counts lost and duplicated ones);
#   2. after 3 s the master is killed with SIGKILL; `shardmq send` is tried every 100 ms until
#      it is acknowledged (write resume time), and the controller is asked every 100 ms until
#      it names another master (election time);
#   3. the killed broker is started again (it rejoins as a slave) and the round waits until
#      the SyncStateSet holds all three again;
#   4. the produce run ends and its lost/duplicate counts are recorded.
# Usage: scripts/failover-rounds.sh [--rounds N] [--seconds D] [--broker-timeout-ms MS]
#   defaults: 10 rounds, 14 s produce runs, 2000 ms controller broker timeout.
# Builds release binaries; loopback ports picked free; prints a markdown table. Heavy (about
# 4 minutes with the defaults); not part of scripts/test.sh.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

rounds=10
seconds=14
timeout_ms=2000
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --broker-timeout-ms) timeout_ms="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --bins --locked -q
bin="$repo_root/target/release"
work="$(mktemp -d "${TMPDIR:-/tmp}/shardmq-failover.XXXXXX")"
pids=()
declare -A broker_pid broker_args
cleanup() {
  for pid in "${pids[@]}" "${broker_pid[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now_ms() { date +%s%3N; }

ns=(); ctl=()
for i in 1 2 3; do ns+=("127.0.0.1:$(free_port)"); ctl+=("127.0.0.1:$(free_port)"); done
namesrvs="$(IFS=,; echo "${ns[*]}")"
controllers="$(IFS=,; echo "${ctl[*]}")"
peers="1=${ctl[0]},2=${ctl[1]},3=${ctl[2]}"
for i in 1 2 3; do
  "$bin/shardmq-namesrv" --listen "${ns[$((i - 1))]}" --broker-timeout-ms 3000 \
    --scan-interval-ms 200 --controller --controller-listen "${ctl[$((i - 1))]}" \
    --controller-peers "$peers" --controller-id "$i" --controller-data-dir "$work/controller-$i" \
    --controller-broker-timeout-ms "$timeout_ms" >"$work/namesrv-$i.log" 2>&1 &
  pids+=($!)
done

start_broker() {
  local id="$1"
  # shellcheck disable=SC2086
  "$bin/shardmq-broker" ${broker_args[$id]} >>"$work/broker-$id.log" 2>&1 &
  broker_pid[$id]=$!
}
for id in 1 2 3; do
  broker_args[$id]="--namesrv $namesrvs --listen 127.0.0.1:$(free_port) --ha-listen 127.0.0.1:$(free_port) --broker-role auto --broker-id $id --controller $controllers --controller-heartbeat-ms 300 --register-interval-ms 1000 --data-dir $work/broker-$id --auto-create-topics"
  start_broker "$id"
done

status_json() { "$bin/shardmq" --json controller status --controller "$controllers" 2>/dev/null || true; }
field() { python3 -c "
import json,sys
d=json.loads(sys.argv[1] or '{}'); g=(d.get('groups') or [{}])[0]
print({'master': g.get('master_id', 0), 'set': len(g.get('sync_state_set', [])), 'epoch': g.get('epoch', 0)}[sys.argv[2]])" "$1" "$2"; }
wait_in_sync() {
  for _ in $(seq 1 300); do
    s="$(status_json)"
    if [ -n "$s" ] && [ "$(field "$s" set)" = 3 ]; then return 0; fi
    sleep 0.2
  done
  echo "the group did not get three in-sync replicas" >&2; exit 1
}
wait_in_sync
"$bin/shardmq" --namesrv "$namesrvs" send Rounds --body warmup >/dev/null

rows=()
for round in $(seq 1 "$rounds"); do
  "$bin/shardmq-perf" produce --namesrv "$namesrvs" --topic Rounds --producers 2 \
    --duration "$seconds" --verify --quiet --json >"$work/perf-$round.json" 2>"$work/perf-$round.log" &
  perf=$!
  sleep 3
  s="$(status_json)"; master="$(field "$s" master)"; epoch="$(field "$s" epoch)"
  killed=$(now_ms)
  kill -KILL "${broker_pid[$master]}"; wait "${broker_pid[$master]}" 2>/dev/null || true
  elected=""; resumed=""
  while [ -z "$elected" ] || [ -z "$resumed" ]; do
    if [ -z "$elected" ]; then
      s="$(status_json)"
      if [ -n "$s" ] && [ "$(field "$s" epoch)" -gt "$epoch" ]; then elected=$(( $(now_ms) - killed )); fi
    fi
    if [ -z "$resumed" ] && "$bin/shardmq" --namesrv "$namesrvs" --request-timeout-ms 1000 send Rounds --body "probe-$round" 2>/dev/null | grep -q SEND_OK; then
      resumed=$(( $(now_ms) - killed ))
    fi
    [ $(( $(now_ms) - killed )) -gt 60000 ] && { echo "round $round: no failover within 60 s" >&2; exit 1; }
    sleep 0.1
  done
  start_broker "$master"
  wait_in_sync
  wait "$perf" || true
  result="$(tail -n 1 "$work/perf-$round.json")"
  acked="$(python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('messages'))" "$result" 2>/dev/null || echo '?')"
  lost="$(python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('lost'))" "$result" 2>/dev/null || echo '?')"
  dups="$(python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('duplicates'))" "$result" 2>/dev/null || echo '?')"
  failed="$(python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('failed'))" "$result" 2>/dev/null || echo '?')"
  rows+=("| $round | $master | $elected | $resumed | $acked | $failed | $lost | $dups |")
  echo "round $round: killed master $master; elected after $elected ms, writes after $resumed ms; acknowledged $acked, failed calls $failed, lost $lost, duplicates $dups" >&2
done

echo "Failover rounds, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD), controller broker timeout ${timeout_ms} ms, heartbeats every 300 ms:"
echo
echo "| round | killed master | new master named (ms) | send acknowledged again (ms) | messages acknowledged | failed calls | lost | duplicates |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
