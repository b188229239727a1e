#!/usr/bin/env bash
# Benchmark of a whole broker against the machine's own limits, measured in one sitting, with
# the end-to-end targets (issue 22) checked at the end.
#
# 1. builds the binaries (release);
# 2. measures the machine: fio O_DIRECT sequential write (1 MiB blocks, io_uring, iodepth 8,
#    1 GiB into fresh space; three runs here and three after the broker scenarios, the median
#    of the six is the reference), O_DIRECT sequential read of each file just written (the
#    drains read their backlog from the disk; the median of six again), and the latency of
#    fdatasync after 4 KiB O_DIRECT writes, and of 4 KiB O_DSYNC writes, on the disk of the
#    data directory (installing fio with apt-get when missing), and TCP loopback
#    throughput, round trip and the sender's CPU per KiB (python3; on 2 or more cores the
#    receiver pinned to core 0 and the sender to core 1, as the isolated layout places the
#    broker and the load generator);
# 3. the storage engine alone: `shardmq-perf store`, 64 producers x batch 64, async;
# 4. for each flush mode (async, sync) starts its own name server and broker on free loopback
#    ports over a fresh data directory, runs the fixed scenarios below with `shardmq-perf`
#    (1 KiB messages; every produce run is read back with --verify), with the broker's CPU
#    seconds per thread around each run; under async also fills one queue with --backlog
#    messages and drains it with a new group warm, then again after a broker restart (cold);
# 5. prints the targets table (each issue-22 row: measured, target, pass or miss) and writes the
#    results between the `bench.sh` markers of docs/performance.md (the rest of the file is
#    kept); the JSON and SVG report of every run go to --out.
#
# Usage: scripts/bench.sh [--dir PARENT] [--seconds S] [--backlog N] [--out DIR] [--doc FILE]
#                         [--layout isolated|default] [--no-doc]
#   --dir PARENT  where to make the temporary data directory (default: $TMPDIR, else /work,
#                 else the repository's target/); it must be on the disk to measure, not tmpfs
#   --seconds S   length of each timed scenario run (default 10)
#   --backlog N   messages of the one-queue backlog drained warm and cold (default 2000000:
#                 about 2 GB of 1 KiB bodies)
#   --out DIR     where the per-run reports go (default target/bench/<date>)
#   --doc FILE    the markdown file to update (default docs/performance.md)
#   --layout L    where the broker and the load generator run. `isolated` (the default on a
#                 machine of exactly 2 cores): both broker shards on core 0 (--storage-cores 0
#                 --network-cores 0) and every shardmq-perf pinned to core 1 (taskset), so
#                 the system measured and the load generator never take each other's core;
#                 `default` (the default elsewhere): the broker's default cores, shardmq-perf
#                 unpinned. An isolated run adds one row of 1 producer x batch 1000 in the
#                 default layout, for comparison.
#   --no-doc      print the generated section instead of writing it
# Env: BENCH_COMMIT names the code measured in the report (default: git HEAD, + dirty mark).
# Heavy (about 10 minutes with the defaults; needs about 3 x the backlog's bytes free); not
# part of scripts/test.sh.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

parent=""
seconds=10
backlog_messages=2000000
out_dir=""
doc="$repo_root/docs/performance.md"
write_doc=1
layout=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) parent="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --backlog) backlog_messages="$2"; shift 2 ;;
    --out) out_dir="$2"; shift 2 ;;
    --doc) doc="$2"; shift 2 ;;
    --layout) layout="$2"; shift 2 ;;
    --no-doc) write_doc=0; shift ;;
    -h|--help) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

step() { printf '==> %s\n' "$*" >&2; }

if [ -z "$layout" ]; then
  if [ "$(nproc)" -eq 2 ]; then layout=isolated; else layout=default; fi
fi
case "$layout" in
  isolated)
    if ! command -v taskset >/dev/null 2>&1; then
      echo "bench: --layout isolated needs taskset (util-linux)" >&2
      exit 2
    fi
    broker_layout=(--storage-cores 0 --network-cores 0)
    client=(taskset -c 1)
    ;;
  default)
    broker_layout=()
    client=()
    ;;
  *) echo "bench: --layout is isolated or default, not $layout" >&2; exit 2 ;;
esac

if [ -z "$parent" ]; then
  if [ -n "${TMPDIR:-}" ]; then
    parent="$TMPDIR"
  elif [ -d /work ] && [ -w /work ]; then
    parent=/work
  else
    parent="$repo_root/target"
  fi
fi
mkdir -p "$parent"
if [ "$(stat -f -c %T "$parent")" = tmpfs ]; then
  echo "bench: $parent is on tmpfs; O_DIRECT there measures memory, not a disk. Pass --dir on a real disk." >&2
  exit 2
