#include "operators/trend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace ingero {

TrendResult TrendOp::observe(const Key& key, uint64_t window, double value) {
  TrendResult r;
  const size_t n = std::max<uint32_t>(node_.windows, 1);
  auto& h = history_[key];
  if (node_.mode == TrendMode::kBaseline) {
    constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    r.holds = true;
    r.needed = 1;
    r.history = static_cast<uint32_t>(h.values.size());
    r.last = value;
    r.median = r.mad = r.first = r.peak = r.change = kNaN;
    if (!h.values.empty()) {
      auto median_of = [](std::vector<double> v) {
        const size_t m = v.size() / 2;
        std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m), v.end());
        if (v.size() % 2) return v[m];
        const double hi = v[m];
        return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m)) + hi) / 2;
      };
      std::vector<double> v(h.values.begin(), h.values.end());
      r.median = median_of(v);
      for (double& x : v) x = std::abs(x - r.median);
      r.mad = median_of(v);
      r.first = h.values.front();
      r.peak = *std::max_element(h.values.begin(), h.values.end());
      r.change = r.median != 0 ? value / r.median : kNaN;
    }
    if (h.added) h.retracted_run = 0;  // the previous window was kept: the run of left-out ones ends
    h.added = false;
    h.has_evicted = false;
    if (value == value) {
      h.values.push_back(value);
      h.added = true;
      h.added_window = window;
      if (h.values.size() > n) {
        h.evicted = h.values.front();
        h.has_evicted = true;
        h.values.pop_front();
      }
    }
    return r;
  }
  if (!h.values.empty() && window != h.last_window + 1) h.values.clear();
  h.last_window = window;
  if (value != value) {
    h.values.clear();
    return r;
  }
  r.needed = static_cast<uint32_t>(n);
  if (node_.mode == TrendMode::kRising) {
    h.values.push_back(value);
    while (h.values.size() > n) h.values.pop_front();
    r.history = static_cast<uint32_t>(h.values.size());
    if (h.values.size() < n) return r;
    r.holds = n > 1;
    for (size_t i = 1; i < h.values.size(); ++i)
      if (!(h.values[i] > h.values[i - 1])) r.holds = false;
    r.first = h.values.front();
    r.last = h.values.back();
    r.peak = *std::max_element(h.values.begin(), h.values.end());
  } else {
    r.history = static_cast<uint32_t>(h.values.size());
    if (h.values.size() >= n) {
      r.peak = *std::max_element(h.values.begin(), h.values.end());
      r.first = h.values.front();
      r.last = value;
      r.holds = value < node_.factor * r.peak;
    }
    h.values.push_back(value);
    while (h.values.size() > n) h.values.pop_front();
  }
  r.change = r.first != 0 ? r.last / r.first : std::numeric_limits<double>::quiet_NaN();
  return r;
}

void TrendOp::retract(const Key& key, uint64_t window) {
  if (node_.mode != TrendMode::kBaseline) return;
  auto it = history_.find(key);
  if (it == history_.end()) return;
  History& h = it->second;
  if (!h.added || h.added_window != window || h.values.empty() || h.retracted_run >= kMaxRetracted) return;
  h.values.pop_back();
  if (h.has_evicted) h.values.push_front(h.evicted);
  h.added = h.has_evicted = false;
  ++h.retracted_run;
}

}  // namespace ingero
