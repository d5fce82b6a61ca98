// Incidents (operators/incidents.h) end to end, as `explain` assembles them: the default rule pack
// through the engine, the chain annotator, the time accounting, step inference and GPU usage
// observers, then assemble_incidents. Generated traces with their ground truth:
// - a 30 s CPU hog on one feeding thread (three 10 s tail windows, thirty 1 s accounting windows)
//   is ONE incident on that thread, starting and ending with the hog (to the second), with a time
//   lost within 10% of the preempted time the hog took; a hog taking 20% of the thread is HIGH;
// - GPU-hours and cost of every incident add up to lost time x GPUs x price (GPUs from the trace
//   when its calls name devices, --gpus otherwise);
// - what-if: the step time without the cause, from the steps and the time lost;
// - the verdict names the incident first; with no hog it names the bound instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/ops.h"
#include "model/result_json.h"
#include "model/trace.h"
#include "operators/chain_annotate.h"
#include "operators/incidents.h"
#include "operators/step_inference.h"
#include "operators/time_accounting.h"
#include "rules/pack.h"

namespace ingero {
namespace {

constexpr uint64_t kSec = 1'000'000'000, kMs = 1'000'000, kUs = 1'000;
constexpr uint64_t kBase = 1'700'000'000 * kSec;

Event call(uint32_t tid, uint64_t ts, uint64_t dur, uint8_t o, uint8_t gpu) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = 100;
  e.tid = tid;
  e.source = Source::kCuda;
  e.op = o;
  e.gpu_id = gpu;
  return e;
}

Event preempt(uint64_t ts, uint64_t dur, uint32_t by) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = 100;
  e.tid = 101;
  e.source = Source::kHost;
  e.op = op::kSchedSwitch;
  e.prev_state = OffCpuState::kPreempted;
  e.arg0 = e.arg1 = by;
  return e;
}

struct Generated {
  std::vector<Event> ev;
  TraceMeta meta;
  uint64_t hog_ns = 0;  // ground truth: the preempted time the hog took
};

