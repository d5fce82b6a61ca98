#include "operators/spill_file.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "model/temp_file.h"

namespace ingero {

size_t SpillFile::budget_from_env(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long mb = std::strtoull(v, &end, 10);
  if (end == nullptr || *end != '\0' || mb > (uint64_t{1} << 20)) return fallback;
  return static_cast<size_t>(mb) << 20;
}

namespace {
constexpr size_t kBufCap = size_t{256} * 1024;  // appends are written in pieces of this size
}

SpillFile::SpillFile(size_t resident_budget, std::string dir) : budget_(resident_budget), dir_(std::move(dir)) {}

SpillFile::~SpillFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool SpillFile::open_file() {
  std::string dir = dir_;
  if (dir.empty()) {
    const char* t = std::getenv("TMPDIR");
    dir = t != nullptr && *t != '\0' ? t : "/tmp";
  }
  std::string error;
  fd_ = open_unnamed_file(dir, error);
  return fd_ >= 0;
}

bool SpillFile::flush() {
  if (buf_.empty()) return true;
  int err = 0;
  if (!pwrite_all(fd_, buf_.data(), buf_.size(), buf_off_, err)) {
    // What the buffer holds was accepted by put(): it stays here, readable, for good.
    usable_ = false;
    ++counters_.errors;
    counters_.stuck_bytes += buf_.size();
    return false;
  }
  buf_off_ += buf_.size();
  buf_.clear();
  return true;
}

bool SpillFile::put(const uint8_t* data, uint32_t len, Slot& out) {
  if (!usable_ || len == 0) return false;
  if (fd_ < 0 && !open_file()) {
    usable_ = false;
    ++counters_.errors;
    return false;
  }
  const uint32_t cap = (len + kUnit - 1) / kUnit * kUnit;
  auto fit = free_.find(cap);
  if (fit != free_.end() && !fit->second.empty()) {
    const uint64_t off = fit->second.back();
    if (off >= buf_off_) {
      std::memcpy(buf_.data() + (off - buf_off_), data, len);
    } else if (int err = 0; !pwrite_all(fd_, data, len, off, err)) {
      usable_ = false;
      ++counters_.errors;
      return false;  // the slot stays free; the caller keeps its bytes
    }
    fit->second.pop_back();
    out = {off, len, cap};
  } else {
    if (buf_.size() + cap > kBufCap && !flush()) return false;
    if (buf_.capacity() < kBufCap) buf_.reserve(kBufCap);
    out = {buf_off_ + buf_.size(), len, cap};
    buf_.insert(buf_.end(), data, data + len);
    buf_.resize(buf_.size() + (cap - len), 0);
    counters_.file_bytes = buf_off_ + buf_.size();
  }
  ++counters_.blocks_out;
  counters_.bytes_out += cap;
  if (counters_.bytes_out > counters_.peak_bytes_out) counters_.peak_bytes_out = counters_.bytes_out;
  return true;
}

bool SpillFile::get(const Slot& s, uint8_t* out) const {
  ++counters_.reads;
  if (s.off >= buf_off_) {
    std::memcpy(out, buf_.data() + (s.off - buf_off_), s.len);
    return true;
  }
  int err = 0;
  if (pread_all(fd_, out, s.len, s.off, err)) return true;
  ++counters_.read_errors;
  return false;
}

void SpillFile::release(const Slot& s) {
  if (s.cap == 0) return;
  free_[s.cap].push_back(s.off);
  counters_.bytes_out -= s.cap;
}

size_t SpillFile::heap_bytes() const {
  size_t n = buf_.capacity();
  for (const auto& [cap, offs] : free_) n += offs.capacity() * sizeof(uint64_t) + 48;
  return n;
}

}  // namespace ingero
