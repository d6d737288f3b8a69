#!/bin/sh
# Render the diagrams of docs/diagrams (Graphviz sources) to SVG beside them:
#   packaging/render-diagrams.sh
set -eu
cd "$(dirname "$0")/../docs/diagrams"
for source in *.dot; do
	dot -Tsvg -o "${source%.dot}.svg" "$source"
done
