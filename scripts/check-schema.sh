#!/usr/bin/env bash
# Fails when schema/src/generated/ differs from what scripts/gen-schema.sh produces from
# schema/fbs/*.fbs, so that a schema change cannot land without its generated code.
#
# Usage: scripts/check-schema.sh      (runnable from any directory)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
committed="$repo_root/schema/src/generated"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

"$repo_root/scripts/gen-schema.sh" --out "$scratch/generated"

if ! diff -r -u "$committed" "$scratch/generated" >"$scratch/diff" 2>&1; then
  head -n 60 "$scratch/diff" >&2
  echo "generated schema code is stale; run scripts/gen-schema.sh" >&2
  exit 1
fi
echo "check-schema: schema/src/generated is up to date"
