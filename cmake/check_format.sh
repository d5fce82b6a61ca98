#!/usr/bin/env bash
# check_format.sh - fail when a file differs from what .clang-format says it should be.
#
# Contract:
#   cmake/check_format.sh [--fix] [ROOT]
#   Checks (or with --fix, rewrites in place) every file cmake/format_files.sh lists, with the
#   clang-format in $CLANG_FORMAT (default: clang-format-14, else clang-format). Exit 0 when every
#   file is formatted, 1 with one "file:line:col: error: code should be clang-formatted" per
#   difference otherwise, 2 when no clang-format 14 is found: formatting differs between
#   clang-format versions, so only the version the tree was formatted with can judge it.
set -uo pipefail
fix=0
if [[ "${1:-}" == "--fix" ]]; then fix=1; shift; fi
ROOT="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$ROOT" || exit 2

cf="${CLANG_FORMAT:-}"
if [[ -z "$cf" ]]; then
  cf="$(command -v clang-format-14 || command -v clang-format || true)"
fi
if [[ -z "$cf" ]] || ! "$cf" --version | grep -q 'version 14\.'; then
  echo "check_format: needs clang-format 14 (apt-get install clang-format); found '${cf:-none}'" >&2
  exit 2
fi

mapfile -t files < <(bash "$ROOT/cmake/format_files.sh" "$ROOT")
if (( fix )); then
  printf '%s\0' "${files[@]}" | xargs -0 -n 20 -P "${JOBS:-2}" "$cf" -i --style=file
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi
# One clang-format per file, so the names of the unformatted files come back whole (parallel
# diagnostics interleave); then the first differences of a few of them, for the log.
export cf
mapfile -t bad < <(printf '%s\0' "${files[@]}" | xargs -0 -P "${JOBS:-2}" -I{} \
  sh -c '"$cf" --dry-run --Werror --style=file "$1" >/dev/null 2>&1 || echo "$1"' _ {} | sort)
if (( ${#bad[@]} > 0 )); then
  for f in "${bad[@]:0:5}"; do
    "$cf" --dry-run --style=file "$f" 2>&1 | grep -E ': (error|warning):' | head -3
  done
  printf 'not formatted: %s\n' "${bad[@]}"
  echo "check_format: ${#bad[@]} of ${#files[@]} file(s) not formatted; run cmake/check_format.sh --fix" \
       "(or cmake --build <dir> --target format)" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
