// Test helpers for tests that compare whole rule-pack results across thread counts and batch
// sizes (threads_routing_test, parallel_source_test, two_stage_test).
//
// Contract:
// - run_pack(src, threads): the default rule pack over `src` at `threads` engine threads; plan
//   errors fail the calling test.
// - result_text(r), ops_text(r): tests/util/result_text.h.
// Header-only.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine.h"
#include "rules/pack.h"
#include "tests/util/result_text.h"

namespace ingero::test {

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
