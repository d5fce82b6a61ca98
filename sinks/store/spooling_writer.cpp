// SpoolingWriter: the SQLite sink on its own thread, fed through a bounded FIFO and a spill file.
// See sinks/store/spooling_writer.h for the contract and docs/storage.md for the figures.
#include "sinks/store/spooling_writer.h"

#include <cstdlib>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "model/format.h"
#include "model/temp_file.h"

namespace ingero {

namespace {

constexpr size_t kSpillReadEvents = 4096;            // 320 KiB read-back buffer
constexpr uint64_t kPunchEvery = uint64_t{1} << 20;  // give back consumed spill space per MiB
constexpr int kProgressSeconds = 5;

}  // namespace

void SpoolingWriter::FreeDeleter::operator()(Event* p) const { std::free(p); }

std::unique_ptr<SpoolingWriter> SpoolingWriter::start(std::unique_ptr<SqliteSink> sink, const Options& options,
                                                      std::string& error) {
  if (!sink) {
    error = "spooling writer: no sink given";
    return nullptr;
  }
  std::string dir = options.spill_dir;
  if (dir.empty()) {
    dir = std::filesystem::path(sink->path()).parent_path().string();
    if (dir.empty()) dir = ".";
  }
  const int fd = open_unnamed_file(dir, error);
  if (fd < 0) return nullptr;
  const size_t capacity = options.memory_cap_bytes / sizeof(Event);
  std::unique_ptr<SpoolingWriter> w(new (std::nothrow) SpoolingWriter(std::move(sink), options, fd, capacity));
  if (!w) {
    ::close(fd);
    error = "spooling writer: out of memory";
    return nullptr;
  }
  if (capacity && !w->ring_) {
    error = "spooling writer: cannot allocate the " + format_count(static_cast<double>(options.memory_cap_bytes)) +
            "-byte event buffer";
    w->finished_ = true;  // no thread to drain or join
    return nullptr;
  }
  try {
    w->spill_buf_.resize(kSpillReadEvents);
    w->thread_ = std::thread([raw = w.get()] { raw->writer_loop(); });
  } catch (const std::exception& e) {
    error = std::string("spooling writer: cannot start the writer thread (") + e.what() + ")";
    w->finished_ = true;  // no thread to drain or join
    return nullptr;
  }
  return w;
}

SpoolingWriter::SpoolingWriter(std::unique_ptr<SqliteSink> sink, const Options& options, int spill_fd, size_t capacity)
    : sink_(std::move(sink)), options_(options), spill_fd_(spill_fd), capacity_(capacity) {
  if (options_.max_batch == 0) options_.max_batch = 1;
  // malloc, not new Event[]: Event's member initializers would write (and so make resident) the
  // whole buffer up front; untouched pages cost nothing until the FIFO actually fills.
  if (capacity_) ring_.reset(static_cast<Event*>(std::malloc(capacity_ * sizeof(Event))));
  stats_.memory_cap_bytes = capacity_ * sizeof(Event);
}

SpoolingWriter::~SpoolingWriter() {
  if (!finished_) {
    std::string ignored;
    finish(nullptr, ignored);
  }
  if (spill_fd_ >= 0) ::close(spill_fd_);
}

void SpoolingWriter::note_error(const std::string& message) {
  if (stats_.error.empty()) stats_.error = message;
}

void SpoolingWriter::write_events(std::span<const Event> events) {
  if (events.empty()) return;
  const size_t n = events.size();
  bool to_memory = false, reset_spill = false;
  {
    std::lock_guard lk(mu_);
    stats_.events_in += n;
    if (finished_ || stop_ || sink_failed_.load(std::memory_order_relaxed)) {
      stats_.lost += n;
      if (finished_ || stop_) note_error("events written after finish() were not stored");
      return;
    }
    if (spilling_ && spill_pending_ == 0) {
      spilling_ = false;
      reset_spill = spill_end_ > 0;
    }
    to_memory = !spilling_ && capacity_ - ring_used_ >= n;
  }
  if (reset_spill) {
    // The writer has stored every spilled event and no spill run is queued, so it will not touch
    // the file or its read offsets until we queue one (under mu_, after this).
    if (::ftruncate(spill_fd_, 0) == 0) spill_end_ = spill_read_ = spill_punched_ = 0;
  }
  if (!to_memory) {
    spill(events);
    return;
  }
  // [ring_tail_, ring_tail_ + n) is free: only this thread fills the ring, the writer only empties.
  const size_t first = std::min(n, capacity_ - ring_tail_);
  std::memcpy(static_cast<void*>(ring_.get() + ring_tail_), events.data(), first * sizeof(Event));
  if (first < n) std::memcpy(static_cast<void*>(ring_.get()), events.data() + first, (n - first) * sizeof(Event));
  ring_tail_ = (ring_tail_ + n) % capacity_;
  std::lock_guard lk(mu_);
  ring_used_ += n;
  if (!runs_.empty() && runs_.back().kind == RunKind::kMemory) runs_.back().count += n;
  else runs_.push_back(Run{RunKind::kMemory, n, nullptr});
  stats_.memory_bytes_now = ring_used_ * sizeof(Event);
  stats_.memory_bytes_peak = std::max(stats_.memory_bytes_peak, stats_.memory_bytes_now);
  if (writer_waiting_) work_cv_.notify_one();
}

bool SpoolingWriter::spill(std::span<const Event> events) {
  const size_t n = events.size();
  const size_t bytes = n * sizeof(Event);
  int err = 0;
  const bool ok = pwrite_all(spill_fd_, events.data(), bytes, spill_end_, err);
  std::lock_guard lk(mu_);
  if (!ok) {
    // spill_end_ stays: the next spill overwrites whatever part of this one reached the file.
    stats_.lost += n;
    note_error("spill file write failed (" + std::string(std::strerror(err)) + "); " + "events lost");
    return false;
  }
  spill_end_ += bytes;
  spill_pending_ += n;
  spilling_ = true;
  if (!runs_.empty() && runs_.back().kind == RunKind::kSpill) runs_.back().count += n;
  else runs_.push_back(Run{RunKind::kSpill, n, nullptr});
  stats_.events_spilled += n;
  stats_.spill_bytes_now = spill_pending_ * sizeof(Event);
  stats_.spill_bytes_peak = std::max(stats_.spill_bytes_peak, stats_.spill_bytes_now);
  if (writer_waiting_) work_cv_.notify_one();
  return true;
}

void SpoolingWriter::write_meta(const TraceMeta& meta) {
  std::unique_ptr<TraceMeta> copy;
  try {
    copy = std::make_unique<TraceMeta>(meta);
  } catch (const std::exception& e) {
    std::lock_guard lk(mu_);
    note_error(std::string("trace metadata not stored: ") + e.what());
    return;
  }
  std::lock_guard lk(mu_);
  if (finished_ || stop_ || sink_failed_.load(std::memory_order_relaxed)) return;
  runs_.push_back(Run{RunKind::kMeta, 0, std::move(copy)});
  ++stats_.metas_pending;
  if (writer_waiting_) work_cv_.notify_one();
}

void SpoolingWriter::apply_meta(const TraceMeta& meta) {
  meta_seen_ = true;
  if (sink_failed_.load(std::memory_order_relaxed)) return;
  bool ok = false;
  try {
    ok = sink_->write_meta(meta);
  } catch (...) {
  }
  if (!ok) {
    sink_failed_.store(true);
    std::lock_guard lk(mu_);
    note_error(sink_->error().empty() ? "writing trace metadata failed" : sink_->error());
  }
}

void SpoolingWriter::store(std::span<const Event> events) {
  if (!meta_seen_) apply_meta(TraceMeta{});  // metadata tables before the first row
  uint64_t written = 0, rejected = 0;
  bool ok = false;
  if (!sink_failed_.load(std::memory_order_relaxed)) {
    const uint64_t w0 = sink_->events_written(), r0 = sink_->events_rejected();
    try {
      ok = sink_->write_events(events);
    } catch (...) {
    }
    written = sink_->events_written() - w0;
    rejected = sink_->events_rejected() - r0;
    if (!ok) sink_failed_.store(true);
  }
  std::lock_guard lk(mu_);
  stats_.events_written += written;
  stats_.events_rejected += rejected;
  stats_.lost += events.size() - written - rejected;
  if (!ok && !sink_->error().empty()) note_error(sink_->error());
}

void SpoolingWriter::writer_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    while (runs_.empty() && !stop_) {
      writer_waiting_ = true;
      work_cv_.wait(lk);
      writer_waiting_ = false;
    }
    if (runs_.empty()) break;  // stop_ and nothing left
    Run& run = runs_.front();
    if (run.kind == RunKind::kMeta) {
      std::unique_ptr<TraceMeta> meta = std::move(run.meta);
      runs_.pop_front();
      --stats_.metas_pending;
      lk.unlock();
      apply_meta(*meta);
      meta.reset();
      lk.lock();
      continue;
    }
    if (run.kind == RunKind::kMemory) {
      const size_t n = std::min<size_t>({run.count, capacity_ - ring_head_, options_.max_batch});
      const Event* p = ring_.get() + ring_head_;
      lk.unlock();
      store({p, n});
      ring_head_ = (ring_head_ + n) % capacity_;
      lk.lock();
      ring_used_ -= n;
      stats_.memory_bytes_now = ring_used_ * sizeof(Event);
      Run& front = runs_.front();  // still this run: only this thread pops
      front.count -= n;
      if (front.count == 0) runs_.pop_front();
      continue;
    }
    const size_t n = std::min<size_t>(run.count, spill_buf_.size());
    lk.unlock();
    int err = 0;
    if (pread_all(spill_fd_, spill_buf_.data(), n * sizeof(Event), spill_read_, err)) {
      store({spill_buf_.data(), n});
    } else {
      std::lock_guard g(mu_);
      stats_.lost += n;
      note_error("spill file read failed (" + std::string(std::strerror(err)) + "); events lost");
    }
    spill_read_ += n * sizeof(Event);
    if (spill_read_ - spill_punched_ >= kPunchEvery) {
      // Gives the consumed part back to the filesystem (and drops it from the page cache) so a
      // long backlog needs disk for the backlog only. Best effort: some filesystems cannot.
      ::fallocate(spill_fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(spill_punched_),
                  static_cast<off_t>(spill_read_ - spill_punched_));
      spill_punched_ = spill_read_;
    }
    lk.lock();
    spill_pending_ -= n;
    stats_.spill_bytes_now = spill_pending_ * sizeof(Event);
    Run& front = runs_.front();
    front.count -= n;
    if (front.count == 0) runs_.pop_front();
  }
  writer_done_ = true;
  done_cv_.notify_all();
}

