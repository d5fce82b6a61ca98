// What a run of the rule pack reports, as text, for comparing runs that must agree (thread
// counts, splits, batch sizes): the parity tests and tests/engine/fuzz/engine_parity_fuzz.cpp. No gtest,
// so the fuzzer can include it.
//
// Contract:
// - result_text(r): explain's JSON of `r` (chains, rule outcomes, counters) with the two counters
//   that legitimately differ with threads and batch size (threads, batches) blanked. It does not
//   hold the per-op statistics (explain's JSON leaves them out).
// - ops_text(r): the per-op statistics, one line per op in the result's order.
// Header-only.
#pragma once

#include <string>

#include "model/result.h"
#include "model/result_json.h"

namespace ingero::test {

inline std::string result_text(AnalysisResult r) {
  r.counters.threads = 0;
  r.counters.batches = 0;
  return explain_json(r).dump();
}

inline std::string ops_text(const AnalysisResult& r) {
  std::string s;
  for (const auto& o : r.ops)
    s += std::to_string(static_cast<int>(o.source)) + "/" + std::to_string(o.op) + " n=" + std::to_string(o.count) +
         " err=" + std::to_string(o.errors) + " p50=" + std::to_string(o.p50_ns) + " p95=" + std::to_string(o.p95_ns) +
         " p99=" + std::to_string(o.p99_ns) + " min=" + std::to_string(o.min_ns) + " max=" + std::to_string(o.max_ns) +
         " total=" + std::to_string(o.total_ns) + "\n";
  return s;
}

}  // namespace ingero::test
