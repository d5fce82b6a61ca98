// The per-step straggler signal one node can export on its own (docs/fleet.md, "The per-step
// straggler signal on /metrics"): per rank, how long the host waits at each step's collective
// and how long the step is, both on the node's own clock.
//
// Why this signal: a synchronous collective completes at one instant on every rank, so rank r's
// wait after it is wait_r = completion - arrival_r, and arrival_last - arrival_r = wait_r -
// wait_last. The rank that arrives last waits least, and the difference of two ranks' waits is
// their arrival lag: no clock alignment needed (each wait is a difference of two timestamps of
// one clock). A node cannot know that it arrived last at a given collective (that needs the
// others' arrivals), so it exports the distribution of its own waits over the last steps; a
// Prometheus recording rule across the nodes (prometheus/gpustall_fleet.rules.yml,
// `gpustall_step_straggler`) compares them and names the rank that waits least, relative to the
// step.
//
// Contract:
// - add() takes events in start-time order per thread (as every Batch holds them). A collective
//   (ncclAllReduce, AllGather, ReduceScatter, Broadcast) opens a pending step on its thread
//   (several collectives before one wait: the last one counts); the first synchronising call
//   after it on the same thread (cudaStreamSynchronize, cudaDeviceSynchronize,
//   cudaEventSynchronize, cuStreamSynchronize, cuCtxSynchronize, a D2H copy) closes it: one
//   sync point, wait = end of that call - entry of the collective. No minimum block time: a
//   rank that arrives last finds the collective almost done and waits little, and dropping its
//   short waits would bias its median up and hide it.
// - Step = entry of a sync point's collective - entry of the previous one of the same stream
//   (rank, pid, communicator). Per stream: totals (sync points, wait seconds, step seconds: the
//   first sync point of a stream has no step) and the last kWindowSteps (wait, step) pairs.
// - ranks(): per rank, totals summed over its streams (monotonic), and the window of its busiest
//   stream (most sync points): median wait and median step over the last kWindowSteps steps,
//   `ready` only once that window is full (kWindowSteps steps: nothing is judged on fewer).
// - Bounded: at most kMaxStreams streams and kMaxThreads pending threads; later ones are counted
//   in dropped() and ignored. Never throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "model/event.h"

namespace ingero::metrics {

inline constexpr size_t kWindowSteps = 20;
inline constexpr size_t kMaxStreams = 1024;
inline constexpr size_t kMaxThreads = 65536;

struct RankStepWaits {
  int16_t rank = -1;
  uint64_t steps = 0;  // sync points, all streams of the rank
  double wait_s = 0;   // sum of waits at the collective
  double step_s = 0;   // sum of step lengths (consecutive sync points of one stream)
  bool ready = false;  // the busiest stream's window holds kWindowSteps steps
  int64_t median_wait_ns = 0;
  int64_t median_step_ns = 0;
};

class StepWaitTracker {
 public:
  void add(const Event& e);
  std::vector<RankStepWaits> ranks() const;  // ordered by rank
  uint64_t dropped() const { return dropped_; }

 private:
  struct Pending {
    bool open = false;
    uint64_t comm = 0;
    uint64_t entry_ns = 0;
  };
  struct Stream {
    uint64_t steps = 0;
    double wait_s = 0, step_s = 0;
    uint64_t last_entry_ns = 0;
    bool has_last = false;
    std::vector<std::pair<int64_t, int64_t>> window;  // (wait, step) ring of kWindowSteps
    size_t next = 0;
  };
  std::map<std::tuple<int16_t, uint32_t, uint32_t>, Pending> threads_;  // (rank, pid, tid)
  std::map<std::tuple<int16_t, uint32_t, uint64_t>, Stream> streams_;   // (rank, pid, comm)
  uint64_t dropped_ = 0;
};

}  // namespace ingero::metrics
