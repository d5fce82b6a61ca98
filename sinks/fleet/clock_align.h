// Clock alignment of per-node traces: how far each node's clock is from a reference node's, and
// how far to trust that figure. Used by `merge` (sinks/fleet/merge.h); pure functions, no I/O.
//
// Contract:
// - SyncPointCollector is fed one node's events in any batch order that is sorted by ts_ns within
//   each thread (a replay source's order). For every thread it numbers the NCCL collectives of
//   the process's busiest communicator (Event::arg1 = communicator handle on live NCCL events; 0
//   when unknown, which is then one communicator) and records a *sync point*: the return of the
//   first blocking wait on that thread after a collective (cudaStreamSynchronize,
//   cudaDeviceSynchronize, cudaEventSynchronize, cuStreamSynchronize, cuCtxSynchronize, a D2H
//   cudaMemcpy) that really blocked (>= min_block_ns). A wait after several collectives belongs
//   to the last one. It also keeps the collective's entry (`entry_ns`: when the rank arrived).
//   Memory: 32 bytes per collective instance seen, nothing per other event.
// - Why that moment: ncclAllReduce returns once enqueued, so entries differ by the straggler gap,
//   but a collective completes on every rank at the same instant, and a host that blocked on it
//   wakes up within microseconds of that instant (docs/fleet.md).
// - estimate_offset() matches the k-th collective of a node with the k-th of the reference, after
//   deciding the ordinal shift (captures start at different steps). Every shift whose pairs agree
//   (offset = median difference, spread = MAD) is a candidate; a candidate *fits* when its MAD is
//   within 3x the tightest one's + 5 us (6x below 16 pairs). Which fitting shift is the truth is
//   decided, in this order, by:
//   1. collective order: when both nodes' captures cover their communicators from the start
//      (AlignHints::start_aligned: the process's exec or its ncclCommInitRank was captured before
//      its first collective, nothing dropped), ordinal k is the same collective on both: shift 0,
//      if it fits (method "collective_order");
//   2. the data: exactly one shift fits, the others (with >= 16 pairs) do not: jittered steps
//      make the wrong shifts' differences spread (method "collectives");
//   3. wall-clock anchors: exactly one fitting shift lies within prior_ns +- prior_bound_ns (+ its
//      own uncertainty) (method "collectives_anchors");
//   4. nothing: method "ambiguous". The offset reported is the fitting one closest to prior_ns,
//      and the uncertainty covers every fitting shift still allowed (within the anchors' window
//      when one is given, else all of them; when the scan was subsampled, every offset at which
//      the two traces overlap), and is never below the step period.
//   offset = median of the differences; uncertainty = max(1.4826 x MAD, 1 us) when decided. It
//   fails (ok = false, `why` says why) with fewer than min_pairs pairs.
// - Offsets are "node clock minus reference clock": corrected ts = ts - offset_ns.
// - count_last_arrivals() is the one place that orders events of different nodes (which rank
//   entered a collective last, "the others waited for it"). Per collective that every matched
//   node has (at least two; corrected entries; a collective some node lacks, because its capture
//   had not started or its wait did not block, is not judged), the latest node is named last only when it leads the
//   next-latest by MORE than the two nodes' clock uncertainties added; otherwise the collective
//   counts as unresolved for it, and no order is claimed. An unknown uncertainty (-1: merged
//   without alignment or anchors) never allows a claim. A node is named last only if it leads
//   EVERY other node by more than their two uncertainties. arrivals_of_merged_trace()
//   (sinks/fleet/merge.h) does this on a merged trace with the uncertainties `merge` recorded in it.
// - Never throws.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/event.h"
#include "model/median.h"  // median_of, used by the alignment and the straggler analysis

