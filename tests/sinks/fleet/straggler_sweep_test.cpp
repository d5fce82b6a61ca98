// Stragglers per step (sinks/fleet/stragglers.h) through `merge` on generated jobs: steps 5 ms -
// 10 s, strictly periodic and jittered, clock offsets up to +-500 ms both signs, one rank 0-50 % of a
// step late, 4-64 ranks, captures starting at different steps. The straggler must be named
// whenever its lag is >= 2 % of the step over >= 20 steps; balanced jobs name nobody.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/ops.h"
#include "model/plan.h"
#include "sinks/fleet/merge.h"
#include "sinks/fleet/stragglers.h"
#include "sinks/store/lmdb_store.h"
#include "tests/sinks/fleet/fleet_synth.h"
#include "tests/util/scratch_db.h"

using namespace ingero;
using ingero::test::FleetSpec;

namespace {

// A job whose step shape scales with the step: compute 30 %, rank-to-rank compute jitter 1 %,
// transfer 5 %, a kernel launch every 1/16 step; the slow rank computes `lag` of a step longer.
FleetSpec job(uint64_t step, double lag, int ranks, bool jittered, bool covers_start, int steps, uint64_t seed) {
  FleetSpec s;
  s.ranks = ranks;
  s.steps = steps;
  s.period_ns = step;
  s.compute_ns = step * 3 / 10;
  s.compute_jitter_ns = step / 100;
  s.transfer_ns = step / 20;
  s.launch_gap_ns = step / 16;
  s.period_jitter_ns = jittered ? step * 3 / 100 : 0;
  s.slow_rank = lag > 0 ? static_cast<int>(seed % static_cast<uint64_t>(ranks)) : -1;
  s.slow_extra_ns = static_cast<uint64_t>(lag * static_cast<double>(step));
  s.job_start_events = covers_start;
  s.seed = seed;
  std::mt19937_64 rng(seed * 7919 + 1);
  std::uniform_int_distribution<int64_t> off(-500'000'000, 500'000'000);
  std::uniform_int_distribution<int> first(0, 2);
  for (int r = 0; r < ranks; ++r) {
    s.clock_offset_ns.push_back(r == 0 ? 0 : off(rng));
    // A capture covering the start begins at step 0; otherwise 0-2 steps late.
    s.first_step.push_back(covers_start ? 0 : first(rng));
  }
  return s;
}

MergeReport merge_job(const FleetSpec& s, const test::ScratchDir& dir, const std::string& tag) {
  std::vector<MergeInput> in;
  for (int r = 0; r < s.ranks; ++r) {
    const std::string path = dir(tag + "_n" + std::to_string(r) + ".db");
    const std::string err = test::write_fleet_node(s, r, "n" + std::to_string(r), path);
    EXPECT_EQ(err, "") << tag;
    in.push_back({path, ""});
  }
  MergeOptions o;
  o.out = dir(tag + "_merged.db");
  MergeReport rep;
  std::string error;
  EXPECT_TRUE(merge_traces(in, o, rep, error)) << tag << ": " << error;
  return rep;
}

TEST(StepStragglers, SweepNamesTheLateRankFrom2PercentAndNobodyOnBalancedJobs) {
  const auto t0 = std::chrono::steady_clock::now();
  test::ScratchDir dir("straggler_sweep");
  const uint64_t steps_ns[] = {5'000'000, 8'000'000, 50'000'000, 400'000'000, 2'000'000'000, 10'000'000'000};
  const double lags[] = {0, 0.02, 0.05, 0.2, 0.5};
  const int rank_counts[] = {4, 8, 16, 8, 4, 64};
  int jobs = 0, named = 0, by_order = 0, by_wait = 0, balanced = 0;
  for (size_t si = 0; si < std::size(steps_ns); ++si)
    for (int shape = 0; shape < 3; ++shape)  // 0 periodic, 1 jittered, 2 periodic covering the start
      for (size_t li = 0; li < std::size(lags); ++li) {
        const uint64_t seed = 1000 + si * 100 + static_cast<uint64_t>(shape) * 10 + li;
        const int ranks = rank_counts[(si + static_cast<size_t>(shape) + li) % std::size(rank_counts)];
        // 64 ranks only for some jobs (time); 22-24 steps so that >= 20 are seen by every node.
        const FleetSpec s = job(steps_ns[si], lags[li], ranks, shape == 1, shape == 2, 24, seed);
        const std::string tag = "j" + std::to_string(jobs++);
        const MergeReport rep = merge_job(s, dir, tag);
        const StragglerReport& st = rep.stragglers;
        const std::string what = tag + " step " + std::to_string(steps_ns[si] / 1'000'000) + " ms, lag " +
                                 std::to_string(lags[li]) + ", shape " + std::to_string(shape) + ", " +
                                 std::to_string(ranks) + " ranks: " + st.note;
        if (lags[li] == 0) {
          ++balanced;
          EXPECT_TRUE(st.stragglers.empty()) << what << " named " << st.stragglers.front().node;
          continue;
        }
        ASSERT_EQ(st.stragglers.size(), 1u) << what;
        const Straggler& g = st.stragglers.front();
        EXPECT_EQ(g.node, "n" + std::to_string(s.slow_rank)) << what;
        EXPECT_EQ(g.rank, s.slow_rank) << what;
        EXPECT_GE(g.collectives, 20u) << what;
        // The lag and the cost are of the injected size (the lead over the next-latest rank is
        // the lag less the rank-to-rank jitter, up to 1 % of the step).
        const double lag_share = static_cast<double>(g.median_lag_ns) / static_cast<double>(st.step_ns);
        EXPECT_NEAR(lag_share, lags[li], 0.012) << what;
        EXPECT_GE(g.cost_share, lags[li] - 0.012) << what;
        EXPECT_LE(g.cost_share, lags[li] + 0.012) << what;
        EXPECT_EQ(g.severity, g.cost_share >= 0.05 ? Severity::kHigh : Severity::kMedium) << what;
        if (g.method == "arrival_order") {
          ++by_order;
          EXPECT_GE(g.last_share, 0.9) << what;
          EXPECT_EQ(g.cross_check, "agrees") << what;
        } else {
          ++by_wait;
          EXPECT_EQ(g.method, "wait_least") << what;
          EXPECT_LT(g.last_share, 0) << what;  // no arrival order claimed
          EXPECT_FALSE(st.order_usable) << what;
        }
        ++named;
      }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "straggler sweep: %d jobs, %d stragglers named (%d by arrival order, %d by wait-least), %d balanced, "
      "%.1f s\n",
      jobs, named, by_order, by_wait, balanced, secs);
  // Both signals were exercised: jittered and start-covering jobs align, strictly periodic ones
  // without the start are ambiguous.
  EXPECT_GT(by_order, 0);
  EXPECT_GT(by_wait, 0);
}

