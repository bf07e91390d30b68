#!/bin/sh
# A copy of the dgr package as committed at REV (default HEAD), beside the compiled
# modules built in this checkout, for an A/B of Python-only changes:
#   sh evidence/DGR-025/snapshot.sh DIR [REV]; then PYTHONPATH=DIR python -m dgr ...
set -e
dir=$1; rev=${2:-HEAD}
rm -rf "$dir"; mkdir -p "$dir"
git archive "$rev" dgr | tar -x -C "$dir"
cp dgr/*.so "$dir/dgr/"
