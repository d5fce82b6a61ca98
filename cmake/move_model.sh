#!/usr/bin/env bash
# move_model.sh - move the model library (CMake target ip_model) out of engine/ into its own folder.
#
# Contract:
#   cmake/move_model.sh [DEST]      DEST = model (default, recommended) or engine/model
#   Run from anywhere inside a clean git checkout; it works on the checkout's root.
#   1. `git mv` every model file (MODEL_FILES below) from engine/ to DEST/.
#   2. Rewrites every mention of engine/<model file> in tracked text files (includes, comments,
#      docs) to DEST/<model file>. Mentions preceded by a path character (tests/engine/x.cpp)
#      are left alone.
#      The folder map rows of docs/architecture.md are renamed to match.
#   3. Moves the ip_model block of engine/CMakeLists.txt (the comment above it, add_library and
#      every line naming ip_model up to the first blank line) into DEST/CMakeLists.txt.
#      The top-level CMakeLists.txt already adds model/ when it exists; for engine/model the
#      script adds add_subdirectory(model) at the top of engine/CMakeLists.txt.
#   Refuses to run (exit 2) on a dirty tree or when DEST already holds a model file, so it can
#   never half-apply over someone's edits. It does not commit: review `git status`, build, commit.
set -euo pipefail

DEST="${1:-model}"
case "$DEST" in
  model|engine/model) ;;
  *) echo "move_model.sh: DEST must be 'model' or 'engine/model', got '$DEST'" >&2; exit 2 ;;
esac

ROOT="$(git rev-parse --show-toplevel)"
cd "$ROOT"

# The model: plain C++ (no TBB, no libbpf) below operators/, dsl/ and sinks/. top_k.h stays in
# engine/: only the runtime (engine/runtime.cpp) uses it.
MODEL_FILES=(
  event.h result.h
  ops.h ops.cpp trace.h trace.cpp expr.h expr.cpp plan.h plan.cpp
  format.h format.cpp synth.h synth.cpp stack.h stack.cpp
)

if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
  echo "move_model.sh: the working tree has uncommitted changes; commit them first" >&2
  exit 2
fi
for f in "${MODEL_FILES[@]}"; do
  if [[ ! -f "engine/$f" ]]; then echo "move_model.sh: engine/$f is missing" >&2; exit 2; fi
  if [[ -e "$DEST/$f" ]]; then echo "move_model.sh: $DEST/$f already exists" >&2; exit 2; fi
done

# 1. Move the files, keeping their history.
mkdir -p "$DEST"
for f in "${MODEL_FILES[@]}"; do
  git mv "engine/$f" "$DEST/$f"
done

# 2. Rewrite path mentions. One alternation of the escaped file names; the left boundary keeps
#    tests/engine/... and other longer paths untouched, the right boundary keeps engine/plan.hpp.
alt=""
for f in "${MODEL_FILES[@]}"; do alt+="${alt:+|}${f//./\\.}"; done
pattern="(^|[^A-Za-z0-9_./-])engine/(${alt})([^A-Za-z0-9_]|\$)"
# The layering check and this script name the legacy paths on purpose: leave them as they are.
mapfile -t files < <(git grep -lIE "$pattern" -- . ':!cmake/check_layering.sh' ':!cmake/move_model.sh' || true)
for file in "${files[@]}"; do
  # Twice: two adjacent mentions share a boundary character, the first pass only takes one.
  sed -E -i "s#${pattern}#\\1${DEST}/\\2\\3#g; s#${pattern}#\\1${DEST}/\\2\\3#g" "$file"
done

# The folder map (docs/architecture.md): the model gets its own row name, the runtime keeps engine/.
if [[ -f docs/architecture.md ]]; then
  sed -i "s#^| \`engine/\` (model files) |#| \`${DEST}/\` |#; s#^| \`engine/\` (runtime) |#| \`engine/\` |#" docs/architecture.md
fi

# The top-level CMakeLists.txt's layer comment stops saying the model is still in engine/.
sed -i '/^#  *(still in engine\/ until cmake\/move_model.sh runs; the layering_check$/{N;d}' CMakeLists.txt
if [[ "$DEST" == engine/model ]]; then
  sed -i 's#^\#   model/        (ip_model)#\#   engine/model/ (ip_model)#' CMakeLists.txt
fi

# 3. CMake: carve the ip_model block out of engine/CMakeLists.txt into DEST/CMakeLists.txt.
python3 - "$DEST" <<'PY'
import pathlib, re, sys
dest = sys.argv[1]
engine = pathlib.Path("engine/CMakeLists.txt")
lines = engine.read_text().splitlines(keepends=True)
start = next(i for i, l in enumerate(lines) if re.match(r"\s*add_library\(\s*ip_model\b", l))
# Take the comment lines directly above add_library with it.
while start > 0 and lines[start - 1].lstrip().startswith("#"):
    start -= 1
end = start
while end < len(lines) and lines[end].strip():
    end += 1
block = lines[start:end]
if not any("ip_model" in l for l in block):
    sys.exit("move_model.sh: could not find the ip_model block in engine/CMakeLists.txt")
rest = lines[:start] + lines[end:]
while rest and not rest[0].strip():
    rest.pop(0)
if dest == "engine/model":
    rest = ["add_subdirectory(model)\n", "\n"] + rest
engine.write_text("".join(rest))
pathlib.Path(dest, "CMakeLists.txt").write_text("".join(block))
PY
git add "$DEST/CMakeLists.txt" engine/CMakeLists.txt
git add -u

echo "move_model.sh: moved ${#MODEL_FILES[@]} files to $DEST/, rewrote ${#files[@]} files; review with git status, then build and commit"
