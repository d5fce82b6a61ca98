// The routing pass answers a range check (`rank >= 0`, `rank != 2`: a small field against a
// constant, RouteCheck::kRange) for a whole batch when the batch's smallest and largest value of
// the field allow it (runtime.cpp, answer_range_checks), and per event otherwise. Rules written
// with such checks must give, at every batch size and thread count, the chains of the same rules
// written so that the check is evaluated per event (`... or duration < 0ns`, which no event
// satisfies: an `or` is never a range). The events come in runs that make batches of one rank
// only, of ranks all inside or all outside each range, and mixed, and change between them, so
// every answer (all pass, all fail, check each) is given and then taken back.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dsl/compiler.h"
#include "engine/engine.h"
#include "model/ops.h"
#include "tests/util/window_events.h"

namespace ingero {
namespace {

using test::kMs;
using test::kT0;

// One rule: CUDA calls whose rank passes `where`, counted per rank over the whole trace.
std::string rule(const std::string& name, const std::string& where) {
  return "rule " + name + " \"calls per rank\"\n  from cuda where " + where +
         "\n  window whole by rank\n  let n = count(), busy = sum(duration)\n  require n >= 1\n"
         "  severity low\n  category straggler\n  summary \"" +
         name + " rank {rank}: {n} calls, {busy}\"\n  root_cause \"r\"\n  fix [\"f\"]\nend\n\n";
}

// Each rule twice: its check as a range (a) and evaluated per event (b, the reference).
const std::vector<std::pair<std::string, std::string>> kChecks = {
    {"rank >= 0", "rank >= 0 or duration < 0ns"},     {"rank != 2", "rank != 2 or duration < 0ns"},
    {"rank < 0", "rank < 0 or duration < 0ns"},       {"rank == 1", "rank == 1 or duration < 0ns"},
    {"rank <= 1.5", "rank <= 1.5 or duration < 0ns"}, {"rank > 7", "rank > 7 or duration < 0ns"},
};

Plan compile(bool ranged) {
  std::string text;
  for (size_t i = 0; i < kChecks.size(); ++i)
    text += rule("r" + std::to_string(i), ranged ? kChecks[i].first : kChecks[i].second);
  auto compiled = dsl::compile_rules({{ranged ? "ranged.rules" : "evaluated.rules", text}});
  EXPECT_TRUE(compiled.ok()) << dsl::render_diagnostics(compiled.diagnostics);
  return compiled.plan;
}

// Runs of calls: rank -1 only, rank 1 only, ranks -1..3 in turn, rank 2 only, -1 again, 0..3.
std::vector<Event> trace() {
  std::vector<Event> ev;
  uint64_t ts = kT0, id = 1;
  auto add = [&](int rank) {
    Event e = test::make(Source::kCuda, op::kCudaLaunchKernel, static_cast<uint32_t>(100 + rank + 1), ts, kMs / 10,
                         id++);
    e.rank = static_cast<int16_t>(rank);
    ev.push_back(e);
    ts += kMs;
  };
  for (int i = 0; i < 500; ++i) add(-1);
  for (int i = 0; i < 500; ++i) add(1);
  for (int i = 0; i < 1000; ++i) add(i % 5 - 1);
  for (int i = 0; i < 300; ++i) add(2);
  for (int i = 0; i < 200; ++i) add(-1);
  for (int i = 0; i < 400; ++i) add(i % 4);
  return ev;
}

std::vector<std::string> summaries(const Plan& plan, const std::vector<Event>& ev, size_t batch, unsigned threads) {
  BorrowedSource src(ev, batch);
  EngineOptions o;
  o.threads = threads;
  std::vector<std::string> errors;
  const auto r = run_plan(plan, src, o, &errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(r.counters.events_in, ev.size());
  std::vector<std::string> out;
  for (const auto& c : r.chains) out.push_back(c.summary);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(RouteRangeBatch, RangeChecksGiveWhatEvaluatingEachEventGives) {
  const auto ev = trace();
  const Plan ranged = compile(true), evaluated = compile(false);
  const auto reference = summaries(evaluated, ev, 4096, 1);
  // Ranks -1..3 are present: r0 (>= 0) four chains, r1 (!= 2) four, r2 (< 0) one, r3 (== 1)
  // one, r4 (<= 1.5) three, r5 (> 7) none.
  ASSERT_EQ(reference.size(), 4u + 4 + 1 + 1 + 3 + 0);
  for (const size_t batch : {1, 3, 64, 250, 500, 4096})
    for (const unsigned threads : {1u, 2u}) {
      EXPECT_EQ(summaries(ranged, ev, batch, threads), reference) << "batch " << batch << ", threads " << threads;
      EXPECT_EQ(summaries(evaluated, ev, batch, threads), reference) << "batch " << batch << ", threads " << threads;
    }
}

}  // namespace
}  // namespace ingero
