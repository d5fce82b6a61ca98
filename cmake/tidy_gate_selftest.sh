#!/usr/bin/env bash
# tidy_gate_selftest.sh - proves the tidy gate (run_tidy.sh --gate, ctest tidy_check) works:
# it skips verified units, catches a new finding in a changed header through the unit that owns
# it, accepts an inline NOLINT, treats a unit missing from the manifest as changed, records a
# known finding with --accept-findings, charges a header's finding to the header's owner only, and
# skips (and lists) a unit marked unverified.
#
# Contract: cmake/tidy_gate_selftest.sh   (ctest tidy_check_selftest). Builds a three-file tree in
# a temporary folder with the repository's .clang-tidy and its own compile_commands.json, so it
# needs clang-tidy but no build. Exit 0 when every step behaves, 1 with the failing step, 77
# (skipped) without clang-tidy. About a second of CPU.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tidy="${CLANG_TIDY:-$(command -v clang-tidy-14 || command -v clang-tidy || true)}"
[[ -n "$tidy" ]] || { echo "tidy_gate_selftest: SKIPPED: clang-tidy is not installed"; exit 77; }
export CLANG_TIDY="$tidy"
t="$(mktemp -d)" || exit 1
trap 'rm -rf "$t"' EXIT
src="$t/src"; build="$t/build"; manifest="$t/manifest.txt"
mkdir -p "$src/model" "$src/cli" "$build"
cp "$here/../.clang-tidy" "$src/.clang-tidy"

# model/calc.h (matched by HeaderFilterRegex), cli/a.cpp includes it, cli/b.cpp does not.
cat > "$src/model/calc.h" <<'EOF'
#pragma once
inline int twice(int x) { return 2 * x; }
EOF
printf '#include "model/calc.h"\nint a() { return twice(1); }\n' > "$src/cli/a.cpp"
printf 'int b() { return 3; }\n' > "$src/cli/b.cpp"
compdb() {
  echo "["
  sep=""
  for f in "$@"; do
    # One key a line, as CMake writes it (run_tidy.sh reads the "file" lines).
    printf '%s{\n  "directory": "%s",\n  "command": "c++ -std=c++20 -I%s -c %s/%s -o %s.o",\n  "file": "%s/%s"\n}\n' \
      "$sep" "$build" "$src" "$src" "$f" "${f//\//_}" "$src" "$f"
    sep=","
  done
  echo "]"
}
compdb cli/a.cpp cli/b.cpp > "$build/compile_commands.json"

gate() { bash "$here/run_tidy.sh" --src "$src" --manifest "$manifest" -j 2 "$@" "$build" > "$t/out" 2>&1; echo $?; }
fail() { echo "tidy_gate_selftest: FAILED: $1"; echo "--- output:"; cat "$t/out"; exit 1; }

# 1. No manifest: every unit is checked; the tree is clean.
rc=$(gate --gate); [[ $rc == 0 ]] || fail "clean tree without manifest: exit $rc, want 0"
grep -q '0 of 2 translation units unchanged' "$t/out" || fail "without a manifest both units must be checked"
# 2. Record both; the next gate checks nothing.
rc=$(gate --update-manifest); [[ $rc == 0 ]] || fail "--update-manifest: exit $rc"
[[ $(grep -vc '^#' "$manifest") == 2 ]] || fail "manifest should hold 2 entries"
rc=$(gate --gate); [[ $rc == 0 ]] || fail "unchanged tree: exit $rc, want 0"
grep -q 'no translation unit to check' "$t/out" || fail "unchanged tree: nothing should be checked"
# 3. A new finding in the header fails the gate through cli/a.cpp; cli/b.cpp stays skipped.
printf '#pragma once\ninline int twice(int x) { int* p = 0; return p ? 0 : 2 * x; }\n' > "$src/model/calc.h"
rc=$(gate --gate); [[ $rc == 1 ]] || fail "new finding in a header: exit $rc, want 1"
grep -q 'model/calc.h:2:.*\[modernize-use-nullptr\]' "$t/out" || fail "the finding is not reported"
grep -q '1 of 2 translation units unchanged' "$t/out" || fail "only the unit including the header should run"
grep -q 'tidy_check: FAILED' "$t/out" || fail "no failure message"
# 4. The same line suppressed with a reason passes.
printf '#pragma once\ninline int twice(int x) { int* p = 0; /* NOLINT(modernize-use-nullptr): test */ return p ? 0 : 2 * x; }\n' \
  > "$src/model/calc.h"
rc=$(gate --gate); [[ $rc == 0 ]] || fail "NOLINT with a reason: exit $rc, want 0"
# 5. A unit that is not in the manifest is checked even though no file of it changed.
grep -v ' cli/b.cpp' "$manifest" > "$t/m2" && mv "$t/m2" "$manifest"
printf 'int b() { int* q = 0; return q ? 1 : 3; }\n' > "$src/cli/b.cpp"
rc=$(gate --gate); [[ $rc == 1 ]] || fail "unit missing from the manifest: exit $rc, want 1"
grep -q 'cli/b.cpp:1:.*\[modernize-use-nullptr\]' "$t/out" || fail "finding in cli/b.cpp not reported"
# 6. cli/c.cpp also includes model/calc.h (owned by cli/a.cpp, its first includer). With a finding
#    in calc.h, --accept-findings records cli/a.cpp with it; cli/c.cpp is clean, since the finding
#    is charged to the owner.
printf '#pragma once\ninline int twice(int x) { int* p = 0; return p ? 0 : 2 * x; }\n' > "$src/model/calc.h"
printf 'int b() { return 3; }\n' > "$src/cli/b.cpp"
printf '#include "model/calc.h"\nint c() { return twice(2); }\n' > "$src/cli/c.cpp"
compdb cli/a.cpp cli/b.cpp cli/c.cpp > "$build/compile_commands.json"
gate --update-manifest --accept-findings 'cli/a\.cpp' > /dev/null
grep -q ' cli/a.cpp known-findings=1$' "$manifest" || fail "cli/a.cpp should be recorded with 1 known finding"
grep -q ' cli/c.cpp$' "$manifest" || fail "cli/c.cpp should be recorded clean (the calc.h finding is cli/a.cpp's)"
# 7. A change to cli/c.cpp alone re-checks only it, and passes: the header's finding is not its own.
printf '#include "model/calc.h"\nint c() { return twice(4); }\n' > "$src/cli/c.cpp"
rc=$(gate --gate); [[ $rc == 0 ]] || fail "a unit including a header with a known finding owned elsewhere: exit $rc, want 0"
grep -q '2 of 3 translation units unchanged' "$t/out" || fail "only cli/c.cpp should be re-checked"
# 8. A unit no one has verified yet, marked "unverified", is skipped by the gate and listed.
printf 'int d() { int* q = 0; return q ? 1 : 4; }\n' > "$src/cli/d.cpp"
compdb cli/a.cpp cli/b.cpp cli/c.cpp cli/d.cpp > "$build/compile_commands.json"
gate --stale --update-manifest --exclude '^cli/d\.cpp$' --mark-unverified 'cli/d\.cpp' > /dev/null
grep -qx 'unverified cli/d.cpp' "$manifest" || fail "cli/d.cpp should be marked unverified"
rc=$(gate --gate); [[ $rc == 0 ]] || fail "an unverified unit must be skipped: exit $rc, want 0"
grep -q 'NOT CHECKED: 1 unit' "$t/out" || fail "the unverified unit must be listed"
echo "tidy_gate_selftest: passed (8 steps)"
