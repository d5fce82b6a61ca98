#!/usr/bin/env bash
# run_tidy.sh - clang-tidy (.clang-tidy) over the translation units of a compile database, and the
# tidy gate of CI (ctest tidy_check) that checks only the units changed since they were verified.
#
# Contract:
#   cmake/run_tidy.sh [options] BUILD_DIR [FILE_REGEX]
#   BUILD_DIR holds compile_commands.json (every configure writes it: CMAKE_EXPORT_COMPILE_COMMANDS)
#   and must have been built far enough for generated headers to exist (the BPF skeletons:
#   cmake --build BUILD_DIR --target ip_bpf_skeletons). Translation units under the source tree
#   are checked, not generated ones in build directories; FILE_REGEX (grep -E, on the absolute
#   path) narrows them. Options:
#     -j N               parallel clang-tidy processes (default 2)
#     --exclude REGEX    leave out the units whose path relative to SRC matches (grep -E)
#     --checks LIST      override the check list (clang-tidy -checks syntax, on top of .clang-tidy)
#     --changed REF      only the .cpp/.c files that differ from git REF (needs git history)
#     --stale            only the units whose key (cmake/tidy_keys.sh: the unit, the project headers
#                        it includes, .clang-tidy, the clang-tidy version) is not in the manifest
#     --gate             the CI gate: --stale, a message that says what to do on a finding, and
#                        exit 77 (ctest: skipped) when clang-tidy is not installed
#     --update-manifest  after the run, rewrite the manifest: the units of this run that came out
#                        clean, plus the entries of units not run whose key is still current
#                        (entries of units this database does not build are kept as they are)
#     --accept-findings REGEX  with --update-manifest: record units matching REGEX (grep -E on the
#                        relative path) even with findings, marked "known-findings=N" (a debt list
#                        for code someone else is changing; the gate skips them until they change)
#     --mark-unverified REGEX  with --update-manifest: units matching REGEX that this run did not
#                        record get an "unverified <path>" entry: --stale and --gate skip them and
#                        list them (for units no one has verified yet; the list should be empty)
#     --no-check         with --update-manifest: run no clang-tidy; only drop the entries that are
#                        no longer current (and mark, with --mark-unverified)
#     --manifest FILE    default SRC/cmake/tidy_clean.txt
#     --src DIR          the source tree (default: the folder above this script)
#   Prints every distinct finding, then a count by check and by file. Exit 0 with no finding,
#   1 with findings, 2 when clang-tidy could not compile a file (its errors are printed too) or on
#   bad usage, 77 under --gate without clang-tidy. Uses clang-tidy-14 (else clang-tidy), or
#   $CLANG_TIDY. Logs stay in BUILD_DIR/tidy/ (BUILD_DIR/tidy-gate/ under --gate, so the gate and a
#   hand run never share logs).
set -uo pipefail
jobs=2; checks=""; exclude=""; changed=""; stale=0; gate=0; update=0; nocheck=0; accept=""; unverified=""; manifest=""; src=""
usage="usage: run_tidy.sh [-j N] [--exclude REGEX] [--checks LIST] [--changed REF] [--stale] [--gate] [--update-manifest [--accept-findings REGEX]] [--manifest FILE] [--src DIR] BUILD_DIR [FILE_REGEX]"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -j) jobs="$2"; shift 2 ;;
    -j*) jobs="${1#-j}"; shift ;;
    --exclude) exclude="$2"; shift 2 ;;
    --exclude=*) exclude="${1#--exclude=}"; shift ;;
    --checks) checks="$2"; shift 2 ;;
    --checks=*) checks="${1#--checks=}"; shift ;;
    --changed) changed="$2"; shift 2 ;;
    --changed=*) changed="${1#--changed=}"; shift ;;
    --stale) stale=1; shift ;;
    --gate) gate=1; stale=1; shift ;;
    --update-manifest) update=1; shift ;;
    --accept-findings) accept="$2"; shift 2 ;;
    --accept-findings=*) accept="${1#--accept-findings=}"; shift ;;
    --no-check) nocheck=1; shift ;;
    --mark-unverified) unverified="$2"; shift 2 ;;
    --mark-unverified=*) unverified="${1#--mark-unverified=}"; shift ;;
    --manifest) manifest="$2"; shift 2 ;;
    --manifest=*) manifest="${1#--manifest=}"; shift ;;
    --src) src="$2"; shift 2 ;;
    --src=*) src="${1#--src=}"; shift ;;
    -*) echo "run_tidy: unknown option $1" >&2; echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
