// operators/diff_stats.h: the Mann-Whitney U test `diff` judges noise with, against values worked
// out by hand (normal approximation with tie and continuity corrections); the incident rows of
// compare() on hand-made sides.
#include "operators/diff_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

using ingero::diff::mann_whitney;

TEST(MannWhitney, FullySeparatedSamples) {
  const std::vector<double> a{1, 2, 3, 4, 5}, b{6, 7, 8, 9, 10};
  const auto t = mann_whitney(a, b);
  EXPECT_DOUBLE_EQ(t.u, 0);
  // mu = 12.5, var = 25 * 11 / 12, z = (12.5 - 0.5) / sqrt(var) = 2.5067, p = 0.01219
  EXPECT_NEAR(t.z, 12.0 / std::sqrt(25.0 * 11 / 12), 1e-9);
  EXPECT_NEAR(t.p, 0.01219, 1e-4);
  const auto r = mann_whitney(b, a);  // the other way round: the same p, the opposite sign
  EXPECT_NEAR(r.p, t.p, 1e-12);
  EXPECT_LT(r.z, 0);
}

TEST(MannWhitney, TiesUseAverageRanksAndShrinkTheVariance) {
  const std::vector<double> a{1, 2, 2, 3}, b{2, 3, 3, 4};
  // Ranks: 1 -> 1; 2,2,2 -> 3; 3,3,3 -> 6; 4 -> 8. R(a) = 1 + 3 + 3 + 6 = 13, U = 13 - 10 = 3.
  // ties: 2 groups of 3 -> sum t^3 - t = 48; var = 16/12 * (9 - 48/56) = 10.857; z = (8-3-0.5)/3.295
  const auto t = mann_whitney(a, b);
  EXPECT_DOUBLE_EQ(t.u, 3);
  EXPECT_NEAR(t.z, 4.5 / std::sqrt(16.0 / 12 * (9 - 48.0 / 56)), 1e-9);
  EXPECT_NEAR(t.p, std::erfc(t.z / std::sqrt(2.0)), 1e-12);
}

TEST(MannWhitney, SameDistributionIsNotSignificantAndTooFewIsNoTest) {
  std::vector<double> a, b;
  for (int i = 0; i < 200; ++i) {
    a.push_back((i * 37) % 101);
    b.push_back((i * 53 + 7) % 101);
  }
  EXPECT_GT(mann_whitney(a, b).p, 0.2);
  const std::vector<double> x{1, 2}, y{3, 4, 5};
  EXPECT_DOUBLE_EQ(mann_whitney(x, y).p, 1);
  const std::vector<double> same{5, 5, 5, 5};
  EXPECT_DOUBLE_EQ(mann_whitney(same, same).p, 1);
}

}  // namespace

