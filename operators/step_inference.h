// Steps, inferred with no instrumentation: the period of each process's training/inference
// iteration, found from the GPU calls it already makes (issue 40, item 3).
//
// Contract:
// - An EventObserver: observe() takes every batch in source order (sorted by ts_ns); finish()
//   appends one ProcessSteps (model/steps.h) per (node, pid, rank) that made a GPU API call to
//   result.steps, sorted by node, pid, rank. Events of other sources are ignored (a process that
//   never called the GPU gets no entry, unless it sent step markers: add_markers). One pass;
//   deterministic; the result does not depend on
//   batch sizes, and shifting every timestamp by a constant shifts the boundaries by it and
//   changes nothing else.
// - Memory: per key, per marker series, the last kMaxMarkers markers (a ring: 16 bytes each) plus
//   a total count. So O(keys x series x min(markers, kMaxMarkers)): bounded on any trace length.
//   Boundaries, step times and percentiles are of the kept (latest) markers; `count` adds the
//   dropped markers / k. The last markers rather than a reservoir: boundaries stay contiguous
//   (a reservoir would leave holes, and step times need consecutive markers).
// - Never invents a period: a key whose markers are not regular gets method "none", a reason,
//   confidence 0, and the fallback grid of fixed kFallbackIntervalNs intervals (model/steps.h).
//
// Marker series (candidates), per key:
// - each blocking synchronisation op, by (source, op): cudaStreamSynchronize,
//   cudaDeviceSynchronize, cudaEventSynchronize, cuCtxSynchronize, cuStreamSynchronize, the
//   synchronous copies (cudaMemcpy, cuMemcpy, cuMemcpyDtoH: `.item()` and other device-to-host
//   reads are one of these or a copy plus a stream sync); a marker is the call's end (when the
//   GPU work it waited for was done) and, as a second candidate, its start;
// - each NCCL collective op (all-reduce, all-gather, reduce-scatter, broadcast, send, recv), by
//   its start and end likewise;
// - launch bursts: the first launch (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch) after a
//   launch-free gap >= T, one series per T in a ladder x4 from 64 us to 4.2 s, so a burst gap is
//   found at any step length from about 0.2 ms to minutes without a tuned threshold. The time
//   the launching thread spent preempted during the gap (sched_switch spans with prev_state
//   kPreempted of that tid) does not count towards it: a thread that launches in a tight loop and
//   loses its CPU to another task every few ms has no step there, only stalls (the scheduler's
//   time slice would otherwise read as a period).
//
// Period of a series (t sorted, n markers): several markers may fall in one step, so for each
// lag k in 1..kMaxLag with at least kMinSteps steps ((n-1)/k >= 5) take the k-step intervals
// t[i+k]-t[i] (every phase), their robust dispersion d_k = MAD / median and the share of them
// within 10% of the median. With k markers per step the k-step intervals are step lengths; with
// any other k they mix the gaps between markers at different positions in the step: d_k is large
// and the share small. Multiples of the true k are regular too (and, summing m steps, have d about
// d_k / sqrt(m): "smallest d" would pick them), so the chosen k is the smallest with share >= 0.8
// and d_k <= kMaxDispersion; when none (jitter over 10%), the smallest whose d_k * sqrt(k) is
// within 1.5x (+0.005) of the smallest d_j * sqrt(j). Over Poisson (serving) calls d_k is about
// 0.67 / sqrt(k) (>= 0.19 at k = 12) and the share about 0.3: no lag looks regular. Accepted when
// d_k <= kMaxDispersion (0.10). The period is the mean of the k-step intervals within 3 scaled
// MADs of their median (the mean beats the median on uniform jitter; the MAD cut keeps it robust).
//
// Phases: a process may change pace (warm-up then training, a fast phase then a starved one), so
// each series is judged whole and on its latest 2/3, 4/9, ... (>= kMinSteps + 1 markers); a
// shorter suffix wins only when the longer was not accepted or it is more confident by over 0.1.
// The result then describes the latest regular phase (its count is that phase's steps).
//
// Phase and boundaries: of the k residues, the one whose markers have the largest median wait
// (sync duration; for launch bursts, the gap before the burst) is the step boundary, by
// convention: the wait that drains the step's queue, or the idle gap before the step's first
// launch. The boundaries are then tracked from the first such marker: the next boundary is the
// marker among the next 2k, from the (floor(k/2)+1)-th on, closest to one period later when within 20%
// of a period (an extra or a missing marker does not shift the phase; a pace that doubles with
// k = 2 does not pass for the old period with half the markers), else the k-th next marker (a stall
// is a long step, not a lost phase). Step times are the intervals between consecutive boundaries.
//
// Choosing among series: the highest confidence; within 0.1 of it, blocking syncs before NCCL
// collectives before launch bursts (a sync's end is the step's end; a collective's enqueue sits
// mid-step), then call ends before starts, then more steps (the iteration, not a multiple of it).
//
// Confidence = q(d) x regular x coverage x size, each in 0..1: q(d) = 1 - (d / 0.2)^2; regular =
// the share of tracked steps within 20% of the period; coverage = min(1, 2 x the time the regular
// steps cover / the key's active span, first GPU call to last) (steps that cover under half of
// the process's GPU time count less); size = min(1, 0.5 + steps / 40). A period is reported only
// with confidence >= kMinConfidence.
//
// Limits: timing alone cannot tell a step from a repeated half-step with identical markers
// (markers evenly spaced in the step give period/k); gradient accumulation reports the
// micro-step; the phase is a convention (the longest wait), not a marker the program set.
//
// Explicit markers win (add_markers; docs/steps.md "Explicit step markers"): markers the program
// sent (`trace --annotate`, Ingero's annotation protocol, or ip_annotations read back on replay)
// replace the inference for every key of their (node, pid) once they make at least one complete
// step (two boundaries). A boundary is a marker with a "step" label whose value differs from the
// previous step marker's of that process (Lightning sends trainer.global_step at every batch
// start: with gradient accumulation the same value repeats for each micro-batch, and the step is
// the optimizer's); a "step" label that is not a number makes every such marker a boundary.
// Markers with only "epoch" set the epoch. Method "annotated (step)", confidence 1, reason "";
// boundaries = the boundary times (the last kMaxMarkers); count = boundaries - 1 (+ those beyond
// the kept ones); p50/p99 = nearest-rank of the intervals between consecutive boundaries, period
// = the mean of those within 3 scaled MADs of their median, both leaving out an interval whose two
// boundaries name different epochs (it holds the epoch's end: validation, checkpointing); epochs
// = the distinct epoch numbers named. A (node, pid) with markers but no GPU call gets an entry of
// its own (rank -1, first/last = its first and last marker). Processes without markers are
// inferred as above, unchanged. Markers of unknown time (ts 0) are ignored.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/event.h"
#include "model/result.h"
#include "model/steps.h"
#include "operators/event_observer.h"

