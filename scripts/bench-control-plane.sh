#!/usr/bin/env bash
# What the control plane costs the data path: many heartbeating clients against one broker.
#
# Storage shard 0 holds the client and group tables, so every heartbeat a network shard
# decodes is applied on the first storage core. This script measures, in one sitting:
#   1. the broker's threads' CPU (per core) while idle, then while --clients producers
#      heartbeat every --heartbeat-ms (shardmq-perf clients);
#   2. a produce run (1 producer x batch 1000, and 4 producers x batch 1 for latency) without
#      and with those clients.
# Usage: scripts/bench-control-plane.sh [--clients N] [--heartbeat-ms MS] [--seconds S]
#   defaults: 5000 clients, 1000 ms (30 x RocketMQ's default rate), 6 s per produce run.
# Builds release binaries; starts its own name server and broker on free loopback ports over a
# temporary data directory; prints a table. Not part of scripts/test.sh.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

clients=5000
heartbeat_ms=1000
seconds=6
while [ $# -gt 0 ]; do
  case "$1" in
    --clients) clients="$2"; shift 2 ;;
    --heartbeat-ms) heartbeat_ms="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --bins --locked -q
bin="$repo_root/target/release"
work="$(mktemp -d "${TMPDIR:-/tmp}/shardmq-cp.XXXXXX")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ns_port="$(free_port)"
broker_port="$(free_port)"
namesrv="127.0.0.1:$ns_port"
"$bin/shardmq-namesrv" --listen "$namesrv" >"$work/namesrv.log" 2>&1 &
pids+=($!)
"$bin/shardmq-broker" --namesrv "$namesrv" --listen "127.0.0.1:$broker_port" \
  --data-dir "$work/data" --auto-create-topics >"$work/broker.log" 2>&1 &
broker_pid=$!
pids+=($broker_pid)
for _ in $(seq 1 100); do grep -q "serving" "$work/broker.log" && break; sleep 0.1; done

# shellcheck source=lib/thread-cpu.sh
source "$repo_root/scripts/lib/thread-cpu.sh"

# CPU share of each thread name over $1 seconds.
cpu_share() {
  local before after
  before="$(thread_cpu "$broker_pid")"
  sleep "$1"
  after="$(thread_cpu "$broker_pid")"
  join <(echo "$before") <(echo "$after") | awk -v s="$1" '{printf "  %-16s %5.1f%%\n", $1, 100 * ($3 - $2) / s}'
}

produce() {
  "$bin/shardmq-perf" produce --namesrv "$namesrv" --topic PerfTopic --quiet --json "$@" \
    | tail -n 1
}

field() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(d.get(sys.argv[2]))" "$1" "$2"; }

produce --producers 1 --batch 1 --messages 10 >/dev/null   # creates the topic
echo "broker threads, idle:"
cpu_share 5
base_batch="$(produce --producers 1 --batch 1000 --duration "$seconds")"
base_small="$(produce --producers 4 --batch 1 --duration "$seconds")"

"$bin/shardmq-perf" clients --namesrv "$namesrv" --topic PerfTopic --clients "$clients" \
  --heartbeat-ms "$heartbeat_ms" --duration 3600 >"$work/clients.out" 2>"$work/clients.err" &
clients_pid=$!
pids+=($clients_pid)
for _ in $(seq 1 1200); do grep -q "started in" "$work/clients.err" && break; sleep 0.5; done
grep "started in" "$work/clients.err" || { cat "$work/clients.err" >&2; exit 1; }
sleep 2
echo "broker threads, $clients clients heartbeating every $heartbeat_ms ms:"
clients_cpu() { awk -v tick="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); print ($12 + $13) / tick}' "/proc/$clients_pid/stat"; }
clients_before="$(clients_cpu)"
cpu_share 5
clients_after="$(clients_cpu)"
awk -v a="$clients_before" -v b="$clients_after" 'BEGIN {printf "  %-16s %5.1f%%  (the load generator, on the same cores)\n", "shardmq-perf", 100 * (b - a) / 5}'
load_batch="$(produce --producers 1 --batch 1000 --duration "$seconds")"
load_small="$(produce --producers 4 --batch 1 --duration "$seconds")"

printf '\n%-34s %14s %14s\n' "produce" "idle" "with clients"
printf '%-34s %14s %14s\n' "1 x batch 1000, MiB/s" "$(field "$base_batch" mb_per_sec)" "$(field "$load_batch" mb_per_sec)"
printf '%-34s %14s %14s\n' "4 x batch 1, msgs/s" "$(field "$base_small" msgs_per_sec)" "$(field "$load_small" msgs_per_sec)"
printf '%-34s %14s %14s\n' "4 x batch 1, p99 us" "$(field "$base_small" p99_us)" "$(field "$load_small" p99_us)"
printf '%-34s %14s %14s\n' "4 x batch 1, p99.9 us" "$(field "$base_small" p999_us)" "$(field "$load_small" p999_us)"
