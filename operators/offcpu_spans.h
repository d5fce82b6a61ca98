// Off-CPU span builder: HOST sched_switch events -> off-CPU spans of a thread.
//
// Contract:
// - Input: HOST sched_switch events in ts order, of two forms. A whole span (replay of Ingero or
//   of our own databases, or a live source that pairs in the kernel) passes through. A pair of
//   halves (flags kSwitchOut at switch-out, kSwitchIn at switch-in, same tid) is joined into one
//   span: ts = switch-out, dur = switch-in - switch-out, prev_state and arg1 (the task that ran
//   instead) from the switch-out half.
// - A switch-in with no open switch-out (its partner was lost or predates the trace) is counted
//   in unpaired() and dropped. A second switch-out on a thread that is already out replaces the
//   first (counted too).
// - finish(end_ts) closes spans still open at the end of the trace at end_ts, flagged kTruncated.
// - Spans shorter than min_ns, or whose state is not in `states` (when given), are dropped.
// - Output is appended to `out`; spans built from halves come out when they close, so they can be
//   behind spans already emitted: consumers insert by ts (interval_join.h does).
// - Single-threaded; state is one open switch-out per thread.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "model/event.h"
#include "model/plan.h"

namespace ingero {

class OffCpuSpanBuilder {
 public:
  explicit OffCpuSpanBuilder(const OffCpuNode& node) : node_(node) {}
  void add(const Event& e, std::vector<Event>& out);
  void finish(uint64_t end_ts, std::vector<Event>& out);
  uint64_t unpaired() const { return unpaired_; }
  uint64_t truncated() const { return truncated_; }
  size_t open_spans() const { return open_.size(); }

 private:
  void emit(const Event& span, std::vector<Event>& out) const;
  OffCpuNode node_;
  std::unordered_map<uint32_t, Event> open_;
  uint64_t unpaired_ = 0, truncated_ = 0;
};

}  // namespace ingero
