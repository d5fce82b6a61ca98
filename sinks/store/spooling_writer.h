// SpoolingWriter: puts a SqliteSink on its own thread so a live capture never waits for SQLite.
//
// Contract:
// - Threads: write_events(), write_meta() and finish() are called by ONE producer thread (the
//   engine's), never concurrently with each other; stats() may be called from any thread at any
//   time. A writer thread owns the SqliteSink between start() and finish(); finish() hands it
//   back to the caller's thread (join) to write the result and close.
// - Never blocks on SQLite: write_events() copies the events into a bounded in-memory FIFO (a
//   ring of memory_cap_bytes) when they fit, and otherwise appends them to an anonymous spill
//   file with one write. The producer only ever waits for the short critical sections in which
//   the writer thread takes or releases work (no I/O is done under the lock).
// - Order: events reach the database in exactly the order of the calls (and within a call), and
//   each write_meta() is applied between the events queued before it and those queued after.
//   SqliteSink::write_meta always precedes the first event: events queued before any
//   write_meta() are preceded by an empty TraceMeta (so the metadata tables exist; node indexes
//   beyond 0 are then named "node#N").
// - Once anything is spilled, later events are spilled too until the writer has read the spill
//   back completely; then the FIFO is used again and the spill file is truncated. This keeps the
//   queue a short list of runs (memory, spill, meta) whatever the input pattern.
// - Memory: the FIFO holds at most memory_cap_bytes of events (80 bytes each), allocated once and
//   touched as it fills; the spill reader uses a fixed 320 KiB buffer; queued runs are a few
//   dozen bytes each (one per meta, at most two per spill cycle). Pending TraceMeta copies are
//   the caller's to keep small (they are rare). Disk: the spill file lives in spill_dir (default:
//   the database's directory), is unlinked at creation (O_TMPFILE, or mkstemp + unlink) so
//   nothing is left behind even after kill -9, and the ranges already read back are punched out
//   (where the filesystem supports it), so it holds about the backlog, not the whole capture.
// - Never throws and never drops silently: a spill write that fails (disk full) counts the
//   call's events in stats().lost and keeps a one-line error; once the sink fails, every event not
//   yet stored is counted lost (the events already committed stay in the database). finish()
//   records losses in the database's ip_health ('drop' rows, which readers add to
//   meta().health.dropped_events) and returns false when anything was lost.
// - Accounting: events_in == events_written + events_rejected + lost + backlog at every
//   stats() call (rejected: unrepresentable times, counted by the sink itself).
// - A killed process leaves what SqliteSink leaves: every committed transaction, no indexes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/event.h"
#include "model/result.h"
#include "model/trace.h"
#include "sinks/store/sqlite_store.h"

namespace ingero {

class SpoolingWriter {
 public:
  struct Options {
    size_t memory_cap_bytes = size_t{8} << 20;  // events held in memory for the writer
    std::string spill_dir;                      // "" = the database file's directory
    size_t max_batch = 65536;                   // events per sink call from the FIFO
  };

  struct Stats {
    uint64_t events_in = 0;        // events passed to write_events()
    uint64_t events_written = 0;   // handed to the sink (committed once finish() returns true)
    uint64_t events_rejected = 0;  // refused by the sink: times not representable (ip_health)
    uint64_t events_spilled = 0;   // went through the spill file
    uint64_t spill_bytes_now = 0;  // spilled bytes not yet read back (what the file holds)
    uint64_t spill_bytes_peak = 0;
    uint64_t memory_bytes_now = 0;  // event bytes in the FIFO (queued or being written)
    uint64_t memory_bytes_peak = 0;
    uint64_t memory_cap_bytes = 0;  // the FIFO's size (memory_cap_bytes rounded down to events)
    uint64_t lost = 0;              // never reached the database (see the contract)
    uint64_t backlog = 0;           // accepted, not yet handed to the sink
    uint64_t metas_pending = 0;
    std::string error;  // first spill or sink error, one line; "" when none
  };

