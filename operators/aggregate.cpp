#include "operators/aggregate.h"

#include <algorithm>
#include <limits>

namespace ingero {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// read_field without a call for the field aggregates read most (the same value).
double field_of(const Event& e, Field f) {
  return f == Field::kDuration ? static_cast<double>(e.dur_ns) : read_field(e, f);
}

int index_of(std::vector<Field>& v, Field f) {
  auto it = std::find(v.begin(), v.end(), f);
  if (it != v.end()) return static_cast<int>(it - v.begin());
  v.push_back(f);
  return static_cast<int>(v.size() - 1);
}
}  // namespace

AggregateLayout::AggregateLayout(const AggregateNode& node) : node_(node) {
  for (const auto& spec : node_.aggs) {
    const bool by_bucket = spec.kind == AggKind::kTime || spec.kind == AggKind::kTopTask ||
                           spec.kind == AggKind::kTopTaskTime;
    has_buckets_ = has_buckets_ || by_bucket;
    const bool uses_field = spec.kind != AggKind::kCount && spec.kind != AggKind::kRate && !by_bucket;
    field_slot_.push_back(uses_field && spec.kind != AggKind::kQuantile ? index_of(fields_, spec.field) : -1);
    quantile_slot_.push_back(spec.kind == AggKind::kQuantile ? index_of(quantile_fields_, spec.field) : -1);
    has_rate_ = has_rate_ || spec.kind == AggKind::kRate;
  }
  // Fields are deduplicated, so "duration only" means at most one of each.
  const bool dur_stats = fields_.size() == 1 && fields_[0] == Field::kDuration;
  const bool dur_quantile = quantile_fields_.size() == 1 && quantile_fields_[0] == Field::kDuration;
  const bool no_stats = fields_.empty(), no_quantile = quantile_fields_.empty();
  if (no_stats && no_quantile) shape_ = Shape::kCount;
  else if (dur_stats && no_quantile) shape_ = Shape::kDurStats;
  else if (no_stats && dur_quantile) shape_ = Shape::kDurQuantile;
  else if (dur_stats && dur_quantile) shape_ = Shape::kDurBoth;
  else shape_ = Shape::kGeneral;
  if (has_buckets_) shape_ = Shape::kGeneral;
}

AggregateState::AggregateState(const AggregateLayout* layout) : layout_(layout) { init(); }

void AggregateState::init() {
  if (!layout_) return;  // counts events only
  shape_ = layout_->shape();
  track_span_ = layout_->has_rate();
  acc_.assign(layout_->fields().size(), FieldAcc{0.0, kNaN, kNaN});
  quantiles_.clear();
  for (size_t i = 0; i < layout_->quantile_fields().size(); ++i)
    quantiles_.emplace_back(layout_->node().exact_limit, layout_->node().sketch_alpha);
  if (layout_->has_buckets()) {
    bucket_time_.assign(layout_->node().aggs.size(), 0.0);
    tasks_.assign(layout_->node().aggs.size(), {});
  }
}

void AggregateState::add_general(const Event& e) {
  const auto& fields = layout_->fields();
  for (size_t i = 0; i < fields.size(); ++i) fold(acc_[i], field_of(e, fields[i]));
  const auto& qf = layout_->quantile_fields();
  for (size_t i = 0; i < qf.size(); ++i) quantiles_[i].add(quantile_input(field_of(e, qf[i])));
  if (!layout_->has_buckets() || e.op >= 32) return;
  const auto& specs = layout_->node().aggs;
  const uint32_t bit = 1u << e.op;
  const double d = static_cast<double>(e.dur_ns);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!(specs[i].buckets & bit)) continue;
    if (specs[i].kind == AggKind::kTime) {
      bucket_time_[i] += d;
    } else if (specs[i].kind == AggKind::kTopTask || specs[i].kind == AggKind::kTopTaskTime) {
      add_task(tasks_[i], e.arg0 ? e.arg0 : e.arg1, d);
    }
  }
}

void AggregateState::add_task(std::vector<std::pair<uint64_t, double>>& v, uint64_t task, double d) {
  if (task == 0) return;
  for (auto& [k, t] : v)
    if (k == task) {
      t += d;
      return;
    }
  if (v.size() >= kMaxTasks) {
    auto least = std::min_element(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    if (least->second >= d) return;
    *least = {task, d};
    return;
  }
  v.emplace_back(task, d);
}

void AggregateState::merge(const AggregateState& o) {
  count_.merge(o.count_);
  for (size_t i = 0; i < acc_.size() && i < o.acc_.size(); ++i) {
    FieldAcc& a = acc_[i];
    const FieldAcc& b = o.acc_[i];
    a.sum += b.sum;
    if (!(a.min <= b.min)) a.min = b.min == b.min ? b.min : a.min;
    if (!(a.max >= b.max)) a.max = b.max == b.max ? b.max : a.max;
  }
  for (size_t i = 0; i < quantiles_.size() && i < o.quantiles_.size(); ++i) quantiles_[i].merge(o.quantiles_[i]);
  for (size_t i = 0; i < bucket_time_.size() && i < o.bucket_time_.size(); ++i) bucket_time_[i] += o.bucket_time_[i];
  for (size_t i = 0; i < tasks_.size() && i < o.tasks_.size(); ++i)
    for (const auto& [k, t] : o.tasks_[i]) add_task(tasks_[i], k, t);
}

void AggregateState::values(uint64_t window_ns, double* out) const {
  if (!layout_) return;
  const auto& specs = layout_->node().aggs;
  const double n = static_cast<double>(count_.count);
  for (size_t i = 0; i < specs.size(); ++i) {
    const int f = layout_->field_slot(i);
    const int q = layout_->quantile_slot(i);
    switch (specs[i].kind) {
      case AggKind::kCount: out[i] = n; break;
      case AggKind::kRate: out[i] = count_.rate(window_ns); break;
      case AggKind::kSum: out[i] = acc_[static_cast<size_t>(f)].sum; break;
      case AggKind::kMin: out[i] = acc_[static_cast<size_t>(f)].min; break;
      case AggKind::kMax: out[i] = acc_[static_cast<size_t>(f)].max; break;
      case AggKind::kMean: out[i] = n > 0 ? acc_[static_cast<size_t>(f)].sum / n : kNaN; break;
      case AggKind::kQuantile: {
        const auto& qs = quantiles_[static_cast<size_t>(q)];
        out[i] = qs.count() ? static_cast<double>(qs.quantile(specs[i].q)) : kNaN;
        break;
      }
      case AggKind::kTime: out[i] = bucket_time_.empty() ? 0.0 : bucket_time_[i]; break;
      case AggKind::kTopTask:
      case AggKind::kTopTaskTime: {
        // The most time, ties to the smaller task: independent of arrival order.
        const std::pair<uint64_t, double>* best = nullptr;
        if (!tasks_.empty())
          for (const auto& kt : tasks_[i])
            if (!best || kt.second > best->second || (kt.second == best->second && kt.first < best->first)) best = &kt;
        if (specs[i].kind == AggKind::kTopTask) out[i] = best ? static_cast<double>(best->first) : kNaN;
        else out[i] = best ? best->second : 0.0;
        break;
      }
    }
  }
}

}  // namespace ingero
