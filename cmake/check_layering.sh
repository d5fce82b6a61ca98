#!/usr/bin/env bash
# check_layering.sh - fail when a source file includes a header from a layer above its own.
#
# Contract:
#   cmake/check_layering.sh [ROOT]     check the tree at ROOT (default: the script's repository);
#                                      exit 0 when clean, 1 with one "file:line: ..." per violation
#   cmake/check_layering.sh --self-test   build small scratch trees with known violations and
#                                      check that each is caught (exit 0) - so the check can fail
# The layers, bottom up (docs/architecture.md); a folder may include its own headers and those of
# the folders listed for it, nothing else:
#   model      : -                        (no TBB, no libbpf either)
#   operators  : model
#   dsl        : model
#   engine     : model operators          (the runtime: engine.*, runtime.*, default_plans.*, top_k.h)
#   rules      : model dsl engine
#   bpf        : model
#   sinks      : model operators dsl rules engine
#   cli        : anything
# The model lives in model/ or engine/model/ once cmake/move_model.sh has run; before that it is
# the LEGACY_MODEL files in engine/. Both layouts are recognised, so the check needs no edit when
# the move lands. tests/ and bench/ may include anything and are not checked.
# Plain bash + grep + find: no build needed, runs as the ctest test layering_check.
set -uo pipefail

# engine/ files that form the model until they move (keep in sync with cmake/move_model.sh).
LEGACY_MODEL=" event.h result.h ops.h ops.cpp trace.h trace.cpp expr.h expr.cpp plan.h plan.cpp
  format.h format.cpp synth.h synth.cpp stack.h stack.cpp "

declare -A ALLOWED=(
  [model]="model"
  [operators]="model operators"
  [dsl]="model dsl"
  [engine]="model operators engine"
  [rules]="model dsl engine rules"
  [bpf]="model bpf"
  [sinks]="model operators dsl rules engine sinks"
)
# System headers the model must not pull in: it is plain C++ under every other layer.
MODEL_FORBIDDEN_SYSTEM='^(tbb/|oneapi/|bpf/|libbpf|sqlite3\.h|lmdb\.h)'

# layer_of PATH: the layer a repository-rooted path belongs to ("" when not layered).
layer_of() {
  local path="$1"
  case "$path" in
    model/*|engine/model/*) echo model ;;
    engine/*)
      local base="${path#engine/}"
      if [[ "$base" != */* && "$LEGACY_MODEL" == *" $base "* ]]; then echo model; else echo engine; fi ;;
    operators/*|dsl/*|rules/*|bpf/*|sinks/*|cli/*|prometheus/*) echo "${path%%/*}" ;;
    *) echo "" ;;
  esac
}

check_tree() {
  local root="$1" violations=0 file layer line inc target allowed lineno
  cd "$root" || { echo "check_layering: no such directory: $root" >&2; return 2; }
  while IFS= read -r file; do
    file="${file#./}"
    layer="$(layer_of "$file")"
    [[ -z "$layer" || "$layer" == cli || "$layer" == prometheus ]] && continue
    allowed="${ALLOWED[$layer]}"
    while IFS= read -r line; do
      lineno="${line%%:*}"
      inc="${line#*:}"
      if [[ "$inc" =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
        target="$(layer_of "${BASH_REMATCH[1]}")"
        [[ -z "$target" ]] && continue        # same-folder relative include or generated header
        if [[ " $allowed " != *" $target "* ]]; then
          echo "$file:$lineno: $layer includes \"${BASH_REMATCH[1]}\" ($target layer is not below $layer)"
          violations=$((violations + 1))
        fi
      elif [[ "$layer" == model && "$inc" =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\<([^\>]+)\> ]]; then
        if [[ "${BASH_REMATCH[1]}" =~ $MODEL_FORBIDDEN_SYSTEM ]]; then
          echo "$file:$lineno: model includes <${BASH_REMATCH[1]}> (the model is plain C++: no TBB, libbpf or stores)"
          violations=$((violations + 1))
        fi
      fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include' "$file")
  done < <(find model engine operators dsl rules bpf sinks -type f \
             \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.c' \) 2>/dev/null | sort)
  if (( violations > 0 )); then
    echo "check_layering: $violations upward include(s); see the layer table in cmake/check_layering.sh" >&2
    return 1
  fi
  echo "check_layering: OK"
  return 0
}

self_test() {
  local tmp failures=0
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  # expect NAME EXPECTED_RC: run the check on $tmp/NAME, compare the exit status.
  expect() {
    local rc
    (check_tree "$tmp/$1") >/dev/null 2>&1
    rc=$?
    if [[ "$rc" != "$2" ]]; then
      echo "self-test $1: expected exit $2, got $rc" >&2
      failures=$((failures + 1))
    fi
  }
  mk() { mkdir -p "$(dirname "$tmp/$1")"; printf '%s\n' "$2" > "$tmp/$1"; }

  mk clean/engine/plan.h '#include "engine/expr.h"'
  mk clean/engine/runtime.h '#include "engine/plan.h"
#include "operators/window.h"'
  mk clean/operators/window.h '#include "engine/event.h"
#include <vector>'
  mk clean/cli/main.cpp '#include "engine/runtime.h"'
  expect clean 0

  mk legacy_up/engine/plan.h '#include "engine/runtime.h"'
  expect legacy_up 1
  mk legacy_ops/engine/result.h '  #  include "operators/window.h"'
  expect legacy_ops 1
  mk legacy_tbb/engine/trace.cpp '#include <tbb/flow_graph.h>'
  expect legacy_tbb 1
  mk moved_up/model/plan.h '#include "sinks/report/text_report.h"'
  expect moved_up 1
  mk moved_runtime/engine/model/plan.h '#include "engine/engine.h"'
  expect moved_runtime 1
  mk moved_clean/model/plan.h '#include "model/expr.h"'
  mk moved_clean/engine/runtime.h '#include "model/plan.h"'
  expect moved_clean 0
  mk ops_up/operators/window.h '#include "engine/runtime.h"'
  expect ops_up 1
  mk dsl_up/dsl/sema.h '#include "operators/window.h"'
  expect dsl_up 1

  if (( failures > 0 )); then return 1; fi
  echo "check_layering self-test: OK"
}

if [[ "${1:-}" == "--self-test" ]]; then
  self_test
else
  check_tree "${1:-$(cd "$(dirname "$0")/.." && pwd)}"
fi
