#include "operators/interval_join.h"

#include <algorithm>
#include <iterator>
#include <limits>

namespace ingero {

void IntervalJoin::add_right(uint64_t key, const Event& e) {
  auto& buf = buffers_[key];
  const SpanRef s{e.ts_ns, e.end_ns(), e.id};
  if (e.arg0 && !buf.has_arg0) {  // from now on, kept for every span
    buf.arg0.assign(buf.spans.size(), 0);
    buf.has_arg0 = true;
  }
  const bool with_arg0 = buf.has_arg0;
  if (buf.spans.empty() || buf.spans.back().ts <= s.ts) {
    buf.spans.push_back(s);
    if (with_arg0) buf.arg0.push_back(e.arg0);
  } else {
    auto it = std::upper_bound(buf.spans.begin(), buf.spans.end(), s.ts,
                               [](uint64_t ts, const SpanRef& x) { return ts < x.ts; });
    const auto at = it - buf.spans.begin();
    buf.spans.insert(it, s);
    if (with_arg0) buf.arg0.insert(buf.arg0.begin() + at, e.arg0);
  }
  ++buffered_;
  buf.max_dur = std::max(buf.max_dur, s.end - s.ts);
}

ProbeResult IntervalJoin::probe(uint64_t key, uint64_t call_ts, uint64_t call_end) const {
  ProbeResult r;
  auto it = buffers_.find(key);
  if (it == buffers_.end()) return r;
  const auto& buf = it->second;
  const uint64_t lo = kind_ == JoinKind::kWithin ? (call_ts > within_ ? call_ts - within_ : 0) : call_ts;
  const uint64_t hi = kind_ == JoinKind::kWithin ? call_end + within_ : call_end;
  // Only spans starting at or after lo - max_dur can reach lo.
  const uint64_t from = lo > buf.max_dur ? lo - buf.max_dur : 0;
  auto first = std::lower_bound(buf.spans.begin(), buf.spans.end(), from,
                                [](const SpanRef& x, uint64_t ts) { return x.ts < ts; });
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  for (auto s = first; s != buf.spans.end() && s->ts <= hi; ++s) {
    const bool instant = s->end == s->ts;
    const bool hit = instant ? (s->ts >= lo && s->ts <= hi) : (s->ts < hi && s->end > lo);
    if (!hit) continue;
    r.right_ids.push_back(s->id);
    r.right_ns += s->end - s->ts;
    if (buf.has_arg0) r.sum_arg0 += buf.arg0[static_cast<size_t>(s - buf.spans.begin())];
    if (kind_ == JoinKind::kOverlap) {
      const uint64_t a = std::max(s->ts, call_ts), b = std::min(s->end, call_end);
      if (b > a) pieces.emplace_back(a, b);
    }
  }
  if (kind_ == JoinKind::kWithin) {
    r.overlap_ns = r.right_ids.empty() ? 0 : call_end - call_ts;
    return r;
  }
  std::sort(pieces.begin(), pieces.end());
  uint64_t cur_a = 0, cur_b = 0;
  bool open = false;
  for (const auto& [a, b] : pieces) {
    if (open && a <= cur_b) {
      cur_b = std::max(cur_b, b);
      continue;
    }
    if (open) r.overlap_ns += cur_b - cur_a;
    cur_a = a;
    cur_b = b;
    open = true;
  }
  if (open) r.overlap_ns += cur_b - cur_a;
  return r;
}

void IntervalJoin::evict(uint64_t watermark, uint64_t retain) {
  if (watermark == std::numeric_limits<uint64_t>::max()) return;  // final: windows close first
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    auto& buf = it->second;
    while (!buf.spans.empty() && buf.spans.front().end + retain < watermark) {
      buf.spans.pop_front();
      if (buf.has_arg0) buf.arg0.pop_front();
      --buffered_;
      ++evicted_;
    }
    if (buf.spans.empty()) {
      it = buffers_.erase(it);
    } else {
      ++it;
    }
  }
}

