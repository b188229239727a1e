#!/usr/bin/env bash
# The whole test suite: generated-code freshness, formatting, lints, then every test of the
# workspace (unit, property, storage crash/corruption, and the integration tests that start the
# real binaries), and the RocketMQ client compatibility suite (compat/: the crates.io
# rocketmq-client-rust against the real binaries; its own workspace, built here). Heavy
# benchmarks live in scripts/bench.sh, not here.
#
# Usage: scripts/test.sh            (from any directory)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

step() { printf '\n==> %s\n' "$*"; }

step "schema: generated code is current"
scripts/check-schema.sh

step "cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path compat/Cargo.toml -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "build the binaries the integration tests start"
cargo build --workspace --bins --locked

step "cargo test"
cargo test --workspace --locked

step "RocketMQ client compatibility (compat/, against the binaries built above)"
(cd compat && cargo test --locked -- --test-threads 1)
