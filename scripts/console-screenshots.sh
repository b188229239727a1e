#!/usr/bin/env bash
# Writes a screenshot of each page of the web console (docs/console.md) to docs/console/*.png:
# starts a name server, a broker and the console on free loopback ports over a temporary data
# directory, fills them with a little data through the `shardmq` command line (a topic, keyed
# JSON messages, a consumer group behind by a few messages), then has headless Chromium
# (Debian's `chromium`; scripts/setup.sh installs it) render each page. Everything it started
# is stopped at the end.
#
# Usage: scripts/console-screenshots.sh [OUT_DIR]   (default: docs/console)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
out_dir="${1:-$repo_root/docs/console}"
mkdir -p "$out_dir"

command -v chromium >/dev/null 2>&1 || {
  echo "console-screenshots: chromium is not installed (scripts/setup.sh installs it)" >&2
  exit 1
}

echo "==> building"
cargo build --bins --locked
bin="$repo_root/target/debug"

work="$(mktemp -d)"
pids=()
stop() {
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap stop EXIT

# Starts a process with its stdout in $work/NAME.out and waits for its "listening on" line;
# sets $address to the address that follows it.
start() {
  local name="$1"
  shift
  "$@" >"$work/$name.out" 2>"$work/$name.log" &
  pids+=($!)
  for _ in $(seq 1 300); do
    if grep -q "listening on" "$work/$name.out" 2>/dev/null; then
      address="$(sed -n 's/.*listening on \(http:\/\/\)\{0,1\}//p' "$work/$name.out" | head -1)"
      return 0
    fi
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then
      echo "$name failed to start:" >&2
      cat "$work/$name.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "$name did not start within 30 s" >&2
  exit 1
}

start namesrv "$bin/shardmq-namesrv" --listen 127.0.0.1:0
namesrv="$address"
start broker "$bin/shardmq-broker" --namesrv "$namesrv" --listen 127.0.0.1:0 \
  --data-dir "$work/broker" --disk-max-used-ratio 0.99
broker="$address"
start console "$bin/shardmq" --namesrv "$namesrv" console --listen 127.0.0.1:0
console="$address"
echo "==> namesrv $namesrv, broker $broker, console http://$console"

cli() { "$bin/shardmq" --namesrv "$namesrv" "$@"; }
cli topic create Orders --queues 4 --broker "$broker" >/dev/null
cli topic create Payments --queues 2 --broker "$broker" >/dev/null
for n in 1 2 3 4 5 6; do
  cli send Orders --body "{\"order\":$n,\"item\":\"book\",\"price\":12.5}" --keys "order-$n" \
    --tags created --property region=eu >/dev/null
done
msg_id="$(cli --json send Orders --body '{"order":42,"item":"lamp","price":30}' --keys order-42 \
  --tags created --property region=eu | sed -n 's/.*"msg_id":"\([0-9A-F]*\)".*/\1/p')"
cli send Payments --body "payment for order 42" --keys order-42 --count 3 >/dev/null
cli consume Orders --group billing --count 4 >/dev/null 2>&1
cli consume Payments --group billing --count 3 >/dev/null 2>&1

# Traffic while the console's metrics sampler runs, so that its charts have something to
# draw by the time they are shot (the last shot).
(for _ in $(seq 1 40); do cli send Orders --body tick --count 30 >/dev/null; sleep 0.5; done) &
traffic=$!
(cli consume Orders --group metrics-demo --timeout-ms 45000 >/dev/null 2>&1) &
consumer=$!
pids+=("$traffic" "$consumer")

shot() {
  local file="$1" hash="$2" height="${3:-900}"
  timeout 120 chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1400,"$height" --virtual-time-budget=8000 \
    --screenshot="$out_dir/$file" "http://$console/$hash" 2>/dev/null >/dev/null
  echo "    $out_dir/$file"
}

echo "==> screenshots"
shot cluster.png "#/cluster" 500
shot topics.png "#/topics" 700
shot topic.png "#/topics/Orders" 900
shot groups.png "#/groups" 400
shot group.png "#/groups/billing" 800
shot messages.png "#/messages/id/$msg_id" 1000
shot dlq.png "#/dlq/billing" 400
# Some 20 s of samples while the traffic still flows.
sleep 20
shot metrics.png "#/metrics" 700
wait "$traffic" "$consumer" 2>/dev/null || true
echo "==> done"
