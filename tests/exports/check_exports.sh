#!/bin/sh
# Checks that libtnt.so exports exactly the functions that tnt.h declares
# with TNT_API: nothing internal (tnt__*), no test fixture, none missing.
# Usage: check_exports.sh LIBTNT_SO TNT_H
set -eu
lib=$1
header=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Defined dynamic symbols of the library (text and data), minus the ones
# the toolchain adds (_init, _fini, ...), which carry no tnt prefix.
nm -D --defined-only "$lib" | awk '{print $NF}' | grep -E '^tnt' | sort -u >"$work/exported"
# Functions declared with TNT_API, whose declarations may span lines.
grep -E '^TNT_API ' "$header" | sed -E 's/^TNT_API [^(]*[ *](tnt_[a-z0-9_]+)\(.*/\1/' |
  sort -u >"$work/declared"
if [ ! -s "$work/declared" ]; then
  echo "libtnt_exports: found no TNT_API declarations in $header" >&2
  exit 1
fi
if ! cmp -s "$work/exported" "$work/declared"; then
  echo "libtnt_exports: $lib exports other symbols than $header declares" >&2
  echo "  exported but not declared (should be hidden):" >&2
  comm -23 "$work/exported" "$work/declared" | sed 's/^/    /' >&2
  echo "  declared but not exported:" >&2
  comm -13 "$work/exported" "$work/declared" | sed 's/^/    /' >&2
  exit 1
fi
# Anything else the library exports must not be ours either.
if nm -D --defined-only "$lib" | awk '{print $NF}' | grep -E 'threads|tnt__' >/dev/null; then
  echo "libtnt_exports: internal or test-fixture symbols are exported:" >&2
  nm -D --defined-only "$lib" | awk '{print $NF}' | grep -E 'threads|tnt__' >&2
  exit 1
fi
echo "libtnt_exports: $(wc -l <"$work/exported") functions exported, all declared in tnt.h"
