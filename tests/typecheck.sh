#!/usr/bin/env bash
# mypy --strict over the package as it is installed (cairn/ plus the process folders:
# broker/ is cairn.broker, and so on), then over each test folder as pytest imports it
# (its own folder and tests/support on the path).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r "$repo/cairn" "$stage/cairn"
for process in broker coordinator daemon worker; do
    cp -r "$repo/$process" "$stage/cairn/$process"
done
mypy() {
    "$repo/.venv/bin/mypy" --config-file "$repo/pyproject.toml" "$@"
}
(cd "$stage" && mypy --cache-dir "$stage/.mypy_cache" -p cairn)
# tests/unit/fixtures holds workflow sources the review reads, some wrong on purpose.
# The benchmarks drive the system tier's machine helpers.
for folder in unit btrfs system vm support bench; do
    path="$stage:$repo/tests/support"
    [ "$folder" = bench ] && path="$path:$repo/tests/system"
    (cd "$repo/tests/$folder" &&
        MYPYPATH="$path" mypy --cache-dir "$stage/.mypy_cache_$folder" \
            --exclude '^fixtures/' .)
done
