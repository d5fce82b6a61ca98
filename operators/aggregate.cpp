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
    const bool uses_field = spec.kind != AggKind::kCount && spec.kind != AggKind::kRate;
    field_slot_.push_back(uses_field && spec.kind != AggKind::kQuantile ? index_of(fields_, spec.field) : -1);
    quantile_slot_.push_back(spec.kind == AggKind::kQuantile ? index_of(quantile_fields_, spec.field) : -1);
  }
}

AggregateState::AggregateState(const AggregateLayout* layout) : layout_(layout) { init(); }

void AggregateState::init() {
  if (!layout_) return;
  const size_t nf = layout_->fields().size();
  sum_.assign(nf, 0.0);
  min_.assign(nf, kNaN);
  max_.assign(nf, kNaN);
  quantiles_.clear();
  for (size_t i = 0; i < layout_->quantile_fields().size(); ++i)
    quantiles_.emplace_back(layout_->node().exact_limit, layout_->node().sketch_alpha);
}

void AggregateState::add(const Event& e) {
  count_.add(e.ts_ns, e.end_ns());
  if (!layout_) return;
  const auto& fields = layout_->fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    const double v = field_of(e, fields[i]);
    sum_[i] += v;
    if (!(min_[i] <= v)) min_[i] = v;
    if (!(max_[i] >= v)) max_[i] = v;
  }
  const auto& qf = layout_->quantile_fields();
  for (size_t i = 0; i < qf.size(); ++i) {
    const double v = field_of(e, qf[i]);
    quantiles_[i].add(v > 0 ? static_cast<uint64_t>(v) : 0);
  }
}

void AggregateState::merge(const AggregateState& o) {
  count_.merge(o.count_);
  for (size_t i = 0; i < sum_.size() && i < o.sum_.size(); ++i) {
    sum_[i] += o.sum_[i];
    if (!(min_[i] <= o.min_[i])) min_[i] = o.min_[i] == o.min_[i] ? o.min_[i] : min_[i];
    if (!(max_[i] >= o.max_[i])) max_[i] = o.max_[i] == o.max_[i] ? o.max_[i] : max_[i];
  }
  for (size_t i = 0; i < quantiles_.size() && i < o.quantiles_.size(); ++i) quantiles_[i].merge(o.quantiles_[i]);
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
      case AggKind::kSum: out[i] = sum_[static_cast<size_t>(f)]; break;
      case AggKind::kMin: out[i] = min_[static_cast<size_t>(f)]; break;
      case AggKind::kMax: out[i] = max_[static_cast<size_t>(f)]; break;
      case AggKind::kMean: out[i] = n > 0 ? sum_[static_cast<size_t>(f)] / n : kNaN; break;
      case AggKind::kQuantile: {
        const auto& qs = quantiles_[static_cast<size_t>(q)];
        out[i] = qs.count() ? static_cast<double>(qs.quantile(specs[i].q)) : kNaN;
        break;
      }
    }
  }
}

}  // namespace ingero