  // Takes ownership of an open sink (nothing written to it yet, or only what the caller wants
  // first) and starts the writer thread. Returns null with `error` set when the spill file
  // cannot be created or the thread cannot start.
  static std::unique_ptr<SpoolingWriter> start(std::unique_ptr<SqliteSink> sink, const Options& options,
                                               std::string& error);
  // Drains and closes (as finish(nullptr, ...)) if finish() was not called.
  ~SpoolingWriter();
  SpoolingWriter(const SpoolingWriter&) = delete;
  SpoolingWriter& operator=(const SpoolingWriter&) = delete;

  // Producer thread. Copies `events`; returns without waiting for SQLite. After finish() the
  // events are counted lost.
  void write_events(std::span<const Event> events);
  // Producer thread. Copies `meta`; applied in order with the events.
  void write_meta(const TraceMeta& meta);
  // Producer thread. Writes everything queued (FIFO and spill), then `result` if given
  // (SqliteSink::write_result), records losses, closes the sink (building the indexes) and joins
  // the writer thread. `progress` (may be empty) gets lines such as "writing 1,234,567 queued
  // events (1,000,000 spilled)" and "indexing 12,021,147 events", on the caller's thread.
  // Returns false with a one-line `error` when the sink failed or any event was lost; the
  // database then still holds everything committed. Idempotent (later calls return the same).
  bool finish(const AnalysisResult* result, std::string& error, const ProgressFn& progress = {});

  Stats stats() const;

 private:
  enum class RunKind : uint8_t { kMemory, kSpill, kMeta };
  struct Run {
    RunKind kind;
    uint64_t count = 0;               // events (kMemory, kSpill)
    std::unique_ptr<TraceMeta> meta;  // kMeta
  };

  SpoolingWriter(std::unique_ptr<SqliteSink> sink, const Options& options, int spill_fd, size_t capacity);
  void writer_loop();
  // Writer thread: hands events to the sink (or counts them lost once it failed).
  void store(std::span<const Event> events);
  void apply_meta(const TraceMeta& meta);
  bool spill(std::span<const Event> events);    // producer thread; false = lost
  void note_error(const std::string& message);  // keeps the first; needs mu_ held

  std::unique_ptr<SqliteSink> sink_;
  Options options_;
  int spill_fd_ = -1;

  // The FIFO ring: capacity_ events of raw storage (allocated untouched).
  struct FreeDeleter {
    void operator()(Event* p) const;
  };
  std::unique_ptr<Event, FreeDeleter> ring_;
  size_t capacity_ = 0;
  size_t ring_head_ = 0;  // writer side: next event to store
  size_t ring_tail_ = 0;  // producer side: next free slot

  std::vector<Event> spill_buf_;  // writer side: read-back buffer
  uint64_t spill_end_ = 0;        // producer side: bytes appended to the spill file
  uint64_t spill_read_ = 0;       // writer side: bytes read back
  uint64_t spill_punched_ = 0;    // writer side: bytes returned to the filesystem

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // producer -> writer: runs queued / stop
  std::condition_variable done_cv_;  // writer -> finish(): drained
  std::deque<Run> runs_;             // guarded by mu_
  size_t ring_used_ = 0;             // guarded by mu_: events in the ring (queued or in flight)
  uint64_t spill_pending_ = 0;       // guarded by mu_: spilled events not yet stored
  bool spilling_ = false;            // guarded by mu_: route new events to the spill file
  bool writer_waiting_ = false;      // guarded by mu_
  bool stop_ = false;                // guarded by mu_
  bool writer_done_ = false;         // guarded by mu_
  bool meta_seen_ = false;           // writer side: a TraceMeta was applied
  std::atomic<bool> sink_failed_{false};
  Stats stats_;  // guarded by mu_ (backlog computed in stats())

  bool finished_ = false;
  bool finish_ok_ = false;
  std::string finish_error_;
  std::thread thread_;
};

}  // namespace ingero
