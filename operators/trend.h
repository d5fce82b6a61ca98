// Trend over consecutive windows of the same key.
//
// Contract: observe(key, window index, value) is called once per closed window of a key, in
// window order. History restarts when a window is skipped (the key had no events in it), so
// "three consecutive windows" means three adjacent windows. kRising holds when the last
// `windows` values strictly increase; kBelowPeak holds when the value is below factor x the peak
// of the previous `windows` values (and that history is full). NaN values break the history.
// Outputs: first (oldest value considered), last, peak (of the history before this value for
// kBelowPeak, of the run for kRising), change = last / first (NaN if first is 0); history and
// needed: the windows in hand and the windows the mode needs (kRising: `windows` values including
// this one; kBelowPeak: `windows` values before it).
// kBaseline always holds: median and mad (median absolute deviation) of the previous `windows`
// values of the key, NaN before it has any (history = how many); a skipped window does not
// restart it, a NaN value is not added to it.
// retract(key, window): the rule fired on this window of the key, so its value is not normal: it
// leaves the baseline (kBaseline only; the value observe() just added for `window`, and the
// oldest value that addition pushed out comes back). A baseline is therefore the key's windows
// that did not fire: a contention that lasts does not become its own baseline and stop firing.
// At most kMaxRetracted windows in a row are left out; after that the level is the new normal.
// Memory: at most `windows` values per key. Single-threaded.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>

#include "model/plan.h"
#include "operators/key_by.h"

namespace ingero {

struct TrendResult {
  bool holds = false;
  double first = 0, last = 0, peak = 0, change = 0;
  double median = 0, mad = 0;  // kBaseline
  // The consecutive windows of this key the judgement had, and the number it needs: a trend that
  // does not hold because its history is short says so (`--why-not`), instead of comparing zeros.
  uint32_t history = 0, needed = 0;
};

class TrendOp {
 public:
  explicit TrendOp(const TrendNode& node) : node_(node) {}
  static constexpr uint32_t kMaxRetracted = 300;
  TrendResult observe(const Key& key, uint64_t window, double value);
  void retract(const Key& key, uint64_t window);

 private:
  struct History {
    uint64_t last_window = 0;
    std::deque<double> values;
    // kBaseline: the last observe() added a value (for window `added_window`), pushing out
    // `evicted` when `has_evicted`; `retracted_run` windows in a row have been left out.
    bool added = false, has_evicted = false;
    uint64_t added_window = 0;
    double evicted = 0;
    uint32_t retracted_run = 0;
  };
  TrendNode node_;
  std::unordered_map<Key, History, KeyHash> history_;
};

}  // namespace ingero
