// Steps inferred with no instrumentation (operators/step_inference.h): a generator with ground
// truth (step lengths 5 ms .. 10 s with +-5% jitter, 1-64 ranks, 1-3 syncs per step at varying
// positions, NCCL, copies, launch bursts, noise calls), Poisson calls that must give "none",
// invariance to time shifts and batch sizes, a stall, the marker cap, the JSON and text forms,
// and the recorded Ingero traces.
#include "operators/step_inference.h"
#include "operators/step_tracker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "model/ops.h"
#include "model/result_json.h"
#include "sinks/report/text_report.h"
#include "sinks/store/sqlite_store.h"

namespace ingero {
namespace {

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;

enum class Kind { kStreamSync, kNcclThenSync, kMemcpyD2H, kDeviceSync, kBurstsOnly };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kStreamSync: return "stream sync";
    case Kind::kNcclThenSync: return "nccl + stream sync";
    case Kind::kMemcpyD2H: return "memcpy d2h";
    case Kind::kDeviceSync: return "device sync";
    case Kind::kBurstsOnly: return "launch bursts";
  }
  return "?";
}

struct Spec {
  uint64_t period = 50 * kMs;
  double jitter = 0.05;
  int ranks = 1;
  bool rank_field = false;  // ranks as Event::rank of one pid (else: one pid per rank, rank set too)
  int syncs = 1;            // blocking syncs per step (1..3)
  Kind kind = Kind::kStreamSync;
  int steps = 40;
  uint32_t seed = 1;
  bool noise = true;
  int stall_step = -1;  // this step lasts 3 periods (no calls in the extra time)
};

struct Truth {
  uint32_t pid = 0;
  int16_t rank = -1;
  std::vector<uint64_t> boundaries;  // what the inference should find (see generate)
  double mean_period = 0;            // of those boundaries
};

Event call(uint32_t pid, int16_t rank, Source s, uint8_t o, uint64_t ts, uint64_t dur, uint64_t arg1 = 0) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = pid;
  e.tid = pid;
  e.rank = rank;
  e.source = s;
  e.op = o;
  e.arg1 = arg1;
  return e;
}