namespace ingero {

struct SyncPoint {
  uint64_t ordinal = 0;   // per (pid, communicator) collective number, from 0
  uint64_t exit_ns = 0;   // return of the first blocking wait after that collective
  uint8_t op = 0;         // the collective's NCCL op (a cross-check when matching)
  uint64_t entry_ns = 0;  // entry of the collective (the rank's arrival); median over the node's ranks
};

class SyncPointCollector {
 public:
  explicit SyncPointCollector(uint64_t min_block_ns = 100'000) : min_block_ns_(min_block_ns) {}
  void add(const Event& e);
  // Sync points of the node, one sequence per ordinal: where several processes (ranks) of the
  // node reached the same ordinal, the median exit. Sorted by ordinal.
  std::vector<SyncPoint> points() const;
  uint64_t collectives() const { return collectives_; }
  // True when every process behind points() was captured from before its communicators' first
  // collective: its exec (HOST process_exec) was seen before it, or at least as many successful
  // ncclCommInitRank calls as it used communicators were. Its ordinal k is then the k-th
  // collective of the job on that communicator (per-communicator order is the same on every
  // rank). False without points.
  bool covers_start() const;

 private:
  struct ThreadState {
    bool pending = false;
    uint64_t ordinal = 0;
    uint8_t op = 0;
    uint64_t entry_ns = 0;
  };
  struct CommKey {
    uint32_t pid;
    uint64_t comm;
    bool operator<(const CommKey& o) const { return pid != o.pid ? pid < o.pid : comm < o.comm; }
  };
  uint64_t min_block_ns_;
  uint64_t collectives_ = 0;
  std::unordered_map<uint32_t, ThreadState> threads_;    // by tid
  std::unordered_map<uint32_t, uint64_t> pending_comm_;  // by tid: communicator of the pending one
  std::map<CommKey, uint64_t> next_ordinal_;             // per (pid, communicator)
  // Per (pid, communicator): the sync points found (ordinal -> exit, op).
  std::map<CommKey, std::vector<SyncPoint>> points_;
  struct PidStart {
    uint64_t exec_ns = UINT64_MAX;  // first process_exec seen
    std::vector<uint64_t> inits;    // successful ncclCommInitRank entries, in arrival order
  };
  std::unordered_map<uint32_t, PidStart> starts_;  // by pid
  std::map<CommKey, uint64_t> first_collective_;   // per (pid, communicator): entry of the first
};

struct AlignHints {
  int64_t prior_ns = 0;         // expected offset (the anchors'), 0 = the clocks roughly agree
  int64_t prior_bound_ns = -1;  // the true offset is within prior_ns +- this; -1 = no bound known
  bool start_aligned = false;   // both nodes' ordinals count from their communicators' start
  int64_t max_shift = 1'000'000;
  uint64_t min_pairs = 3;
};

struct OffsetEstimate {
  bool ok = false;
  bool ambiguous = false;  // several whole-step shifts fit: uncertainty covers them (>= period)
  std::string method;      // collective_order | collectives | collectives_anchors | ambiguous
  int64_t offset_ns = 0;
  int64_t uncertainty_ns = 0;
  int64_t ordinal_shift = 0;  // node ordinal = reference ordinal + shift
  uint64_t pairs = 0;
  int64_t period_ns = 0;  // the reference's median step between consecutive collectives
  uint64_t fitting = 0;   // shifts that fit as well as the best (1 = unique)
  std::string why;        // when !ok
  std::string note;       // how the shift was decided, conflicts seen
};

OffsetEstimate estimate_offset(const std::vector<SyncPoint>& reference, const std::vector<SyncPoint>& node,
                               const AlignHints& hints);
// prior_ns without a bound: it only picks which fitting shift is reported.
OffsetEstimate estimate_offset(const std::vector<SyncPoint>& reference, const std::vector<SyncPoint>& node,
                               int64_t prior_ns = 0);

// One node of a merged trace, for count_last_arrivals(): its sync points on the common clock
// (already corrected), its clock uncertainty (-1 = unknown) and its ordinal shift against the
// first node (node ordinal = first node's ordinal + shift).
struct ArrivalNode {
  std::string node;
  std::vector<SyncPoint> points;
  int64_t uncertainty_ns = -1;
  int64_t ordinal_shift = 0;
  bool matched = false;  // false: its collectives could not be matched; left out
};

struct ArrivalCount {
  std::string node;
  uint64_t compared = 0;         // collectives matched with at least one other node
  uint64_t last = 0;             // arrived last by more than the clock uncertainty: claimed
  uint64_t last_unresolved = 0;  // latest entry, but within the uncertainty: no order claimed
  int64_t max_lead_ns = 0;       // largest lead over the next-latest among the claimed ones
};

std::vector<ArrivalCount> count_last_arrivals(const std::vector<ArrivalNode>& nodes);

}  // namespace ingero
