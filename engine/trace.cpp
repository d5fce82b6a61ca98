#include "engine/trace.h"

#include <algorithm>
#include <limits>

namespace ingero {

VectorSource::VectorSource(std::vector<Event> events, size_t batch_size, TraceMeta meta)
    : events_(std::move(events)), batch_size_(batch_size ? batch_size : 4096), meta_(std::move(meta)) {
  std::stable_sort(events_.begin(), events_.end(),
                   [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  if (!events_.empty()) {
    meta_.first_ts = events_.front().ts_ns;
    uint64_t last = 0;
    for (const auto& e : events_) last = std::max(last, e.end_ns());
    meta_.last_ts = last;
  }
}

bool VectorSource::next(Batch& out) {
  if (done_) return false;
  out.events.clear();
  const size_t n = std::min(batch_size_, events_.size() - pos_);
  out.events.assign(events_.begin() + static_cast<std::ptrdiff_t>(pos_),
                    events_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
  pos_ += n;
  out.seq = seq_++;
  out.final = pos_ >= events_.size();
  out.watermark = out.final ? std::numeric_limits<uint64_t>::max()
                            : (n ? out.events.back().ts_ns : 0);
  if (out.final) done_ = true;
  return true;
}

bool BorrowedSource::next(Batch& out) {
  if (done_) return false;
  const size_t n = std::min(batch_size_, events_.size() - pos_);
  out.events.assign(events_.begin() + static_cast<std::ptrdiff_t>(pos_),
                    events_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
  pos_ += n;
  out.seq = seq_++;
  out.final = pos_ >= events_.size();
  out.watermark = out.final ? std::numeric_limits<uint64_t>::max() : (n ? out.events.back().ts_ns : 0);
  done_ = out.final;
  return true;
}

}  // namespace ingero