fi
# fio's 1 GiB, the largest produce run (about 1 GB/s) and the backlog (about 1.1 KiB a message).
needed_kib=$(( (1 << 20) + seconds * 1000 * 1024 + backlog_messages * 11 / 10 ))
available_kib="$(df -Pk "$parent" | awk 'NR == 2 {print $4}')"
if [ "$available_kib" -lt "$needed_kib" ]; then
  echo "bench: $parent has $((available_kib >> 20)) GiB free, the runs need about $((needed_kib >> 20)) GiB" >&2
  exit 2
fi
work_dir="$(mktemp -d "$parent/shardmq-bench.XXXXXX")"
pids=()
cleanup() {
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$work_dir"
}
trap cleanup EXIT
# shellcheck source=lib/thread-cpu.sh
. "$repo_root/scripts/lib/thread-cpu.sh"

target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
case "$target_dir" in /*) ;; *) target_dir="$repo_root/$target_dir" ;; esac
bin="$target_dir/release"
[ -n "$out_dir" ] || out_dir="$target_dir/bench/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out_dir"
results="$out_dir/results.jsonl"
: >"$results"

step "building (release)"
cargo build --release --locked --bins >&2

if ! command -v fio >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "installing fio"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >&2
  else
    echo "bench: fio is missing; install it (e.g. apt-get install fio)" >&2
    exit 1
  fi
fi

# Appends {"kind": ..., "label": ..., "result": <json>} to the results.
record() {
  python3 -c 'import json,sys; print(json.dumps({"kind": sys.argv[1], "label": sys.argv[2], "result": json.loads(sys.stdin.read())}))' \
    "$1" "$2" >>"$results"
}

# Records the job of the last fio run ($work_dir/fio.json) under the label $1.
record_fio_job() {
  python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["jobs"][0]))' \
    "$work_dir/fio.json" | record fio "$1"
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"

# ---- machine limits ------------------------------------------------------------------------
fio_engine=io_uring
if ! fio --name=probe --rw=write --bs=4k --direct=1 --size=64k --ioengine=io_uring \
    --filename="$work_dir/fio-probe.dat" --output=/dev/null >/dev/null 2>&1; then
  fio_engine=libaio
fi
rm -f "$work_dir/fio-probe.dat"
# This virtual disk's write rate into fresh space varies by more than 1.5x within an hour, and
# by a fifth between runs a minute apart: three runs now and three after the broker scenarios,
# the median of the six is the reference (the table shows the range of each three).
fio_seqwrite() {
  local fio_run="$1"
  step "fio: sequential O_DIRECT write, 1 MiB blocks, iodepth 8, 1 GiB into fresh space ($fio_engine), run $fio_run of 6"
  fio --name=seqwrite --rw=write --bs=1m --direct=1 --size=1g --ioengine="$fio_engine" \
    --iodepth=8 --filename="$work_dir/fio.dat" --output-format=json --output="$work_dir/fio.json" >&2
  record_fio_job "seqwrite $fio_run"
  # The drains read their backlog from the disk (it is far larger than the write ring and the
  # read-ahead cache): the disk's sequential read rate bounds them. It varies as much as the
  # write rate, so it is taken after each write, of the file just written.
  step "fio: sequential O_DIRECT read, 1 MiB blocks, iodepth 8, the 1 GiB just written ($fio_engine), run $fio_run of 6"
  fio --name=seqread --rw=read --bs=1m --direct=1 --size=1g --ioengine="$fio_engine" \
    --iodepth=8 --filename="$work_dir/fio.dat" --output-format=json --output="$work_dir/fio.json" >&2
  record_fio_job "seqread $fio_run"
  rm -f "$work_dir/fio.dat"
}
for fio_run in 1 2 3; do fio_seqwrite "$fio_run"; done
step "fio: 4 KiB O_DIRECT write + fdatasync (10 s)"
fio --name=fdatasync --rw=write --bs=4k --direct=1 --fdatasync=1 --size=16m --runtime=10 \
  --ioengine=sync --filename="$work_dir/fio.dat" --output-format=json \
  --output="$work_dir/fio.json" >&2
record_fio_job fdatasync
rm -f "$work_dir/fio.dat"
step "fio: 4 KiB O_DIRECT write with O_DSYNC (10 s; the least a durable lone send costs)"
fio --name=dsync --rw=write --bs=4k --direct=1 --sync=dsync --size=16m --runtime=10 \
  --ioengine=sync --filename="$work_dir/fio.dat" --output-format=json \
  --output="$work_dir/fio.json" >&2
record_fio_job dsync
rm -f "$work_dir/fio.dat"

step "loopback: TCP throughput (2 GiB, 1 MiB writes) and 1 KiB round trips"
python3 - <<'PY' | record loopback tcp
import json, multiprocessing, os, resource, socket, time

TOTAL = 2 << 30
CHUNK = 1 << 20
ROUND_TRIPS = 20000

# As the isolated layout places them on a 2-core machine: the receiver (the broker's side) on
# core 0, the sender (the load generator's) on core 1.
PIN = (os.cpu_count() or 1) >= 2


def sink(port_queue):
    if PIN:
        os.sched_setaffinity(0, {0})
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port_queue.put(server.getsockname()[1])
    for _ in range(2):
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        first = conn.recv_into(view)
        if first == 0:
            continue
        if buffer[0] == ord("E"):  # echo mode: answer each 1 KiB message
            pending = first
            while True:
                while pending < 1024:
                    got = conn.recv_into(view[pending:1024])
                    if got == 0:
                        break
                    pending += got
                if pending < 1024:
                    break
                conn.sendall(view[:1024])
                pending = conn.recv_into(view[:1024])
                if pending == 0:
                    break
        else:
            while conn.recv_into(view):
                pass
        conn.close()

if __name__ == "__main__":
    queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=sink, args=(queue,))
    process.start()
    if PIN:
        os.sched_setaffinity(0, {1})
    port = queue.get()
    data = b"D" * CHUNK
    client = socket.create_connection(("127.0.0.1", port))
    started = time.perf_counter()
    # The sender's own CPU (the sink is another process): on loopback it also runs the
    # receiver's TCP processing, so this is what any client pays to send a KiB here.
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    sent = 0
    while sent < TOTAL:
        client.sendall(data)
        sent += CHUNK
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    client.shutdown(socket.SHUT_WR)
    client.recv(1)
    elapsed = time.perf_counter() - started
    send_cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    client.close()
    echo = socket.create_connection(("127.0.0.1", port))
    echo.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    message = b"E" * 1024
    answer = bytearray(1024)
    samples = []
    for _ in range(ROUND_TRIPS):
        begin = time.perf_counter()
        echo.sendall(message)
        got = 0
        while got < 1024:
            got += echo.recv_into(memoryview(answer)[got:])
        samples.append(time.perf_counter() - begin)
    echo.close()
    process.join()
    samples.sort()
    percentile = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))] * 1e6
    print(json.dumps({
        "mib_per_sec": TOTAL / (1 << 20) / elapsed,
        "send_cpu_us_per_kib": send_cpu * 1e6 / (TOTAL / 1024),
        "rtt_p50_us": percentile(0.50),
        "rtt_p99_us": percentile(0.99),
    }))
PY

# ---- broker scenarios ----------------------------------------------------------------------
# Waits for "<name> listening on ADDR" in FILE; prints ADDR.
listening_addr() {
  local name="$1" file="$2" pid="$3"
  for _ in $(seq 1 300); do
    local line
    line="$(grep -m1 "^$name listening on " "$file" 2>/dev/null || true)"
    if [ -n "$line" ]; then
      echo "${line##* }"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "bench: $name exited; its log:" >&2
      cat "${file%.out}.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "bench: $name did not start within 30 s" >&2
  return 1
}

namesrv_addr=""
broker_pid=""
broker_addr=""
cluster_dir=""
# Starts the broker over $cluster_dir/broker at address $1 with flush mode $2. Retention must
# not delete the backlog under a drain on a shared disk already fuller than the default
# disk_max_used_ratio (0.75).
start_broker() {
  "$bin/shardmq-broker" --namesrv "$namesrv_addr" --listen "$1" --data-dir "$cluster_dir/broker" \
    --flush "$2" --disk-max-used-ratio 0.95 ${broker_layout[@]+"${broker_layout[@]}"} >>"$cluster_dir/broker.out" 2>>"$cluster_dir/broker.log" &
  broker_pid="$!"
  pids+=("$broker_pid")
  broker_addr="$(listening_addr shardmq-broker "$cluster_dir/broker.out" "$broker_pid")"
}

start_cluster() {
  local flush="$1"
  cluster_dir="$work_dir/cluster-$1"
  mkdir -p "$cluster_dir"
  "$bin/shardmq-namesrv" --listen 127.0.0.1:0 >"$cluster_dir/namesrv.out" 2>"$cluster_dir/namesrv.log" &
  pids=("$!")
  namesrv_addr="$(listening_addr shardmq-namesrv "$cluster_dir/namesrv.out" "${pids[0]}")"
  start_broker 127.0.0.1:0 "$flush"
}

# Stops the broker gracefully and starts it again on the same data directory and address.
restart_broker() {
  kill -TERM "$broker_pid" 2>/dev/null || true
  wait "$broker_pid" 2>/dev/null || true
  pids=("${pids[0]}")
  # The next start appends to the same file: only its own line may be found.
  : >"$cluster_dir/broker.out"
  start_broker "$broker_addr" "$1"
}

stop_cluster() {
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
  rm -rf "$cluster_dir"
}

# Runs one shardmq-perf scenario; records its JSON line under LABEL, and the broker's CPU
# seconds per thread during the run (kind "<scenario>-broker-cpu").
perf() {
  local label="$1"; shift
  local scenario="$1"; shift
  local slug before after
  slug="$(echo "$label" | tr -c 'a-zA-Z0-9\n' '-' | tr -s '-')"
  step "$scenario: $label"
  before="$(thread_cpu "$broker_pid")"
  ${client[@]+"${client[@]}"} "$bin/shardmq-perf" "$scenario" --namesrv "$namesrv_addr" --size 1024 \
    --json --quiet --report "$out_dir/$slug" "$@" | tail -n 1 | record "$scenario" "$label"
  after="$(thread_cpu "$broker_pid")"
  python3 - "$before" "$after" <<'PY' | record "$scenario-broker-cpu" "$label"
import json, sys
parse = lambda text: {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.strip()}
before, after = parse(sys.argv[1]), parse(sys.argv[2])
# Threads that ended during the run (io_uring workers) are not counted.
print(json.dumps({name: round(max(0.0, after[name] - before.get(name, 0.0)), 3) for name in after}))
PY
}

json_field() {
  python3 -c 'import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]; print([r for r in rows if r["label"]==sys.argv[2] and not r["kind"].endswith("-broker-cpu")][-1]["result"][sys.argv[3]])' \
    "$results" "$1" "$2"
}

step "storage engine alone: 64 producers x batch 64, async, 2,000,000 messages"
"$bin/shardmq-perf" store --data-dir "$work_dir/store" --flush async --producers 64 --batch 64 \
  --messages 2000000 --size 1024 --cpu 0 --json | tail -n 1 | record store "store, async, 64 producers x batch 64"
rm -rf "$work_dir/store"

# Every produce scenario gets a fresh cluster (and data directory): a run at disk speed writes
# several GB, and the runs together would fill a shared disk.
step "broker with --flush async"
start_cluster async
perf "async, batch 1, 1 producer" produce --topic b1 --batch 1 --producers 1 --duration "$seconds" --verify
perf "async, batch 1, 16 producers" produce --topic b1x16 --batch 1 --producers 16 --duration "$seconds" --verify
stop_cluster; start_cluster async
perf "async, batch 32, 4 producers" produce --topic b32x4 --batch 32 --producers 4 --duration "$seconds" --verify
stop_cluster; start_cluster async
perf "async, batch 1000, 1 producer, 1 queue" produce --topic b1000 --batch 1000 --producers 1 --queues 1 --duration "$seconds" --verify
stop_cluster; start_cluster async
perf "async, batch 1000, 1 producer, 1 queue, inflight 4" produce --topic b1000i4 --batch 1000 --producers 1 --queues 1 --inflight 4 --duration "$seconds" --verify
stop_cluster; start_cluster async
if [ "$layout" = isolated ]; then
  # For comparison: the same run with the broker on its default cores and shardmq-perf
  # unpinned, all three sharing both cores.
  stop_cluster
  saved_layout=("${broker_layout[@]}"); saved_client=("${client[@]}")
  broker_layout=(); client=()
  start_cluster async
  perf "async, batch 1000, 1 producer, 1 queue, default layout" produce --topic b1000d --batch 1000 --producers 1 --queues 1 --duration "$seconds" --verify
  stop_cluster
  broker_layout=("${saved_layout[@]}"); client=("${saved_client[@]}")
  start_cluster async
fi
# The broker's CPU per message, without a read-back in the same window.
perf "async, batch 1000, 1 producer, 1 queue, no verify" produce --topic b1000cpu --batch 1000 --producers 1 --queues 1 --duration "$seconds"
stop_cluster; start_cluster async
backlog="$(python3 -c 'import sys; print(max(10000, min(2000000, int(float(sys.argv[1]) * float(sys.argv[2])))))' \
  "$(json_field "async, batch 32, 4 producers" msgs_per_sec)" "$seconds")"
perf "backlog, 1 consumer" consume --topic backlog1 --backlog "$backlog" --consumers 1
perf "backlog, 2 consumers" consume --topic backlog2 --backlog "$backlog" --consumers 2
perf "e2e max, batch 1, 16 producers" e2e --topic e2e --batch 1 --producers 16 --consumers 1 --duration "$seconds"
half_rate="$(python3 -c 'import sys; print(round(float(sys.argv[1]) / 2))' \
  "$(json_field "e2e max, batch 1, 16 producers" msgs_per_sec)")"
perf "e2e at 50% load" e2e --topic e2e-half --batch 1 --producers 16 --consumers 1 --duration "$seconds" --rate "$half_rate"
perf "long-poll wake-up, 50 msg/s" e2e --topic e2e-50 --batch 1 --producers 1 --consumers 1 --duration "$seconds" --rate 50
stop_cluster; start_cluster async
step "filling one queue with $backlog_messages messages (untimed)"
${client[@]+"${client[@]}"} "$bin/shardmq-perf" produce --namesrv "$namesrv_addr" --topic drain1 --size 1024 --batch 128 \
  --producers 4 --queues 1 --messages "$backlog_messages" --json --quiet | tail -n 1 | record fill drain1
perf "drain 1 queue, warm" consume --topic drain1 --from first --consumers 1
step "restarting the broker on the same data directory"
restart_broker async
perf "drain 1 queue, after a restart" consume --topic drain1 --from first --consumers 1
stop_cluster

step "broker with --flush sync"
start_cluster sync
perf "sync, batch 1, 1 producer" produce --topic s1 --batch 1 --producers 1 --duration "$seconds" --verify
perf "sync, batch 1, 16 producers" produce --topic s1x16 --batch 1 --producers 16 --duration "$seconds" --verify
stop_cluster; start_cluster sync
perf "sync, batch 32, 4 producers" produce --topic s32x4 --batch 32 --producers 4 --duration "$seconds" --verify
stop_cluster

for fio_run in 4 5 6; do fio_seqwrite "$fio_run"; done

# ---- the report ----------------------------------------------------------------------------
device="$(df --output=source "$work_dir" | tail -n 1)"
export BENCH_CORES="$(nproc)"
export BENCH_CPU="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
export BENCH_KERNEL="$(uname -r)"
export BENCH_DEVICE="$device"
export BENCH_FS="$(df --output=fstype "$work_dir" | tail -n 1 | tr -d ' ')"
export BENCH_FIO_ENGINE="$fio_engine"
export BENCH_LOAD="$load_before -> $(cut -d' ' -f1-3 /proc/loadavg)"
export BENCH_COMMIT="${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')}"
export BENCH_SECONDS="$seconds"
export BENCH_LAYOUT="$layout"
export BENCH_OUT="$out_dir"
section="$out_dir/section.md"
python3 - "$results" >"$section" <<'PY'
import json, os, sys, time

rows = [json.loads(line) for line in open(sys.argv[1])]
env = os.environ

def result(kind, label):
    found = [r["result"] for r in rows if r["kind"] == kind and r["label"] == label]
    return found[-1] if found else None

def seq_mib_of(n):
    return result("fio", f"seqwrite {n}")["write"]["bw"] / 1024  # fio reports KiB/s

seq_before = sorted(seq_mib_of(n) for n in (1, 2, 3))
seq_after = sorted(seq_mib_of(n) for n in (4, 5, 6))
seq_runs = sorted(seq_before + seq_after)
sync = result("fio", "fdatasync")
loop = result("loopback", "tcp")
seq_mib = (seq_runs[2] + seq_runs[3]) / 2  # the median of six
read_runs = sorted(result("fio", f"seqread {n}")["read"]["bw"] / 1024 for n in range(1, 7))
seq_read_mib = (read_runs[2] + read_runs[3]) / 2  # the median of six
sync_pct = sync["sync"]["lat_ns"]["percentile"]
fdatasync_p50 = sync_pct["50.000000"] / 1000
fdatasync_p99 = sync_pct["99.000000"] / 1000
loop_mib = loop["mib_per_sec"]

def num(value, digits=0):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"

def lost_dup(r):
    def one(v):
        return "–" if v is None else str(v)
    return f"{one(r.get('lost'))} / {one(r.get('duplicates'))}"

out = []
say = out.append
say("<!-- BEGIN bench.sh: generated by scripts/bench.sh; edit the script, not this block -->")
say("#### Results of `scripts/bench.sh`")
say("")
say(f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on commit {env['BENCH_COMMIT']}; "
    f"{env['BENCH_CORES']} cores ({env['BENCH_CPU']}), kernel {env['BENCH_KERNEL']}, data on "
    f"{env['BENCH_DEVICE']} ({env['BENCH_FS']}). "
    + ("Layout `isolated`: the broker's storage and network shards both on core 0 "
       "(`--storage-cores 0 --network-cores 0`), `shardmq-perf` (tokio) pinned to core 1 with "
       "`taskset`, so the broker and its load generator never share a core; one row below runs "
       "the default layout for comparison. "
       if env['BENCH_LAYOUT'] == 'isolated' else
       "Layout `default`: broker with its default cores (storage shard on core 0, network "
       "shard on core 1); `shardmq-perf` on the same machine (tokio, unpinned). ")
    + f"Other options default. "
    f"Each run {env['BENCH_SECONDS']} s, one run each; load average (1/5/15 min) before -> after: "
    f"{env['BENCH_LOAD']}.")
say("")
say("**Machine limits** (same sitting, same disk):")
say("")
say("| limit | value |")
say("|---|---:|")
say(f"| fio sequential write, O_DIRECT, 1 MiB blocks, iodepth 8, fresh space ({env['BENCH_FIO_ENGINE']}), median of 6: 3 before the broker runs, 3 after (ranges) | {num(seq_mib)} MiB/s (before {num(seq_before[0])}–{num(seq_before[2])}, after {num(seq_after[0])}–{num(seq_after[2])}) |")
say(f"| fio sequential read, O_DIRECT, 1 MiB blocks, iodepth 8, of each 1 GiB just written ({env['BENCH_FIO_ENGINE']}), median of 6 (range) | {num(seq_read_mib)} MiB/s ({num(read_runs[0])}–{num(read_runs[5])}) |")
say(f"| fio 4 KiB O_DIRECT write + fdatasync: fdatasync p50 / p99 | {num(fdatasync_p50)} / {num(fdatasync_p99)} µs |")
dsync_pct = result("fio", "dsync")["write"]["clat_ns"]["percentile"]
say(f"| fio 4 KiB O_DIRECT write with O_DSYNC: p50 / p99 | {num(dsync_pct['50.000000'] / 1000)} / {num(dsync_pct['99.000000'] / 1000)} µs |")
say(f"| TCP loopback, one connection, 1 MiB writes (python3) | {num(loop_mib)} MiB/s |")
say(f"| TCP loopback 1 KiB round trip p50 / p99 (python3) | {num(loop['rtt_p50_us'])} / {num(loop['rtt_p99_us'])} µs |")
if loop.get("send_cpu_us_per_kib") is not None:
    say(f"| TCP loopback, the sender's CPU per KiB sent (it runs the receiver's TCP processing too) | {loop['send_cpu_us_per_kib']:.2f} µs |")
say("")
say("**Produce** (1 KiB bodies; latency per send call; every run read back with `--verify`). "
    "MiB/s counts bodies only (a stored record adds ~125 B).")
say("")
say("| scenario | msgs/s | MiB/s | ÷ fio write | ÷ loopback | p50 µs | p99 µs | p99.9 µs | max µs | p99 ÷ fdatasync p99 | lost / dup |")
say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
labels = [r["label"] for r in rows if r["kind"] == "produce"]
for label in labels:
    r = result("produce", label)
    is_sync = r.get("broker_flush") == "sync"
    ratio = f"{r['p99_us'] / fdatasync_p99:.1f}" if is_sync else "–"
    say(f"| {label} | {num(r['msgs_per_sec'])} | {num(r['mb_per_sec'], 1)} | "
        f"{r['mb_per_sec'] / seq_mib:.2f} | {r['mb_per_sec'] / loop_mib:.3f} | "
        f"{num(r['p50_us'])} | {num(r['p99_us'])} | {num(r['p999_us'])} | {num(r['max_us'])} | "
        f"{ratio} | {lost_dup(r)} |")
say("")
best_produce = max((result("produce", l) for l in labels if result("produce", l).get("broker_flush") == "async"),
                   key=lambda r: r["msgs_per_sec"], default=None)
say("**Consume from a backlog** (`consume --backlog N`: N messages sent first, untimed, then a "
    "new group drains them; the clock includes the group's start-up). Age = receive time − born time.")
say("")
say("| scenario | messages | msgs/s | MiB/s | ÷ best async produce rate | age p50 ms | age max ms | lost / dup |")
say("|---|---:|---:|---:|---:|---:|---:|---:|")
for label in [r["label"] for r in rows if r["kind"] == "consume"]:
    r = result("consume", label)
    ratio = f"{r['msgs_per_sec'] / best_produce['msgs_per_sec']:.2f}" if best_produce else "–"
    say(f"| {label} | {num(r['messages'])} | {num(r['msgs_per_sec'])} | {num(r['mb_per_sec'], 1)} | "
        f"{ratio} | {num(r['p50_us'] / 1000, 1)} | {num(r['max_us'] / 1000, 1)} | {lost_dup(r)} |")
say("")
if best_produce:
    say(f"(best async produce rate: {num(best_produce['msgs_per_sec'])} msgs/s.)")
    say("")
say("**End to end** (producers and one consumer at once; latency = receive time − send time "
    "carried in the message: from the intended send time under `--rate`, and from the born time, "
    "just before the send call).")
say("")
say("| scenario | rate asked | msgs/s | e2e p50 µs | e2e p99 µs | e2e p99.9 µs | e2e max µs | from born p50 / p99 µs | send p99 µs | lost / dup |")
say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for label in [r["label"] for r in rows if r["kind"] == "e2e"]:
    r = result("e2e", label)
    say(f"| {label} | {num(r.get('rate'))} | {num(r['msgs_per_sec'])} | {num(r['p50_us'])} | "
        f"{num(r['p99_us'])} | {num(r['p999_us'])} | {num(r['max_us'])} | "
        f"{num(r['born_p50_us'])} / {num(r['born_p99_us'])} | {num(r['send_p99_us'])} | {lost_dup(r)} |")
say("")
store = result("store", "store, async, 64 producers x batch 64")
say("**Storage engine alone** (`shardmq-perf store`, no network; MiB/s of bodies, and of stored records).")
say("")
say("| scenario | msgs/s | MiB/s bodies | MiB/s stored | ÷ fio write (bodies) | append p50 / p99 µs |")
say("|---|---:|---:|---:|---:|---:|")
if store:
    say(f"| 64 producers x batch 64, async | {num(store['msgs_per_sec'])} | {num(store['mb_per_sec'])} | "
        f"{num(store['stored_mb_per_sec'])} | {store['mb_per_sec'] / seq_mib:.2f} | "
        f"{num(store['p50_us'])} / {num(store['p99_us'])} |")
say("")

def broker_cpu_us_per_msg(kind, label):
    r, cpu = result(kind, label), result(kind + "-broker-cpu", label)
    if not r or not cpu or not r.get("messages"):
        return None, {}
    return sum(cpu.values()) * 1e6 / r["messages"], cpu

say("**Broker CPU per message** (CPU seconds of the broker's threads during the run ÷ messages; "
    + ("`shardmq-core-0` is the one thread of both shards; in the default-layout row "
       "`shardmq-core-1` is the network shard)."
       if env['BENCH_LAYOUT'] == 'isolated' else
       "`shardmq-core-0` is the storage shard, `shardmq-core-1` the network shard)."))
say("")
say("| scenario | µs / message | per thread (s) |")
say("|---|---:|---|")
for label in [r["label"] for r in rows if r["kind"] == "produce"] + [r["label"] for r in rows if r["kind"] == "consume"]:
    kind = "produce" if result("produce", label) else "consume"
    per_msg, cpu = broker_cpu_us_per_msg(kind, label)
    if per_msg is None:
        continue
    threads = ", ".join(f"{n} {v:.2f}" for n, v in sorted(cpu.items()) if v >= 0.05)
    say(f"| {label} | {per_msg:.2f} | {threads} |")
say("")

# ---- the targets of issue 22 ----
one = result("produce", "async, batch 1000, 1 producer, 1 queue")
four = result("produce", "async, batch 1000, 1 producer, 1 queue, inflight 4")
b32 = result("produce", "async, batch 32, 4 producers")
b1 = result("produce", "async, batch 1, 1 producer")
cpu_run = result("produce", "async, batch 1000, 1 producer, 1 queue, no verify")
warm = result("consume", "drain 1 queue, warm")
cold = result("consume", "drain 1 queue, after a restart")
s1 = result("produce", "sync, batch 1, 1 producer")
targets = []
def target(name, measured, shown, goal_text, ok):
    targets.append((name, shown if measured is not None else "–", goal_text,
                    "–" if measured is None else ("pass" if ok(measured) else "**miss**")))
ratio = lambda r: None if not r else r["mb_per_sec"] / seq_mib
v = ratio(one); target("1 producer, batch 1000, 1 queue, one call in flight", v, f"{v or 0:.2f} x fio", ">= 0.5 x fio", lambda x: x >= 0.5)
v = ratio(four); target("same with --inflight 4", v, f"{v or 0:.2f} x fio", ">= 0.75 x fio", lambda x: x >= 0.75)
v = ratio(b32); target("4 producers, batch 32", v, f"{v or 0:.2f} x fio", ">= 0.3 x fio", lambda x: x >= 0.3)
v = b1 and b1["p50_us"]
target("1 producer, batch 1, async: p50", v, f"{v or 0:.0f} µs (loopback round trip p50 {loop['rtt_p50_us']:.0f} µs)", "<= 150 µs", lambda x: x <= 150)
for label, r in (("1 consumer draining 1 queue, warm", warm), ("1 consumer draining 1 queue, after a restart", cold)):
    v = ratio(r)
    vs_producer = r["mb_per_sec"] / one["mb_per_sec"] if r and one else None
    # 1.5 x the producer in record bytes (a stored 1 KiB message is about 1.12 KiB), against
    # what the disk reads: the drains read their backlog from it.
    asks = one and 1.5 * one["mb_per_sec"] * 1.12
    disk_note = (f"; 1.5 x the producer asks ~{asks:,.0f} MiB/s of records, the disk reads {seq_read_mib:,.0f}"
                 if asks and seq_read_mib else "")
    target(label, v, f"{v or 0:.2f} x fio, {vs_producer or 0:.2f} x the 1-producer rate{disk_note}",
           ">= 0.6 x fio and >= 1.5 x the 1-producer rate",
           lambda x, p=vs_producer: x >= 0.6 and (p or 0) >= 1.5)
v, _ = broker_cpu_us_per_msg("produce", "async, batch 1000, 1 producer, 1 queue, no verify")
target("broker CPU per message, 1 producer x batch 1000", v, f"{v or 0:.2f} µs", "<= 0.5 µs", lambda x: x <= 0.5)
v = None
if cpu_run and cpu_run.get("client_cpu_us_per_msg") is not None:
    v = cpu_run["client_cpu_us_per_msg"] - (cpu_run.get("build_cpu_us_per_msg") or 0)
send_floor = loop.get("send_cpu_us_per_kib")
target("client CPU per message to encode and send (process CPU less building the messages)", v,
       f"{v or 0:.2f} µs (whole process {cpu_run.get('client_cpu_us_per_msg') if cpu_run else '–'} µs; "
       f"loopback send alone {send_floor if send_floor is None else round(send_floor, 2)} µs a KiB)",
       "<= 0.3 µs", lambda x: x <= 0.3)
v = store and store["mb_per_sec"] / seq_mib
target("storage engine alone, 64 x 64", v, f"{v or 0:.2f} x fio", ">= 0.8 x fio", lambda x: x >= 0.8)
v = s1 and s1["p99_us"] / fdatasync_p99
# About the least a lone durable send can take at p99 on this machine, with no broker at all:
# fio's own 4 KiB O_DSYNC write plus a 1 KiB loopback round trip, each at its p99. The sum of
# two p99s is above the p99 of the sum, so this overstates the floor somewhat.
sync_floor = dsync_pct["99.000000"] / 1000 + loop["rtt_p99_us"]
target("sync, 1 producer, batch 1: p99", v,
       f"{v or 0:.1f} x fdatasync p99 ({s1['p99_us'] if s1 else 0:.0f} µs; fio's O_DSYNC write p99 + the loopback "
       f"round trip p99, with no broker: {sync_floor:.0f} µs = {sync_floor / fdatasync_p99:.1f} x)",
       "<= 2 x fdatasync p99", lambda x: x <= 2)
say("**Targets of issue 22** (1 KiB messages, async flush unless named; MiB/s of bodies ÷ fio above).")
say("")
say("| scenario | measured | target | |")
say("|---|---|---|---|")
for name, shown, goal_text, verdict in targets:
    say(f"| {name} | {shown} | {goal_text} | {verdict} |")
say("")
say(f"Per-run JSON and SVG reports: `{env['BENCH_OUT']}` (not committed).")
say("<!-- END bench.sh -->")
print("\n".join(out))
PY

sed -n '/^\*\*Targets of issue 22/,/^$/p;/^| scenario | measured/,/^$/p' "$section" | awk '!seen[$0]++' >&2
if [ "$write_doc" = 1 ]; then
  python3 - "$doc" "$section" <<'PY'
import re, sys
doc_path, section_path = sys.argv[1], sys.argv[2]
section = open(section_path).read().rstrip("\n")
text = open(doc_path).read()
pattern = re.compile(r"<!-- BEGIN bench.sh.*?<!-- END bench.sh -->", re.S)
if pattern.search(text):
    text = pattern.sub(lambda _: section, text, count=1)
else:
    text = text.rstrip("\n") + "\n\n" + section + "\n"
open(doc_path, "w").write(text)
PY
  step "wrote the results into $doc (reports in $out_dir)"
else
  cat "$section"
fi