// One process per rank. Step i spans [S_i, S_i+1), P_i = P (1 + U(-j, j)): host work to 0.15 P,
// 30 launches over [0.15 P, 0.55 P) with the extra syncs (short waits) at fixed per-process
// positions inside that burst, then the final wait from 0.58 P to S_i+1. Truth: the end of each
// step's final wait (S_i+1) for the sync kinds; each step's first launch for kBurstsOnly (no syncs).
std::vector<Event> generate(const Spec& sp, std::vector<Truth>& truth) {
  std::vector<Event> ev;
  truth.clear();
  for (int r = 0; r < sp.ranks; ++r) {
    std::mt19937_64 rng(sp.seed * 1000003ull + static_cast<uint64_t>(r));
    std::uniform_real_distribution<double> u(-1, 1), u01(0, 1);
    const uint32_t pid = sp.rank_field ? 4000 : 4000 + static_cast<uint32_t>(r);
    const auto rank = static_cast<int16_t>(sp.ranks > 1 ? r : -1);
    const auto P = static_cast<double>(sp.period);
    // Extra sync positions: uneven in the step (0.22-0.30 and 0.38-0.48), fixed per process.
    const double pos1 = 0.22 + 0.08 * u01(rng), pos2 = 0.38 + 0.10 * u01(rng);
    Truth t;
    t.pid = pid;
    t.rank = rank;
    auto S = static_cast<double>(kT0 + static_cast<uint64_t>(u01(rng) * P));
    for (int i = 0; i < sp.steps; ++i) {
      double Pi = P * (1 + sp.jitter * u(rng));
      const double len = (i == sp.stall_step) ? 3 * Pi : Pi;  // a stall: the host waits 2 extra periods first
      const double base = S + (len - Pi);
      auto at = [&](double f) { return static_cast<uint64_t>(base + f * Pi); };
      // Launch burst.
      const int launches = 30;
      for (int l = 0; l < launches; ++l) {
        const double f = 0.15 + 0.40 * (l + 0.3 * u01(rng)) / launches;
        const uint64_t ts = at(f);
        if (l == 0 && sp.kind == Kind::kBurstsOnly) t.boundaries.push_back(ts);
        ev.push_back(
            call(pid, rank, Source::kCuda, op::kCudaLaunchKernel, ts, 4000 + static_cast<uint64_t>(2000 * u01(rng))));
      }
      if (sp.kind != Kind::kBurstsOnly) {
        const double wait = 0.005 * Pi;
        const double jit = 0.01 * u(rng);
        if (sp.syncs >= 2)
          ev.push_back(
              call(pid, rank, Source::kCuda, op::kCudaStreamSync, at(pos1 + jit), static_cast<uint64_t>(wait)));
        if (sp.syncs >= 3)
          ev.push_back(
              call(pid, rank, Source::kCuda, op::kCudaStreamSync, at(pos2 + jit), static_cast<uint64_t>(wait)));
        if (sp.kind == Kind::kNcclThenSync)
          ev.push_back(call(pid, rank, Source::kNccl, op::kNcclAllReduce, at(0.56), 20000));
        const uint64_t start = at(0.58 + 0.01 * u(rng));
        const auto end = static_cast<uint64_t>(base + Pi);
        Source s = Source::kCuda;
        uint8_t o = op::kCudaStreamSync;
        if (sp.kind == Kind::kMemcpyD2H) o = op::kCudaMemcpy;
        if (sp.kind == Kind::kDeviceSync) o = op::kCudaDeviceSync;
        ev.push_back(call(pid, rank, s, o, start, end - start, 2));
        t.boundaries.push_back(end);
      }
      if (sp.noise) {
        // Poisson noise: allocations, async copies, an unrelated event sync, host switches.
        std::exponential_distribution<double> gap(3.0 / Pi);
        for (double x = base + gap(rng); x < base + Pi; x += gap(rng)) {
          const int which = static_cast<int>(u01(rng) * 4);
          const auto ts = static_cast<uint64_t>(x);
          if (which == 0) ev.push_back(call(pid, rank, Source::kCuda, op::kCudaMalloc, ts, 3000));
          if (which == 1) ev.push_back(call(pid, rank, Source::kCuda, op::kCudaMemcpyAsync, ts, 2000));
          if (which == 2)
            ev.push_back(
                call(pid, rank, Source::kCuda, op::kCudaEventSync, ts, 1000 + static_cast<uint64_t>(0.001 * Pi)));
          if (which == 3) ev.push_back(call(pid, rank, Source::kHost, op::kSchedSwitch, ts, 50000));
        }
      }
      S = base + Pi;
    }
    const auto& b = t.boundaries;
    t.mean_period = static_cast<double>(b.back() - b.front()) / static_cast<double>(b.size() - 1);
    truth.push_back(std::move(t));
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return ev;
}

std::vector<ProcessSteps> run(const std::vector<Event>& ev, size_t batch) {
  StepInference si;
  for (size_t i = 0; i < ev.size(); i += batch) si.observe(ev.data() + i, std::min(batch, ev.size() - i));
  AnalysisResult r;
  si.finish(TraceMeta{}, r);
  return r.steps;
}

const ProcessSteps* find(const std::vector<ProcessSteps>& v, uint32_t pid, int16_t rank) {
  for (const auto& s : v)
    if (s.pid == pid && s.rank == rank) return &s;
  return nullptr;
}

struct Accuracy {
  double max_period_err = 0, sum_period_err = 0, max_boundary_err = 0, sum_boundary_err = 0;
  size_t processes = 0, boundaries = 0;
};

// Checks one scenario against its truth; adds to `acc`.
void check(const Spec& sp, Accuracy& acc) {
  std::vector<Truth> truth;
  const auto ev = generate(sp, truth);
  const auto got = run(ev, 4096);
  const std::string what = std::string(kind_name(sp.kind)) + " period " + std::to_string(sp.period / kMs) + " ms, " +
                           std::to_string(sp.syncs) + " sync(s), " + std::to_string(sp.ranks) + " rank(s)";
  ASSERT_EQ(got.size(), truth.size()) << what;
  for (const auto& t : truth) {
    const ProcessSteps* s = find(got, t.pid, t.rank);
    ASSERT_NE(s, nullptr) << what << " pid " << t.pid << " rank " << t.rank;
    ASSERT_NE(s->method, "none") << what << ": " << s->reason;
    EXPECT_GE(s->confidence, 0.5) << what << " " << s->method;
    const double perr = std::fabs(static_cast<double>(s->period_ns) - t.mean_period) / t.mean_period;
    EXPECT_LT(perr, 0.01) << what << " " << s->method << ": period " << s->period_ns << " vs " << t.mean_period;
    if (sp.kind == Kind::kBurstsOnly) {
      EXPECT_NE(s->method.find("launch bursts"), std::string::npos) << what << " " << s->method;
    } else if (sp.kind == Kind::kMemcpyD2H) {
      EXPECT_EQ(s->method.rfind("cudaMemcpy x1", 0), 0u) << what << " " << s->method;
    } else if (sp.kind == Kind::kDeviceSync) {
      EXPECT_EQ(s->method.rfind("cudaDeviceSynchronize x1", 0), 0u) << what << " " << s->method;
    } else {
      EXPECT_EQ(s->method, "cudaStreamSynchronize x" + std::to_string(sp.syncs)) << what;
    }
    EXPECT_NEAR(static_cast<double>(s->count), static_cast<double>(t.boundaries.size() - 1), 1.0) << what;
    EXPECT_GE(s->boundaries.size() + 1, t.boundaries.size()) << what << " " << s->method;
    double berr_max = 0;
    for (uint64_t b : s->boundaries) {
      auto it = std::lower_bound(t.boundaries.begin(), t.boundaries.end(), b);
      double best = 1e300;
      if (it != t.boundaries.end()) best = static_cast<double>(*it - b);
      if (it != t.boundaries.begin()) best = std::min(best, static_cast<double>(b - *(it - 1)));
      const double e = best / t.mean_period;
      berr_max = std::max(berr_max, e);
      acc.sum_boundary_err += e;
      ++acc.boundaries;
    }
    EXPECT_LT(berr_max, 0.05) << what << " " << s->method << ": a boundary " << berr_max << " of a step from the truth";
    EXPECT_TRUE(std::is_sorted(s->boundaries.begin(), s->boundaries.end())) << what;
    acc.max_period_err = std::max(acc.max_period_err, perr);
    acc.sum_period_err += perr;
    acc.max_boundary_err = std::max(acc.max_boundary_err, berr_max);
    ++acc.processes;
  }
}

TEST(StepInference, GeneratorSweepFindsThePeriodAndTheBoundaries) {
  const uint64_t periods[] = {5 * kMs, 50 * kMs, 500 * kMs, 10'000 * kMs};
  const Kind kinds[] = {Kind::kStreamSync, Kind::kNcclThenSync, Kind::kMemcpyD2H, Kind::kDeviceSync, Kind::kBurstsOnly};
  uint32_t seed = 1;
  for (uint64_t p : periods) {
    Accuracy acc;
    size_t scenarios = 0;
    for (Kind k : kinds) {
      const int max_syncs = (k == Kind::kStreamSync || k == Kind::kNcclThenSync) ? 3 : 1;
      for (int syncs = 1; syncs <= max_syncs; ++syncs) {
        Spec sp;
        sp.period = p;
        sp.kind = k;
        sp.syncs = syncs;
        sp.seed = seed++;
        // Ranks cycle 1, 8 (Event::rank of one pid), 64 (a pid each).
        const int variant = static_cast<int>(sp.seed % 3);
        sp.ranks = variant == 0 ? 1 : (variant == 1 ? 8 : 64);
        sp.rank_field = variant == 1;
        check(sp, acc);
        ++scenarios;
        if (HasFatalFailure()) return;
      }
    }
    std::printf(
        "step %8.0f ms: %zu scenarios, %zu processes: period error mean %.4f%% max %.4f%%; boundary error "
        "mean %.4f%% max %.4f%% of a step (%zu boundaries)\n",
        static_cast<double>(p) / 1e6, scenarios, acc.processes,
        100 * acc.sum_period_err / static_cast<double>(acc.processes), 100 * acc.max_period_err,
        100 * acc.sum_boundary_err / static_cast<double>(acc.boundaries), 100 * acc.max_boundary_err, acc.boundaries);
  }
}

TEST(StepInference, PoissonCallsHaveNoPeriod) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    std::exponential_distribution<double> sync_gap(1.0 / (20.0 * kMs)), launch_gap(1.0 / (0.5 * kMs));
    std::uniform_real_distribution<double> u01(0, 1);
    std::vector<Event> ev;
    ev.reserve(3000);
    auto x = static_cast<double>(kT0);
    for (int i = 0; i < 3000; ++i) {
      x += sync_gap(rng);
      ev.push_back(call(777, -1, Source::kCuda, op::kCudaStreamSync, static_cast<uint64_t>(x),
                        static_cast<uint64_t>(u01(rng) * 2 * kMs)));
    }
    const double end = x;
    for (x = static_cast<double>(kT0); x < end; x += launch_gap(rng))
      ev.push_back(call(777, -1, Source::kCuda, op::kCudaLaunchKernel, static_cast<uint64_t>(x), 5000));
    std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
    const auto got = run(ev, 1000);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].method, "none") << "seed " << seed << ": " << got[0].method << " period " << got[0].period_ns
                                     << " confidence " << got[0].confidence;
    EXPECT_EQ(got[0].period_ns, 0u);
    EXPECT_EQ(got[0].confidence, 0.0);
    EXPECT_NE(got[0].reason.find("no regular spacing"), std::string::npos) << got[0].reason;
    EXPECT_EQ(got[0].fallback_interval_ns, StepInference::kFallbackIntervalNs);
    ASSERT_GE(got[0].boundaries.size(), 2u);
    EXPECT_EQ(got[0].boundaries[1] - got[0].boundaries[0], StepInference::kFallbackIntervalNs);
    if (seed == 1) std::printf("poisson: %s\n", got[0].reason.c_str());
  }
}