namespace ingero {

class StepInference final : public EventObserver {
 public:
  static constexpr size_t kMaxMarkers = 4096;     // per (key, series): the ring's capacity
  static constexpr size_t kMaxLag = 12;           // markers per step tried: 1..12
  static constexpr size_t kMinSteps = 5;          // steps a series must span to be judged
  static constexpr double kMaxDispersion = 0.10;  // MAD / median of the k-step intervals
  static constexpr double kMinConfidence = 0.3;
  static constexpr uint64_t kFallbackIntervalNs = 1'000'000'000;  // "none": fixed 1 s intervals
  static constexpr size_t kBurstLadder = 10;                      // launch-gap thresholds 64 us x 4^j
  static constexpr uint64_t kBurstBaseNs = 64'000;

  // Marker series slots of one key: the sync and NCCL ops, then the launch-burst ladder.
  static constexpr size_t kSyncSlots = 14;

  StepInference();
  ~StepInference() override;
  StepInference(const StepInference&) = delete;
  StepInference& operator=(const StepInference&) = delete;

  void observe(const Event* events, size_t n) override;
  void finish(const TraceMeta& meta, AnalysisResult& result) override;

  // Explicit step markers for the processes they name (see "Explicit markers win" above), in any
  // order, in any number of calls. Thread-safe: may be called from any thread before finish()
  // (the live capture's annotation socket hands them over as the capture stops).
  void add_markers(std::span<const StepMarker> markers);

  // The step boundaries the markers of one process make (the header's "Explicit markers win":
  // a boundary per new "step" label, the last kMaxMarkers), in time order; empty when they make
  // no complete step.
  static std::vector<uint64_t> marker_boundaries(std::span<const StepMarker> markers);

  // The same analysis without an AnalysisResult (tests): one entry per key, sorted.
  std::vector<ProcessSteps> results() const;

  // A service over a churn of processes (the agent; off by default): a process whose leader
  // exited (HOST process_exit, pid == tid) more than 5 s of trace time ago is judged then, as
  // finish() would judge it (its entry is the same), and its state freed; the entries of the last
  // max_finished processes so judged are kept (older ones are dropped: finished_dropped()). A
  // process with explicit markers (add_markers) is kept live. Call before the first observe().
  void evict_exited(size_t max_finished = 256) {
    evict_ = true;
    max_finished_ = max_finished;
  }
  size_t live_keys() const { return keys_.size(); }
  size_t finished_keys() const { return finished_.size(); }
  uint64_t finished_dropped() const { return finished_dropped_; }

