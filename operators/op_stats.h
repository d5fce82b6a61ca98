// Per-op statistics over a whole trace: count, p50/p95/p99, min, max, total time, errors.
//
// Contract: add() every event of a call-like op (any op works; off-CPU spans give off-CPU
// statistics). Quantiles are nearest-rank, exact up to `exact_limit` samples per op, then DDSketch
// (quantile.h) - OpStats::exact says which. merge() folds in another accumulator (another shard):
// the merged result equals what one accumulator over all the events would give, so statistics do
// not depend on the number of shards. Single-threaded per instance. add() is inline (one table
// lookup, the quantile state's inline add, two counters); merge() and results() are not.
// A caller that keeps the durations in quantile states of its own may instead give each event's
// totals (add_totals) and fold those states in (merge_quantile): the same numbers (see there).
#pragma once

#include <memory>
#include <vector>

#include "model/event.h"
#include "model/result.h"
#include "operators/count_rate.h"
#include "operators/quantile.h"

namespace ingero {

class OpStatsAccumulator {
 public:
  explicit OpStatsAccumulator(uint32_t exact_limit = 1u << 16, double alpha = 0.01)
      : exact_limit_(exact_limit), alpha_(alpha) {}
  void add(const Event& e) {  // inline: runs on every event
    PerOp& p = slot(e.source, e.op);
    p.q.add(e.dur_ns);
    take_totals(p, e);
  }
  // add() in two parts, for a caller whose own quantile states already hold the durations of an
  // op's events (the engine's window states; merged in later with merge_quantile): the total and
  // error count of one event, and the duration of one event alone. add_totals(e) plus either
  // add_duration(e) or a merge_quantile() of a state that took e.dur_ns is exactly add(e).
  void add_totals(const Event& e) { take_totals(slot(e.source, e.op), e); }
  void add_duration(const Event& e) { slot(e.source, e.op).q.add(e.dur_ns); }
  // Folds in the durations a quantile state took for events of (source, op). The result equals
  // adding each of them, provided the state's exact limit is at least exact_limit() and its alpha
  // is alpha() (QuantileState::merge keeps exactness exactly while the total fits the limit).
  void merge_quantile(Source s, uint8_t op, const QuantileState& q) { slot(s, op).q.merge(q); }
  uint32_t exact_limit() const { return exact_limit_; }
  double alpha() const { return alpha_; }
  void merge(const OpStatsAccumulator& other);
  std::vector<OpStats> results() const;  // sorted by (source, op)

 private:
  struct PerOp {
    QuantileState q;
    uint64_t total = 0, errors = 0;
  };
  static void take_totals(PerOp& p, const Event& e) {
    p.total = sat_add(p.total, e.dur_ns);
    p.errors += e.ret != 0 ? 1 : 0;
  }
  PerOp& slot(Source s, uint8_t op) {
    const size_t i = static_cast<size_t>(s) << 8 | op;
    if (i < ops_.size() && ops_[i]) return *ops_[i];
    return make_slot(i);
  }
  PerOp& make_slot(size_t i);  // grows ops_ to cover index i, creates its PerOp
  uint32_t exact_limit_;
  double alpha_;
  // Indexed by source << 8 | op: a lookup per event without hashing; iterates in (source, op) order.
  // Sized up to the highest source seen (256 entries per source), not all 65,536 up front.
  std::vector<std::unique_ptr<PerOp>> ops_;
};

}  // namespace ingero