build="${1:?$usage}"
regex="${2:-.}"
here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "${src:-$here/..}" && pwd)" || exit 2
manifest="${manifest:-$src/cmake/tidy_clean.txt}"
if [[ -n "$accept" && $update -eq 0 ]]; then echo "run_tidy: --accept-findings needs --update-manifest" >&2; exit 2; fi
if [[ -n "$checks" && $update -eq 1 ]]; then echo "run_tidy: --checks changes what clean means; not with --update-manifest" >&2; exit 2; fi
build="$(cd "$build" && pwd)" || exit 2
db="$build/compile_commands.json"
[[ -f "$db" ]] || { echo "run_tidy: no $db (configure first)" >&2; exit 2; }
tidy="${CLANG_TIDY:-$(command -v clang-tidy-14 || command -v clang-tidy || true)}"
if [[ -z "$tidy" ]]; then
  if (( gate )); then
    echo "tidy_check: SKIPPED: clang-tidy is not installed (apt-get install clang-tidy; CI installs it)"
    exit 77
  fi
  echo "run_tidy: clang-tidy not found (apt-get install clang-tidy)" >&2; exit 2
fi

# Source files of the database that live in the source tree, outside any build*/ directory.
mapfile -t all < <(sed -n 's/^ *"file": "\(.*\)",\{0,1\}$/\1/p' "$db" | sort -u |
  grep "^$src/" | grep -v "^$src/build[^/]*/")
mapfile -t files < <(printf '%s\n' "${all[@]}" | grep -E -- "$regex" | sed "s#^$src/##" |
  grep -vE -- "${exclude:-^$}" | sed "s#^#$src/#")
if [[ -n "$changed" ]]; then
  mapfile -t diff < <(cd "$src" && git diff --name-only "$changed" -- '*.cpp' '*.c' | sed "s#^#$src/#")
  mapfile -t files < <(comm -12 <(printf '%s\n' "${files[@]}" | sort) <(printf '%s\n' "${diff[@]}" | sort) | grep -v '^$')
fi

