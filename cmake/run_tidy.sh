#!/usr/bin/env bash
# run_tidy.sh - clang-tidy (.clang-tidy) over the translation units of a compile database.
#
# Contract:
#   cmake/run_tidy.sh [-j N] [--checks LIST] [--changed GIT_REF] BUILD_DIR [FILE_REGEX]
#   BUILD_DIR holds compile_commands.json (every configure writes it: CMAKE_EXPORT_COMPILE_COMMANDS)
#   and must have been built far enough for generated headers to exist (the BPF skeletons:
#   cmake --build BUILD_DIR --target ip_bpf_skeletons). Translation units under the source tree
#   are checked, not generated ones in build directories; FILE_REGEX (grep -E) narrows them;
#   --changed REF keeps only the .cpp/.c files that differ from REF (git diff), for quick CI runs.
#   --checks overrides the check list (clang-tidy -checks syntax, applied on top of .clang-tidy).
#   Prints every distinct finding, then a count by check and by file. Exit 0 with no finding,
#   1 with findings, 2 when clang-tidy could not compile a file (its errors are printed too).
#   Uses clang-tidy-14 (else clang-tidy), or $CLANG_TIDY. The logs stay in BUILD_DIR/tidy/.
set -uo pipefail
jobs=2; checks=""; changed=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -j) jobs="$2"; shift 2 ;;
    -j*) jobs="${1#-j}"; shift ;;
    --checks) checks="$2"; shift 2 ;;
    --checks=*) checks="${1#--checks=}"; shift ;;
    --changed) changed="$2"; shift 2 ;;
    --changed=*) changed="${1#--changed=}"; shift ;;
    -*) echo "run_tidy: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
build="${1:?usage: run_tidy.sh [-j N] [--checks LIST] [--changed REF] BUILD_DIR [FILE_REGEX]}"
regex="${2:-.}"
src="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "$build" && pwd)" || exit 2
db="$build/compile_commands.json"
[[ -f "$db" ]] || { echo "run_tidy: no $db (configure first)" >&2; exit 2; }
tidy="${CLANG_TIDY:-$(command -v clang-tidy-14 || command -v clang-tidy || true)}"
[[ -n "$tidy" ]] || { echo "run_tidy: clang-tidy not found (apt-get install clang-tidy)" >&2; exit 2; }

# Source files of the database that live in the source tree, outside any build*/ directory.
mapfile -t files < <(sed -n 's/^ *"file": "\(.*\)",\{0,1\}$/\1/p' "$db" | sort -u |
  grep "^$src/" | grep -v "^$src/build[^/]*/" | grep -E -- "$regex")
if [[ -n "$changed" ]]; then
  mapfile -t diff < <(cd "$src" && git diff --name-only "$changed" -- '*.cpp' '*.c' | sed "s#^#$src/#")
  mapfile -t files < <(comm -12 <(printf '%s\n' "${files[@]}" | sort) <(printf '%s\n' "${diff[@]}" | sort) | grep -v '^$')
fi
if (( ${#files[@]} == 0 )); then echo "run_tidy: no translation unit to check"; exit 0; fi

logs="$build/tidy"
rm -rf "$logs"; mkdir -p "$logs"
export tidy build logs checks
start=$(date +%s)
# One log per translation unit, so parallel runs never interleave; the product's sources first,
# tests and benchmarks last. CPU seconds per unit go to <log>.time when /usr/bin/time exists.
timer=""; [[ -x /usr/bin/time ]] && timer=/usr/bin/time
export timer
{ printf '%s\n' "${files[@]}" | grep -vE "^$src/(tests|bench)/"
  printf '%s\n' "${files[@]}" | grep -E "^$src/(tests|bench)/"; } | xargs -P "$jobs" -I{} sh -c '
  log="$logs/$(printf %s "$1" | tr / _).log"
  ${timer:+$timer -f "%U %S" -o "$log.time"} "$tidy" -p "$build" --quiet --extra-arg=-Wno-unknown-warning-option \
    ${checks:+--checks="$checks"} "$1" > "$log" 2>&1
  echo $? >> "$log.rc"' _ {}
elapsed=$(( $(date +%s) - start ))

findings="$logs/findings.txt"
cat "$logs"/*.log | grep -E '^/.*:[0-9]+:[0-9]+: warning: .* \[[a-zA-Z0-9.,-]+\]$' |
  sed "s#^$src/##" | sort -u > "$findings"
errors="$(cat "$logs"/*.log | grep -E '^/.*:[0-9]+:[0-9]+: error: ' | sed "s#^$src/##" | sort -u)"
n=$(wc -l < "$findings")
cat "$findings"
echo
echo "== findings by check"
sed -E 's/.*\[([^]]+)\]$/\1/' "$findings" | sort | uniq -c | sort -rn
echo "== findings by file"
cut -d: -f1 "$findings" | sort | uniq -c | sort -rn
cpu="$(cat "$logs"/*.time 2>/dev/null | awk '{s += $1 + $2} END {printf "%.0f", s}')"
echo "run_tidy: ${#files[@]} translation units, $n finding(s), ${elapsed}s wall with -j$jobs, ${cpu:-?} CPU s"
if [[ -n "$errors" ]]; then
  printf '%s\n' "$errors" | head -50
  echo "run_tidy: clang-tidy could not compile some files (generated headers missing? see $logs)" >&2
  exit 2
fi
(( n == 0 ))
