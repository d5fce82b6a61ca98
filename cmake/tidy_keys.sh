#!/usr/bin/env bash
# tidy_keys.sh - a content key per translation unit, for the tidy manifest (cmake/tidy_clean.txt).
#
# Contract:
#   cmake/tidy_keys.sh SRC_DIR TIDY_BINARY < units      (units: absolute .cpp/.c paths, one a line)
#   prints "<key> <path relative to SRC_DIR>" for each unit, in input order. Needs only bash,
#   coreutils, grep and a POSIX awk (mawk is enough); no git, no compiler, no build.
#   The key is the sha256 of these lines, in this order:
#     config <sha256 of SRC_DIR/.clang-tidy> <first line of `TIDY_BINARY --version` with "version">
#     <relative path> <sha256 of its content>   for the unit, then every file it includes,
#                                                 transitively, breadth first in include order
#   An include is `#include "x"` (quoted form only), resolved the way the build resolves it: first
#   next to the including file, then from SRC_DIR (the project's only -I inside the tree).
#   `#include "bpf/NAME.skel.h"` (generated into the build directory) stands for its source,
#   bpf/NAME.bpf.c. A quoted include that resolves to nothing in the tree adds "? <name>".
#   So the key changes when the unit, any project header it reaches, .clang-tidy or the clang-tidy
#   version changes, and stays the same across machines and checkouts (relative paths only).
#
# Limits (what the key does not see; docs/contributing.md, "Static checks"):
#   - compile flags (-D, -std, build type): the same unit under another configuration keeps its key;
#   - system and third-party headers (angle-bracket includes): an upgraded library keeps keys;
#   - #if / #ifdef: every quoted include counts, even in a branch that is compiled out (this only
#     adds files to a key, so it can cause a re-check, never hide one);
#   - `#include MACRO` forms are not followed (none in the tree today).
set -uo pipefail
src="$(cd "${1:?usage: tidy_keys.sh SRC_DIR TIDY_BINARY < units}" && pwd)" || exit 2
tidy="${2:?usage: tidy_keys.sh SRC_DIR TIDY_BINARY < units}"
tmp="$(mktemp -d)" || exit 2
trap 'rm -rf "$tmp"' EXIT

# Every C/C++ file of the tree, outside build*/ folders and .git: its hash and its quoted includes.
find "$src" \( -path "$src/build*" -o -path "$src/.git" \) -prune -o -type f \
  \( -name '*.h' -o -name '*.hpp' -o -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.inc' \) \
  -print0 > "$tmp/files"
xargs -0 sha256sum < "$tmp/files" > "$tmp/hashes"
xargs -0 grep -H -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' < "$tmp/files" > "$tmp/includes"

cfg_hash="none"
[[ -f "$src/.clang-tidy" ]] && cfg_hash="$(sha256sum < "$src/.clang-tidy" | cut -d' ' -f1)"
version="$("$tidy" --version 2>/dev/null | grep -m1 -i 'version' | sed 's/^ *//')"
cat > "$tmp/units"

mkdir "$tmp/m"
awk -v src="$src" -v cfg="config $cfg_hash ${version:-unknown}" -v out="$tmp/m" '
  # Collapse "a/./b" and "a/x/../b" so that every spelling of a path is one key.
  function norm(p,   n, parts, stack, depth, i, r) {
    n = split(p, parts, "/"); depth = 0
    for (i = 1; i <= n; i++) {
      if (parts[i] == "" || parts[i] == ".") continue
      if (parts[i] == ".." && depth > 0) { depth--; continue }
      stack[++depth] = parts[i]
    }
    r = ""
    for (i = 1; i <= depth; i++) r = r "/" stack[i]
    return r
  }
  function dir(p) { sub(/\/[^\/]*$/, "", p); return p }
  function rel(p) { return substr(p, length(src) + 2) }
  FILENAME ~ /\/hashes$/ { h = $1; sub(/^[0-9a-f]+  /, ""); hash[$0] = h; next }
  FILENAME ~ /\/includes$/ {
    # "<path>:#include "name"  ..." -> an edge from path to the resolved name.
    i = index($0, ":"); f = substr($0, 1, i - 1); line = substr($0, i + 1)
    sub(/^[^"]*"/, "", line); sub(/".*$/, "", line)
    d = norm(dir(f) "/" line)
    if (!(d in hash)) d = norm(src "/" line)
    if (!(d in hash) && line ~ /\.skel\.h$/) { s = line; sub(/\.skel\.h$/, ".bpf.c", s); d = norm(src "/" s) }
    if (!(d in hash)) d = "? " line
    deps[f] = deps[f] "\034" d
    next
  }
  {
    # One unit: breadth-first over its includes, each file once.
    u = norm($0); m = out "/" FNR
    print cfg > m
    split("", seen); head = 1; tail = 1; queue[1] = u; seen[u] = 1
    while (head <= tail) {
      f = queue[head++]
      if (f ~ /^\? /) { print f > m; continue }
      print rel(f) " " ((f in hash) ? hash[f] : "missing") > m
      n = split(deps[f], ds, "\034")
      for (k = 2; k <= n; k++) if (!(ds[k] in seen)) { seen[ds[k]] = 1; queue[++tail] = ds[k] }
    }
    close(m)
    print FNR " " rel(u) > (out "/index")
  }
' "$tmp/hashes" "$tmp/includes" "$tmp/units" || exit 2

# TIDY_KEYS_DUMP=DIR keeps each unit's key material (DIR/<n>, DIR/index) for debugging.
[[ -n "${TIDY_KEYS_DUMP:-}" ]] && mkdir -p "$TIDY_KEYS_DUMP" && cp "$tmp"/m/* "$TIDY_KEYS_DUMP"/
# Hash each unit's material, then print in input order: "<key> <relative path>".
[[ -f "$tmp/m/index" ]] || exit 0
(cd "$tmp/m" && sha256sum -- $(cut -d' ' -f1 index)) | awk '
  NR == FNR { key[$2] = $1; next }
  { print key[$1], substr($0, index($0, " ") + 1) }' - "$tmp/m/index"
