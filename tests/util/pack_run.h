// Test helpers for tests that compare whole rule-pack results across thread counts and batch
// sizes (threads_routing_test, parallel_source_test).
//
// Contract:
// - run_pack(src, threads): the default rule pack over `src` at `threads` engine threads; plan
//   errors fail the calling test.
// - result_text(r): explain's JSON of `r` (chains, rule outcomes, counters) with the two counters
//   that legitimately differ with threads and batch size (threads, batches) blanked. It does not
//   hold the per-op statistics (explain's JSON leaves them out): compare r.ops on their own
//   (threads_routing_test's ops_text).
// Header-only.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine.h"
#include "rules/pack.h"
#include "sinks/report.h"

namespace ingero::test {

inline std::string result_text(AnalysisResult r) {
  r.counters.threads = 0;
  r.counters.batches = 0;
  return explain_json(r).dump();
}

inline AnalysisResult run_pack(EventSource& src, unsigned threads) {
  static const Plan plan = rules::default_rule_pack_plan();
  EngineOptions o;
  o.threads = threads;
  std::vector<std::string> errors;
  auto r = run_plan(plan, src, o, &errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  return r;
}

}  // namespace ingero::test
