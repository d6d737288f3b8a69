#!/usr/bin/env bash
# mypy --strict over cairn/ and broker/ as they are installed (broker/ is cairn.broker).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r "$repo/cairn" "$stage/cairn"
cp -r "$repo/broker" "$stage/cairn/broker"
cd "$stage"
"$repo/.venv/bin/mypy" --config-file "$repo/pyproject.toml" --cache-dir "$stage/.mypy_cache" -p cairn
