#!/usr/bin/env bash
# check_layering.sh - fail when a source file includes a header from a layer it may not use.
#
# The layer table (docs/architecture.md copies it). A folder may include its own headers and those
# of the folders listed for it, nothing else:
#
#   layer          may include
#   model          -                                   (plain C++: no TBB, libbpf, SQLite or LMDB)
#   operators      model
#   dsl            model
#   engine         model operators
#   rules          model dsl engine
#   bpf            model
#   sinks/store    model
#   sinks/report   model
#   sinks/metrics  model
#   sinks/fleet    model sinks/store
#   sinks/mcp      model operators dsl rules engine sinks/store sinks/fleet
#   cli            anything (not checked)
#
# sinks/ holds only these sub-folders: a file directly in sinks/, or a sub-folder without a row,
# is a violation. tests/ and bench/ may include anything and are not checked.
#
# Contract:
#   cmake/check_layering.sh [ROOT]     check the tree at ROOT (default: the script's repository);
#                                      exit 0 when clean, 1 with one "file:line: ..." per violation
#   cmake/check_layering.sh --self-test   build small scratch trees with known violations and
#                                      check that each is caught (exit 0) - so the check can fail
# Plain bash + grep + find: no build needed, runs as the ctest test layering_check.
set -uo pipefail

declare -A ALLOWED=(
  [model]="model"
  [operators]="model operators"
  [dsl]="model dsl"
  [engine]="model operators engine"
  [rules]="model dsl engine rules"
  [bpf]="model bpf"
  [sinks/store]="model sinks/store"
  [sinks/report]="model sinks/report"
  [sinks/metrics]="model sinks/metrics"
  [sinks/fleet]="model sinks/store sinks/fleet"
  [sinks/mcp]="model operators dsl rules engine sinks/store sinks/fleet sinks/mcp"
)
# System headers the model must not pull in: it is plain C++ under every other layer.
MODEL_FORBIDDEN_SYSTEM='^(tbb/|oneapi/|bpf/|libbpf|sqlite3\.h|lmdb\.h)'

# layer_of PATH: the layer a repository-rooted path belongs to ("" when not layered). A file
# directly in sinks/ is in the layer "sinks", which has no row.
layer_of() {
  local path="$1" rest
  case "$path" in
    sinks/*/*)
      rest="${path#sinks/}"
      echo "sinks/${rest%%/*}" ;;
    model/*|engine/*|operators/*|dsl/*|rules/*|bpf/*|sinks/*|cli/*|prometheus/*) echo "${path%%/*}" ;;
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
    if [[ -z "${ALLOWED[$layer]+x}" ]]; then
      echo "$file: $layer has no row in the layer table (sinks/ holds only store, report, metrics, fleet, mcp)"
      violations=$((violations + 1))
      continue
    fi
    allowed="${ALLOWED[$layer]}"
    while IFS= read -r line; do
      lineno="${line%%:*}"
      inc="${line#*:}"
      if [[ "$inc" =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
        target="$(layer_of "${BASH_REMATCH[1]}")"
        [[ -z "$target" ]] && continue        # same-folder relative include or generated header
        if [[ " $allowed " != *" $target "* ]]; then
          echo "$file:$lineno: $layer includes \"${BASH_REMATCH[1]}\" ($target is not in $layer's row of the layer table)"
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
    echo "check_layering: $violations include(s) against the layer table in cmake/check_layering.sh" >&2
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

  # A tree that follows every row.
  mk clean/model/plan.h '#include "model/expr.h"'
  mk clean/engine/runtime.h '#include "model/plan.h"
#include "operators/window.h"'
  mk clean/operators/window.h '#include "model/event.h"
#include <vector>'
  mk clean/sinks/store/lmdb_store.cpp '#include "sinks/store/lmdb_store.h"
#include "model/result_json.h"
#include <lmdb.h>'
  mk clean/sinks/report/text_report.cpp '#include "sinks/report/text_report.h"
#include "model/result_json.h"'
  mk clean/sinks/metrics/prometheus_exporter.cpp '#include "model/plan.h"'
  mk clean/sinks/fleet/merge.cpp '#include "sinks/fleet/clock_align.h"
#include "sinks/store/sqlite_store.h"'
  mk clean/sinks/mcp/trace_tools.cpp '#include "sinks/mcp/server.h"
#include "sinks/store/sqlite_store.h"
#include "engine/engine.h"
#include "operators/chain_annotate.h"
#include "dsl/compiler.h"
#include "rules/pack.h"'
  mk clean/sinks/CMakeLists.txt 'add_subdirectory(store)'
  mk clean/cli/main.cpp '#include "engine/runtime.h"
#include "sinks/mcp/server.h"'
  expect clean 0

  # The model, the operators, dsl.
  mk model_up/model/plan.h '#include "engine/runtime.h"'
  expect model_up 1
  mk model_ops/model/result.h '  #  include "operators/window.h"'
  expect model_ops 1
  mk model_tbb/model/trace.cpp '#include <tbb/flow_graph.h>'
  expect model_tbb 1
  mk model_sinks/model/plan.h '#include "sinks/report/text_report.h"'
  expect model_sinks 1
  mk ops_up/operators/window.h '#include "engine/runtime.h"'
  expect ops_up 1
  mk dsl_up/dsl/sema.h '#include "operators/window.h"'
  expect dsl_up 1
  # One planted violation per sinks row.
  mk store_report/sinks/store/sqlite_writer.cpp '#include "sinks/report/text_report.h"'
  expect store_report 1
  mk store_fleet/sinks/store/lmdb_store.cpp '#include "sinks/fleet/process_identity.h"'
  expect store_fleet 1
  mk store_engine/sinks/store/sqlite_reader.cpp '#include "engine/engine.h"'
  expect store_engine 1
  mk report_store/sinks/report/html_report.cpp '#include "sinks/store/sqlite_store.h"'
  expect report_store 1
  mk metrics_report/sinks/metrics/prometheus_exporter.cpp '#include "sinks/report/text_report.h"'
  expect metrics_report 1
  mk fleet_report/sinks/fleet/merge.cpp '#include "sinks/report/text_report.h"'
  expect fleet_report 1
  mk fleet_engine/sinks/fleet/merge.cpp '#include "engine/engine.h"'
  expect fleet_engine 1
  mk mcp_report/sinks/mcp/trace_tools.cpp '#include "sinks/report/text_report.h"'
  expect mcp_report 1
  mk mcp_metrics/sinks/mcp/trace_tools.cpp '#include "sinks/metrics/prometheus_exporter.h"'
  expect mcp_metrics 1
  # sinks/ holds only the sub-folders of the table.
  mk sinks_flat/sinks/report.cpp '#include "model/result.h"'
  expect sinks_flat 1
  mk sinks_unknown/sinks/other/thing.h '#include "model/result.h"'
  expect sinks_unknown 1

  if (( failures > 0 )); then return 1; fi
  echo "check_layering self-test: OK"
}

if [[ "${1:-}" == "--self-test" ]]; then
  self_test
else
  check_tree "${1:-$(cd "$(dirname "$0")/.." && pwd)}"
fi
