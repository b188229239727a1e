#!/usr/bin/env bash
# Runs each cargo-fuzz target in fuzz/ for a bounded time: the wire frame decoder, the
# CommitLog record decoder and scanner, the client's record decoding, the record
# encoder/decoder round trip, the broker's check of a producer's run (SendRecordsRequest), and
# RocketMQ's remoting codec (frames, headers, request bodies). Not part of scripts/test.sh (it
# needs nightly and takes minutes).
#
# Usage: scripts/fuzz.sh [seconds-per-target] [target ...]
#   seconds-per-target  default 60
#   target              default: every target (`cargo +nightly fuzz list`)
#
# Installs cargo-fuzz when it is missing (the nightly toolchain must be installed). New inputs
# go to fuzz/corpus/<target>/ (kept between runs, not committed); the committed seeds in
# fuzz/seeds/<target>/ are read too. A crash stops the script with a non-zero status and leaves
# the input in fuzz/artifacts/<target>/; replay it with
#   (cd fuzz && cargo +nightly fuzz run <target> artifacts/<target>/<file>)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root/fuzz"

seconds="${1:-60}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "fuzz.sh: seconds per target must be a positive number, got '$seconds'" >&2
  exit 2
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz.sh: the nightly toolchain is missing: rustup toolchain install nightly" >&2
  exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

echo "==> building ${targets[*]}"
cargo +nightly fuzz build

for target in "${targets[@]}"; do
  echo "==> fuzzing $target for ${seconds} s"
  mkdir -p "corpus/$target" "seeds/$target"
  # -rss_limit_mb: a decoder must never need much memory for a small input.
  cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=1024 -print_final_stats=1
done
echo "==> fuzz.sh: no crashes in ${targets[*]} (${seconds} s each)"
