// Deterministic synthetic traces: one per demo scenario (with a known, injected cause) and its
// control (the same workload without the fault), plus a large generic trace for benchmarks.
//
// Contract:
// - Pure functions of (scenario, fault on/off, seed): the same arguments give byte-identical
//   events on every platform (own RNG and distributions, never <random>'s distributions, whose
//   output differs between standard libraries).
// - Events follow model/event.h: ts_ns is the START of every interval (off-CPU spans start at the
//   switch-out), events are returned sorted by ts_ns, ids are 1..n in that order.
// - Timestamps start at kSynthEpochNs, a multiple of 10 s, so the default 10 s tumbling windows
//   start exactly at the trace start; every scenario covers whole windows, and every rate that is
//   not part of the fault is constant per window (a partial or noisy window must not look like a
//   throughput drop or a rising trend in a control).
// - Magnitudes are realistic: cudaLaunchKernel p50 ~15 us, a preempted launch ~2-4 ms, a
//   cudaStreamSynchronize waiting for a step ~ms, checkpoint writes of MiBs, RTO >= 200 ms.
// - Controls have no heavy tail (p99/p50 < 2 for every op in every window), no off-CPU time or
//   host signal overlapping any call, and constant per-window rates: the default analyses must
//   produce no chain on them.
//
// Scenario table (window = 10 s tumbling window index from the trace start):
//   name              category         injected fault
//   cpu_contention    cpu_contention   window 1: 5% of tid 4242's cudaLaunchKernel calls are
//                                      preempted (kPreempted off-CPU span of 2-4 ms of the SAME
//                                      tid inside the call; arg1 = 31337, the CPU hog "stress-ng")
//   dataloader        blocking         windows 1-2: every 8th training step's cudaMemcpy (H2D of
//                                      the batch) of tid 5100 waits 20-40 ms asleep (kSleeping
//                                      span of the same tid; arg1 = a DataLoader worker pid)
//   checkpoint_io     block_io         window 1: a 1.5 s checkpoint burst of block_write requests
//                                      (4 MiB each, host-wide, pid 6100) during which tid 6000's
//                                      cudaMemcpy calls take 8-15 ms instead of ~400 us
//   tcp_retransmit    network          window 1: a 2 s burst of tcp_retransmit events (host-wide)
//                                      during which tid 7000's cudaStreamSynchronize calls wait
//                                      220-400 ms (RTO); retransmits fall inside every slow call
//   allocator         allocator        tid 8000's cudaMalloc p99/p50 rises in windows 1..5
//                                      (tail multiplier 4x, 8x, 16x, 32x, 64x of p50); windows 0
//                                      of fault and every window of the control are identical
//   throughput_drop   throughput_drop  tid 9000's cudaLaunchKernel rate is 1000/s in windows 0-5
//                                      and 300/s in windows 6-8 (cudaStreamSynchronize per 20
//                                      launches drops with it); the control keeps 1000/s
//   straggler         straggler        8 ranks (pid = tid = 10000 + rank, rank field set, one per
//                                      GPU); from window 1 on, rank 5's pre-collective compute
//                                      (its cudaStreamSynchronize before ncclAllReduce) takes
//                                      ~84 ms instead of ~60 ms, and its peers wait the difference
//                                      inside ncclAllReduce
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/event.h"
#include "model/trace.h"

