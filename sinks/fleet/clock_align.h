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
//   searching the ordinal shift (captures start at different steps): the shift whose differences
//   are tightest (MAD), and among near-ties the one closest to `prior_ns` (the wall clocks agree
//   to far better than one step, normally). offset = median of the differences; uncertainty =
//   max(1.4826 x MAD, 1 us). It fails (ok = false, `why` says why) with fewer than min_pairs pairs.
//   Ambiguity: when the step period is shorter than the wall-clock error, the shift cannot be told
//   apart from the offset; `prior_ns` decides.
// - Offsets are "node clock minus reference clock": corrected ts = ts - offset_ns.
// - count_last_arrivals() is the one place that orders events of different nodes (which rank
//   entered a collective last, "the others waited for it"). Per collective matched across at
//   least two nodes (corrected entries), the latest node is named last only when it leads the
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
};

struct OffsetEstimate {
  bool ok = false;
  int64_t offset_ns = 0;
  int64_t uncertainty_ns = 0;
  int64_t ordinal_shift = 0;  // node ordinal = reference ordinal + shift
  uint64_t pairs = 0;
  std::string why;  // when !ok
};

OffsetEstimate estimate_offset(const std::vector<SyncPoint>& reference, const std::vector<SyncPoint>& node,
                               int64_t prior_ns = 0, int64_t max_shift = 64, uint64_t min_pairs = 3);

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

// Median of a vector (copied; empty -> 0).
int64_t median_of(std::vector<int64_t> v);

}  // namespace ingero