TEST(StepInference, TooFewCallsAndNoMarkersSayWhy) {
  std::vector<Event> ev;
  ev.reserve(14);
  for (int i = 0; i < 3; ++i)
    ev.push_back(call(10, -1, Source::kCuda, op::kCudaStreamSync, kT0 + static_cast<uint64_t>(i) * 50 * kMs, kMs));
  for (int i = 0; i < 10; ++i)
    ev.push_back(call(11, -1, Source::kCuda, op::kCudaMalloc, kT0 + static_cast<uint64_t>(i) * 50 * kMs, kMs));
  ev.push_back(call(12, -1, Source::kHost, op::kSchedSwitch, kT0, kMs));  // not a GPU process: no entry
  const auto got = run(ev, 4);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].method, "none");
  EXPECT_NE(got[0].reason.find("too few markers"), std::string::npos) << got[0].reason;
  EXPECT_EQ(got[1].method, "none");
  EXPECT_NE(got[1].reason.find("no synchronisation or kernel launch"), std::string::npos) << got[1].reason;
}

// A thread launching in a tight loop (every 5 us) that a CPU hog preempts for 4 ms in every 8 ms
// (the scheduler's time slices): the launch gaps are preemption, not steps. Without the sched
// spans the same launches would read as 8 ms "steps" (the control), with them: no period.
TEST(StepInference, PreemptionGapsAreNotSteps) {
  std::vector<Event> with, without;
  constexpr uint64_t kSlice = 4 * kMs;
  for (uint64_t slice = 0; slice < 200; ++slice) {
    const uint64_t start = kT0 + slice * 2 * kSlice;
    for (uint64_t t = start; t < start + kSlice; t += 5'000) {
      with.push_back(call(30, -1, Source::kCuda, op::kCudaLaunchKernel, t, 1'000));
      without.push_back(with.back());
    }
    Event off = call(30, -1, Source::kHost, op::kSchedSwitch, start + kSlice, kSlice - 1'000, 99);
    off.prev_state = OffCpuState::kPreempted;
    with.push_back(off);
  }
  const auto control = run(without, 4096);
  ASSERT_EQ(control.size(), 1u);
  EXPECT_NE(control[0].method, "none") << "the control should read the slices as steps";
  const auto got = run(with, 4096);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].method, "none") << got[0].method << " period " << got[0].period_ns;
}

bool same(const ProcessSteps& a, const ProcessSteps& b, uint64_t shift) {
  if (a.pid != b.pid || a.rank != b.rank || a.node != b.node || a.count != b.count || a.period_ns != b.period_ns ||
      a.p50_ns != b.p50_ns || a.p99_ns != b.p99_ns || a.method != b.method || a.reason != b.reason ||
      a.confidence != b.confidence || a.boundaries.size() != b.boundaries.size() || a.first_ns + shift != b.first_ns)
    return false;
  for (size_t i = 0; i < a.boundaries.size(); ++i)
    if (a.boundaries[i] + shift != b.boundaries[i]) return false;
  return true;
}

TEST(StepInference, SameResultForAnyBatchSizeAndAnyTimeShift) {
  for (Kind k : {Kind::kStreamSync, Kind::kBurstsOnly, Kind::kNcclThenSync}) {
    Spec sp;
    sp.kind = k;
    sp.syncs = 2;
    sp.ranks = 4;
    sp.period = 20 * kMs;
    std::vector<Truth> truth;
    const auto ev = generate(sp, truth);
    const auto ref = run(ev, ev.size());
    ASSERT_EQ(ref.size(), 4u);
    for (size_t batch : {size_t{1}, size_t{7}, size_t{333}, size_t{4096}}) {
      const auto got = run(ev, batch);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(same(ref[i], got[i], 0)) << kind_name(k) << " batch " << batch;
    }
    for (uint64_t shift : {uint64_t{1}, uint64_t{987'654'321}, uint64_t{3'600'000'000'000}}) {
      auto moved = ev;
      for (auto& e : moved) e.ts_ns += shift;
      const auto got = run(moved, 500);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(same(ref[i], got[i], shift)) << kind_name(k) << " shift " << shift;
    }
  }
}

TEST(StepInference, AStallIsASlowStepNotALostPhase) {
  for (int syncs : {1, 3}) {
    Spec sp;
    sp.syncs = syncs;
    sp.period = 50 * kMs;
    sp.steps = 60;
    sp.stall_step = 30;
    std::vector<Truth> truth;
    const auto ev = generate(sp, truth);
    const auto got = run(ev, 4096);
    ASSERT_EQ(got.size(), 1u);
    const auto& s = got[0];
    ASSERT_NE(s.method, "none") << s.reason;
    EXPECT_EQ(s.method, "cudaStreamSynchronize x" + std::to_string(syncs));
    EXPECT_NEAR(static_cast<double>(s.period_ns), 50e6, 0.03 * 50e6) << "the stall is not in the period";
    EXPECT_NEAR(static_cast<double>(s.p50_ns), 50e6, 0.06 * 50e6);
    EXPECT_GE(static_cast<double>(s.p99_ns), 2.5 * 50e6) << "the stalled step is the p99";
    EXPECT_EQ(s.boundaries.size(), truth[0].boundaries.size()) << "one boundary per step, after the stall too";
    for (size_t i = 0; i < std::min(s.boundaries.size(), truth[0].boundaries.size()); ++i)
      EXPECT_EQ(s.boundaries[i], truth[0].boundaries[i]) << "boundary " << i;
  }
}

TEST(StepInference, MarkersBeyondTheCapAreCountedNotKept) {
  Spec sp;
  sp.period = 5 * kMs;
  sp.steps = 10'000;
  sp.noise = false;
  std::vector<Truth> truth;
  const auto ev = generate(sp, truth);
  const auto got = run(ev, 4096);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].method, "cudaStreamSynchronize x1");
  EXPECT_NEAR(static_cast<double>(got[0].count), 9999.0, 1.0);
  EXPECT_LE(got[0].boundaries.size(), StepInference::kMaxMarkers);
  EXPECT_GE(got[0].boundaries.size(), StepInference::kMaxMarkers - 1);
  EXPECT_EQ(got[0].boundaries.back(), truth[0].boundaries.back()) << "the latest markers are the ones kept";
}

