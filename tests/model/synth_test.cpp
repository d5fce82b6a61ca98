// The synthetic generators' contracts, checked without the engine: determinism, ordering, and that
// every fault is where its contract says and every control is clean.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "model/ops.h"
#include "model/synth.h"

using namespace ingero;
using namespace ingero::synth;

namespace {

uint64_t nearest_rank(std::vector<uint64_t> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::max(0.0, std::ceil(q * static_cast<double>(v.size())) - 1))];
}

int window_of(const Event& e) { return static_cast<int>((e.ts_ns - kSynthEpochNs) / kWindowNs); }

// p99/p50 of every (window, source, op, tid) group of GPU API calls.
std::map<std::tuple<int, int, int, uint32_t>, double> tail_ratios(const std::vector<Event>& ev) {
  std::map<std::tuple<int, int, int, uint32_t>, std::vector<uint64_t>> groups;
  for (const auto& e : ev) {
    if (is_gpu_api(e.source)) groups[{window_of(e), static_cast<int>(e.source), e.op, e.tid}].push_back(e.dur_ns);
  }
  std::map<std::tuple<int, int, int, uint32_t>, double> out;
  for (auto& [k, v] : groups)
    out[k] = static_cast<double>(nearest_rank(v, 0.99)) / static_cast<double>(nearest_rank(v, 0.5));
  return out;
}

// Off-CPU spans per thread, in time order (a thread's spans never overlap each other).
std::map<uint32_t, std::vector<Event>> offcpu_by_tid(const std::vector<Event>& ev) {
  std::map<uint32_t, std::vector<Event>> out;
  for (const auto& e : ev)
    if (e.source == Source::kHost && e.op == op::kSchedSwitch) out[e.tid].push_back(e);
  return out;
}

// Time of `call` covered by off-CPU spans of the same tid.
uint64_t offcpu_overlap(const std::map<uint32_t, std::vector<Event>>& spans, const Event& call) {
  auto it = spans.find(call.tid);
  if (it == spans.end()) return 0;
  const auto& v = it->second;
  auto pos = std::upper_bound(v.begin(), v.end(), call.end_ns(),
                              [](uint64_t t, const Event& e) { return t < e.ts_ns; });
  uint64_t sum = 0;
  while (pos != v.begin()) {
    --pos;
    if (pos->end_ns() <= call.ts_ns) break;
    sum += std::min(pos->end_ns(), call.end_ns()) - std::max(pos->ts_ns, call.ts_ns);
  }
  return sum;
}

TEST(Synth, EveryScenarioIsDeterministicSortedAndNumbered) {
  for (const auto& info : all_scenarios()) {
    for (bool fault : {true, false}) {
      SCOPED_TRACE(std::string(info.name) + (fault ? "" : " (control)"));
      const auto a = make_scenario(info.id, fault, 1);
      const auto b = make_scenario(info.id, fault, 1);
      ASSERT_EQ(a.events.size(), b.events.size());
      ASSERT_GT(a.events.size(), 1000u);
      EXPECT_EQ(std::memcmp(a.events.data(), b.events.data(), a.events.size() * sizeof(Event)), 0);
      for (size_t i = 0; i < a.events.size(); ++i) {
        ASSERT_EQ(a.events[i].id, i + 1);
        if (i > 0) {
          ASSERT_LE(a.events[i - 1].ts_ns, a.events[i].ts_ns);
        }
      }
      EXPECT_EQ(a.events.front().ts_ns / kWindowNs * kWindowNs, kSynthEpochNs);
      EXPECT_EQ(a.category, fault ? std::string(info.category) : "");
      EXPECT_EQ(a.fault, fault);
      EXPECT_FALSE(a.meta.process_names.empty());
      const auto other_seed = make_scenario(info.id, fault, 2);
      EXPECT_FALSE(other_seed.events.size() == a.events.size() &&
                   std::memcmp(a.events.data(), other_seed.events.data(), a.events.size() * sizeof(Event)) == 0);
    }
  }
  EXPECT_EQ(all_scenarios().size(), 7u);
  EXPECT_EQ(find_scenario("straggler")->category, "straggler");
  EXPECT_EQ(find_scenario("nope"), nullptr);
}

TEST(Synth, ControlsHaveNoTailAndNoOffCpuInsideCalls) {
  for (const auto& info : all_scenarios()) {
    SCOPED_TRACE(std::string(info.name));
    const auto t = make_scenario(info.id, false, 1);
    for (const auto& [k, r] : tail_ratios(t.events)) EXPECT_LT(r, 2.0) << "window " << std::get<0>(k);
    const auto spans = offcpu_by_tid(t.events);
    for (const auto& e : t.events) {
      if (is_gpu_api(e.source)) {
        ASSERT_EQ(offcpu_overlap(spans, e), 0u) << "call " << e.id;
      }
    }
  }
}

