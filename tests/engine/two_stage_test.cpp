// Two stages on two threads (engine.cpp, run_parallel: two threads split by window group with a
// router): the calling thread reads, routes and runs the light shard, a thread of its own the
// heavy shard, each waiting for the other by spinning and then sleeping on a futex. Whatever the
// waits do, the result is the one-thread result: with no spinning at all (every wait sleeps and
// is woken), with a source that stalls now and then (the heavy stage outwaits its spin), at batch
// sizes down to one event; the flow graph (INGERO_TWO_STAGE=0) gives the same; every chain reaches
// EngineOptions::on_chain once; an exception from the source stops the heavy stage's thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "model/ops.h"
#include "model/synth.h"
#include "rules/pack.h"
#include "tests/util/pack_run.h"

namespace ingero {
namespace {

using test::result_text;

// Sets an environment variable for the scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A source over `events` that sleeps `pause` before every `every`-th batch: the heavy stage runs
// out of work, spins its budget away and sleeps until the source hands it the next batch.
class StallingSource final : public EventSource {
 public:
  StallingSource(const std::vector<Event>& events, size_t batch, size_t every, std::chrono::microseconds pause)
      : inner_(events, batch), every_(every), pause_(pause) {}
  bool next(Batch& out) override {
    if (every_ && ++calls_ % every_ == 0) std::this_thread::sleep_for(pause_);
    return inner_.next(out);
  }
  TraceMeta& meta() override { return inner_.meta(); }
  PrefetchHint upcoming() override { return inner_.upcoming(); }

