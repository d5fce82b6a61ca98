#include "model/trace.h"

#include <algorithm>
#include <limits>

namespace ingero {

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