namespace ingero::synth {

inline constexpr uint64_t kSynthEpochNs = 1'763'800'000'000'000'000ull;  // 10 s aligned
inline constexpr uint64_t kWindowNs = 10'000'000'000ull;

enum class Scenario : uint8_t {
  kCpuContention,
  kDataLoader,
  kCheckpointIo,
  kTcpRetransmit,
  kAllocator,
  kThroughputDrop,
  kStraggler,
};

struct ScenarioInfo {
  Scenario id;
  std::string_view name;      // CLI name: "cpu_contention"
  std::string_view category;  // the chain category the default analyses must report
  std::string_view title;     // one line for `demo --list`
  std::string_view cause;     // what was injected, for the explanation at the end of `demo`
  std::string_view fix;       // what a user would do about it
};

std::span<const ScenarioInfo> all_scenarios();
const ScenarioInfo* find_scenario(std::string_view name);  // nullptr when unknown
const ScenarioInfo& scenario_info(Scenario s);

// What a generated scenario holds, and where the fault is (for tests and the demo's epilogue).
struct SynthTrace {
  std::vector<Event> events;  // sorted by ts_ns, ids 1..n
  TraceMeta meta;             // process names, first/last ts, format "synthetic-1"
  Scenario scenario = Scenario::kCpuContention;
  bool fault = false;
  std::string category;              // expected chain category ("" for a control: no chain expected)
  Source source = Source::kUnknown;  // the affected op (0 for straggler: the chain names a rank)
  uint8_t op = 0;
  uint32_t pid = 0, tid = 0;                // the affected process/thread
  int16_t rank = -1;                        // straggler: the slow rank
  uint64_t fault_start = 0, fault_end = 0;  // [start, end) of the injected fault, 0 for controls
};

// One scenario. `fault` = false gives its control. Same seed = same trace.
SynthTrace make_scenario(Scenario s, bool fault, uint64_t seed = 1);

// Per-scenario entry points (same as make_scenario(kX, fault, seed)); see the table above.
SynthTrace make_cpu_contention(bool fault, uint64_t seed = 1);
SynthTrace make_dataloader(bool fault, uint64_t seed = 1);
SynthTrace make_checkpoint_io(bool fault, uint64_t seed = 1);
SynthTrace make_tcp_retransmit(bool fault, uint64_t seed = 1);
SynthTrace make_allocator(bool fault, uint64_t seed = 1);
SynthTrace make_throughput_drop(bool fault, uint64_t seed = 1);
SynthTrace make_straggler(bool fault, uint64_t seed = 1);

// A large, realistic mixed workload for benchmarks: 4 training processes (ranks 0-3), each with a
// launcher thread (cudaMemcpyAsync H2D, 40 x cudaLaunchKernel with a nested cuLaunchKernel,
// ncclAllReduce, cudaStreamSynchronize that sleeps off CPU, a cudaMalloc/cudaFree pair every 16
// steps), two DataLoader workers (sleep/run off-CPU spans, page allocations), a kworker issuing
// block I/O and rare TCP retransmits. In every 6th 10 s window (index 3, 9, ...) a CPU hog shares
// rank 1's core and preempts 3% of its launches for 0.5-3 ms, so the default analyses find real
// cpu_contention chains there; elsewhere 0.05% of launches are preempted (no tail). Roughly 56k
// events per simulated second, so a trace that stops mid-window ends with a partial window.
//
// LargeTraceGenerator streams it in ts order with O(threads) memory, so traces of hundreds of
// millions of events can be written without holding them; make_large_trace() collects one.
class LargeTraceGenerator {
 public:
  LargeTraceGenerator(uint64_t n_events, uint64_t seed);
  ~LargeTraceGenerator();
  LargeTraceGenerator(const LargeTraceGenerator&) = delete;
  LargeTraceGenerator& operator=(const LargeTraceGenerator&) = delete;

  // Appends up to `max` events (ts-ordered across calls); returns false once all are produced.
  bool next(std::vector<Event>& out, size_t max);
  uint64_t produced() const;
  uint64_t total() const;
  TraceMeta meta() const;  // process names, format; first/last ts once finished

 private:
  struct Impl;
  Impl* impl_;
};

std::vector<Event> make_large_trace(uint64_t n_events, uint64_t seed = 1);

// An EventSource over a LargeTraceGenerator (benchmarks without a file).
class LargeTraceSource final : public EventSource {
 public:
  LargeTraceSource(uint64_t n_events, uint64_t seed, size_t batch_size = 4096);
  bool next(Batch& out) override;
  TraceMeta& meta() override { return meta_; }

 private:
  LargeTraceGenerator gen_;
  size_t batch_size_;
  uint64_t seq_ = 0;
  bool done_ = false;
  TraceMeta meta_;
};

}  // namespace ingero::synth
