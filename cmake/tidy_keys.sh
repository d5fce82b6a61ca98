#!/usr/bin/env bash
# tidy_keys.sh - a content key per translation unit, for the tidy manifest (cmake/tidy_clean.txt).
#
# Contract:
#   cmake/tidy_keys.sh SRC_DIR TIDY_BINARY < units      (units: absolute .cpp/.c paths, one a line)
#   prints "<key> <path relative to SRC_DIR>" for each unit, in input order. Needs only bash,
#   coreutils, grep and a POSIX awk (mawk is enough); no git, no compiler, no build.
#   Every project file that some unit includes has exactly one OWNER unit:
#     - the unit with the same name next to it, if it includes the file (model/expr.h ->
#       model/expr.cpp), else
#     - of the units that include it directly, the first by path (product units before tests/ and
#       bench/), else the first by path of those that reach it through other headers.
#   An include is `#include "x"` (quoted form only), resolved the way the build resolves it: first
#   next to the including file, then from SRC_DIR (the project's only -I inside the tree).
#   `#include "bpf/NAME.skel.h"` (generated into the build directory) stands for its source,
#   bpf/NAME.bpf.c. The key of a unit is the sha256 of these lines:
#     config <sha256 of SRC_DIR/.clang-tidy> <first line of `TIDY_BINARY --version` with "version">
#     <relative path> <sha256 of its content>   for the unit, then each file it owns, by path
#   So a change to a file re-checks the unit itself (a .cpp) or its one owner (a header), where
#   clang-tidy reports findings inside that header (HeaderFilterRegex); a change to .clang-tidy or
#   to the clang-tidy version re-checks every unit. Keys are the same across machines and
#   checkouts (relative paths only).
#
# Limits (what the key does not see; docs/contributing.md, "Static checks"):
#   - a header change that causes a finding in ANOTHER unit that includes it (a changed type that
#     makes a call site narrow, a macro or template used differently there): only the owner is
#     re-checked. The whole-tree run (target tidy) finds these; run it after changing a header
#     that many units include, and record the result (run_tidy.sh --update-manifest BUILD).
#   - compile flags (-D, -std, build type) and system or third-party headers are not in the key;
#   - `#include MACRO` forms are not followed (none in the tree today).
# TIDY_KEYS_DUMP=DIR keeps each unit's key material there (DIR/index maps numbers to units).
# TIDY_KEYS_OWNERS=FILE writes "<owner unit> <file>" for every unit (owning itself) and owned file,
# relative paths: run_tidy.sh charges each finding to the owner of the file it is in.
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
awk -v src="$src" -v cfg="config $cfg_hash ${version:-unknown}" -v out="$tmp/m" -v owners="${TIDY_KEYS_OWNERS:-}" '
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
  function stem(p) { sub(/\.[^.\/]*$/, "", p); return p }
  # Ordering of candidate owners: product units before tests/ and bench/, then by path.
  function rank(u,   r) { r = rel(u); return (r ~ /^(tests|bench)\//) ? "1" r : "0" r }
  function better(a, b) { return b == "" || rank(a) < rank(b) }
  FILENAME ~ /\/hashes$/ { h = $1; sub(/^[0-9a-f]+  /, ""); hash[$0] = h; next }
  FILENAME ~ /\/includes$/ {
    # "<path>:#include "name"  ..." -> an edge from path to the resolved name.
    i = index($0, ":"); f = substr($0, 1, i - 1); line = substr($0, i + 1)
    sub(/^[^"]*"/, "", line); sub(/".*$/, "", line)
    d = norm(dir(f) "/" line)
    if (!(d in hash)) d = norm(src "/" line)
    if (!(d in hash) && line ~ /\.skel\.h$/) { s = line; sub(/\.skel\.h$/, ".bpf.c", s); d = norm(src "/" s) }
    if (d in hash) deps[f] = deps[f] "\034" d
    next
  }
  { nu++; unit[nu] = norm($0); isunit[unit[nu]] = 1; if (!(stem(unit[nu]) in unitstem)) unitstem[stem(unit[nu])] = unit[nu] }
  END {
    # Owners: a same-named unit, else the best unit including the file directly, else transitively.
    for (k = 1; k <= nu; k++) {
      u = unit[k]
      n = split(deps[u], ds, "\034")
      for (j = 2; j <= n; j++) if (better(u, direct[ds[j]])) direct[ds[j]] = u
      split("", seen); head = 1; tail = 1; queue[1] = u; seen[u] = 1
      while (head <= tail) {
        f = queue[head++]
        if (f != u) { reached[u, f] = 1; if (better(u, reach[f])) reach[f] = u }
        n = split(deps[f], ds, "\034")
        for (j = 2; j <= n; j++) if (!(ds[j] in seen)) { seen[ds[j]] = 1; queue[++tail] = ds[j] }
      }
    }
    for (f in reach) {
      if (f in isunit) continue
      o = ((stem(f) in unitstem) && ((unitstem[stem(f)], f) in reached)) ? unitstem[stem(f)] : ((f in direct) ? direct[f] : reach[f])
      owned[o] = owned[o] "\034" f
    }
    for (k = 1; k <= nu; k++) {
      u = unit[k]; m = out "/" k
      print cfg > m
      print rel(u) " " ((u in hash) ? hash[u] : "missing") > m
      # The owned files, sorted by path (insertion sort: a unit owns a handful).
      n = split(owned[u], ds, "\034"); c = 0
      for (j = 2; j <= n; j++) {
        x = ds[j]; i = ++c
        while (i > 1 && sorted[i - 1] > x) { sorted[i] = sorted[i - 1]; i-- }
        sorted[i] = x
      }
      for (j = 1; j <= c; j++) print rel(sorted[j]) " " hash[sorted[j]] > m
      close(m)
      if (owners != "") {
        print rel(u) " " rel(u) > owners
        for (j = 1; j <= c; j++) print rel(u) " " rel(sorted[j]) > owners
      }
      print k " " rel(u) > (out "/index")
    }
  }
' "$tmp/hashes" "$tmp/includes" "$tmp/units" || exit 2

# TIDY_KEYS_DUMP=DIR keeps each unit's key material (DIR/<n>, DIR/index) for debugging.
[[ -n "${TIDY_KEYS_DUMP:-}" ]] && mkdir -p "$TIDY_KEYS_DUMP" && cp "$tmp"/m/* "$TIDY_KEYS_DUMP"/
# Hash each unit's material, then print in input order: "<key> <relative path>".
[[ -f "$tmp/m/index" ]] || exit 0
(cd "$tmp/m" && sha256sum -- $(cut -d' ' -f1 index)) | awk '
  NR == FNR { key[$2] = $1; next }
  { print key[$1], substr($0, index($0, " ") + 1) }' - "$tmp/m/index"