TEST(Synth, CpuContentionTailIsCoveredByPreemptionOfTheSameThread) {
  const auto t = make_cpu_contention(true);
  const auto ratios = tail_ratios(t.events);
  EXPECT_GT(ratios.at({1, 1, op::kCudaLaunchKernel, 4242}), 50.0);
  EXPECT_LT(ratios.at({0, 1, op::kCudaLaunchKernel, 4242}), 2.0);
  EXPECT_LT(ratios.at({2, 1, op::kCudaLaunchKernel, 4242}), 2.0);
  std::vector<uint64_t> w1;
  for (const auto& e : t.events)
    if (e.op == op::kCudaLaunchKernel && window_of(e) == 1) w1.push_back(e.dur_ns);
  const uint64_t p99 = nearest_rank(w1, 0.99);
  const auto spans = offcpu_by_tid(t.events);
  for (const auto& e : t.events) {
    if (e.source == Source::kCuda && e.dur_ns >= p99) {
      EXPECT_GE(static_cast<double>(offcpu_overlap(spans, e)), 0.9 * static_cast<double>(e.dur_ns));
    }
    if (e.source == Source::kHost && e.ts_ns >= t.fault_start && e.dur_ns > 1'000'000) {
      EXPECT_EQ(e.prev_state, OffCpuState::kPreempted);
    }
  }
}

TEST(Synth, FaultsShowWhereTheContractSays) {
  const auto dl = make_dataloader(true);
  EXPECT_GT(tail_ratios(dl.events).at({1, 1, op::kCudaMemcpy, 5100}), 20.0);
  const auto io = make_checkpoint_io(true);
  EXPECT_GT(tail_ratios(io.events).at({1, 1, op::kCudaMemcpy, 6000}), 10.0);
  uint64_t writes = 0;
  for (const auto& e : io.events) writes += e.source == Source::kIo && e.op == op::kBlockWrite;
  EXPECT_GT(writes, 100u);
  const auto tcp = make_tcp_retransmit(true);
  EXPECT_GT(tail_ratios(tcp.events).at({1, 1, op::kCudaStreamSync, 7000}), 10.0);
  // Allocator: the tail rises strictly over windows 1..5 while windows of the control are equal.
  const auto al = make_allocator(true), alc = make_allocator(false);
  const auto r = tail_ratios(al.events), rc = tail_ratios(alc.events);
  for (int w = 1; w < 6; ++w) {
    EXPECT_GT(r.at({w, 1, op::kCudaMalloc, 8000}), r.at({w - 1, 1, op::kCudaMalloc, 8000}));
    EXPECT_DOUBLE_EQ(rc.at({w, 1, op::kCudaMalloc, 8000}), rc.at({0, 1, op::kCudaMalloc, 8000}));
  }
  // Throughput: exactly 10000 launches per window, then 3000.
  std::map<int, int> launches;
  for (const auto& e : make_throughput_drop(true).events)
    launches[window_of(e)] += e.op == op::kCudaLaunchKernel && e.source == Source::kCuda;
  EXPECT_EQ(launches[0], 10000);
  EXPECT_EQ(launches[5], 10000);
  EXPECT_EQ(launches[6], 3000);
  EXPECT_EQ(launches[8], 3000);
  // Straggler: rank 5's sync is ~1.4x its peers' from window 1 on.
  const auto st = make_straggler(true);
  std::map<int16_t, std::vector<uint64_t>> sync_w2;
  for (const auto& e : st.events) {
    if (e.op == op::kCudaStreamSync && e.source == Source::kCuda && window_of(e) == 2)
      sync_w2[e.rank].push_back(e.dur_ns);
  }
  ASSERT_EQ(sync_w2.size(), 8u);
  const double slow = static_cast<double>(nearest_rank(sync_w2[5], 0.5));
  for (const auto& [rank, v] : sync_w2) {
    if (rank != 5) {
      EXPECT_GT(slow / static_cast<double>(nearest_rank(v, 0.5)), 1.3);
    }
  }
}

TEST(Synth, LargeTraceStreamsInOrderAndMatchesTheVectorForm) {
  const auto v = make_large_trace(300'000, 9);
  ASSERT_EQ(v.size(), 300'000u);
  LargeTraceSource src(300'000, 9, 1000);
  Batch b;
  size_t i = 0;
  bool final_seen = false;
  std::map<int, uint64_t> per_source;
  while (src.next(b)) {
    for (const auto& e : b.events) {
      ASSERT_LT(i, v.size());
      ASSERT_EQ(std::memcmp(&e, &v[i], sizeof e), 0) << i;
      if (i > 0) {
        ASSERT_LE(v[i - 1].ts_ns, e.ts_ns);
      }
      ++per_source[static_cast<int>(e.source)];
      ++i;
    }
    final_seen = b.final;
  }
  EXPECT_TRUE(final_seen);
  EXPECT_EQ(i, v.size());
  // A realistic mix: mostly CUDA/driver calls, off-CPU spans, some block I/O.
  EXPECT_GT(per_source[1], 100'000u);
  EXPECT_GT(per_source[4], 100'000u);
  EXPECT_GT(per_source[3], 5'000u);
  EXPECT_GT(per_source[5], 100u);
  EXPECT_EQ(src.meta().health.rows_read, 300'000u);
}

}  // namespace
