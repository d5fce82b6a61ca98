#include "operators/offcpu_spans.h"

#include <algorithm>

namespace ingero {

void OffCpuSpanBuilder::emit(const Event& span, std::vector<Event>& out) const {
  if (span.dur_ns < node_.min_ns) return;
  if (!node_.states.empty() &&
      std::find(node_.states.begin(), node_.states.end(), span.prev_state) == node_.states.end())
    return;
  out.push_back(span);
}

void OffCpuSpanBuilder::add(const Event& e, std::vector<Event>& out) {
  if (e.flags & event_flags::kSwitchOut) {
    auto [it, inserted] = open_.try_emplace(e.tid, e);
    if (!inserted) {
      ++unpaired_;
      it->second = e;
    }
    return;
  }
  if (e.flags & event_flags::kSwitchIn) {
    auto it = open_.find(e.tid);
    if (it == open_.end()) {
      ++unpaired_;
      return;
    }
    Event span = it->second;
    open_.erase(it);
    span.flags &= static_cast<uint8_t>(~event_flags::kSwitchOut);
    span.dur_ns = e.ts_ns > span.ts_ns ? e.ts_ns - span.ts_ns : 0;
    emit(span, out);
    return;
  }
  emit(e, out);
}

void OffCpuSpanBuilder::finish(uint64_t end_ts, std::vector<Event>& out) {
  std::vector<Event> spans;
  spans.reserve(open_.size());
  for (auto& [tid, open] : open_) {
    Event span = open;
    span.flags = static_cast<uint8_t>((span.flags & ~event_flags::kSwitchOut) | event_flags::kTruncated);
    span.dur_ns = end_ts > span.ts_ns ? end_ts - span.ts_ns : 0;
    spans.push_back(span);
    ++truncated_;
  }
  open_.clear();
  std::sort(spans.begin(), spans.end(),
            [](const Event& a, const Event& b) { return a.ts_ns != b.ts_ns ? a.ts_ns < b.ts_ns : a.tid < b.tid; });
  for (const auto& s : spans) emit(s, out);
}

}  // namespace ingero