TEST(StepInference, JsonOnlyWhenThereAreStepsAndOneTextLinePerProcess) {
  AnalysisResult r;
  r.meta.process_names[4242] = "python3";
  EXPECT_FALSE(explain_json(r).contains("steps"));
  EXPECT_EQ(explain_text(r).find("Steps"), std::string::npos);
  ProcessSteps a;
  a.pid = 4242;
  a.count = 1204;
  a.period_ns = 48'200'000;
  a.p50_ns = 48'000'000;
  a.p99_ns = 61'300'000;
  a.method = "cudaStreamSynchronize x1";
  a.confidence = 0.97;
  ProcessSteps b;
  b.pid = 77;
  b.rank = 3;
  b.method = "none";
  b.reason = "no regular spacing";
  b.fallback_interval_ns = StepInference::kFallbackIntervalNs;
  r.steps = {a, b};
  const auto j = explain_json(r);
  ASSERT_TRUE(j.contains("steps"));
  ASSERT_EQ(j["steps"].size(), 2u);
  for (const char* key : {"pid", "rank", "count", "period_ns", "p50_ns", "p99_ns", "method", "confidence"})
    EXPECT_TRUE(j["steps"][0].contains(key)) << key;
  EXPECT_EQ(j["steps"][0]["period_ns"], 48'200'000u);
  EXPECT_EQ(j["steps"][1]["method"], "none");
  EXPECT_EQ(j["steps"][1]["rank"], 3);
  const std::string text = steps_text(r);
  EXPECT_NE(text.find("pid 4242 (python3): 1,204 steps, period 48.2 ms (p50 48.0 ms, p99 61.3 ms), recognised by "
                      "cudaStreamSynchronize x1, confidence 0.97\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("pid 77 (pid 77) rank 3: no period: no regular spacing; fixed 1.00 s intervals instead"),
            std::string::npos)
      << text;
  EXPECT_NE(explain_text(r).find("  pid 4242 (python3): 1,204 steps"), std::string::npos);
}

// --- Ingero's recorded traces ------------------------------------------------------------------

TEST(StepInference, RecordedIngeroTraces) {
  const std::filesystem::path dir = INGERO_SHARED_DATA;
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no shared Ingero traces at " << dir;
  size_t traces = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".db") continue;
    std::string error;
    auto src = open_sqlite_trace(entry.path().string(), error);
    ASSERT_TRUE(src) << error;
    ++traces;
    StepInference si;
    Batch b;
    while (src->next(b)) {
      const auto& v = b.view();
      si.observe(v.data(), v.size());
      if (b.final) break;
    }
    AnalysisResult r;
    r.meta = src->meta();
    si.finish(r.meta, r);
    std::printf("%s:\n%s", entry.path().filename().c_str(), steps_text(r).c_str());
    if (entry.path().filename() == "pytorch-dataloader-starvation.db") {
      // Read by hand from the trace: after a fast phase (six ~63 ms iterations at 0.24-0.62 s),
      // pid 2233's cudaStreamSync returns at 13.05, 19.41, 25.59, 31.80, 38.06, 44.69, 50.22 s
      // after its first call: the DataLoader-starved iterations, about 6.2 s each.
      ASSERT_EQ(r.steps.size(), 1u);
      EXPECT_EQ(r.steps[0].pid, 2233u);
      EXPECT_EQ(r.steps[0].method, "cudaStreamSynchronize x1");
      EXPECT_NEAR(static_cast<double>(r.steps[0].period_ns), 6.2e9, 0.2e9);
    }
    for (const auto& s : r.steps) {
      EXPECT_TRUE(std::is_sorted(s.boundaries.begin(), s.boundaries.end()));
      if (s.method == "none") {
        EXPECT_EQ(s.period_ns, 0u);
        EXPECT_EQ(s.confidence, 0.0);
        EXPECT_FALSE(s.reason.empty());
        continue;
      }
      EXPECT_GE(s.confidence, StepInference::kMinConfidence);
      EXPECT_GT(s.period_ns, 0u);
      EXPECT_LE(s.p50_ns, s.p99_ns);
      EXPECT_GE(s.count, StepInference::kMinSteps);
      EXPECT_LE(s.period_ns, s.last_ns - s.first_ns) << "a period longer than the process's GPU activity";
      ASSERT_GE(s.boundaries.size(), 2u);
      EXPECT_GE(s.boundaries.front(), s.first_ns);
      EXPECT_LE(s.boundaries.back(), s.last_ns);
    }
  }
  if (traces == 0) GTEST_SKIP() << "no .db under " << dir;
}

