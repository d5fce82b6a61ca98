#include "operators/op_stats.h"

namespace ingero {

OpStatsAccumulator::PerOp& OpStatsAccumulator::make_slot(size_t i) {
  if (i >= ops_.size()) ops_.resize((i | 0xff) + 1);  // whole sources
  auto& p = ops_[i];
  if (!p) p = std::make_unique<PerOp>(PerOp{QuantileState(exact_limit_, alpha_), 0, 0});
  return *p;
}

void OpStatsAccumulator::merge(const OpStatsAccumulator& other) {
  for (size_t i = 0; i < other.ops_.size(); ++i) {
    if (!other.ops_[i]) continue;
    const auto& o = *other.ops_[i];
    auto& p = slot(static_cast<Source>(i >> 8), static_cast<uint8_t>(i));
    p.q.merge(o.q);
    p.total = sat_add(p.total, o.total);
    p.errors += o.errors;
  }
}

std::vector<OpStats> OpStatsAccumulator::results() const {
  std::vector<OpStats> out;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (!ops_[i]) continue;
    const auto& p = *ops_[i];
    OpStats s;
    s.source = static_cast<Source>(i >> 8);
    s.op = static_cast<uint8_t>(i);
    s.count = p.q.count();
    s.p50_ns = p.q.quantile(0.50);
    s.p95_ns = p.q.quantile(0.95);
    s.p99_ns = p.q.quantile(0.99);
    s.min_ns = p.q.min();
    s.max_ns = p.q.max();
    s.total_ns = p.total;
    s.errors = p.errors;
    s.tail_ratio = s.p50_ns ? static_cast<double>(s.p99_ns) / static_cast<double>(s.p50_ns) : 0;
    s.exact = p.q.exact();
    s.rel_error = s.exact ? 0 : p.q.alpha();
    out.push_back(s);
  }
  return out;
}

}  // namespace ingero
