// Count and rate: how many events a window saw, and how many per second of the window.
//
// Contract: add() per event; rate() divides by the window's length in seconds - the nominal
// size for time windows, the observed span (first start to last end) for a whole-trace window.
// A zero-length span gives rate NaN (never a division by zero). Counters saturate instead of
// wrapping on overflow.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace ingero {

struct CountRate {
  uint64_t count = 0;
  uint64_t first_ts = std::numeric_limits<uint64_t>::max();
  uint64_t last_end = 0;

  void add(uint64_t ts, uint64_t end) {
    if (count != std::numeric_limits<uint64_t>::max()) ++count;
    add_span(ts, end);
  }
  // The span part of add() alone, for a caller that counts by itself and needs the span only
  // for rate() over a whole-trace window (AggregateState skips it when it has no rate).
  void add_span(uint64_t ts, uint64_t end) {
    first_ts = std::min(first_ts, ts);
    last_end = std::max(last_end, end);
  }
  void merge(const CountRate& o) {
    count = o.count > std::numeric_limits<uint64_t>::max() - count ? std::numeric_limits<uint64_t>::max()
                                                                   : count + o.count;
    first_ts = std::min(first_ts, o.first_ts);
    last_end = std::max(last_end, o.last_end);
  }
  double rate(uint64_t window_ns) const {
    const uint64_t span = window_ns ? window_ns : (last_end > first_ts ? last_end - first_ts : 0);
    if (span == 0) return std::numeric_limits<double>::quiet_NaN();
    return static_cast<double>(count) * 1e9 / static_cast<double>(span);
  }
};

// Saturating add for the 64-bit sums of durations and sizes.
inline uint64_t sat_add(uint64_t a, uint64_t b) {
  return b > std::numeric_limits<uint64_t>::max() - a ? std::numeric_limits<uint64_t>::max() : a + b;
}

}  // namespace ingero
