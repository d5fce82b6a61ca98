// Tumbling, sliding and whole-trace windows over event time, with keyed state per window.
//
// Contract:
// - Assignment: tumbling windows are [k*size, (k+1)*size); sliding windows are
//   [k*slide, k*slide + size) for every k that contains ts; kWhole is one window, index 0, that
//   only the final watermark closes. An event belongs to windows by its START time (ts_ns).
// - kSteps (add_step): window k of a key holds the Source::kStep events whose ordinal (arg0) is in
//   [k*steps, (k+1)*steps); its start/end are its first step's start and its last step's end.
//   Such a window closes as soon as it holds `steps` steps (close() at any watermark), or at
//   close_all(); never late. Closing order: (window, key) among those due.
// - State: one State per (window, key), created on first use. Empty windows have no state and
//   emit nothing.
// - Closing: close(watermark, fn) calls fn(window index, start, end, key, state&) for every window
//   whose end + lateness <= watermark, in (window, key) order - deterministic whatever the arrival
//   order - then frees it. close_all() closes everything (final watermark).
// - An event behind the watermark whose windows are already closed is "late": add() returns false
//   and the caller counts it; nothing is reopened.
// - Single-threaded: one WindowStore per shard.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <unordered_map>
#include <vector>

#include "model/event.h"
#include "model/plan.h"
#include "operators/key_by.h"

namespace ingero {

class WindowAssigner {
 public:
  explicit WindowAssigner(const WindowNode& w) : kind_(w.kind), size_(w.size_ns), slide_(w.slide_ns) {
    if (kind_ == WindowKind::kTumbling) slide_ = size_;
    if (size_ == 0) size_ = 1;
    if (slide_ == 0) slide_ = size_;
  }
  // Calls fn(index) for every window containing ts.
  template <class Fn>
  void assign(uint64_t ts, Fn&& fn) const {
    if (kind_ == WindowKind::kWhole) {
      fn(uint64_t{0});
      return;
    }
    const uint64_t last = ts / slide_;
    const uint64_t span = (size_ + slide_ - 1) / slide_;  // windows that can contain one instant
    const uint64_t first = last >= span - 1 ? last - (span - 1) : 0;
    for (uint64_t k = first; k <= last; ++k)
      if (ts >= k * slide_ && ts < k * slide_ + size_) fn(k);
  }
  uint64_t start(uint64_t k) const { return kind_ == WindowKind::kWhole ? 0 : k * slide_; }
  uint64_t end(uint64_t k) const {
    return kind_ == WindowKind::kWhole ? std::numeric_limits<uint64_t>::max() : k * slide_ + size_;
  }
  uint64_t size() const { return size_; }
  bool whole() const { return kind_ == WindowKind::kWhole; }

 private:
  WindowKind kind_;
  uint64_t size_, slide_;
};

template <class State>
class WindowStore {
 public:
  WindowStore(const WindowNode& w, uint64_t lateness)
      : assigner_(w),
        lateness_(lateness),
        sliding_(w.kind == WindowKind::kSliding),
        steps_(w.kind == WindowKind::kSteps ? std::max<uint32_t>(w.steps, 1) : 0) {}

  bool by_steps() const { return steps_ != 0; }
  // kSteps: the state of the window of step event `e` for `key`, creating it.
  template <class Fn>
  void add_step(const Event& e, const Key& key, Fn&& fn) {
    const uint64_t k = e.arg0 / steps_;
    StepSpan& sp = spans_[{k, key}];
    if (sp.n == 0 || e.ts_ns < sp.start) sp.start = e.ts_ns;
    sp.end = std::max(sp.end, e.end_ns());
    ++sp.n;
    fn(k, windows_[k][key]);
    if (sp.n >= steps_) full_ = true;
  }

