#!/bin/sh
# Copy the source tree at REPO into DEST for a package build, from a git checkout or from
# a release tarball (`git archive`) alike:
#
#   packaging/copy-tree.sh REPO DEST
#
# Left out: version control, virtual environments, caches, build output and earlier
# prebuilt/ results (the same names as .gitignore), and packaging/out.
set -eu
repo=$1
dest=$2
tar -C "$repo" -cf - \
	--exclude=./.git --exclude=./.venv --exclude=./.venv-mcp --exclude=./.venv-click --exclude=./.coverage-broker \
	--exclude=./packaging/out --exclude=./prebuilt --exclude=./tests/system/artifacts \
	--exclude=./build --exclude=./dist --exclude='*.egg-info' --exclude=__pycache__ \
	--exclude=.mypy_cache --exclude=.ruff_cache --exclude=.pytest_cache \
	. | tar -xf - -C "$dest"
