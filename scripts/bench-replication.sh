#!/usr/bin/env bash
# What replication costs the write path, measured in one sitting (docs/performance.md,
# "Replication"):
#   - no slave, async-master + slave, sync-master + slave (all under async flush);
#   - for each: 1 producer x batch 1, and 4 producers x batch 32 (1 KiB messages): throughput
#     and send latency p50/p99 from `shardmq-perf produce`;
#   - for async-master, the replication lag while the 4 x 32 load runs at its maximum rate:
#     the master's `shardmq_replication_lag_bytes` and `_lag_ms` (storage shard 0) sampled
#     every 100 ms, reported as p50/p99/max;
#   - for each, the CPU of the master's and the slave's executor threads during the 4 x 32 run
#     (core 0 hosts the storage shard, core 1 the network shard): which shard does the
#     replication work.
# Usage: scripts/bench-replication.sh [--seconds S] [--dir PARENT]
#   --seconds S   length of each produce run (default 8)
#   --dir PARENT  where the temporary data directories go (default $TMPDIR, else /work, else
#                 target/); must be a real disk, not tmpfs
# Builds release binaries; starts its own name server, master and slave on free loopback
# ports; prints a markdown table. Heavy (about 2 minutes); not part of scripts/test.sh.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

seconds=8
parent="${TMPDIR:-}"
[ -z "$parent" ] && { [ -d /work ] && [ -w /work ] && parent=/work || parent="$repo_root/target"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --dir) parent="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --bins --locked -q
bin="$repo_root/target/release"
work="$(mktemp -d "$parent/shardmq-repl.XXXXXX")"
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq 1 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done; echo "timed out waiting for $2 in $1" >&2; exit 1; }

# Starts a name server, a master of role $1 and, unless $1 is "none", a slave.
start_group() {
  local role="$1" dir="$work/$1"
  mkdir -p "$dir"
  namesrv="127.0.0.1:$(free_port)"
  local master_port ha_port slave_port
  master_port="$(free_port)"; ha_port="$(free_port)"; slave_port="$(free_port)"
  metrics="127.0.0.1:$(free_port)"
  "$bin/shardmq-namesrv" --listen "$namesrv" >"$dir/namesrv.log" 2>&1 &
  pids+=($!)
  local master_role="$role"
  [ "$role" = none ] && master_role=async-master
  "$bin/shardmq-broker" --namesrv "$namesrv" --listen "127.0.0.1:$master_port" \
    --ha-listen "127.0.0.1:$ha_port" --broker-role "$master_role" --data-dir "$dir/master" \
    --metrics-listen "$metrics" --auto-create-topics >"$dir/master.log" 2>&1 &
  pids+=($!)
  master_pid=$!
  slave_pid=
  wait_for "$dir/master.log" serving
  if [ "$role" != none ]; then
    "$bin/shardmq-broker" --namesrv "$namesrv" --listen "127.0.0.1:$slave_port" \
      --broker-role slave --broker-id 1 --ha-master "127.0.0.1:$ha_port" \
      --data-dir "$dir/slave" >"$dir/slave.log" 2>&1 &
    pids+=($!)
    slave_pid=$!
    wait_for "$dir/slave.log" "replicating from the master"
  fi
}

produce() {
  "$bin/shardmq-perf" produce --namesrv "$namesrv" --topic Repl --quiet --json "$@" | tail -n 1
}
field() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); v=d.get(sys.argv[2]); print(round(v) if isinstance(v,float) else v)" "$1" "$2"; }

# shellcheck source=lib/thread-cpu.sh
source "$repo_root/scripts/lib/thread-cpu.sh"

# "core-0 X%, core-1 Y%" between two thread_cpu samples over $3 seconds.
cpu_delta() {
  join <(echo "$1" | grep shardmq-core) <(echo "$2" | grep shardmq-core) | awk -v s="$3" '{sub("shardmq-", "", $1); sub(/-$/, "", $1); printf "%s%s %.0f%%", sep, $1, 100 * ($3 - $2) / s; sep=", "}'
}

# Samples the master's lag metrics every 100 ms into $1 until killed.
sample_lag() {
  while true; do
    curl -s "http://$metrics/metrics" 2>/dev/null \
      | awk '/^shardmq_replication_lag_(bytes|ms)\{shard="0"\}/ {sub(/.*_lag_/, ""); print}' \
      | tr '\n' ' ' >>"$1"
    echo >>"$1"
    sleep 0.1
  done
}

rows=()
cpu_lines=()
lag_line=""
for role in none async-master sync-master; do
  start_group "$role"
  produce --producers 1 --batch 1 --messages 200 >/dev/null   # creates the topic
  sleep 3                                                     # the slave copies it
  one="$(produce --producers 1 --batch 1 --duration "$seconds")"
  lag_file="$work/$role/lag.txt"
  sample_lag "$lag_file" &
  sampler=$!
  master_before="$(thread_cpu "$master_pid")"
  slave_before=""
  [ -n "$slave_pid" ] && slave_before="$(thread_cpu "$slave_pid")"
  started=$(date +%s.%N)
  four="$(produce --producers 4 --batch 32 --duration "$seconds")"
  took="$(python3 -c "import sys; print(float(sys.argv[1]) - float(sys.argv[2]))" "$(date +%s.%N)" "$started")"
  cpu_line="master $(cpu_delta "$master_before" "$(thread_cpu "$master_pid")" "$took")"
  if [ -n "$slave_pid" ]; then
    cpu_line="$cpu_line; slave $(cpu_delta "$slave_before" "$(thread_cpu "$slave_pid")" "$took")"
  fi
  cpu_lines+=("- $role: $cpu_line")
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  label="$role + slave"
  [ "$role" = none ] && label="no slave (async-master)"
  rows+=("| $label | $(field "$one" msgs_per_sec) | $(field "$one" p50_us) | $(field "$one" p99_us) | $(field "$four" msgs_per_sec) | $(field "$four" p50_us) | $(field "$four" p99_us) | $(field "$four" failed) |")
  if [ "$role" = async-master ]; then
    lag_line="$(python3 - "$lag_file" <<'EOF'
import sys
bytes_, ms = [], []
for line in open(sys.argv[1]):
    parts = line.split()
    for p in zip(parts[::2], parts[1::2]):
        name, value = p[0], float(p[1])
        (bytes_ if name.startswith("bytes") else ms).append(value)
def q(v, f):
    v = sorted(v)
    return v[min(len(v) - 1, int(f * len(v)))] if v else float("nan")
print(f"async-master lag under 4 x 32 at full rate ({len(bytes_)} samples every 100 ms): "
      f"bytes p50 {q(bytes_, .5):.0f}, p99 {q(bytes_, .99):.0f}, max {max(bytes_, default=0):.0f}; "
      f"ms p50 {q(ms, .5):.0f}, p99 {q(ms, .99):.0f}, max {max(ms, default=0):.0f}")
EOF
)"
  fi
  stop_all
done

echo "Replication, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD), 1 KiB messages, async flush, ${seconds} s per run:"
echo
echo "| configuration | 1x1 msgs/s | 1x1 p50 µs | 1x1 p99 µs | 4x32 msgs/s | 4x32 p50 µs | 4x32 p99 µs | 4x32 failed calls |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "$lag_line"
echo
echo "Executor threads' CPU during the 4x32 run (core-0: storage shard, core-1: network shard):"
printf '%s\n' "${cpu_lines[@]}"
