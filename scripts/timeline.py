#!/usr/bin/env python3
"""Where one call's time goes: the time between the stages of a request, from the logs of a
broker and a client run with RUST_LOG=shardmq::timeline=trace.

Usage: scripts/timeline.py LOG [LOG ...]

Each log is the stderr of a `shardmq-broker` or a client (e.g. `shardmq-perf produce`) whose
`shardmq::timeline` trace events are on. The events of all the logs are merged by their
timestamps (the processes share the machine's clock; the fmt layer prints microseconds) and
every transition from one stage to the next is counted, with its median and 90th percentile.
The stages of a send of a run of records, in order:

    encode_begins -> encode_ends        client: records encoded into the run
    -> write_begins -> write_ends       client: the frame written into the socket
    frame_begins -> frame_complete      broker network shard: first bytes to whole frame
    -> run_checked                      the run checked (CRCs, lengths, properties)
    -> append_begins -> append_ends     broker storage shard: copied, patched, journaled
    -> stored -> answered               network shard: answer encoded and written
    -> answer_read                      client: the answer read

The transitions are only a timeline when one call is in flight (one producer, --inflight 1);
with more, stages of different calls interleave and the table shows how they interleave.
Events of other requests (heartbeats, route lookups) show up as rare transitions.
"""

import re
import signal
import statistics
import sys
from datetime import datetime

EVENT = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z.*shardmq::timeline: .*?stage=\"?(?P<stage>\w+)"
)


def parse(path):
    events = []
    with open(path, errors="replace") as log:
        for line in log:
            # Colour codes, should a log have them, are dropped before matching.
            match = EVENT.match(re.sub(r"\x1b\[[0-9;]*m", "", line))
            if match:
                moment = datetime.fromisoformat(match["ts"][:26])
                events.append((moment.timestamp(), match["stage"]))
    return events


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    events = sorted(event for path in paths for event in parse(path))
    if len(events) < 2:
        print("timeline: fewer than two shardmq::timeline events in the logs "
              "(run with RUST_LOG=shardmq::timeline=trace)", file=sys.stderr)
        return 1
    gaps = {}
    for (before, stage_before), (after, stage_after) in zip(events, events[1:]):
        gaps.setdefault((stage_before, stage_after), []).append((after - before) * 1e6)
    total = sum(len(v) for v in gaps.values())
    print(f"{len(events)} events, {events[-1][0] - events[0][0]:.3f} s")
    print(f"{'from':<16} {'to':<16} {'count':>7} {'share':>6} {'median µs':>10} {'p90 µs':>10}")
    for (stage_before, stage_after), values in sorted(gaps.items(), key=lambda kv: -len(kv[1])):
        if len(values) * 200 < total:
            continue  # rare transitions: other requests, start-up
        values.sort()
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        print(f"{stage_before:<16} {stage_after:<16} {len(values):>7} "
              f"{100 * len(values) / total:>5.1f}% {statistics.median(values):>10.1f} {p90:>10.1f}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    sys.exit(main(sys.argv[1:]))