 private:
  BorrowedSource inner_;
  size_t every_;
  std::chrono::microseconds pause_;
  size_t calls_ = 0;
};

AnalysisResult run_with(EventSource& src, unsigned threads, const std::function<void(const Chain&)>& on_chain = {}) {
  static const Plan plan = rules::default_rule_pack_plan();
  EngineOptions o;
  o.threads = threads;
  o.on_chain = on_chain;
  std::vector<std::string> errors;
  auto r = run_plan(plan, src, o, &errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  return r;
}

std::vector<synth::SynthTrace> scenarios() {
  std::vector<synth::SynthTrace> v;
  v.push_back(synth::make_cpu_contention(true));
  v.push_back(synth::make_checkpoint_io(true));
  v.push_back(synth::make_straggler(true));
  return v;
}

void expect_one_thread_result(const char* what, size_t every, std::chrono::microseconds pause) {
  for (const auto& t : scenarios()) {
    SCOPED_TRACE(t.category);
    BorrowedSource one_src(t.events, 4096);
    const auto one = run_with(one_src, 1);
    ASSERT_GE(one.chains.size(), 1u);
    const std::string base = result_text(one);
    for (const size_t batch : {size_t{1}, size_t{33}, size_t{4096}}) {
      // One event a batch is ~10^5 batches: stall far less often there.
      StallingSource src(t.events, batch, every ? every * (batch == 1 ? 64 : 1) : 0, pause);
      const auto r = run_with(src, 2);
      EXPECT_EQ(r.counters.events_in, t.events.size()) << what << ", batch " << batch;
      EXPECT_EQ(r.counters.node_errors, 0u) << what << ", batch " << batch;
      EXPECT_TRUE(result_text(r) == base) << what << ", batch " << batch << " differs from one thread";
    }
  }
}

// A source that says it keeps `busy` threads of its own busy (as the SQLite reader's thread and
// fetch threads do).
class BusySource final : public EventSource {
 public:
  BusySource(const std::vector<Event>& events, size_t batch, unsigned busy) : inner_(events, batch), busy_(busy) {}
  bool next(Batch& out) override { return inner_.next(out); }
  TraceMeta& meta() override { return inner_.meta(); }
  PrefetchHint upcoming() override { return inner_.upcoming(); }
  unsigned busy_threads() const override { return busy_; }

 private:
  BorrowedSource inner_;
  unsigned busy_;
};

// threads = 0: the engine picks one or two threads itself (engine.cpp, auto_engine_threads); the
// result is the one-thread result whatever it picks, at every batch size (the first batch, read
// ahead to choose, is still the first one the engine runs), and a source that keeps every core
// busy itself always gets one.
TEST(TwoStage, TheAutomaticThreadCountGivesTheOneThreadResult) {
  const ScopedEnv ignore_load("INGERO_AUTO_IGNORE_LOAD", "1");
  for (const auto& t : scenarios()) {
    SCOPED_TRACE(t.category);
    BorrowedSource one_src(t.events, 4096);
    const std::string base = result_text(run_with(one_src, 1));
    for (const size_t batch : {size_t{1}, size_t{33}, size_t{4096}}) {
      BorrowedSource src(t.events, batch);
      const auto r = run_with(src, 0);
      EXPECT_GE(r.counters.threads, 1u);
      EXPECT_LE(r.counters.threads, 2u);
      EXPECT_EQ(r.counters.events_in, t.events.size()) << "batch " << batch;
      EXPECT_TRUE(result_text(r) == base) << "batch " << batch << " differs from one thread";
      BusySource busy(t.events, batch, 1024);
      const auto b = run_with(busy, 0);
      EXPECT_EQ(b.counters.threads, 1u) << "a source that keeps 1024 threads busy left the engine two";
      EXPECT_TRUE(result_text(b) == base) << "batch " << batch;
    }
  }
  // An empty source: nothing to peek at, one thread, no events.
  const std::vector<Event> none;
  BorrowedSource empty(none, 4096);
  const auto r = run_with(empty, 0);
  EXPECT_EQ(r.counters.threads, 1u);
  EXPECT_EQ(r.counters.events_in, 0u);
}

TEST(TwoStage, StagesThatNeverSpinGiveTheOneThreadResult) {
  // Every wait of either stage sleeps on its futex and is woken by the other.
  const ScopedEnv spin("INGERO_TWO_STAGE_SPIN_US", "0");
  expect_one_thread_result("no spin", 0, std::chrono::microseconds(0));
}

TEST(TwoStage, AStallingSourceGivesTheOneThreadResult) {
  // The heavy stage outwaits its spin budget (200 us) every 5th batch and sleeps; its budget
  // shrinks and grows back as waits end asleep or while spinning.
  expect_one_thread_result("stalling source", 5, std::chrono::microseconds(1500));
}

TEST(TwoStage, TheFlowGraphGivesTheSameResult) {
  for (const auto& t : scenarios()) {
    SCOPED_TRACE(t.category);
    BorrowedSource a(t.events, 777);
    const std::string two_stage = result_text(run_with(a, 2));
    const ScopedEnv graph("INGERO_TWO_STAGE", "0");
    BorrowedSource b(t.events, 777);
    EXPECT_TRUE(result_text(run_with(b, 2)) == two_stage);
  }
}

// `events` with every whole off-CPU span (a HOST sched_switch with a duration) given as a
// switch-out half and a switch-in half, as a live source delivers them, in time order, up to
// `cut`: a switch back in after it is left out (the thread is still off CPU when the trace ends),
// and so is its switch-out unless keep_open.
std::vector<Event> as_halves_cut_at(const std::vector<Event>& events, uint64_t cut, bool keep_open) {
  std::vector<Event> out;
  for (const Event& e : events) {
    if (e.ts_ns > cut) continue;
    if (e.source != Source::kHost || e.op != op::kSchedSwitch || e.dur_ns == 0) {
      out.push_back(e);
      continue;
    }
    const bool open = e.ts_ns + e.dur_ns > cut;
    if (open && !keep_open) continue;
    Event half = e;
    half.dur_ns = 0;
    half.flags = event_flags::kSwitchOut;
    out.push_back(half);
    if (open) continue;
    half.flags = event_flags::kSwitchIn;
    half.ts_ns = e.ts_ns + e.dur_ns;
    out.push_back(half);
  }
  std::stable_sort(out.begin(), out.end(), [](const Event& x, const Event& y) { return x.ts_ns < y.ts_ns; });
  for (size_t i = 0; i < out.size(); ++i) out[i].id = i + 1;
  return out;
}

TEST(TwoStage, ThreadsStillOffCpuWhenTheTraceEndsGiveTheOneThreadResult) {
  // The router builds the off-CPU spans for both stages (runtime.h, RoutedBatch::spans): a span
  // still open at the last batch is closed there, at the trace's end, as a shard closes its own.
  // The CPU contention trace, its spans in halves, cut inside each of its preempted calls of the
  // fault window in turn: the last one's switch back in is cut, and its call, recorded with its
  // whole duration, overlaps the span that only the close at the end makes.
  const auto t = synth::make_cpu_contention(true);
  std::vector<uint64_t> cuts;
  for (const Event& e : t.events)
    if (e.source == Source::kHost && e.op == op::kSchedSwitch && e.prev_state == OffCpuState::kPreempted)
      cuts.push_back(e.ts_ns + e.dur_ns / 2);
  ASSERT_GE(cuts.size(), 8u);
  size_t open_span_matters = 0;
  for (const size_t k : {size_t{2}, cuts.size() / 2, cuts.size() - 1}) {
    const std::vector<Event> events = as_halves_cut_at(t.events, cuts[k], true);
    SCOPED_TRACE(k);
    BorrowedSource one_src(events, 4096);
    const auto one = run_with(one_src, 1);
    // Whether the open span shows in the result at all (the trace without it gives another).
    const std::vector<Event> without = as_halves_cut_at(t.events, cuts[k], false);
    BorrowedSource without_src(without, 4096);
    if (result_text(run_with(without_src, 1)) != result_text(one)) ++open_span_matters;
    for (const size_t batch : {size_t{64}, size_t{4096}}) {
      BorrowedSource src(events, batch);
      EXPECT_TRUE(result_text(run_with(src, 2)) == result_text(one)) << "batch " << batch;
    }
  }
  EXPECT_GT(open_span_matters, 0u) << "no cut's open span changes the result: the test proves nothing";
}

// A source that throws at its `at`-th batch (a data-plane source never does, but an allocation
// can fail): the exception leaves run_plan as it would from the flow graph, and the heavy stage's
// thread is stopped and joined first (a joinable std::thread destroyed would end the process).
class ThrowingSource final : public EventSource {
 public:
  ThrowingSource(const std::vector<Event>& events, size_t batch, size_t at) : inner_(events, batch), at_(at) {}
  bool next(Batch& out) override {
    if (++calls_ == at_) throw std::runtime_error("source failed");
    return inner_.next(out);
  }
  TraceMeta& meta() override { return inner_.meta(); }

 private:
  BorrowedSource inner_;
  size_t at_;
  size_t calls_ = 0;
};

TEST(TwoStage, AnExceptionFromTheSourceStopsTheHeavyStage) {
  const auto t = synth::make_cpu_contention(true);
  for (const size_t at : {size_t{2}, size_t{20}, size_t{200}}) {
    ThrowingSource src(t.events, 64, at);
    EXPECT_THROW(run_with(src, 2), std::runtime_error) << "at batch " << at;
  }
}

// The events of several scenarios in one trace (time order, ids renumbered): chains from window
// groups of both stages, closing in the same batches.
std::vector<Event> combined_trace() {
  std::vector<Event> all;
  for (const auto& t : scenarios()) all.insert(all.end(), t.events.begin(), t.events.end());
  std::stable_sort(all.begin(), all.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  for (size_t i = 0; i < all.size(); ++i) all[i].id = i + 1;
  return all;
}

TEST(TwoStage, EveryChainReachesTheCallbackOnce) {
  // Both stages find chains (the light shard's straggler rule on the calling thread, the heavy
  // shard's tail rules on its own): each is delivered once, under a lock. Overlapping calls are
  // counted too, but this trace's windows close at different batches in the two stages, so that
  // part would rarely catch a missing lock (tried: it did not).
  const std::vector<Event> events = combined_trace();
  BorrowedSource one_src(events, 4096);
  const auto one = run_with(one_src, 1);
  std::vector<std::string> categories;
  for (const auto& c : one.chains)
    if (std::find(categories.begin(), categories.end(), c.category) == categories.end())
      categories.push_back(c.category);
  ASSERT_GE(categories.size(), 2u) << "the trace must have chains from more than one family";
  for (int round = 0; round < 5; ++round) {
    std::atomic<int> inside{0};
    std::atomic<int> overlaps{0};
    std::atomic<size_t> delivered{0};
    BorrowedSource src(events, 64);
    const auto r = run_with(src, 2, [&](const Chain&) {
      if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      inside.fetch_sub(1);
      delivered.fetch_add(1);
    });
    EXPECT_EQ(overlaps.load(), 0);
    // A finding over time is delivered once per window it fired in, and is one chain over them
    // in the result (engine/runtime.h merge_window_runs): count its windows.
    size_t emitted = 0;
    for (const auto& c : r.chains) {
      double windows = 1;
      for (const auto& [k, v] : c.values)
        if (c.over_time && k == "windows") windows = v;
      emitted += static_cast<size_t>(windows);
    }
    EXPECT_EQ(delivered.load(), emitted);
    EXPECT_TRUE(result_text(r) == result_text(one));
  }
}

}  // namespace
}  // namespace ingero
