// Medians, written once (the fleet's clock alignment and stragglers, the per-step waits on
// /metrics and the peer statistics all take them).
//
// Contract:
// - median_of(vector<int64_t>), median_of(vector<uint64_t>): the median; for an even count the
//   mean of the two middle values, rounded toward the lower one; 0 for an empty vector. O(n)
//   (nth_element on the copy).
// - median_of(vector<double>): the median; for an even count the mean of the two middle values;
//   0 for an empty vector. O(n).
// Header-only, plain C++.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ingero {

inline int64_t median_of(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2) return v[mid];
  const int64_t hi = v[mid];
  const int64_t lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return lo + (hi - lo) / 2;
}

inline uint64_t median_of(std::vector<uint64_t> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2) return v[mid];
  const uint64_t hi = v[mid];
  const uint64_t lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return lo + (hi - lo) / 2;
}

inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2) return v[mid];
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lo + v[mid]) / 2.0;
}

}  // namespace ingero
