#!/bin/sh
# Steps both packages run before their package build, in the source copy SRC:
#   SRC/prebuilt/sealed-release/  the signed capsule (releases/<hash>, releases/current,
#                              release-key.pub; a development key in release-key.pem
#                              unless CAIRN_RELEASE_KEY names the project's key)
#   SRC/prebuilt/man/             the man page sources with the CLI's commands expanded
#                              (NAME.SECTION.md; the package builds render them with
#                              packaging/render-man.sh)
# Both import cairn (pydantic 2, click, cryptography): the interpreter is
# $CAIRN_BUILD_PYTHON, else /usr/bin/python3 when it has pydantic 2, else the
# development venv (.venv) of this checkout.
set -eu
src=$1
repo=$(cd "$(dirname "$0")/.." && pwd)

python=${CAIRN_BUILD_PYTHON:-}
if [ -z "$python" ]; then
	if /usr/bin/python3 -c 'import pydantic, click, cryptography, sys; sys.exit(pydantic.VERSION < "2")' 2>/dev/null; then
		python=/usr/bin/python3
	elif [ -x "$repo/.venv/bin/python" ]; then
		python="$repo/.venv/bin/python"
	else
		echo "prebuild: no Python with pydantic 2, click and cryptography; set CAIRN_BUILD_PYTHON" >&2
		exit 1
	fi
fi

rm -rf "$src/prebuilt/sealed-release" "$src/prebuilt/man"
if [ -n "${CAIRN_RELEASE_KEY:-}" ]; then
	"$python" "$src/sealed-release/build.py" --source "$src" --out "$src/prebuilt/sealed-release" --key "$CAIRN_RELEASE_KEY"
else
	"$python" "$src/sealed-release/build.py" --source "$src" --out "$src/prebuilt/sealed-release"
fi
"$python" "$src/packaging/gen-man.py" --out "$src/prebuilt/man"