// Explicit step markers (StepInference::add_markers, `trace --annotate`): they win.

StepMarker marker(uint32_t pid, uint64_t ts, int64_t step, int64_t epoch = -1, uint16_t node = 0) {
  StepMarker m;
  m.ts_ns = ts;
  m.pid = pid;
  m.node = node;
  m.has_step = true;
  m.step = step;
  m.has_epoch = epoch >= 0;
  m.epoch = epoch;
  return m;
}

std::vector<ProcessSteps> run_with(const std::vector<Event>& ev, const std::vector<StepMarker>& markers) {
  StepInference si;
  si.add_markers(markers);
  si.observe(ev.data(), ev.size());
  AnalysisResult r;
  si.finish(TraceMeta{}, r);
  return r.steps;
}

TEST(StepInference, ExplicitMarkersWinAndOthersStillInfer) {
  // Two processes stepping every 50 ms by their stream syncs; pid 4000 also says where its steps
  // are, every second sync (e.g. it counts optimizer steps over two micro-batches).
  Spec sp;
  sp.ranks = 2;
  std::vector<Truth> truth;
  const auto ev = generate(sp, truth);
  ASSERT_EQ(truth.size(), 2u);
  std::vector<StepMarker> m;
  for (size_t i = 0; i < truth[0].boundaries.size(); i += 2)
    m.push_back(marker(truth[0].pid, truth[0].boundaries[i], static_cast<int64_t>(i / 2)));
  const auto got = run_with(ev, m);
  ASSERT_EQ(got.size(), 2u);
  const ProcessSteps* a = find(got, truth[0].pid, truth[0].rank);
  const ProcessSteps* b = find(got, truth[1].pid, truth[1].rank);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->method, "annotated (step)");
  EXPECT_EQ(a->confidence, 1.0);
  EXPECT_TRUE(a->reason.empty());
  EXPECT_EQ(a->count, m.size() - 1);
  ASSERT_EQ(a->boundaries.size(), m.size());
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(a->boundaries[i], m[i].ts_ns);
  EXPECT_NEAR(static_cast<double>(a->period_ns), 2 * truth[0].mean_period, 0.02 * 2 * truth[0].mean_period);
  EXPECT_LE(a->p50_ns, a->p99_ns);
  EXPECT_EQ(a->rank, truth[0].rank);
  EXPECT_EQ(a->fallback_interval_ns, 0u);
  // Its GPU span, not the markers', still bounds the process.
  EXPECT_LT(a->first_ns, m.front().ts_ns);
  // The other process: inferred exactly as without markers.
  const auto alone = run(ev, 4096);
  const ProcessSteps* b0 = find(alone, truth[1].pid, truth[1].rank);
  ASSERT_NE(b0, nullptr);
  EXPECT_EQ(b->method, "cudaStreamSynchronize x1");
  EXPECT_EQ(b->method, b0->method);
  EXPECT_EQ(b->period_ns, b0->period_ns);
  EXPECT_EQ(b->boundaries, b0->boundaries);
  EXPECT_EQ(b->confidence, b0->confidence);
}

TEST(StepInference, RepeatedStepNumbersAreOneStepAndEpochEndsAreLeftOutOfThePeriod) {
  // Lightning with accumulate_grad_batches=4: on_train_batch_start every 10 ms, global_step
  // advancing every 4 batches; 5 optimizer steps an epoch, then 300 ms of validation.
  std::vector<StepMarker> m;
  uint64_t t = kT0;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    StepMarker e = marker(7, t, -1, epoch);
    e.has_step = false;  // on_train_epoch_start: epoch only
    m.push_back(e);
    for (int s = 0; s < 5; ++s, ++step)
      for (int micro = 0; micro < 4; ++micro, t += 10 * kMs) m.push_back(marker(7, t, step, epoch));
    t += 300 * kMs;
  }
  const auto got = run_with({}, m);
  ASSERT_EQ(got.size(), 1u);
  const ProcessSteps& s = got[0];
  EXPECT_EQ(s.pid, 7u);
  EXPECT_EQ(s.rank, -1);
  EXPECT_EQ(s.method, "annotated (step)");
  EXPECT_EQ(s.count, 19u);  // 20 optimizer steps = 20 boundaries
  EXPECT_EQ(s.boundaries.size(), 20u);
  EXPECT_EQ(s.epochs, 4u);
  EXPECT_EQ(s.period_ns, 40 * kMs);  // the 3 epoch-crossing intervals (340 ms) are left out
  EXPECT_EQ(s.p50_ns, 40 * kMs);
  EXPECT_EQ(s.p99_ns, 40 * kMs);
  // No GPU call: the markers bound the entry.
  EXPECT_EQ(s.first_ns, kT0);
  EXPECT_EQ(s.last_ns, m.back().ts_ns);
}

