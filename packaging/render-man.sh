#!/bin/sh
# Render the expanded man page sources (packaging/gen-man.py) into roff with pandoc:
#
#   packaging/render-man.sh DIR      # DIR/NAME.SECTION.md -> DIR/NAME.SECTION
#
# Run by the package builds (debian/rules, the spec's %build): pandoc is a build
# dependency of both.
set -eu
dir=$1
for source in "$dir"/*.md; do
	pandoc --standalone --from markdown --to man --output "${source%.md}" "$source"
done
