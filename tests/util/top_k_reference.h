// The reference a top-K structure is tested against (tests/engine/top_k_test.cpp,
// top_k_primary_test.cpp): keep everything up to k, then a min-heap of the k greatest under
// `Greater` (the engine's CallBuffer before engine/top_k.h). Order of the result: heap order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace ingero::test {

template <class Item, class Greater>
std::vector<Item> heap_top_k(const std::vector<Item>& in, size_t k, Greater greater = Greater{}) {
  std::vector<Item> h;
  for (const auto& x : in) {
    if (h.size() < k) {
      h.push_back(x);
      if (h.size() == k) std::make_heap(h.begin(), h.end(), greater);
      continue;
    }
    if (!greater(x, h.front())) continue;
    std::pop_heap(h.begin(), h.end(), greater);
    h.back() = x;
    std::push_heap(h.begin(), h.end(), greater);
  }
  return h;
}

}  // namespace ingero::test