TEST(StepInference, StepLabelsThatAreNotNumbersMakeEveryMarkerABoundary) {
  std::vector<StepMarker> m;
  for (int i = 0; i < 10; ++i) m.push_back(marker(9, kT0 + static_cast<uint64_t>(i) * 25 * kMs, -1));
  const auto got = run_with({}, m);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].count, 9u);
  EXPECT_EQ(got[0].period_ns, 25 * kMs);
  EXPECT_EQ(got[0].epochs, 0u);
}

TEST(StepInference, TooFewMarkersOrAnotherNodeLeaveTheInference) {
  Spec sp;
  std::vector<Truth> truth;
  const auto ev = generate(sp, truth);
  const auto alone = run(ev, 4096);
  ASSERT_EQ(alone.size(), 1u);
  // One marker: no complete step. Markers of the same pid on another node: another process.
  std::vector<StepMarker> m{marker(truth[0].pid, truth[0].boundaries[3], 3)};
  for (int i = 0; i < 10; ++i)
    m.push_back(marker(truth[0].pid, kT0 + static_cast<uint64_t>(i) * 100 * kMs, i, -1, /*node=*/1));
  m.push_back(marker(truth[0].pid, 0, 99));  // no time: ignored
  const auto got = run_with(ev, m);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].node, 0);
  EXPECT_EQ(got[0].method, alone[0].method);
  EXPECT_EQ(got[0].boundaries, alone[0].boundaries);
  EXPECT_EQ(got[1].node, 1);
  EXPECT_EQ(got[1].pid, truth[0].pid);
  EXPECT_EQ(got[1].method, "annotated (step)");
  EXPECT_EQ(got[1].period_ns, 100 * kMs);
}

TEST(StepInference, MarkersInAnyOrderFromAnyThreadGiveTheSameSteps) {
  std::vector<StepMarker> m;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<uint64_t> jitter(0, 4 * kMs);
  for (int pid = 1; pid <= 3; ++pid)
    for (int i = 0; i < 200; ++i)
      m.push_back(marker(static_cast<uint32_t>(pid * 100), kT0 + static_cast<uint64_t>(i) * 50 * kMs + jitter(rng), i));
  const auto in_order = run_with({}, m);
  std::shuffle(m.begin(), m.end(), rng);
  StepInference si;
  std::vector<std::thread> threads;
  for (size_t k = 0; k < 4; ++k)
    threads.emplace_back([&si, &m, k] {
      for (size_t i = k; i < m.size(); i += 4) si.add_markers(std::span<const StepMarker>(&m[i], 1));
    });
  for (auto& th : threads) th.join();
  AnalysisResult r;
  si.finish(TraceMeta{}, r);
  ASSERT_EQ(r.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.steps[i].pid, in_order[i].pid);
    EXPECT_EQ(r.steps[i].boundaries, in_order[i].boundaries);
    EXPECT_EQ(r.steps[i].period_ns, in_order[i].period_ns);
    EXPECT_EQ(r.steps[i].count, 199u);
    EXPECT_NEAR(static_cast<double>(r.steps[i].period_ns), 50.0 * kMs, 1.0 * kMs);
  }
}

TEST(StepInference, MarkersBeyondTheCapAreCountedAndTheJsonAndTextSayAnnotated) {
  std::vector<StepMarker> m;
  for (int i = 0; i < 10000; ++i) m.push_back(marker(5, kT0 + static_cast<uint64_t>(i) * kMs, i, i / 1000));
  StepInference si;
  si.add_markers(m);
  AnalysisResult r;
  si.finish(TraceMeta{}, r);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].boundaries.size(), StepInference::kMaxMarkers);
  EXPECT_EQ(r.steps[0].boundaries.back(), m.back().ts_ns);
  EXPECT_EQ(r.steps[0].count, 9999u);
  EXPECT_EQ(r.steps[0].epochs, 10u);
  const auto j = explain_json(r);
  ASSERT_TRUE(j.contains("steps"));
  EXPECT_EQ(j["steps"][0]["method"], "annotated (step)");
  EXPECT_EQ(j["steps"][0]["confidence"], 1.0);
  EXPECT_EQ(j["steps"][0]["epochs"], 10);
  EXPECT_EQ(j["steps"][0]["period_ns"], kMs);
  EXPECT_NE(steps_text(r).find("recognised by annotated (step), confidence 1.00"), std::string::npos) << steps_text(r);
}

}  // namespace
}  // namespace ingero

