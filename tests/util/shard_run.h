// Test helpers that drive Shards directly (tests/engine/join_prune_test, join_share_test,
// threads_routing_test).
//
// Contract:
// - for_each_batch(ev, batch, f): calls f(ShardInput&) for `ev` (sorted by start) cut into
//   batches of `batch` events, as a replay source delivers them: each batch's events owned (a
//   copy), watermark = its last start (the Batch contract), trace_end = the trace's last end, the
//   last batch final. Stops after the final batch.
// - shard_text(outs): everything a run of shard outputs reports but the span counters, as text:
//   chains (id, rule, summary, every value, every evidence item with its event ids), rule
//   outcomes with their closest miss, window counters. Equal text means equal results.
// Header-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "model/event.h"

namespace ingero::test {

template <class F>
void for_each_batch(const std::vector<Event>& ev, size_t batch, F&& f) {
  for (size_t at = 0;; at += batch) {
    const size_t end = std::min(ev.size(), at + batch);
    ShardInput in;
    in.owned = std::make_shared<const std::vector<Event>>(ev.begin() + static_cast<ptrdiff_t>(at),
                                                          ev.begin() + static_cast<ptrdiff_t>(end));
    in.final = end == ev.size();
    in.watermark = in.owned->empty() ? 0 : in.owned->back().ts_ns;
    in.trace_end = ev.empty() ? 0 : ev.back().end_ns();
    f(in);
    if (in.final) return;
  }
}

inline std::string num_text(double v) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

inline std::string shard_text(const std::vector<ShardOutput>& outs) {
  std::string s;
  for (const auto& out : outs) {
    for (const auto& c : out.chains) {
      s += c.id + " " + c.rule + " " + c.summary + "\n";
      for (const auto& [name, v] : c.values) s += " " + name + "=" + num_text(v);
      s += "\n";
      for (const auto& e : c.evidence) {
        s += " ev " + e.kind + " " + num_text(e.value) + " " + e.detail + " ids";
        for (uint64_t id : e.event_ids) s += " " + std::to_string(id);
        s += "\n";
      }
    }
    for (const auto& o : out.outcomes)
      s += "outcome " + o.rule + " " + std::to_string(o.windows) + " " + std::to_string(o.chains) + " " + o.miss_key +
           "\n";
    s += "windows " + std::to_string(out.counters.windows_closed) + " late " +
         std::to_string(out.counters.late_events) + " capped " + std::to_string(out.counters.tail_windows_capped) +
         "\n";
  }
  return s;
}

}  // namespace ingero::test
