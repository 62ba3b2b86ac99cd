#!/usr/bin/env bash
# A document's verbatim copies of source files stay equal to the files. In the
# document, a line `<!-- verbatim: PATH -->` (PATH from the repository root) is
# followed by a fenced code block holding the whole file; every such block must
# equal its file byte for byte, and the document must have at least one.
# Usage: check_doc_quotes.sh SOURCE_DIR DOC...
set -euo pipefail
src=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for doc in "$@"; do
  paths=$(sed -n 's/^<!-- verbatim: \(.*\) -->$/\1/p' "$src/$doc")
  [ -n "$paths" ] || { echo "FAIL: $doc has no '<!-- verbatim: PATH -->' block" >&2; status=1; continue; }
  for path in $paths; do
    # The lines between the fence after the marker and the closing fence.
    awk -v marker="<!-- verbatim: $path -->" '
      $0 == marker { state = 1; next }
      state == 1 && /^```/ { state = 2; next }
      state == 2 && /^```$/ { exit }
      state == 2 { print }
    ' "$src/$doc" > "$work/quoted"
    if ! diff -u "$src/$path" "$work/quoted" > "$work/diff"; then
      echo "FAIL: $doc quotes $path, but the copy differs from the file (copy the file into the document):" >&2
      cat "$work/diff" >&2
      status=1
    else
      echo "$doc: $path quoted verbatim"
    fi
  done
done
exit $status
