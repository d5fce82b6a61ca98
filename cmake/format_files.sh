#!/usr/bin/env bash
# format_files.sh - print the files .clang-format governs, one per line, repository-relative.
#
# Contract: cmake/format_files.sh [ROOT]; every tracked C/C++ source and header (git ls-files),
# except the kernel-side BPF sources (*.bpf.c, *.bpf.h: their include order is fixed by libbpf,
# not alphabetical). Used by the format_check test and the format target, so both see one list.
# Outside a git checkout (a source tarball) it falls back to find, pruning build directories.
set -euo pipefail
ROOT="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$ROOT"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -- '*.c' '*.cc' '*.cpp' '*.h' '*.hpp'
else
  find . \( -name 'build*' -o -name '.git' -o -name node_modules \) -prune -o -type f \
    \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.h' -o -name '*.hpp' \) -print | sed 's#^\./##' | sort
fi | grep -vE '\.bpf\.(c|h)$'