namespace {

TEST(Welch, MeansOfUnequalVariances) {
  const std::vector<double> a{1, 2, 3, 4, 5}, b{2, 4, 6, 8, 10};
  // means 3 and 6, variances 2.5 and 10: se = sqrt(0.5 + 2) = 1.5811, z = 1.8974
  const auto t = ingero::diff::welch(a, b);
  EXPECT_NEAR(t.z, 3 / std::sqrt(2.5), 1e-9);
  EXPECT_NEAR(t.p, std::erfc(t.z / std::sqrt(2.0)), 1e-12);
  const std::vector<double> same{5, 5, 5, 5};
  EXPECT_DOUBLE_EQ(ingero::diff::welch(same, same).p, 1);
}

// Incidents side by side: keyed by rule, category, process and thread name (the pids differ
// between runs); only keys with a MEDIUM/HIGH incident on a side; grew/shrank past 25% and the
// effect floors, else same; appeared first, then grew, vanished, same.
TEST(DiffIncidents, RowsByKeyWithTheirChange) {
  using namespace ingero;
  constexpr uint64_t kSec = 1'000'000'000, kT0 = 1'700'000'000 * kSec;
  auto side = [](uint32_t pid) {
    AnalysisResult r;
    r.meta.first_ts = kT0;
    r.meta.last_ts = kT0 + 10 * kSec;
    r.meta.process_names[pid] = "trainer";
    r.meta.thread_names[pid + 1] = "trainer";
    ThreadAccounting t;
    t.pid = pid;
    t.tid = pid + 1;
    t.comm = "trainer";
    t.wall_ns = 10 * kSec;
    t.in_calls_ns["sync"] = 5 * kSec;
    t.on_cpu_ns = 5 * kSec;
    r.accounting.push_back(t);
    return r;
  };
  auto incident = [](AnalysisResult& r, const char* rule, const char* category, Severity s, double lost_s) {
    Incident in;
    in.rule = rule;
    in.category = category;
    in.severity = s;
    in.pid = r.accounting[0].pid;
    in.tid = r.accounting[0].tid;
    in.start_ns = kT0;
    in.end_ns = kT0 + 10 * kSec;
    in.lost_ns = static_cast<uint64_t>(lost_s * 1e9);
    in.summary = std::string(rule) + " happened";
    r.incidents.push_back(in);
  };
  AnalysisResult b = side(100), a = side(200);  // another run: other pids, the same names
  incident(b, "cpu_preempted", "cpu_contention", Severity::kMedium, 1.0);
  incident(a, "cpu_preempted", "cpu_contention", Severity::kHigh, 3.0);  // grew
  incident(b, "input_wait", "input_starvation", Severity::kHigh, 2.0);
  incident(a, "input_wait", "input_starvation", Severity::kMedium, 2.05);     // same (within 25%)
  incident(a, "launch_gap", "launch_gap", Severity::kMedium, 0.5);            // appeared
  incident(b, "throughput_drop", "throughput_drop", Severity::kMedium, 4.0);  // vanished
  incident(b, "unexplained_tail", "unexplained_tail", Severity::kLow, 0.1);   // LOW on both: no row
  incident(a, "unexplained_tail", "unexplained_tail", Severity::kLow, 0.9);
  incident(b, "gpu_tail", "gpu_tail", Severity::kLow, 0.1);  // LOW before, MEDIUM after: appeared
  incident(a, "gpu_tail", "gpu_tail", Severity::kMedium, 0.2);
  diff::DiffSide sb{"before.db", &b, {}, 10 * kSec, false, {}};
  diff::DiffSide sa{"after.db", &a, {}, 10 * kSec, false, {}};
  const diff::DiffReport rep = diff::compare(sb, sa);
  ASSERT_EQ(rep.unit, "second");
  std::string got;
  for (const auto& r : rep.incidents) got += r.change + ":" + r.rule + " ";
  EXPECT_EQ(got, "appeared:launch_gap appeared:gpu_tail grew:cpu_preempted vanished:throughput_drop same:input_wait ")
      << got;
  for (const auto& r : rep.incidents) {
    EXPECT_EQ(r.process, "trainer");
    EXPECT_EQ(r.thread, "trainer");
    if (r.rule == "cpu_preempted") {
      EXPECT_EQ(r.before_severity, "MEDIUM");
      EXPECT_EQ(r.after_severity, "HIGH");
      EXPECT_NEAR(r.before_ns, 0.1e9, 1);  // 1 s lost over 10 s: 100 ms per second
      EXPECT_NEAR(r.after_ns, 0.3e9, 1);
      EXPECT_EQ(r.evidence.size(), 2u);
    }
    if (r.rule == "launch_gap") {
      EXPECT_EQ(r.before_count, 0u);
      EXPECT_EQ(r.before_severity, "");
    }
    if (r.rule == "gpu_tail") EXPECT_EQ(r.before_severity, "LOW");
  }
  // Reversed: what grew shrank, what appeared vanished.
  const diff::DiffReport back = diff::compare(sa, sb);
  got.clear();
  for (const auto& r : back.incidents) got += r.change + ":" + r.rule + " ";
  EXPECT_EQ(got, "appeared:throughput_drop vanished:launch_gap vanished:gpu_tail shrank:cpu_preempted same:input_wait ")
      << got;
}

}  // namespace
