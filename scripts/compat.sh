#!/usr/bin/env bash
# RocketMQ client compatibility: the tests in compat/ start the real binaries (name server,
# broker) and talk to them with the real RocketMQ Rust client from crates.io,
# `rocketmq-client-rust` 1.0.0, over RocketMQ's remoting protocol: topic routes from the name
# server with JSON and with binary headers (route_*.rs), and producers and push consumers
# through the client's public APIs (messaging.rs: sync, batch, delayed, orderly and
# transactional sends, tag filters, shared queues, retries, and ShardMQ's CLI side by side).
# compat/ is a workspace of its own with its own Cargo.lock, so the main build and
# scripts/test.sh never build the client's dependency tree; this script does (several minutes
# the first time).
#
# Usage: scripts/compat.sh [test-name-filter]
#   test-name-filter  only the tests whose names contain it (default: every test)
# Builds the main workspace's binaries (debug) first; the tests take them from target/debug/
# (or from $SHARDMQ_BIN_DIR). Each test waits on conditions with deadlines and each client call
# has one, so a server that does not answer fails the test instead of hanging it.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

case "${1:-}" in
  -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

cargo build --workspace --bins --locked
cd compat
# One test at a time: each starts its own name server and broker, and the machine may be small.
# Every test binary runs (--no-fail-fast), so a failure shows for both serialize types.
exec cargo test --locked --no-fail-fast -- --test-threads 1 "$@"