// `seconds` of a feeding thread (pid 100, tid 101): a step every 10 ms (launches every ~1 ms, then
// a 2 ms synchronise), on `gpus` devices; background preemption (~1%) by short tasks; from second
// `from` for `len` seconds a hog (pid 4242) preempts it for `share` of every 3 ms.
Generated generate(uint64_t seconds, uint64_t from, uint64_t len, double share, uint8_t gpus, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  Generated g;
  g.meta.process_names[100] = "trainer";
  g.meta.process_names[4242] = "ip-hog";
  uint64_t step = 0;
  for (uint64_t t = kBase; t < kBase + seconds * kSec; t += 10 * kMs, ++step) {
    for (uint64_t k = 0; k < 7; ++k)
      g.ev.push_back(call(101, t + k * kMs + uni(0, 100 * kUs), uni(10 * kUs, 30 * kUs), op::kCudaLaunchKernel,
                          static_cast<uint8_t>(step % gpus)));
    g.ev.push_back(call(101, t + 8 * kMs, 2 * kMs - uni(0, 50 * kUs), op::kCudaStreamSync, 0));
  }
  for (uint64_t t = kBase + uni(0, 50 * kMs); t < kBase + seconds * kSec; t += uni(40 * kMs, 80 * kMs))
    g.ev.push_back(preempt(t, uni(100 * kUs, 700 * kUs), 77));
  const auto slice = static_cast<uint64_t>(share * 3 * kMs);
  for (uint64_t t = kBase + from * kSec; t + 3 * kMs <= kBase + (from + len) * kSec; t += 3 * kMs) {
    g.ev.push_back(preempt(t + uni(0, 3 * kMs - slice), slice, 4242));
    g.hog_ns += slice;
  }
  std::stable_sort(g.ev.begin(), g.ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  g.meta.first_ts = g.ev.front().ts_ns;
  g.meta.last_ts = g.ev.back().ts_ns + g.ev.back().dur_ns;
  return g;
}

// Feeds every batch to the observers first (what cli/pipeline_common.h ObservingSource does).
class Observe final : public EventSource {
 public:
  Observe(EventSource& in, std::vector<EventObserver*> obs) : in_(in), obs_(std::move(obs)) {}
  bool next(Batch& b) override {
    if (!in_.next(b)) return false;
    for (auto* o : obs_) o->observe(b.view().data(), b.view().size());
    return true;
  }
  TraceMeta& meta() override { return in_.meta(); }

 private:
  EventSource& in_;
  std::vector<EventObserver*> obs_;
};

AnalysisResult explain(const Generated& g, const IncidentOptions& io) {
  VectorSource src(g.ev, 4096, g.meta);
  AccountingOptions ao;
  ao.chain_accounting = true;
  ao.meta = &src.meta();
  TimeAccounting accounting(ao);
  StepInference steps;
  GpuUsage gpus;
  Observe observed(src, {&accounting, &steps, &gpus});
  LiveChainAnnotator annotator(LiveChainAnnotator::replay_defaults());
  EventSource& annotated = annotator.tap(observed);
  EngineOptions eo;
  eo.on_chain = [&annotator](const Chain& c) { annotator.annotate(c); };
  std::vector<std::string> errors;
  static const Plan plan = rules::default_rule_pack_plan();
  AnalysisResult r = run_plan(plan, annotated, eo, &errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  annotator.finish(r);
  accounting.finish(src.meta(), r);
  steps.finish(src.meta(), r);
  assemble_incidents(r, io, &gpus);
  return r;
}

std::string incidents_text(const AnalysisResult& r) {
  std::string s;
  for (const auto& in : r.incidents)
    s += in.rule + " " + severity_name(in.severity) + " tid " + std::to_string(in.tid) + " [" +
         std::to_string((in.start_ns - kBase) / kMs) + "ms, " + std::to_string((in.end_ns - kBase) / kMs) +
         "ms) lost " + std::to_string(in.lost_ns / kMs) + "ms, " + std::to_string(in.chains.size()) + " chains\n";
  return s;
}

TEST(Incidents, ThirtySecondsOfContentionAreOneIncident) {
  for (uint64_t seed : {1, 2}) {
    const Generated g = generate(60, 15, 30, 0.45, 1, seed);
    const AnalysisResult r = explain(g, {});
    std::vector<const Incident*> hog;
    for (const auto& in : r.incidents)
      if (in.category == "cpu_contention" && in.tid == 101 && in.severity >= Severity::kMedium) hog.push_back(&in);
    ASSERT_EQ(hog.size(), 1u) << incidents_text(r);
    const Incident& in = *hog[0];
    EXPECT_EQ(in.rule, "cpu_preempted");
    EXPECT_EQ(in.start_ns, kBase + 15 * kSec) << incidents_text(r);
    EXPECT_EQ(in.end_ns, kBase + 45 * kSec) << incidents_text(r);
    EXPECT_NEAR(static_cast<double>(in.lost_ns), static_cast<double>(g.hog_ns), 0.10 * static_cast<double>(g.hog_ns))
        << incidents_text(r);
    EXPECT_EQ(in.severity, Severity::kHigh);
    EXPECT_EQ(r.incidents.front().id, in.id) << "the most time lost comes first\n" << incidents_text(r);
    // The steps (10 ms) inside it, and the what-if: the step without the hog's share of it.
    EXPECT_NEAR(static_cast<double>(in.steps), 3000.0, 30.0);
    ASSERT_TRUE(in.what_if_step_ns.has_value());
    EXPECT_LT(*in.what_if_step_ns, in.step_ns);
    EXPECT_EQ(*in.what_if_step_ns, in.step_ns - in.lost_ns / in.steps);
    // The verdict opens with where the time went, then names it first.
    EXPECT_EQ(r.bound, "");
    EXPECT_NE(r.verdict.find("1) HIGH cpu_contention on tid 101 of trainer (pid 100)"), std::string::npos) << r.verdict;
  }
}

// A moderate hog (under the rule's 30% that fires whatever the baseline) must not become its own
// baseline half-way: the windows that fired leave the thread's baseline (operators/trend.h
// retract), so 30 s of it is still one incident of 30 s.
TEST(Incidents, ModerateContentionStaysOneWholeIncident) {
  for (const double share : {0.20, 0.12}) {
    const Generated g = generate(60, 15, 30, share, 1, 5);
    const AnalysisResult r = explain(g, {});
    std::vector<const Incident*> hog;
    for (const auto& in : r.incidents)
      if (in.category == "cpu_contention" && in.tid == 101 && in.severity >= Severity::kMedium) hog.push_back(&in);
    ASSERT_EQ(hog.size(), 1u) << share << "\n" << incidents_text(r);
    EXPECT_EQ(hog[0]->start_ns, kBase + 15 * kSec) << share << "\n" << incidents_text(r);
    EXPECT_EQ(hog[0]->end_ns, kBase + 45 * kSec) << share << "\n" << incidents_text(r);
    EXPECT_NEAR(static_cast<double>(hog[0]->lost_ns), static_cast<double>(g.hog_ns),
                0.10 * static_cast<double>(g.hog_ns))
        << share << "\n"
        << incidents_text(r);
  }
}

// A neighbour present from the very start is its own baseline: the thread never had a normal
// window. From `standing_preempted_share` (15%) the rule fires whatever the baseline, so a standing
// 16-28% contention is one incident over the whole run, naming the task that ran instead, and the
// verdict never calls the job healthy. Without the hog: no incident of MEDIUM or HIGH, and the
// bound is not "cpu-contended".
TEST(Incidents, ContentionFromTheStartIsAnIncident) {
  for (const double share : {0.16, 0.22, 0.28}) {
    const Generated g = generate(20, 0, 20, share, 1, 7);
    const AnalysisResult r = explain(g, {});
    std::vector<const Incident*> hog;
    for (const auto& in : r.incidents)
      if (in.category == "cpu_contention" && in.severity >= Severity::kMedium) hog.push_back(&in);
    ASSERT_EQ(hog.size(), 1u) << share << "\n" << incidents_text(r);
    EXPECT_EQ(hog[0]->tid, 101u);
    EXPECT_LE(hog[0]->start_ns, kBase + kSec) << share << "\n" << incidents_text(r);
    EXPECT_GE(hog[0]->end_ns, kBase + 19 * kSec) << share << "\n" << incidents_text(r);
    EXPECT_NEAR(static_cast<double>(hog[0]->lost_ns), static_cast<double>(g.hog_ns),
                0.10 * static_cast<double>(g.hog_ns))
        << share << "\n"
        << incidents_text(r);
    EXPECT_EQ(r.bound, "") << r.verdict;  // an incident is named, not a bound
    EXPECT_NE(r.verdict.find(
                  "cpu_contention on tid 101 of trainer (pid 100), mostly ip-hog (pid 4242) running instead"),
              std::string::npos)
        << r.verdict;
    EXPECT_EQ(r.verdict.find("gpu-bound"), std::string::npos) << r.verdict;
  }
  const Generated none = generate(20, 0, 0, 0.0, 1, 7);
  const AnalysisResult r = explain(none, {});
  for (const auto& in : r.incidents) EXPECT_LT(in.severity, Severity::kMedium) << incidents_text(r);
  EXPECT_NE(r.bound, "cpu-contended") << r.verdict;
}

// The verdict's bound, from the main feeding thread's time alone (no incident): preemption or
// input waits of 15% or more are never "gpu-bound", even when most of the time is a GPU wait.
TEST(Incidents, MaterialContentionIsNeverCalledHealthy) {
  auto result = [](uint64_t sync, uint64_t preempted, uint64_t lock) {
    AnalysisResult r;
    ThreadAccounting a;
    a.pid = 100;
    a.tid = 101;
    a.comm = "trainer";
    a.scheduler_data = true;
    a.in_calls_ns["sync"] = sync * kMs;
    a.preempted_ns = preempted * kMs;
    if (preempted) a.preempted_by.push_back({4242, 4242, "stress-ng", preempted * kMs});
    a.blocked_ns["lock"] = lock * kMs;
    a.on_cpu_ns = (1000 - sync - preempted - lock) * kMs;
    a.wall_ns = 1000 * kMs;
    r.accounting.push_back(a);
    return r;
  };
  std::string text;
  EXPECT_EQ(make_verdict(result(700, 10, 0), text), "gpu-bound") << text;
  EXPECT_EQ(make_verdict(result(600, 180, 0), text), "cpu-contended") << text;
  EXPECT_NE(text.find("loses 18% of its time to other tasks, mostly stress-ng (pid 4242)"), std::string::npos) << text;
  EXPECT_EQ(make_verdict(result(600, 0, 200), text), "input-bound") << text;
  EXPECT_NE(text.find("waits for its input 20% of its time"), std::string::npos) << text;
  EXPECT_EQ(make_verdict(result(600, 140, 0), text), "gpu-bound") << text;  // below the floor
}

TEST(Incidents, TwentyPercentPreemptedIsHigh) {
  const Generated g = generate(40, 10, 20, 0.20, 1, 3);
  const AnalysisResult r = explain(g, {});
  const Incident* hog = nullptr;
  for (const auto& in : r.incidents)
    if (in.rule == "cpu_preempted" && in.tid == 101) hog = &in;
  ASSERT_NE(hog, nullptr) << incidents_text(r);
  EXPECT_EQ(hog->severity, Severity::kHigh) << incidents_text(r);
  for (const auto& c : r.chains)
    if (c.rule == "cpu_preempted") {
      EXPECT_EQ(c.declared_severity, Severity::kMedium);  // the rule says high only from 30%
      EXPECT_EQ(c.severity, Severity::kHigh) << c.root_cause;
    }
}

TEST(Incidents, GpuHoursAndCostAddUp) {
  // Two devices named by the calls: the trace wins over --gpus.
  IncidentOptions io;
  io.gpus = 8;
  io.rates.fallback = 2.5;
  for (uint8_t devices : {1, 2}) {
    const Generated g = generate(40, 10, 20, 0.45, devices, 4);
    const AnalysisResult r = explain(g, io);
    ASSERT_FALSE(r.incidents.empty());
    for (const auto& in : r.incidents) {
      const double gpus = devices == 2 ? 2.0 : 8.0;
      EXPECT_EQ(in.gpus, gpus) << in.id;
      EXPECT_EQ(in.gpus_from, devices == 2 ? "trace" : "--gpus");
      const double hours = static_cast<double>(in.lost_ns) / 3.6e12 * gpus;
      EXPECT_NEAR(in.gpu_hours, hours, 1e-12 * std::max(1.0, hours)) << in.id;
      ASSERT_TRUE(in.cost.has_value());
      EXPECT_NEAR(*in.cost, hours * 2.5, 1e-12 * std::max(1.0, hours)) << in.id;
      EXPECT_EQ(in.currency, "USD");
    }
    // The JSON carries the same numbers.
    const auto j = explain_json(r);
    ASSERT_EQ(j["incidents"].size(), r.incidents.size());
    EXPECT_EQ(j["incidents"][0]["lost_ns"].get<uint64_t>(), r.incidents[0].lost_ns);
    EXPECT_DOUBLE_EQ(j["incidents"][0]["cost"].get<double>(), *r.incidents[0].cost);
    EXPECT_EQ(j["verdict"].get<std::string>(), r.verdict);
  }
}

TEST(Incidents, NoContentionNamesTheBound) {
  const Generated g = generate(30, 0, 0, 0.0, 1, 5);
  const AnalysisResult r = explain(g, {});
  for (const auto& in : r.incidents) EXPECT_LT(in.severity, Severity::kMedium) << incidents_text(r);
  // 2 ms of every 10 ms step in a synchronise, ~0.2 ms in launches, the rest on CPU (no scheduler
  // data for the gaps is "on CPU" with recorded states): host-bound, said plainly.
  EXPECT_EQ(r.bound, "host-bound") << r.verdict;
  EXPECT_NE(r.verdict.find("No incident of MEDIUM or HIGH severity: the job is host-bound"), std::string::npos)
      << r.verdict;
}

// A rate finding has a time lost: the work done in a window at the reduced rate would have taken
// drop x window at the recent peak, so window x (1 - drop) is lost. The process launches 1000/s
// for 30 s, then 300/s for 30 s (each launch through the runtime and the driver: both ops fire,
// and each window is counted once): three 10 s windows at 30% of the peak, 21 s lost.
TEST(Incidents, ThroughputDropHasATimeLost) {
  Generated g;
  g.meta.process_names[100] = "server";
  for (uint64_t t = kBase; t < kBase + 60 * kSec;) {
    Event e = call(101, t, 10 * kUs, op::kCudaLaunchKernel, 0);
    g.ev.push_back(e);
    e.source = Source::kDriver;
    e.op = op::kCuLaunchKernel;
    e.ts_ns += 2 * kUs;
    e.dur_ns = 5 * kUs;
    g.ev.push_back(e);
    t += t < kBase + 30 * kSec ? kMs : 10 * kMs / 3;
  }
  std::stable_sort(g.ev.begin(), g.ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  g.meta.first_ts = g.ev.front().ts_ns;
  g.meta.last_ts = g.ev.back().ts_ns + g.ev.back().dur_ns;
  const AnalysisResult r = explain(g, {});
  const Incident* drop = nullptr;
  size_t chains = 0;
  for (const auto& in : r.incidents)
    if (in.rule == "throughput_drop") drop = &in;
  for (const auto& c : r.chains) chains += c.rule == "throughput_drop" ? 1 : 0;
  ASSERT_NE(drop, nullptr) << incidents_text(r);
  EXPECT_EQ(chains, 6u) << incidents_text(r);  // three windows x two ops
  EXPECT_EQ(drop->start_ns, kBase + 30 * kSec) << incidents_text(r);
  EXPECT_EQ(drop->end_ns, kBase + 60 * kSec) << incidents_text(r);
  EXPECT_NEAR(static_cast<double>(drop->lost_ns), 21e9, 0.02 * 21e9) << incidents_text(r);
  EXPECT_NE(drop->lost_basis.find("window x (1 - rate / peak)"), std::string::npos) << drop->lost_basis;
  EXPECT_NEAR(drop->lost_share, 21.0 / 60.0, 0.01);
  EXPECT_EQ(drop->gpu_hours, static_cast<double>(drop->lost_ns) / 3.6e12);
}

TEST(Incidents, RatesFileParsesAndNamesLineOnError) {
  GpuRates rates;
  std::string error;
  ASSERT_TRUE(parse_gpu_rates("# prices\ncurrency EUR\nnode-a 2.5\n* 1.75  # the rest\n", "r.txt", rates, error))
      << error;
  EXPECT_EQ(rates.currency, "EUR");
  EXPECT_EQ(rates.rate_for("node-a"), 2.5);
  EXPECT_EQ(rates.rate_for("other"), 1.75);
  EXPECT_FALSE(parse_gpu_rates("node-a 2.5\nnode-b cheap\n", "r.txt", rates, error));
  EXPECT_NE(error.find("r.txt:2:"), std::string::npos) << error;
  EXPECT_FALSE(parse_gpu_rates("node-a\n", "r.txt", rates, error));
  EXPECT_NE(error.find("r.txt:1:"), std::string::npos) << error;
}

}  // namespace
}  // namespace ingero