// The issue's held-out set, regenerated: 8 ranks, steps of 8, 50 and 400 ms, clocks off by up to
// 2, 20 and 200 ms, one rank 3, 10 or 40 % of a step late, a 10 s capture (at most 300 steps), plus
// 9 balanced jobs. The old rule named 18 of 27.
TEST(StepStragglers, IssueCase27JobsAllNamedNoFalseOnes) {
  test::ScratchDir dir("straggler_issue");
  const uint64_t steps_ns[] = {8'000'000, 50'000'000, 400'000'000};
  const int64_t max_off[] = {2'000'000, 20'000'000, 200'000'000};
  const double lags[] = {0.03, 0.10, 0.40};
  int named = 0, jobs = 0, false_ones = 0;
  for (size_t si = 0; si < 3; ++si)
    for (int rep = 0; rep < 3; ++rep)
      for (int li = -1; li < 3; ++li) {  // li = -1: a balanced job (9 in all)
        const uint64_t seed = 300 + si * 10 + static_cast<uint64_t>(rep) * 3 + static_cast<uint64_t>(li + 1);
        const int steps = static_cast<int>(std::min<uint64_t>(300, 10'000'000'000ULL / steps_ns[si]));
        FleetSpec s = job(steps_ns[si], li < 0 ? 0 : lags[li], 8, rep != 1, false, steps, seed);
        std::mt19937_64 rng(seed);
        std::uniform_int_distribution<int64_t> off(-max_off[si], max_off[si]);
        for (size_t r = 1; r < s.clock_offset_ns.size(); ++r) s.clock_offset_ns[r] = off(rng);
        const std::string tag = "i" + std::to_string(jobs++);
        const MergeReport m = merge_job(s, dir, tag);
        const auto& g = m.stragglers.stragglers;
        if (li < 0) {
          false_ones += static_cast<int>(g.size());
          continue;
        }
        if (si == 0 && rep == 0 && li == 1)  // the issue's 8 ms step, 0.8 ms lag: print the chain
          for (const auto& c : straggler_chains(m.stragglers))
            std::printf("[%s] %s  %s\n  %s\n", severity_name(c.severity), c.category.c_str(), c.rule.c_str(),
                        c.summary.c_str());
        if (g.size() == 1 && g[0].rank == s.slow_rank) ++named;
        else ADD_FAILURE() << tag << " step " << steps_ns[si] << " lag " << lags[li] << ": " << m.stragglers.note;
      }
  std::printf("issue case: %d of 27 stragglers named, %d false in 9 balanced jobs\n", named, false_ones);
  EXPECT_EQ(named, 27);
  EXPECT_EQ(false_ones, 0);
}

TEST(StepStragglers, FewerThan20StepsNamesNobody) {
  test::ScratchDir dir("straggler_few");
  const FleetSpec s = job(400'000'000, 0.4, 8, true, false, 18, 77);
  const MergeReport rep = merge_job(s, dir, "few");
  EXPECT_TRUE(rep.stragglers.stragglers.empty()) << rep.stragglers.note;
  // The same job with 24 steps names it (the floor is the step count, not seconds).
  const MergeReport more = merge_job(job(400'000'000, 0.4, 8, true, false, 24, 77), dir, "more");
  ASSERT_EQ(more.stragglers.stragglers.size(), 1u) << more.stragglers.note;
  EXPECT_EQ(more.stragglers.stragglers.front().rank, 77 % 8);
  // Recomputed on the merged file with the uncertainties `merge` recorded: the same finding.
  StragglerReport again;
  std::string error;
  ASSERT_TRUE(stragglers_of_merged_trace(dir("more_merged.db"), again, error)) << error;
  ASSERT_EQ(again.stragglers.size(), 1u) << again.note;
  EXPECT_EQ(again.stragglers[0].node, more.stragglers.stragglers[0].node);
  EXPECT_EQ(again.stragglers[0].rank, 77 % 8);
  EXPECT_EQ(again.stragglers[0].method, more.stragglers.stragglers[0].method);
  EXPECT_EQ(again.stragglers[0].collectives, more.stragglers.stragglers[0].collectives);
}

TEST(StepStragglers, LagUnderOnePercentOfTheStepIsNotNamed) {
  test::ScratchDir dir("straggler_small");
  const MergeReport rep = merge_job(job(50'000'000, 0.004, 8, true, false, 30, 5), dir, "small");
  EXPECT_TRUE(rep.stragglers.stragglers.empty()) << rep.stragglers.stragglers.front().node;
}

// Sync points of 4 nodes on one clock, node 2 arriving `lag` late; every node's uncertainty `u`.
std::vector<ArrivalNode> four_nodes(int64_t step, int64_t lag, int64_t u) {
  std::vector<ArrivalNode> out(4);
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> j(0, step / 200);
  for (int n = 0; n < 4; ++n) {
    out[static_cast<size_t>(n)].node = "n" + std::to_string(n);
    out[static_cast<size_t>(n)].uncertainty_ns = n == 0 ? 0 : u;
    out[static_cast<size_t>(n)].matched = true;
  }
  for (int k = 0; k < 40; ++k) {
    const int64_t t = 1'000'000'000 + k * step;
    const int64_t done = t + step / 2 + lag + step / 20;
    for (int n = 0; n < 4; ++n) {
      const int64_t entry = t + step / 2 + (n == 2 ? lag : 0) + j(rng);
      out[static_cast<size_t>(n)].points.push_back({static_cast<uint64_t>(k), static_cast<uint64_t>(done + j(rng)),
                                                    op::kNcclAllReduce, static_cast<uint64_t>(entry)});
    }
  }
  return out;
}

TEST(StepStragglers, ClockCoarserThanTheLagFallsBackToWaitLeast) {
  // 8 ms step, rank 2 0.8 ms late (the issue's fast-step case, under the old 1 ms floor).
  const auto fine = find_stragglers(four_nodes(8'000'000, 800'000, 10'000));
  ASSERT_EQ(fine.stragglers.size(), 1u) << fine.note;
  EXPECT_EQ(fine.stragglers[0].node, "n2");
  EXPECT_EQ(fine.stragglers[0].method, "arrival_order");
  EXPECT_DOUBLE_EQ(fine.stragglers[0].last_share, 1.0);
  EXPECT_EQ(fine.stragglers[0].severity, Severity::kHigh);  // ~10 % of the step
  const auto chains = straggler_chains(fine);
  ASSERT_EQ(chains.size(), 1u);
  EXPECT_EQ(chains[0].category, "straggler");
  EXPECT_NE(chains[0].summary.find("arrived last in 100.0% of 40 steps, a median 0.8"), std::string::npos)
      << chains[0].summary;
  // Clocks known only to 1 ms: no arrival order; wait-least names it, without "last in X%".
  const auto coarse = find_stragglers(four_nodes(8'000'000, 800'000, 1'000'000));
  EXPECT_FALSE(coarse.order_usable);
  ASSERT_EQ(coarse.stragglers.size(), 1u) << coarse.note;
  EXPECT_EQ(coarse.stragglers[0].node, "n2");
  EXPECT_EQ(coarse.stragglers[0].method, "wait_least");
  EXPECT_LT(coarse.stragglers[0].last_share, 0);
  EXPECT_EQ(straggler_chains(coarse)[0].summary.find("arrived last"), std::string::npos);
  // Balanced: nobody, with either clock.
  EXPECT_TRUE(find_stragglers(four_nodes(8'000'000, 0, 10'000)).stragglers.empty());
  EXPECT_TRUE(find_stragglers(four_nodes(8'000'000, 0, 1'000'000)).stragglers.empty());
}

// `explain` on a merged trace gives the same per-step straggler chain as `merge` (the issue's
// 8 ms step with a rank 0.8 ms late: under the per-window rule's 1 ms floor), and none on the
// balanced control.
// `ingero-pipeline ARGS` (stderr dropped): its stdout.
std::string run_pipeline(const std::string& args) {
  const std::string cmd = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline " + args + " 2>/dev/null";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  return out;
}

std::string explain_json(const std::string& db) { return run_pipeline("explain --json --db '" + db + "'"); }

TEST(StepStragglers, ExplainOnTheMergedTraceNamesTheSameRank) {
  test::ScratchDir dir("straggler_explain");
  const FleetSpec s = job(8'000'000, 0.1, 8, true, false, 300, 13);
  const MergeReport rep = merge_job(s, dir, "late");
  ASSERT_EQ(rep.stragglers.stragglers.size(), 1u) << rep.stragglers.note;
  const auto j = nlohmann::json::parse(explain_json(dir("late_merged.db")), nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("chains")) << "explain gave no JSON";
  std::vector<nlohmann::json> found;
  for (const auto& c : j["chains"])
    if (c.value("rule", "") == "fleet_step_straggler") found.push_back(c);
  ASSERT_EQ(found.size(), 1u) << "one chain for one straggler";
  EXPECT_EQ(found[0].value("rank", -2), rep.stragglers.stragglers[0].rank);
  // The incident that carries it (the answers' unit) names the same rank.
  bool incident = false;
  for (const auto& i : j.value("incidents", nlohmann::json::array()))
    incident = incident || (i.value("rule", "") == "fleet_step_straggler" && i.value("rank", -2) == found[0]["rank"]);
  EXPECT_TRUE(incident) << j.value("incidents", nlohmann::json::array()).dump(1).substr(0, 2000);
  const MergeReport even = merge_job(job(8'000'000, 0, 8, true, false, 300, 13), dir, "even");
  EXPECT_TRUE(even.stragglers.stragglers.empty()) << even.stragglers.note;
  EXPECT_EQ(explain_json(dir("even_merged.db")).find("\"fleet_step_straggler\""), std::string::npos);
}

// `diff BEFORE AFTER` on merged fleet traces (issue: "a straggling rank" among the injected
// regressions): a balanced job, then the same job with one rank late by a share of the step.
// Steps run back to back (the next starts when the all-reduce has completed everywhere), so the
// late rank lengthens the job's step; the truth is the generator's own mean step time, before and
// after. The straggler must be the first cause, with its time per step within 15% of the true
// added step time, and the waits of the focus rank it explains must not be counted again.
double mean_step_ns(const FleetSpec& s) {
  const auto ev = test::fleet_node_events(s, 0);
  std::vector<uint64_t> ends;  // the blocking wait after each all-reduce returns: a step boundary
  for (const Event& e : ev)
    if (e.source == Source::kCuda && e.op == op::kCudaStreamSync) ends.push_back(e.ts_ns + e.dur_ns);
  return ends.size() < 2 ? 0 : static_cast<double>(ends.back() - ends.front()) / static_cast<double>(ends.size() - 1);
}

TEST(StepStragglers, DiffNamesTheStragglingRankFirst) {
  test::ScratchDir dir("straggler_diff");
  struct Case {
    uint64_t step;
    double lag;
    int ranks, steps;
    uint64_t seed;
  };
  // Three 4-rank jobs with the late rank 1-3: the focus rank (the diff's own pick) is the late one in
  // some and waits for it in the others.
  for (const Case& k :
       {Case{50'000'000, 0.10, 8, 200, 21}, Case{400'000'000, 0.05, 4, 60, 22}, Case{20'000'000, 0.2, 4, 100, 25},
        Case{20'000'000, 0.2, 4, 100, 26}, Case{20'000'000, 0.2, 4, 100, 27}}) {
    const std::string tag = std::to_string(k.step / 1'000'000) + "ms_seed" + std::to_string(k.seed);
    FleetSpec even = job(k.step, 0, k.ranks, false, false, k.steps, k.seed);
    even.back_to_back = true;
    FleetSpec late = job(k.step, k.lag, k.ranks, false, false, k.steps, k.seed);
    late.back_to_back = true;
    late.seed = k.seed + 100;  // another run of the workload, not the same random draws
    const double truth = mean_step_ns(late) - mean_step_ns(even);
    ASSERT_GT(truth, 0) << tag;
    merge_job(even, dir, tag + "_even");
    const MergeReport rep = merge_job(late, dir, tag + "_late");
    ASSERT_EQ(rep.stragglers.stragglers.size(), 1u) << tag << ": " << rep.stragglers.note;
    const int slow = late.slow_rank;
    const std::string out = run_pipeline("diff --json '" + dir(tag + "_even_merged.db") + "' '" +
                                         dir(tag + "_late_merged.db") + "'");
    const auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("causes") && !j["causes"].empty()) << tag << ": " << out.substr(0, 2000);
    const auto& first = j["causes"][0];
    EXPECT_EQ(first.value("category", ""), "straggler") << tag << ": " << j["verdict"];
    EXPECT_TRUE(first.value("significant", false)) << tag;
    EXPECT_NE(first.value("what", "").find("rank " + std::to_string(slow) + " "), std::string::npos)
        << tag << ": " << first.value("what", "");
    const double added = first.value("added_ns_per_step", 0.0);
    EXPECT_NEAR(added, truth, 0.15 * truth) << tag << ": added " << added << " ns per step, truth " << truth;
    const std::string verdict = j.value("verdict", "");
    std::printf("%s (truth +%.3f ms per step; focus pid %d): %s\n", tag.c_str(), truth / 1e6,
                j["after"].value("pid", 0), verdict.c_str());
    EXPECT_NE(verdict.find("rank " + std::to_string(slow) + " "), std::string::npos) << verdict;
    // The focus rank's wait grew by about the same time: explained by the straggler, not a second cause.
    for (const auto& c : j["causes"]) {
      if (c.value("significant", false) && c.value("category", "") != "straggler") {
        EXPECT_NE(c.value("explained_by", ""), "")
            << tag << ": counted twice: " << c.value("what", "") << " in " << verdict;
      }
    }
    // Two balanced runs with different seeds: no straggler cause.
    FleetSpec even2 = even;
    even2.seed = k.seed + 200;
    merge_job(even2, dir, tag + "_even2");
    const auto n = nlohmann::json::parse(run_pipeline("diff --json '" + dir(tag + "_even_merged.db") + "' '" +
                                                      dir(tag + "_even2_merged.db") + "'"),
                                         nullptr, false);
    ASSERT_TRUE(n.is_object() && n.contains("causes")) << tag;
    for (const auto& c : n["causes"])
      EXPECT_FALSE(c.value("significant", false)) << tag << ": balanced pair: " << c.value("what", "");
  }
}

}  // namespace

// The stragglers `merge` found are stored with the merged trace: ip_stragglers (SQLite), the
// meta value "fleet_stragglers" (LMDB); a balanced job stores no row.
TEST(StepStragglers, StoredInTheMergedTrace) {
  test::ScratchDir dir("straggler_stored");
  const FleetSpec s = job(50'000'000, 0.1, 6, true, false, 40, 31);
  const MergeReport rep = merge_job(s, dir, "late");
  ASSERT_EQ(rep.stragglers.stragglers.size(), 1u) << rep.stragglers.note;
  const Straggler& g = rep.stragglers.stragglers[0];
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(dir("late_merged.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "SELECT node, rank, method, collectives, last_share, median_lag_ns, step_ns, cost_share,"
                               " cross_check, severity, summary FROM ip_stragglers",
                               -1, &st, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, 0))), g.node);
  EXPECT_EQ(sqlite3_column_int(st, 1), 31 % 6);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, 2))), "arrival_order");
  EXPECT_EQ(static_cast<uint64_t>(sqlite3_column_int64(st, 3)), g.collectives);
  EXPECT_DOUBLE_EQ(sqlite3_column_double(st, 4), g.last_share);
  EXPECT_NEAR(static_cast<double>(sqlite3_column_int64(st, 5)), 5e6, 0.6e6);  // 10 % of 50 ms
  EXPECT_EQ(sqlite3_column_int64(st, 6), g.step_ns);
  EXPECT_DOUBLE_EQ(sqlite3_column_double(st, 7), g.cost_share);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, 9))), "HIGH");
  EXPECT_NE(std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, 10))).find("arrived last in"),
            std::string::npos);
  EXPECT_EQ(sqlite3_step(st), SQLITE_DONE);  // one row
  sqlite3_finalize(st);
  sqlite3_close(db);

  // Balanced: the table exists and is empty.
  merge_job(job(50'000'000, 0, 6, true, false, 40, 32), dir, "even");
  ASSERT_EQ(sqlite3_open_v2(dir("even_merged.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT count(*) FROM ip_stragglers", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 0);
  sqlite3_finalize(st);
  sqlite3_close(db);

  // LMDB output: the same straggler in the meta value.
  std::vector<MergeInput> in;
  for (int r = 0; r < s.ranks; ++r) in.push_back({dir("late_n" + std::to_string(r) + ".db"), ""});
  MergeOptions o;
  o.out = dir("late_merged.lmdb");
  MergeReport lrep;
  std::string error;
  ASSERT_TRUE(merge_traces(in, o, lrep, error)) << error;
  std::string value;
  ASSERT_TRUE(lmdb_get_meta_value(o.out, "fleet_stragglers", value));
  const auto j = nlohmann::json::parse(value, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << value;
  ASSERT_EQ(j["stragglers"].size(), 1u) << value;
  EXPECT_EQ(j["stragglers"][0]["rank"], 31 % 6) << value;
  EXPECT_EQ(j["stragglers"][0]["method"], "arrival_order") << value;
}
