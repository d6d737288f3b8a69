#!/bin/sh
# Build packaging/out/cairn_<version>_all.deb from a clean copy of the tree.
#
# The copy holds the tracked files plus untracked files that are not ignored (so a build
# works before commit), never build leftovers or the venv. debian/ comes from
# packaging/debian. Prints the path of the built package on its last line.
set -eu
# Debian's own toolchain and Python only (no pyenv/venv interpreters from the caller).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV

repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/packaging/out"

version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$repo/pyproject.toml")
deb_version=$(dpkg-parsechangelog -l "$repo/packaging/debian/changelog" -S Version)
if [ "$version" != "$deb_version" ]; then
	echo "build-deb: pyproject.toml says $version but packaging/debian/changelog says $deb_version; add a changelog entry (dch -v $version)" >&2
	exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
src="$work/cairn-$version"
mkdir "$src"

cd "$repo"
git ls-files -z --cached --others --exclude-standard -- . ':!:packaging/debian' ':!:packaging/out' \
	| xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh \
	| tar --null --files-from=- -cf - \
	| tar -xf - -C "$src"
cp -a "$repo/packaging/debian" "$src/debian"

(cd "$src" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 || {
	tail -n 40 "$work/build.log" >&2
	echo "build-deb: dpkg-buildpackage failed (last 40 lines above)" >&2
	exit 1
}

mkdir -p "$out"
deb="$out/cairn_${version}_all.deb"
cp "$work/cairn_${version}_all.deb" "$deb"
echo "$deb"
