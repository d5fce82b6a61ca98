#include "sinks/metrics/step_waits.h"

#include <algorithm>

#include "model/median.h"
#include "model/ops.h"

namespace ingero::metrics {
void StepWaitTracker::add(const Event& e) {
  const bool coll = is_collective_call(e);
  if (!coll && !is_blocking_wait(e)) return;
  const std::tuple<int16_t, uint32_t, uint32_t> tkey{e.rank, e.pid, e.tid};
  auto it = threads_.find(tkey);
  if (coll) {
    if (it == threads_.end()) {
      if (threads_.size() >= kMaxThreads) {
        ++dropped_;
        return;
      }
      it = threads_.emplace(tkey, Pending{}).first;
    }
    it->second = {true, e.arg1, e.ts_ns};
    return;
  }
  if (it == threads_.end() || !it->second.open) return;
  Pending p = it->second;
  it->second.open = false;  // only the first wait after a collective closes its step
  const std::tuple<int16_t, uint32_t, uint64_t> skey{e.rank, e.pid, p.comm};
  auto st = streams_.find(skey);
  if (st == streams_.end()) {
    if (streams_.size() >= kMaxStreams) {
      ++dropped_;
      return;
    }
    st = streams_.emplace(skey, Stream{}).first;
  }
  Stream& s = st->second;
  const uint64_t end = e.end_ns();
  const int64_t wait = end > p.entry_ns ? static_cast<int64_t>(end - p.entry_ns) : 0;
  ++s.steps;
  s.wait_s += static_cast<double>(wait) * 1e-9;
  if (s.has_last && p.entry_ns > s.last_entry_ns) {
    const auto len = static_cast<int64_t>(p.entry_ns - s.last_entry_ns);
    s.step_s += static_cast<double>(len) * 1e-9;
    if (s.window.size() < kWindowSteps) {
      s.window.emplace_back(wait, len);
    } else {
      s.window[s.next] = {wait, len};
      s.next = (s.next + 1) % kWindowSteps;
    }
  }
  s.has_last = true;
  s.last_entry_ns = p.entry_ns;
}

std::vector<RankStepWaits> StepWaitTracker::ranks() const {
  std::map<int16_t, RankStepWaits> by_rank;
  std::map<int16_t, const Stream*> busiest;
  for (const auto& [key, s] : streams_) {
    const int16_t rank = std::get<0>(key);
    auto& r = by_rank[rank];
    r.rank = rank;
    r.steps += s.steps;
    r.wait_s += s.wait_s;
    r.step_s += s.step_s;
    auto& b = busiest[rank];
    if (!b || s.steps > b->steps) b = &s;
  }
  std::vector<RankStepWaits> out;
  out.reserve(by_rank.size());
  for (auto& [rank, r] : by_rank) {
    const Stream& s = *busiest[rank];
    if (s.window.size() == kWindowSteps) {
      std::vector<int64_t> w, l;
      for (const auto& [wait, len] : s.window) {
        w.push_back(wait);
        l.push_back(len);
      }
      r.ready = true;
      r.median_wait_ns = median_of(std::move(w));
      r.median_step_ns = median_of(std::move(l));
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace ingero::metrics
