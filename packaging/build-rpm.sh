#!/bin/sh
# Build cairn-<version>-1.noarch.rpm from a clean copy of the tree; print its path last.
#
#   packaging/build-rpm.sh [--out DIR] [--source]
#
# Same copy (packaging/copy-tree.sh) and prebuild (signed capsule, man pages) as
# build-deb.sh, packed as the spec's Source0. On a Fedora host this is plain rpmbuild;
# on Debian (no Fedora macro sets) it loads packaging/rpm/macros.debian-shim and skips
# dependency checks (--nodeps). See docs/packaging.md for what that verifies. --source
# builds the source RPM instead (rpmbuild -bs: the spec and that Source0).
set -eu
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV

repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/packaging/out"
stage=-bb
while [ $# -gt 0 ]; do
	case "$1" in
	--out) out=$2; shift 2 ;;
	--source) stage=-bs; shift ;;
	*) echo "usage: build-rpm.sh [--out DIR] [--source]" >&2; exit 2 ;;
	esac
done

version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$repo/pyproject.toml")
spec_version=$(sed -n 's/^Version: *//p' "$repo/packaging/rpm/cairn.spec")
if [ "$version" != "$spec_version" ]; then
	echo "build-rpm: pyproject.toml says $version but packaging/rpm/cairn.spec says $spec_version" >&2
	exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-rpm.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
src="$work/cairn-$version"
mkdir -p "$src" "$work/rpmbuild/SOURCES"

"$repo/packaging/copy-tree.sh" "$repo" "$src"
"$repo/packaging/prebuild.sh" "$src" >"$work/prebuild.log" 2>&1 || {
	cat "$work/prebuild.log" >&2
	echo "build-rpm: prebuild (capsule, man pages) failed" >&2
	exit 1
}
rm -f "$src/prebuilt/sealed-release/release-key.pem"  # never ship a signing key
tar -C "$work" -czf "$work/rpmbuild/SOURCES/cairn-$version.tar.gz" "cairn-$version"

set -- --define "_topdir $work/rpmbuild" "$stage" "$repo/packaging/rpm/cairn.spec"
if ! rpm --eval '%{?pyproject_wheel}' | grep -q .; then
	set -- --load "$repo/packaging/rpm/macros.debian-shim" --nodeps "$@"
fi
rpmbuild "$@" >"$work/build.log" 2>&1 || {
	tail -n 40 "$work/build.log" >&2
	echo "build-rpm: rpmbuild failed (last 40 lines above)" >&2
	exit 1
}

mkdir -p "$out"
rpm_file=$(find "$work/rpmbuild/RPMS" "$work/rpmbuild/SRPMS" -name "cairn-$version-*.rpm" | head -n 1)
cp "$rpm_file" "$out/"
find "$work/rpmbuild/RPMS" -name "cairn-cockpit-$version-*.rpm" -exec cp {} "$out/" \;
echo "$out/$(basename "$rpm_file")"