void IntervalJoin::prune(uint64_t floor, std::unordered_map<uint64_t, std::vector<CallRange>>& candidates) {
  const uint64_t reach = kind_ == JoinKind::kWithin ? within_ : 0;
  if (floor <= reach) return;
  const uint64_t below = floor - reach;  // (a): spans ending before this are out of future reach
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  // The candidates' closed ranges widened by reach, merged: disjoint, sorted, as [ts, end].
  std::vector<CallRange> merged;
  std::vector<char> drop;
  for (auto& [key, buf] : buffers_) {
    auto& spans = buf.spans;
    if (spans.empty() || spans.front().ts >= below) continue;  // every span starts (so ends) past it
    merged.clear();
    if (auto c = candidates.find(key); c != candidates.end()) {
      auto& calls = c->second;
      std::sort(calls.begin(), calls.end(), [](const CallRange& a, const CallRange& b) { return a.ts < b.ts; });
      for (const auto& call : calls) {
        const uint64_t lo = call.ts > reach ? call.ts - reach : 0;
        const uint64_t hi = call.end > kMax - reach ? kMax : call.end + reach;
        if (!merged.empty() && lo <= merged.back().end) merged.back().end = std::max(merged.back().end, hi);
        else merged.push_back({lo, hi});
      }
    }
    // Spans come in start order, so the first merged range not wholly before a span's start only
    // moves forward.
    drop.assign(spans.size(), 0);
    size_t m = 0, dropped = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      const SpanRef& s = spans[i];
      if (s.end >= below) continue;
      while (m < merged.size() && merged[m].end < s.ts) ++m;
      if (m < merged.size() && merged[m].ts <= s.end) continue;
      drop[i] = 1;
      ++dropped;
    }
    // Spans with one start are dropped all or none (kept spans stay a run per start).
    for (size_t i = 0, j = 0; i < spans.size(); i = j) {
      bool all = true;
      for (j = i; j < spans.size() && spans[j].ts == spans[i].ts; ++j) all = all && drop[j];
      if (all) continue;
      for (size_t x = i; x < j; ++x) {
        dropped -= drop[x];
        drop[x] = 0;
      }
    }
    if (!dropped) continue;
    // The kept spans close up in place, in order.
    size_t w = 0;
    auto& arg0 = buf.arg0;
    for (size_t i = 0; i < spans.size(); ++i) {
      if (drop[i]) continue;
      if (buf.has_arg0) arg0[w] = arg0[i];
      spans[w++] = spans[i];
    }
    spans.erase(spans.begin() + static_cast<std::ptrdiff_t>(w), spans.end());
    if (buf.has_arg0) arg0.erase(arg0.begin() + static_cast<std::ptrdiff_t>(w), arg0.end());
    pruned_ += dropped;
    buffered_ -= dropped;
  }
}

void JoinOutcome::add(uint64_t call_id, uint64_t call_dur, const ProbeResult& r, uint32_t max_exemplars) {
  ++calls;
  tail_ns += call_dur;
  overlap_ns += std::min(r.overlap_ns, call_dur);
  right_ns += r.right_ns;
  sum_arg0 += r.sum_arg0;
  if (r.right_ids.empty()) return;
  ++hit_calls;
  right_ids.insert(r.right_ids.begin(), r.right_ids.end());
  if (max_exemplars == 0) return;
  Exemplar ex{call_id, r.overlap_ns, {}};
  ex.right_ids.assign(r.right_ids.begin(),
                      r.right_ids.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(r.right_ids.size(), 5)));
  auto pos = std::find_if(exemplars.begin(), exemplars.end(), [&](const Exemplar& e) {
    return e.overlap_ns < ex.overlap_ns || (e.overlap_ns == ex.overlap_ns && e.call_id > ex.call_id);
  });
  exemplars.insert(pos, std::move(ex));
  if (exemplars.size() > max_exemplars) exemplars.pop_back();
}

double JoinOutcome::share() const {
  return tail_ns ? static_cast<double>(overlap_ns) / static_cast<double>(tail_ns)
                 : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace ingero
