#!/usr/bin/env bash
# mypy --strict over the package as it is installed: cairn/ plus the process folders
# (broker/ is cairn.broker, and so on).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r "$repo/cairn" "$stage/cairn"
for process in broker coordinator daemon worker; do
    cp -r "$repo/$process" "$stage/cairn/$process"
done
cd "$stage"
"$repo/.venv/bin/mypy" --config-file "$repo/pyproject.toml" --cache-dir "$stage/.mypy_cache" -p cairn
