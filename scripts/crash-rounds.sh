#!/usr/bin/env bash
# Heavier kill -9 run than the test command's: N rounds (default 100) of SIGKILL under each flush
# mode, asserting that every acknowledged message survives and `verify` is clean
# (tests/tests/reliability_crash.rs with SHARDMQ_CRASH_ROUNDS=N). Not part of scripts/test.sh.
#
# Usage: scripts/crash-rounds.sh [N]
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
rounds="${1:-100}"
case "$rounds" in ''|*[!0-9]*) echo "crash-rounds: N must be a number" >&2; exit 2 ;; esac
cargo build --workspace --bins --locked
SHARDMQ_CRASH_ROUNDS="$rounds" cargo test --locked -p shardmq-tests --test reliability_crash -- --nocapture --test-threads 1