// ---- StepTracker: the same steps online, as events (operators/step_tracker.h) ----------------
namespace ingero {
namespace {

// The steps of `ev` fed in batches of `batch` (a flush after each), in (pid, rank, ordinal) order;
// `markers`: the program's own step markers, given first.
std::vector<Event> track(const std::vector<Event>& ev, size_t batch, const std::vector<StepMarker>& markers = {}) {
  StepTracker t;
  t.add_markers(markers);
  std::vector<Event> out;
  for (size_t i = 0; i < ev.size(); i += batch) {
    const size_t n = std::min(batch, ev.size() - i);
    t.observe(ev.data() + i, n);
    t.flush(i + n == ev.size(), out);
  }
  std::stable_sort(out.begin(), out.end(), [](const Event& a, const Event& b) {
    return std::tie(a.pid, a.rank, a.arg0) < std::tie(b.pid, b.rank, b.arg0);
  });
  return out;
}

// Per (pid, rank): the step events in ordinal order; checks the stream's own invariants.
std::map<std::pair<uint32_t, int16_t>, std::vector<Event>> by_process(const std::vector<Event>& steps,
                                                                      const std::string& what) {
  std::map<std::pair<uint32_t, int16_t>, std::vector<Event>> m;
  for (const Event& e : steps) {
    EXPECT_EQ(e.source, Source::kStep) << what;
    EXPECT_TRUE(e.flags & event_flags::kSynthetic) << what;
    m[{e.pid, e.rank}].push_back(e);
  }
  for (const auto& [k, v] : m)
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_EQ(v[i].arg0, i) << what << ": ordinals 0, 1, 2, ... in order";
      if (i) {
        EXPECT_EQ(v[i].ts_ns, v[i - 1].end_ns()) << what << ": each step starts where the previous ended";
      }
    }
  return m;
}

TEST(StepTracker, OnlineStepsMatchTheTruthAtEveryStepLength) {
  uint32_t seed = 7;
  for (uint64_t p : {5 * kMs, 50 * kMs, 500 * kMs, 10'000 * kMs}) {
    for (Kind k : {Kind::kStreamSync, Kind::kNcclThenSync, Kind::kBurstsOnly}) {
      for (size_t batch : {size_t{1}, size_t{4096}}) {
        Spec sp;
        sp.period = p;
        sp.kind = k;
        sp.syncs = k == Kind::kStreamSync ? 2 : 1;
        sp.ranks = 4;
        sp.steps = 60;
        sp.seed = seed++;
        std::vector<Truth> truth;
        const auto ev = generate(sp, truth);
        const std::string what = std::string(kind_name(k)) + " period " + std::to_string(p / kMs) + " ms batch " +
                                 std::to_string(batch);
        const auto m = by_process(track(ev, batch), what);
        ASSERT_EQ(m.size(), truth.size()) << what;
        for (const auto& t : truth) {
          const auto it = m.find({t.pid, t.rank});
          ASSERT_NE(it, m.end()) << what;
          const auto& steps = it->second;
          // Locking on needs kMinSteps steps; every step after it comes out, none invented.
          EXPECT_GE(steps.size() + 12, t.boundaries.size() - 1) << what;
          EXPECT_LE(steps.size(), t.boundaries.size() - 1) << what;
          for (const Event& e : steps)
            for (uint64_t b : {e.ts_ns, e.end_ns()}) {
              auto at = std::lower_bound(t.boundaries.begin(), t.boundaries.end(), b);
              double err = 1e300;
              if (at != t.boundaries.end()) err = static_cast<double>(*at - b);
              if (at != t.boundaries.begin()) err = std::min(err, static_cast<double>(b - *(at - 1)));
              EXPECT_LT(err / t.mean_period, 0.05) << what << ": boundary off the truth";
            }
          for (const Event& e : steps) EXPECT_NEAR(static_cast<double>(e.dur_ns), t.mean_period, 0.2 * t.mean_period);
        }
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(StepTracker, APaceChangeIsFollowedAndAStallIsOneLongStep) {
  Spec a;
  a.period = 50 * kMs;
  a.steps = 150;
  a.stall_step = 120;
  a.seed = 3;
  std::vector<Truth> ta, tb;
  auto ev = generate(a, ta);
  Spec b = a;
  b.period = 80 * kMs;
  b.steps = 150;
  b.stall_step = -1;
  b.seed = 4;
  auto second = generate(b, tb);
  const uint64_t shift = ev.back().end_ns() + 10 * kMs - second.front().ts_ns;
  for (auto& e : second) ev.push_back((e.ts_ns += shift, e));
  const auto m = by_process(track(ev, 512), "pace change");
  ASSERT_EQ(m.size(), 1u);
  const auto& steps = m.begin()->second;
  size_t fast = 0, slow = 0, stalls = 0;
  for (const Event& e : steps) {
    const double ms = static_cast<double>(e.dur_ns) / 1e6;
    if (ms > 45 && ms < 55) ++fast;
    if (ms > 72 && ms < 88) ++slow;
    if (ms > 120) ++stalls;
  }
  EXPECT_GE(fast, 100u);
  EXPECT_GE(slow, 100u) << "the 80 ms phase is tracked after the change";
  EXPECT_GE(stalls, 1u) << "the stalled step is one long step";
  EXPECT_LE(stalls, 3u);
}

TEST(StepTracker, PoissonCallsGiveNoSteps) {
  std::mt19937_64 rng(11);
  std::exponential_distribution<double> gap(1.0 / (20.0 * kMs));
  std::vector<Event> ev;
  auto x = static_cast<double>(kT0);
  for (int i = 0; i < 3000; ++i) {
    x += gap(rng);
    ev.push_back(call(777, -1, Source::kCuda, op::kCudaStreamSync, static_cast<uint64_t>(x), kMs));
  }
  EXPECT_TRUE(track(ev, 100).empty());
}

TEST(StepTracker, TheSameStepsForAnyBatchSizeAndFlushSpacing) {
  for (Kind k : {Kind::kStreamSync, Kind::kBurstsOnly, Kind::kNcclThenSync}) {
    Spec sp;
    sp.kind = k;
    sp.period = 20 * kMs;
    sp.syncs = 3;
    sp.ranks = 4;
    sp.steps = 200;
    sp.seed = 21;
    std::vector<Truth> truth;
    const auto ev = generate(sp, truth);
    const auto ref = track(ev, ev.size());
    ASSERT_GT(ref.size(), 4u * 150u) << kind_name(k);
    for (size_t batch : {size_t{1}, size_t{97}, size_t{4096}}) {
      const auto got = track(ev, batch);
      ASSERT_EQ(got.size(), ref.size()) << kind_name(k) << " batch " << batch;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].ts_ns, ref[i].ts_ns) << kind_name(k) << " batch " << batch << " step " << i;
        EXPECT_EQ(got[i].dur_ns, ref[i].dur_ns);
        EXPECT_EQ(got[i].arg0, ref[i].arg0);
        EXPECT_EQ(got[i].arg1, ref[i].arg1);
        EXPECT_EQ(got[i].flags, ref[i].flags);
        EXPECT_EQ(got[i].pid, ref[i].pid);
        if (HasFailure()) return;
      }
    }
  }
}

TEST(StepTracker, ExplicitMarkersWinForTheirProcessOnly) {
  // Two processes with regular syncs every 20 ms; pid 4000 also sent a "step" marker every 60 ms
  // (its own notion of a step: three syncs), with gradient accumulation's repeated step numbers.
  Spec sp;
  sp.period = 20 * kMs;
  sp.ranks = 2;
  sp.steps = 300;
  sp.seed = 5;
  std::vector<Truth> truth;
  const auto ev = generate(sp, truth);
  std::vector<StepMarker> marks;
  const uint64_t t0 = truth[0].boundaries.front();
  for (int i = 0; i < 90; ++i) {
    StepMarker m;
    m.pid = 4000;
    m.ts_ns = t0 + static_cast<uint64_t>(i) * 60 * kMs;
    m.has_step = true;
    m.step = i;
    marks.push_back(m);
    if (i % 2 == 0) {  // a repeated step number (a micro-batch) is no boundary
      m.ts_ns += 5 * kMs;
      m.tid = 77;
      marks.push_back(m);
    }
  }
  std::vector<std::vector<Event>> runs;
  for (size_t batch : {size_t{1}, size_t{333}, ev.size()}) runs.push_back(track(ev, batch, marks));
  const auto m = by_process(runs[0], "markers");
  ASSERT_EQ(m.size(), 2u);
  const auto& marked = m.at({4000, 0});
  ASSERT_EQ(marked.size(), 89u) << "one step between each two of the 90 step numbers";
  for (size_t i = 0; i < marked.size(); ++i) {
    EXPECT_EQ(marked[i].ts_ns, t0 + i * 60 * kMs);
    EXPECT_EQ(marked[i].dur_ns, 60 * kMs);
    EXPECT_FALSE(marked[i].flags & event_flags::kStepIrregular);
  }
  // The other process is still inferred: its ~20 ms steps.
  const auto& other = m.at({4001, 1});
  ASSERT_GT(other.size(), 250u);
  for (const Event& e : other) EXPECT_NEAR(static_cast<double>(e.dur_ns), 20e6, 0.2 * 20e6);
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size()) << "batch variant " << r;
    for (size_t i = 0; i < runs[r].size(); ++i) {
      EXPECT_EQ(runs[r][i].ts_ns, runs[0][i].ts_ns);
      EXPECT_EQ(runs[r][i].dur_ns, runs[0][i].dur_ns);
      EXPECT_EQ(runs[r][i].arg0, runs[0][i].arg0);
    }
  }
}

// A service's churn (evict_exited): 300 short processes, each with a step loop of its own period
// (a stream sync per step, launches before it), most ending with their leader's process_exit.
TEST(StepInference, EvictingExitedProcessesGivesTheSameEntriesWithBoundedState) {
  std::mt19937_64 rng(44);
  std::vector<Event> ev;
  for (uint32_t p = 0; p < 300; ++p) {
    const uint32_t pid = 5000 + p;
    const uint64_t start = kT0 + rng() % (300'000 * kMs), period = (5 + rng() % 40) * kMs;
    const uint64_t steps = 10 + rng() % 50;
    uint64_t t = start;
    for (uint64_t i = 0; i < steps; ++i, t += period) {
      for (int l = 0; l < 4; ++l) {
        Event e;
        e.ts_ns = t + static_cast<uint64_t>(l) * kMs / 4;
        e.dur_ns = 10'000;
        e.pid = e.tid = pid;
        e.source = Source::kCuda;
        e.op = op::kCudaLaunchKernel;
        ev.push_back(e);
      }
      Event sync;
      sync.ts_ns = t + 2 * kMs;
      sync.dur_ns = period / 2 + rng() % 100'000;
      sync.pid = sync.tid = pid;
      sync.source = Source::kCuda;
      sync.op = op::kCudaStreamSync;
      ev.push_back(sync);
    }
    if (p % 7 == 0) continue;  // its exit was not seen: it stays live
    Event x;
    x.ts_ns = t + period;
    x.pid = x.tid = pid;
    x.source = Source::kHost;
    x.op = op::kProcessExit;
    ev.push_back(x);
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  StepInference plain, evicting;
  evicting.evict_exited(1000);
  size_t most_live = 0;
  for (size_t i = 0; i < ev.size(); i += 1024) {
    const size_t n = std::min<size_t>(1024, ev.size() - i);
    plain.observe(ev.data() + i, n);
    evicting.observe(ev.data() + i, n);
    most_live = std::max(most_live, evicting.live_keys());
  }
  EXPECT_EQ(plain.live_keys(), 300u);
  EXPECT_LT(most_live, 120u);  // the 43 never seen to exit, and those alive or within 5 s of their exit
  EXPECT_GT(evicting.finished_keys(), 200u);
  const auto want = plain.results(), got = evicting.results();
  ASSERT_EQ(got.size(), want.size());
  size_t with_period = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("pid " + std::to_string(want[i].pid));
    EXPECT_EQ(got[i].pid, want[i].pid);
    EXPECT_EQ(got[i].method, want[i].method);
    EXPECT_EQ(got[i].count, want[i].count);
    EXPECT_EQ(got[i].period_ns, want[i].period_ns);
    EXPECT_EQ(got[i].p99_ns, want[i].p99_ns);
    EXPECT_EQ(got[i].boundaries, want[i].boundaries);
    EXPECT_EQ(got[i].first_ns, want[i].first_ns);
    EXPECT_EQ(got[i].last_ns, want[i].last_ns);
    with_period += want[i].period_ns > 0;
  }
  EXPECT_GT(with_period, 250u);  // the loops were found: the comparison is of real entries
  // Past max_finished, the oldest judged entries go.
  StepInference small;
  small.evict_exited(10);
  small.observe(ev.data(), ev.size());
  EXPECT_EQ(small.finished_keys(), 10u);
  EXPECT_GT(small.finished_dropped(), 200u);
}

}  // namespace
}  // namespace ingero