  // A ring of the last kMaxMarkers markers (start, duration, thread) of one series.
  struct Series {
    std::vector<uint64_t> ts, dur;
    std::vector<uint32_t> tid;
    size_t head = 0;     // next slot to overwrite once full
    uint64_t total = 0;  // markers ever added
    uint64_t first_ts = 0;
    // pick(): `total` and `last` when the newest `last` markers, by start [0] or by end [1], were
    // judged whole and not accepted (UINT64_MAX: never); the same markers are not judged again.
    mutable uint64_t rejected_total[2] = {UINT64_MAX, UINT64_MAX};
    mutable size_t rejected_last[2] = {0, 0};
    void add(uint64_t t, uint64_t d, uint32_t thread);
    // The i-th of the last m markers added (i = 0 the oldest of them), m <= ts.size().
    size_t at(size_t m, size_t i) const { return (head + ts.size() - m + i) % ts.size(); }
  };

  // The series a key's steps are recognised from, as finish() would choose it now (the online
  // tracker, operators/step_tracker.h, follows its markers): `slot` < kSyncSlots is a sync or NCCL
  // op (markers at call ends when `ends`, else starts), kSyncSlots + j the j-th launch-burst
  // series; k markers per step, `period` the step length, `first_boundary` the first boundary of
  // the judged markers. ok = false: no period (method "none").
  struct Pick {
    bool ok = false;
    size_t slot = 0;
    bool ends = true;
    size_t k = 0;
    uint64_t period = 0;
    double confidence = 0;
    uint64_t first_boundary = 0;
    std::string method;
  };

  // What one (node, pid, rank) has seen.
  struct KeyState {
    uint32_t pid = 0;
    int16_t rank = -1;
    uint16_t node = 0;
    uint64_t first_ns = UINT64_MAX, last_ns = 0;
    uint64_t gpu_calls = 0;
    uint64_t last_launch = 0;
    uint32_t last_launch_tid = 0;
    uint64_t preempted_since = 0;  // ns the last launching thread was preempted since its launch
    bool launched = false;
    std::array<std::unique_ptr<Series>, kSyncSlots> sync;
    std::array<std::unique_ptr<Series>, kBurstLadder> bursts;
    uint64_t markers = 0;  // markers added to any series
    // Free for one online user of this key (StepTracker: the index of its track); never read here.
    mutable uint32_t user = UINT32_MAX;
    // The series of marker slot `slot` (sync slots, then the burst ladder); null if none yet.
    const Series* series(size_t slot) const {
      return slot < kSyncSlots                  ? sync[slot].get()
             : slot - kSyncSlots < kBurstLadder ? bursts[slot - kSyncSlots].get()
                                                : nullptr;
    }
  };

  // The series finish() would choose for one key now; `last` < kMaxMarkers: judging only the
  // newest `last` markers of each series, whole (no shorter suffixes: the online tracker's
  // cheaper judgements).
  static Pick pick(const KeyState& s, size_t last = kMaxMarkers);
  // The key the last GPU API event given to observe() belongs to (null before any).
  const KeyState* last_state() const { return last_state_; }
  // Every key seen so far, in no particular order.
  template <class Fn>
  void for_each_key(Fn&& fn) const {
    for (const auto& [k, s] : keys_) fn(k, *s);
  }

 private:
  KeyState& state(const Event& e);
  void evict(uint64_t now);

  std::unordered_map<uint64_t, std::unique_ptr<KeyState>> keys_;
  std::unordered_map<uint64_t, KeyState*> launcher_;  // (node, tid) of a key's last launch -> the key
  mutable std::mutex markers_mu_;
  std::unordered_map<uint64_t, std::vector<StepMarker>> markers_;  // (node, pid) -> markers, as given
  uint64_t last_key_ = UINT64_MAX;
  KeyState* last_state_ = nullptr;
  std::array<std::pair<uint64_t, KeyState*>, 64> cache_{};  // key -> state, direct-mapped
  bool evict_ = false;
  size_t max_finished_ = 256;
  std::vector<std::pair<uint64_t, uint64_t>> exits_;  // (node, pid) key, exit ts: not yet judged
  std::deque<ProcessSteps> finished_;                 // judged at exit, oldest first
  uint64_t finished_dropped_ = 0;
};

}  // namespace ingero
