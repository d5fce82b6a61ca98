#include "model/trace.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace ingero {

void InputHealth::add_loss(const LossSpan& in) {
  if (in.total() == 0) return;
  LossSpan s = in;
  if (s.end_ns < s.start_ns) std::swap(s.start_ns, s.end_ns);
  auto& v = loss_spans;
  // First span that ends at or after s starts: everything before it stays apart.
  auto it = std::lower_bound(v.begin(), v.end(), s.start_ns,
                             [](const LossSpan& x, uint64_t t) { return x.end_ns < t; });
  auto last = it;
  while (last != v.end() && last->start_ns <= s.end_ns) {  // overlaps or touches: merged into s
    s.start_ns = std::min(s.start_ns, last->start_ns);
    s.end_ns = std::max(s.end_ns, last->end_ns);
    s.gpu += last->gpu;
    s.host += last->host;
    s.queue += last->queue;
    ++last;
  }
  it = v.erase(it, last);
  v.insert(it, s);
  if (v.size() <= kMaxLossSpans) return;
  // Too many: merge neighbours pairwise (spans grow, never shrink, so no loss is forgotten).
  std::vector<LossSpan> half;
  half.reserve(v.size() / 2 + 1);
  for (size_t i = 0; i < v.size(); i += 2) {
    LossSpan m = v[i];
    if (i + 1 < v.size()) {
      m.end_ns = v[i + 1].end_ns;
      m.gpu += v[i + 1].gpu;
      m.host += v[i + 1].host;
      m.queue += v[i + 1].queue;
    }
    half.push_back(m);
  }
  v = std::move(half);
}

LossSpan InputHealth::losses_between(uint64_t t0, uint64_t t1) const {
  if (t1 < t0) std::swap(t0, t1);
  auto it = std::lower_bound(loss_spans.begin(), loss_spans.end(), t0,
                             [](const LossSpan& x, uint64_t t) { return x.end_ns < t; });
  LossSpan sum;
  for (; it != loss_spans.end() && it->start_ns <= t1; ++it) {
    if (sum.total() == 0) sum.start_ns = it->start_ns;
    sum.end_ns = it->end_ns;
    sum.gpu += it->gpu;
    sum.host += it->host;
    sum.queue += it->queue;
  }
  return sum;
}

VectorSource::VectorSource(std::vector<Event> events, size_t batch_size, TraceMeta meta)
    : events_(std::move(events)), batch_size_(batch_size ? batch_size : 4096), meta_(std::move(meta)) {
  std::stable_sort(events_.begin(), events_.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  if (!events_.empty()) {
    meta_.first_ts = events_.front().ts_ns;
    uint64_t last = 0;
    for (const auto& e : events_) last = std::max(last, e.end_ns());
    meta_.last_ts = last;
  }
}

namespace {
// Copies the next batch of an already sorted vector; the watermark is the batch's last start.
bool next_slice(const std::vector<Event>& events, size_t batch_size, size_t& pos, uint64_t& seq, bool& done,
                Batch& out) {
  if (done) return false;
  const size_t n = std::min(batch_size, events.size() - pos);
  out.events.assign(events.begin() + static_cast<std::ptrdiff_t>(pos),
                    events.begin() + static_cast<std::ptrdiff_t>(pos + n));
  pos += n;
  out.seq = seq++;
  out.final = pos >= events.size();
  out.watermark = out.final ? std::numeric_limits<uint64_t>::max() : (n ? out.events.back().ts_ns : 0);
  done = out.final;
  return true;
}
// The slice the next next_slice() copies.
PrefetchHint next_slice_range(const std::vector<Event>& events, size_t batch_size, size_t pos, bool done) {
  if (done || pos >= events.size()) return {};
  return {events.data() + pos, std::min(batch_size, events.size() - pos) * sizeof(Event)};
}
}  // namespace

bool VectorSource::next(Batch& out) { return next_slice(events_, batch_size_, pos_, seq_, done_, out); }

bool BorrowedSource::next(Batch& out) { return next_slice(events_, batch_size_, pos_, seq_, done_, out); }

PrefetchHint VectorSource::upcoming() { return next_slice_range(events_, batch_size_, pos_, done_); }
PrefetchHint BorrowedSource::upcoming() { return next_slice_range(events_, batch_size_, pos_, done_); }

}  // namespace ingero