  // Returns the states of every window containing ts for `key`, creating them; false if late.
  template <class Fn>
  bool add(uint64_t ts, const Key& key, Fn&& fn) {
    // Fast path: consecutive events of one key usually land in the same (single) window.
    if (cache_ && cache_key_ == key && !sliding_) {
      const uint64_t k = assigner_.whole() ? 0 : ts / assigner_.size();
      if (k == cache_k_) {
        fn(k, *cache_);
        return true;
      }
    }
    bool any = false;
    assigner_.assign(ts, [&](uint64_t k) {
      if (closed_any_ && k <= last_closed_) return;
      any = true;
      State& st = windows_[k][key];
      cache_ = &st;
      cache_k_ = k;
      cache_key_ = key;
      fn(k, st);
    });
    return any;
  }

  template <class Fn>
  void close(uint64_t watermark, Fn&& fn) {
    if (steps_) {
      if (!full_) return;
      full_ = false;
      for (auto it = spans_.begin(); it != spans_.end();) {
        if (it->second.n < steps_) {
          ++it;
          continue;
        }
        emit_step(it++, fn);
      }
      return;
    }
    while (!windows_.empty()) {
      auto it = windows_.begin();
      const uint64_t end = assigner_.end(it->first);
      const uint64_t due = end > std::numeric_limits<uint64_t>::max() - lateness_ ? std::numeric_limits<uint64_t>::max()
                                                                                  : end + lateness_;
      if (watermark != std::numeric_limits<uint64_t>::max() && due > watermark) break;
      emit(it, fn);
    }
  }

  template <class Fn>
  void close_all(Fn&& fn) {
    if (steps_) {
      while (!spans_.empty()) emit_step(spans_.begin(), fn);
      return;
    }
    while (!windows_.empty()) emit(windows_.begin(), fn);
  }

  const WindowAssigner& assigner() const { return assigner_; }
  size_t open_windows() const { return windows_.size(); }
  // Calls fn(state) for every state of every open window, in no particular order.
  template <class Fn>
  void for_each_open(Fn&& fn) {
    for (auto& [k, keys] : windows_)
      for (auto& [key, state] : keys) fn(state);
  }

 private:
  using KeyMap = std::unordered_map<Key, State, KeyHash>;
  template <class It, class Fn>
  void emit(It it, Fn&& fn) {
    const uint64_t k = it->first;
    std::vector<std::pair<Key, State*>> keys;
    keys.reserve(it->second.size());
    for (auto& [key, state] : it->second) keys.emplace_back(key, &state);
    std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [key, state] : keys) fn(k, assigner_.start(k), assigner_.end(k), key, *state);
    windows_.erase(it);
    cache_ = nullptr;
    last_closed_ = closed_any_ ? std::max(last_closed_, k) : k;
    closed_any_ = true;
  }

  struct StepSpan {
    uint64_t start = 0, end = 0;
    uint32_t n = 0;
  };
  template <class It, class Fn>
  void emit_step(It it, Fn&& fn) {
    const uint64_t k = it->first.first;
    auto w = windows_.find(k);
    if (w != windows_.end()) {
      if (auto st = w->second.find(it->first.second); st != w->second.end()) {
        fn(k, it->second.start, it->second.end, it->first.second, st->second);
        w->second.erase(st);
      }
      if (w->second.empty()) windows_.erase(w);
    }
    spans_.erase(it);
  }

  WindowAssigner assigner_;
  uint64_t lateness_;
  bool sliding_;
  uint32_t steps_ = 0;  // kSteps: steps per window
  bool full_ = false;   // kSteps: a window filled since the last close()
  std::map<std::pair<uint64_t, Key>, StepSpan> spans_;
  State* cache_ = nullptr;  // the state the last event went to (pointers into the maps are stable)
  uint64_t cache_k_ = 0;
  Key cache_key_;
  std::map<uint64_t, KeyMap> windows_;
  uint64_t last_closed_ = 0;
  bool closed_any_ = false;
};

}  // namespace ingero