bool SpoolingWriter::finish(const AnalysisResult* result, std::string& error, const ProgressFn& progress) {
  if (finished_) {
    if (!finish_ok_) error = finish_error_;
    return finish_ok_;
  }
  uint64_t backlog = 0, spilled = 0;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    backlog = stats_.events_in - stats_.events_written - stats_.events_rejected - stats_.lost;
    spilled = spill_pending_;
    work_cv_.notify_one();
  }
  if (progress && backlog) {
    std::string line = "writing " + format_count(static_cast<double>(backlog)) + " queued events";
    if (spilled) line += " (" + format_count(static_cast<double>(spilled)) + " spilled)";
    progress(line);
  }
  {
    std::unique_lock lk(mu_);
    while (!writer_done_) {
      if (done_cv_.wait_for(lk, std::chrono::seconds(kProgressSeconds)) == std::cv_status::timeout && !writer_done_ &&
          progress) {
        const uint64_t left = stats_.events_in - stats_.events_written - stats_.events_rejected - stats_.lost;
        lk.unlock();
        progress(format_count(static_cast<double>(left)) + " events left to write");
        lk.lock();
      }
    }
  }
  if (thread_.joinable()) thread_.join();
  // The writer thread is gone: from here this thread owns the sink and stats_ alone (stats()
  // still locks, so concurrent readers stay safe).
  finished_ = true;
  bool ok = !sink_failed_.load();
  if (ok && result && !sink_->write_result(*result)) ok = false;
  uint64_t lost = 0;
  {
    std::lock_guard lk(mu_);
    lost = stats_.lost;
  }
  if (ok && lost &&
      !sink_->record_drops("writer: events lost on the way to the database (" + stats().error + ")", lost))
    ok = false;
  std::string close_error;
  const bool closed = sink_->close(close_error, progress);
  {
    std::lock_guard lk(mu_);
    // Rows handed to the sink but rolled back when it failed never made it to the file.
    const uint64_t committed = sink_->events_committed();
    if (stats_.events_written > committed) {
      stats_.lost += stats_.events_written - committed;
      stats_.events_written = committed;
    }
    if (!closed) note_error(close_error);
    if (!ok && !sink_->error().empty()) note_error(sink_->error());
    ok = ok && closed && stats_.lost == 0;
    if (!ok) {
      finish_error_ = stats_.error.empty() ? sink_->path() + ": writing failed" : stats_.error;
      if (stats_.lost)
        finish_error_ += " (" + format_count(static_cast<double>(stats_.lost)) + " of " +
                         format_count(static_cast<double>(stats_.events_in)) + " events not stored)";
    }
  }
  finish_ok_ = ok;
  if (!ok) error = finish_error_;
  return ok;
}

SpoolingWriter::Stats SpoolingWriter::stats() const {
  std::lock_guard lk(mu_);
  Stats s = stats_;
  s.backlog = s.events_in - s.events_written - s.events_rejected - s.lost;
  return s;
}

}  // namespace ingero
