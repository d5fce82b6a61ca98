// Aggregate: the per-window state behind an Aggregate plan node.
//
// Contract: one AggregateState per (window, key). add() folds one event in; values() writes one
// double per AggSpec, in spec order, into a row. count/sum/min/max/mean/rate/quantile over an
// event field; quantiles of the same field share one QuantileState (exact nearest-rank up to the
// node's exact_limit, then DDSketch with relative error alpha). Sums, minima and maxima are
// doubles (the field read as a double); a quantile state takes the field's value as an unsigned
// integer (negative values as 0). An empty state yields count 0 and NaN for min/max/mean/quantile,
// so predicates over them are false. merge() combines partial states (used when a window's events
// were split, e.g. across shards), and is exact when the quantile states are.
//
// Per-event cost: AggregateLayout sorts the node into a Shape once. The shapes the rule pack uses
// (count only; duration's sum/min/max and/or duration's quantiles) take an inline path with no
// loop and no field dispatch; any other node takes the general loop. The first start and last end
// (for rate over a whole-trace window) are tracked only when the node has a rate spec.
#pragma once

#include <vector>

#include "model/event.h"
#include "model/plan.h"
#include "operators/count_rate.h"
#include "operators/quantile.h"

namespace ingero {

class AggregateLayout {
 public:
  // How add() folds an event in: kCount, or duration only (kDurStats: its sum/min/max; kDurQuantile:
  // its quantile state; kDurBoth: both), or kGeneral (any other mix of fields: a loop).
  enum class Shape : uint8_t { kCount, kDurStats, kDurQuantile, kDurBoth, kGeneral };

  explicit AggregateLayout(const AggregateNode& node);
  const AggregateNode& node() const { return node_; }
  // For spec i: index into the state's per-field accumulators, and its quantile state (or -1).
  int field_slot(size_t spec) const { return field_slot_[spec]; }
  int quantile_slot(size_t spec) const { return quantile_slot_[spec]; }
  const std::vector<Field>& fields() const { return fields_; }
  const std::vector<Field>& quantile_fields() const { return quantile_fields_; }
  Shape shape() const { return shape_; }
  bool has_rate() const { return has_rate_; }
  bool has_buckets() const { return has_buckets_; }  // a kTime/kTopTask/kTopTaskTime spec

 private:
  AggregateNode node_;
  std::vector<int> field_slot_, quantile_slot_;
  std::vector<Field> fields_, quantile_fields_;
  Shape shape_ = Shape::kGeneral;
  bool has_rate_ = false;
  bool has_buckets_ = false;
};

class AggregateState {
 public:
  explicit AggregateState(const AggregateLayout* layout = nullptr);
  void add(const Event& e) {
    switch (shape_) {
      case Shape::kCount: add_as<Shape::kCount>(e); return;
      case Shape::kDurStats: add_as<Shape::kDurStats>(e); return;
      case Shape::kDurQuantile: add_as<Shape::kDurQuantile>(e); return;
      case Shape::kDurBoth: add_as<Shape::kDurBoth>(e); return;
      case Shape::kGeneral: add_as<Shape::kGeneral>(e); return;
    }
  }
  // add() for a caller that knows the state's shape S (every state bound to one layout has the
  // layout's shape: the engine feeds a window group's states in a loop compiled per shape), with
  // no dispatch. S must be the layout's shape (a state without a layout has kCount).
  template <AggregateLayout::Shape S>
  [[gnu::always_inline]] void add_as(const Event& e) {
    if (count_.count != UINT64_MAX) ++count_.count;
    if (track_span_) count_.add_span(e.ts_ns, e.end_ns());
    if constexpr (S == Shape::kDurStats || S == Shape::kDurBoth) fold(acc_[0], static_cast<double>(e.dur_ns));
    if constexpr (S == Shape::kDurQuantile || S == Shape::kDurBoth) quantiles_[0].add(duration_value(e.dur_ns));
    if constexpr (S == Shape::kGeneral) add_general(e);
  }
  void merge(const AggregateState& other);
  // Writes one value per spec into out[0..n). window_ns: nominal window length (0 = whole trace).
  void values(uint64_t window_ns, double* out) const;
  uint64_t count() const { return count_.count; }
  // The quantile state of the durations (kDurQuantile and kDurBoth: every event's
  // duration_value(dur_ns), which is dur_ns itself below 2^53), or null for other shapes.
  const QuantileState* duration_quantile() const {
    return shape_ == Shape::kDurQuantile || shape_ == Shape::kDurBoth ? &quantiles_[0] : nullptr;
  }

  // The value a quantile state takes for a field read as the double v: v truncated to an
  // integer, 0 for v <= 0 or NaN, UINT64_MAX from 2^64 up.
  static uint64_t quantile_input(double v) {
    if (!(v > 0)) return 0;
    return v < 18446744073709551616.0 ? static_cast<uint64_t>(v) : UINT64_MAX;
  }

 private:
  using Shape = AggregateLayout::Shape;
  struct FieldAcc {  // one field's sum, min and max (NaN until the first value)
    double sum, min, max;
  };
  static void fold(FieldAcc& a, double v) {
    a.sum += v;
    if (!(a.min <= v)) a.min = v;
    if (!(a.max >= v)) a.max = v;
  }
  // quantile_input(double(d)) without the double round trip where it is exact (d < 2^53).
  static uint64_t duration_value(uint64_t d) {
    return d < (uint64_t{1} << 53) ? d : quantile_input(static_cast<double>(d));
  }
  void add_general(const Event& e);
  static void add_task(std::vector<std::pair<uint64_t, double>>& v, uint64_t task, double d);
  void init();

  const AggregateLayout* layout_;
  Shape shape_ = Shape::kCount;
  bool track_span_ = false;
  CountRate count_;
  std::vector<FieldAcc> acc_;  // per layout field
  std::vector<QuantileState> quantiles_;
  // Per spec (kTime: its sum; kTopTask/kTopTaskTime: time by task, at most kMaxTasks tasks, the
  // least one dropped past that - the top task is exact unless more tasks than that took turns).
  static constexpr size_t kMaxTasks = 64;
  std::vector<double> bucket_time_;
  std::vector<std::vector<std::pair<uint64_t, double>>> tasks_;
};

}  // namespace ingero
