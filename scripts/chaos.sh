#!/usr/bin/env bash
# The long fault-injection run (docs/replication.md, "Fault injection"): the test
# `tests/tests/chaos.rs` with many rounds, against release binaries. Each round injects one
# fault at a random moment under continuous produce and consume (kill -9 of the master or a
# slave, SIGSTOP of the master or of the controller leader past the heartbeat timeout, a slave
# or the master restarted after a simulated power loss, a crash-looping master, the master cut
# off from the controllers, the name servers or its slaves, its messages to the controllers
# held or slowed, its slaves' acknowledgements held, one slave cut off from the master or the
# controllers, both slaves stopped while the master restarts), then the same number of rounds on a
# manual sync-master pair (kill -9, SIGSTOP or a power loss of either, the replication link
# cut or held one way); the checker
# then reports acknowledged messages lost, unconsumed, skipped and diverged (each must be 0),
# duplicates, and how long writes took to come back after each kill -9 of the master.
#
# Usage: scripts/chaos.sh [--rounds N] [--seed S]
#   --rounds N  rounds of one run (default 200)
#   --seed S    replay a run: the seed a run printed (default: a new one)
# Prints the tests' own reports (each seed first, `chaos round ...` per round, a summary line
# last). Heavy (about 7 s a round); not part of scripts/test.sh, which runs a short run.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

rounds=200
seed=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "chaos: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$rounds" in ''|*[!0-9]*) echo "chaos: --rounds takes a number" >&2; exit 2 ;; esac

cargo build --release --workspace --bins --locked -q
export SHARDMQ_CHAOS_ROUNDS="$rounds"
if [ -n "$seed" ]; then export SHARDMQ_TEST_SEED="$seed"; fi
# The test looks for the binaries beside its own executable: a release test uses release ones.
exec cargo test --release --locked -q -p shardmq-tests --test chaos -- --nocapture --test-threads 1