# Keys of the selected units ("<key> <relative path>"), when the manifest is read or written.
# They are computed over every unit of the database (who owns a header depends on the whole set),
# then narrowed to the selection, so FILE_REGEX and --exclude never change a key.
selected_keys() {
  printf '%s\n' "${all[@]}" | bash "$here/tidy_keys.sh" "$src" "$tidy" |
    awk -v src="$src" 'NR == FNR { want[$0] = 1; next } ((src "/" $2) in want)' <(printf '%s\n' "${files[@]}") -
}
logs="$build/tidy"; (( gate )) && logs="$build/tidy-gate"
rm -rf "$logs"; mkdir -p "$logs"
keys=""
if (( stale || update )) && (( ${#files[@]} > 0 )); then
  keys="$(TIDY_KEYS_OWNERS="$logs/owners.txt" selected_keys)" || exit 2
fi
total=${#files[@]}
if (( stale )) && (( ${#files[@]} > 0 )); then
  # Keep the units whose current key has no manifest entry (new, changed, or never verified).
  # Units with an "unverified" entry are skipped and listed.
  mapfile -t files < <(printf '%s\n' "$keys" | awk -v src="$src" -v unv="$logs/unverified.txt" '
    NR == FNR { if ($0 !~ /^#/ && NF >= 2) { if ($1 == "unverified") skip[$2] = 1; else known[$1 " " $2] = 1 }; next }
    (($1 " " $2) in known) { next }
    ($2 in skip) { print $2 > unv; next }
    { print src "/" $2 }' "${manifest}" - 2>/dev/null)
  [[ -f "$manifest" ]] || mapfile -t files < <(printf '%s\n' "$keys" | awk -v src="$src" '{print src "/" $2}')
  nunv=0; [[ -f "$logs/unverified.txt" ]] && nunv=$(wc -l < "$logs/unverified.txt")
  echo "run_tidy: $(( total - ${#files[@]} - nunv )) of $total translation units unchanged since verified ($(basename "$manifest")), ${#files[@]} to check"
  if (( nunv > 0 )); then
    echo "run_tidy: NOT CHECKED: $nunv unit(s) marked unverified in the manifest (never verified; to do):"
    tr '\n' ' ' < "$logs/unverified.txt" | fold -s -w 100 | sed 's/^/  /'; echo
  fi
fi

mark_unverified() {
  # --mark-unverified: an "unverified" entry for each matching unit that this run did not record.
  [[ -n "$unverified" ]] || return 0
  printf '%s\n' "${all[@]}" | sed "s#^$src/##" | grep -E -- "$unverified" |
    awk 'FILENAME != "-" { done[$2] = 1; next } !($1 in done) { print "unverified " $1 }' "$logs/new.entries" - >> "$logs/new.entries"
}
write_manifest() {
  # $1: current keys of the selected units; $2: entries from this run; $3: units this run checked.
  # Header, then one line per unit: "<key> <path>" or "<key> <path> known-findings=N", by path.
  local tmp="$manifest.tmp.$$"
  {
    echo "# Translation units that clang-tidy (.clang-tidy) verified in exactly this state. Written by"
    echo "# cmake/run_tidy.sh --update-manifest; read by ctest tidy_check (run_tidy.sh --gate), which"
    echo "# re-checks only the units whose key is not listed here. Key: cmake/tidy_keys.sh (the unit, the"
    echo "# headers it owns, .clang-tidy, the clang-tidy version). \"known-findings=N\": recorded"
    echo "# with N findings by --accept-findings, to fix (docs/contributing.md, \"Static checks\")."
    # Old entries: kept for units this database does not build (or FILE_REGEX left out); for the
    # others, kept when still current and not re-checked by this run (this run's verdict wins).
    # "unverified" entries stay until the unit is recorded (a key sorts before "unverified").
    { [[ -f "$manifest" ]] && grep -v '^#' "$manifest" | awk -v cur="$1" -v ran="$3" '
        BEGIN { while ((getline l < cur) > 0) { split(l, f, " "); built[f[2]] = 1; key[f[2] " " f[1]] = 1 }
                while ((getline l < ran) > 0) checked[l] = 1 }
        NF >= 2 && ($1 == "unverified" || !($2 in built) || ((($2 " " $1) in key) && !($2 in checked)))'
      cat "$2"; } | sort -k2,2 -k1,1 | awk '!seen[$2]++'
  } > "$tmp" && mv "$tmp" "$manifest"
}

if (( nocheck && ! update )); then echo "run_tidy: --no-check needs --update-manifest" >&2; exit 2; fi
if (( ${#files[@]} == 0 || nocheck )); then
  echo "run_tidy: no translation unit to check"
  if (( update )); then
    printf '%s\n' "$keys" | grep -v '^$' > "$logs/current.keys"; : > "$logs/new.entries"; : > "$logs/ran.units"
    mark_unverified
    write_manifest "$logs/current.keys" "$logs/new.entries" "$logs/ran.units"
    echo "run_tidy: manifest $manifest: $(grep -vc '^#' "$manifest") entries"
  fi
  exit 0
fi

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

# With the manifest (--stale, --update-manifest), each finding is charged to the unit that owns
# the file it is in (cmake/tidy_keys.sh): a unit's log keeps the findings in its own files, and a
# finding in a header owned by another unit is left to that unit (reported when it is checked).
# Compile errors are always kept. <log>.own is what counts from here on.
for log in "$logs"/*.log; do
  if [[ -f "$logs/owners.txt" ]]; then
    awk -v src="$src/" -v me="$(basename "$log" .log)" '
      NR == FNR { owner[$2] = $1; next }
      /^\/.*:[0-9]+:[0-9]+: (warning|note|error): / {
        f = $0; sub(/:[0-9]+:[0-9]+: .*$/, "", f); if (index(f, src) == 1) f = substr(f, length(src) + 1)
        if ($0 ~ /: error: /) keep = 1
        else if ($0 ~ /: warning: /) { o = owner[f]; g = src o; gsub("/", "_", g); keep = (o == "" || g == me) }
      }
      keep { print }' "$logs/owners.txt" "$log" > "$log.own"
  else
    cp "$log" "$log.own"
  fi
done
finding_re='^/.*:[0-9]+:[0-9]+: warning: .* \[[a-zA-Z0-9.,-]+\]$'
findings="$logs/findings.txt"
cat "$logs"/*.log.own | grep -E "$finding_re" | sed "s#^$src/##" | sort -u > "$findings"
errors="$(cat "$logs"/*.log.own | grep -E '^/.*:[0-9]+:[0-9]+: error: ' | sed "s#^$src/##" | sort -u)"
n=$(wc -l < "$findings")
if (( n > 0 )); then
  if (( gate )); then
    # The finding, its source line and caret, as clang-tidy printed them (first occurrence each).
    cat "$logs"/*.log.own | awk -v src="$src/" '
      /^\/.*:[0-9]+:[0-9]+: (warning|note|error): / { keep = !seen[$0]++; if (keep) print substr($0, index($0, src) == 1 ? length(src) + 1 : 1); next }
      /warnings? generated\.$|^Suppressed [0-9]|^Use -header-filter|^Error while processing/ { keep = 0; next }
      keep { print }'
  else
    cat "$findings"
  fi
  echo
  echo "== findings by check"
  sed -E 's/.*\[([^]]+)\]$/\1/' "$findings" | sort | uniq -c | sort -rn
  echo "== findings by file"
  cut -d: -f1 "$findings" | sort | uniq -c | sort -rn
fi
cpu="$(cat "$logs"/*.time 2>/dev/null | awk '{s += $1 + $2} END {printf "%.0f", s}')"
echo "run_tidy: ${#files[@]} translation units checked, $n finding(s), ${elapsed}s wall with -j$jobs, ${cpu:-?} CPU s"

if (( update )); then
  # A unit is recorded when its log has no finding and no error and clang-tidy exited 0; with
  # --accept-findings, a matching unit with findings (but no error) is recorded with their count.
  # A unit whose key changed during the run (a file edited meanwhile) is not recorded: its entry
  # would name content that was not the content checked.
  printf '%s\n' "$keys" | grep -v '^$' > "$logs/current.keys"
  selected_keys > "$logs/after.keys"
  : > "$logs/new.entries"; : > "$logs/ran.units"; skipped=0
  while read -r key rel; do
    log="$logs/$(printf %s "$src/$rel" | tr / _).log"
    [[ -f "$log" ]] || continue
    echo "$rel" >> "$logs/ran.units"
    if ! grep -qx -- "$key $rel" "$logs/after.keys"; then
      skipped=$((skipped + 1)); echo "run_tidy: not recorded (changed during the run): $rel"; continue
    fi
    nf=$(grep -cE "$finding_re" "$log.own"); ne=$(grep -cE '^/.*:[0-9]+:[0-9]+: error: ' "$log.own")
    rc=$(cat "$log.rc" 2>/dev/null || echo 1)
    if (( nf == 0 && ne == 0 && rc == 0 )); then echo "$key $rel" >> "$logs/new.entries"
    elif (( ne == 0 )) && [[ -n "$accept" ]] && grep -qE -- "$accept" <<< "$rel"; then
      echo "$key $rel known-findings=$nf" >> "$logs/new.entries"
    else skipped=$((skipped + 1)); echo "run_tidy: not recorded (findings or errors): $rel"; fi
  done < "$logs/current.keys"
  mark_unverified
  write_manifest "$logs/current.keys" "$logs/new.entries" "$logs/ran.units"
  echo "run_tidy: manifest $manifest: $(grep -vc '^#' "$manifest") entries, $(grep -v '^#' "$manifest" | grep -c ' known-findings=') with known findings, $skipped unit(s) of this run not recorded"
fi

if [[ -n "$errors" ]]; then
  printf '%s\n' "$errors" | head -50
  echo "run_tidy: clang-tidy could not compile some files (generated headers missing? see $logs)" >&2
  exit 2
fi
if (( gate && n > 0 )); then
  cat <<EOF
tidy_check: FAILED: clang-tidy found $n finding(s) in the translation units above, which changed
since they were last verified ($manifest). Fix each one, or, where the
code is right, suppress it on its line with the reason: // NOLINT(check-name): why
(docs/contributing.md, "Static checks"). Then record the clean units in the same commit:
  cmake --build $build --target tidy_manifest   (writes cmake/tidy_clean.txt)
EOF
fi
if (( gate && n == 0 && ${#files[@]} > 0 && ! update )); then
  echo "tidy_check: passed; ${#files[@]} changed unit(s) are clean but not recorded yet (faster next time):"
  echo "  cmake --build $build --target tidy_manifest"
fi
(( n == 0 ))
