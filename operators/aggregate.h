// Aggregate: the per-window state behind an Aggregate plan node.
//
// Contract: one AggregateState per (window, key). add() folds one event in; values() writes one
// double per AggSpec, in spec order, into a row. count/sum/min/max/mean/rate/quantile over an
// event field; quantiles of the same field share one QuantileState (exact nearest-rank up to the
// node's exact_limit, then DDSketch with relative error alpha). An empty state yields count 0 and
// NaN for min/max/mean/quantile, so predicates over them are false. merge() combines partial
// states (used when a window's events were split, e.g. across shards), and is exact when the
// quantile states are.
#pragma once

#include <vector>

#include "model/event.h"
#include "model/plan.h"
#include "operators/count_rate.h"
#include "operators/quantile.h"

namespace ingero {

class AggregateLayout {
 public:
  explicit AggregateLayout(const AggregateNode& node);
  const AggregateNode& node() const { return node_; }
  // For spec i: index into the state's sums/min/max, and its quantile state (or -1).
  int field_slot(size_t spec) const { return field_slot_[spec]; }
  int quantile_slot(size_t spec) const { return quantile_slot_[spec]; }
  const std::vector<Field>& fields() const { return fields_; }
  const std::vector<Field>& quantile_fields() const { return quantile_fields_; }

 private:
  AggregateNode node_;
  std::vector<int> field_slot_, quantile_slot_;
  std::vector<Field> fields_, quantile_fields_;
};

class AggregateState {
 public:
  explicit AggregateState(const AggregateLayout* layout = nullptr);
  void add(const Event& e);
  void merge(const AggregateState& other);
  // Writes one value per spec into out[0..n). window_ns: nominal window length (0 = whole trace).
  void values(uint64_t window_ns, double* out) const;
  uint64_t count() const { return count_.count; }

 private:
  void init();
  const AggregateLayout* layout_;
  CountRate count_;
  std::vector<double> sum_, min_, max_;
  std::vector<QuantileState> quantiles_;
};

}  // namespace ingero
