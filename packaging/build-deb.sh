#!/bin/sh
# Build cairn_<version>_all.deb (and cairn-cockpit_<version>_all.deb beside it) from a
# clean copy of the tree; print the path of cairn's last.
#
#   packaging/build-deb.sh [--version V] [--out DIR] [--source]
#
# The copy is made by packaging/copy-tree.sh (a git checkout or a release tarball alike;
# never build leftovers or the venv). debian/ comes from packaging/debian. --version
# builds the same tree as version V (a changelog entry is added in the copy only; the
# lifecycle tests use it for an upgrade). --out defaults to packaging/out. --source builds
# the source package instead (cairn_<version>.dsc and its tarball, the .dsc printed last):
# the tree with prebuilt/ (the signed capsule and the man page sources, never the signing
# key), from which dpkg-buildpackage -b makes the same .deb.
#
# Before dpkg-buildpackage, packaging/prebuild.sh signs the sealed release capsule and
# generates the man pages into prebuilt/ of the copy (see docs/packaging.md for why these
# two steps run outside the package build).
set -eu
# Debian's own toolchain and Python only (no pyenv/venv interpreters from the caller).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV

repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/packaging/out"
new_version=
source_only=
while [ $# -gt 0 ]; do
	case "$1" in
	--version) new_version=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--source) source_only=1; shift ;;
	*) echo "usage: build-deb.sh [--version V] [--out DIR] [--source]" >&2; exit 2 ;;
	esac
done

version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$repo/pyproject.toml")
deb_version=$(dpkg-parsechangelog -l "$repo/packaging/debian/changelog" -S Version)
if [ "$version" != "$deb_version" ]; then
	echo "build-deb: pyproject.toml says $version but packaging/debian/changelog says $deb_version; add a changelog entry (dch -v $version)" >&2
	exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
src="$work/cairn"
mkdir "$src"

"$repo/packaging/copy-tree.sh" "$repo" "$src"
rm -rf "$src/packaging/debian"
cp -a "$repo/packaging/debian" "$src/debian"

if [ -n "$new_version" ]; then
	sed -i "s/^version = \"$version\"/version = \"$new_version\"/" "$src/pyproject.toml"
	sed -i "s/^__version__ = \"$version\"/__version__ = \"$new_version\"/" "$src/cairn/__init__.py"
	{
		printf 'cairn (%s) unstable; urgency=medium\n\n  * Rebuild as %s.\n\n' "$new_version" "$new_version"
		printf ' -- Cairn Developers <dev@cairn.invalid>  %s\n\n' "$(date -R)"
		cat "$src/debian/changelog"
	} >"$src/debian/changelog.new"
	mv "$src/debian/changelog.new" "$src/debian/changelog"
	version=$new_version
fi

"$repo/packaging/prebuild.sh" "$src" >"$work/prebuild.log" 2>&1 || {
	cat "$work/prebuild.log" >&2
	echo "build-deb: prebuild (capsule, man pages) failed" >&2
	exit 1
}

if [ -n "$source_only" ]; then
	rm -f "$src/prebuilt/sealed-release/release-key.pem"  # never ship a signing key
	(cd "$src" && dpkg-buildpackage -us -uc -S -d) >"$work/build.log" 2>&1 || {
		tail -n 40 "$work/build.log" >&2
		echo "build-deb: dpkg-buildpackage -S failed (last 40 lines above)" >&2
		exit 1
	}
	mkdir -p "$out"
	cp "$work/cairn_${version}.dsc" "$work"/cairn_"${version}".tar.* "$out/"
	echo "$out/cairn_${version}.dsc"
	exit 0
fi

(cd "$src" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 || {
	tail -n 40 "$work/build.log" >&2
	echo "build-deb: dpkg-buildpackage failed (last 40 lines above)" >&2
	exit 1
}

mkdir -p "$out"
deb="$out/cairn_${version}_all.deb"
cp "$work/cairn_${version}_all.deb" "$deb"
cp "$work/cairn-cockpit_${version}_all.deb" "$out/"  # beside it (tests/system/console.py)
echo "$deb"
