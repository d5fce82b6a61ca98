// Bounded disk for an always-on capture: the SQLite store rolled over into a set of timestamped
// files, and that set read back as one trace.
//
// Writer contract (RollingWriter):
// - Files are named `<dir>/<prefix>-YYYYMMDDTHHMMSS.mmmZ-NNNNNN.db` (UTC time the file was opened,
//   then a sequence number), so name order is time order. Each is a complete database of its own
//   (SqliteSink: Ingero 0.9's tables + ours, the trace metadata as of its close: process names,
//   stacks its events reference, health; the chains that fired while it was open; indexes built
//   at its close): Ingero's tools and every command here read one file alone.
// - The open file is rolled over when its size on disk (database + write-ahead log) reaches
//   `file_bytes`, or when it has been open `file_age_ns`. Rolling never waits for SQLite on the
//   producer's thread: a new SpoolingWriter starts on a new file at once, and the old one is
//   drained, indexed and closed by a closer thread. One file is closed at a time: while the
//   closer is busy, the open file keeps growing past its bounds (stats().rolls_deferred), so a
//   producer faster than the closer makes larger files, never a pile of files being closed.
// - The disk bound (max_bytes), held at every moment, not only after a close: every file the set
//   takes on disk counts (database, -wal, -shm, -journal, and the writers' unlinked spill files),
//   and so does what the files in use may still grow to: the open file up to its roll size plus
//   two checks' growth, a file being closed up to its size at roll (its writer's backlog
//   included), each times the growth measured at the last close (indexes, metadata; x1.1, 2 until
//   a file was closed). At each check (every check_every_ns, on the producer thread) and after
//   each close, the oldest closed files are deleted while that sum exceeds max_bytes; when no
//   closed file is left to delete (SQLite slower than the capture), events are shed, counted lost
//   (stats().shed, .lost) until a check finds room again. The open file and the files being
//   closed are never deleted, so the newest data always stays. A file's write-ahead log is kept
//   to an eighth of the file (SqliteSink::Options::wal_pages), and its indexes are built outside
//   the log (SqliteSink::close), so closing does not double it. max_age_ns: closed files whose
//   last write is older go too.
// - Crash / kill -9: every closed file is complete; the open file is a WAL database holding every
//   committed transaction (SqliteSink commits every 4096 events), readable as is, without indexes.
//   A file left with a -wal beside it is checkpointed, one with a -journal (killed while its
//   indexes were built) rolled back to its data without indexes, when the next RollingWriter
//   starts on the directory (recover_trace_set()).
// - Threads: write_events(), write_meta() and finish() on one producer thread; add_chain() and
//   stats() from any thread. Never throws; failures are counted (stats().lost, .error).
//
// Reader contract (the set as one trace):
// - A trace set path is a directory (its `*.db` SQLite files, by name) or a glob pattern
//   (`/var/lib/x/ingero-2026*.db`). open_sqlite_trace(), read_loss_spans(), read_annotations() and
//   SqlQueryRunner::open() accept one, so `explain`, `stats`, `query`, `export` and `mcp` do.
// - open_trace_set() replays the files one after the other in name order as one EventSource:
//   metadata merged (node names remapped by name, process/thread names and stacks united, health
//   summed), watermarks kept monotone; the last batch of a file carries that file's last start
//   time instead of the end-of-trace watermark. An event that starts behind a watermark already
//   handed out (a context interval delivered late by the live source at the boundary) goes out
//   flagged event_flags::kLate and is counted in meta().health.reasons. A file that cannot be
//   opened (deleted under us by retention, damaged) is skipped and named in meta().health.damage.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/event.h"
#include "model/result.h"
#include "model/trace.h"
#include "sinks/store/spooling_writer.h"
#include "sinks/store/sqlite_store.h"

namespace ingero {

// True when `path` names a set rather than one file: an existing directory, or a pattern with
// glob characters (* ? [) that is not itself an existing file.
bool is_trace_set_path(const std::string& path);
// The files of a set in name (= time) order: a directory's regular `*.db` files that start with
// the SQLite magic, or what a glob matches (same filter). False with a one-line `error` when the
// directory cannot be read or nothing matches.
bool list_trace_set(const std::string& path, std::vector<std::string>& files, std::string& error);
// Replays a set as one trace (see the reader contract). Null with `error` when the set is empty or
// its first file cannot be opened.
std::unique_ptr<EventSource> open_trace_set(const std::string& path, std::string& error,
                                            const SqliteReadOptions& options);

// Checkpoints the write-ahead log of every file of `dir` that has one left (a writer killed
// mid-file), so the file stands alone again. Returns how many were recovered; problems go to
// `warnings` (one line each).
size_t recover_trace_set(const std::string& dir, const std::string& prefix, std::vector<std::string>& warnings);

struct RolloverOptions {
  std::string dir;                           // created if missing
  std::string prefix = "ingero";             // file names: <prefix>-<UTC time>-<seq>.db
  uint64_t file_bytes = uint64_t{64} << 20;  // roll at this size on disk (0 = no size bound)
  uint64_t file_age_ns = 3600'000'000'000;   // roll when open this long (0 = no age bound)
  uint64_t max_bytes = 0;                    // delete the oldest beyond this total (0 = none)
  uint64_t max_age_ns = 0;                   // delete closed files older than this (0 = none)
  uint64_t check_every_ns = 200'000'000;     // how often the open file's size is read
  SpoolingWriter::Options writer;
  // Called on the producer thread as a file is rolled out (and at finish for the last one); what
  // it returns (may be empty) runs on the closer thread once that file is closed, with its path:
  // for side tables written after close (identity, clock anchors).
  std::function<std::function<void(const std::string&)>()> on_rotate;
};

class RollingWriter {
 public:
  struct Stats {
    uint64_t events_in = 0, events_written = 0, lost = 0, backlog = 0, spilled = 0;
    uint64_t files_opened = 0, files_closed = 0, files_deleted = 0, bytes_deleted = 0;
    uint64_t bytes_on_disk = 0;       // the set's files at the last retention check
    uint64_t bytes_on_disk_peak = 0;  // largest total seen by a check
    uint64_t bytes_reserved = 0;      // what the files in use may still grow to (see the contract)
    uint64_t rolls_deferred = 0;      // size/age checks that found the closer still busy
    uint64_t shed = 0;                // events not stored to hold the disk bound (in `lost` too)
    std::string current;              // the open file
    std::string error;                // first error, one line
  };

  static std::unique_ptr<RollingWriter> start(const RolloverOptions& options, std::string& error);
  ~RollingWriter();
  RollingWriter(const RollingWriter&) = delete;
  RollingWriter& operator=(const RollingWriter&) = delete;

  // Producer thread. `meta` is the capture's metadata now (a new file starts with it; a file
  // rolled out is closed with it, so it names every stack and process its events reference).
  void write_events(std::span<const Event> events, const TraceMeta& meta);
  void write_meta(const TraceMeta& meta);
  // Any thread: a chain that fired; stored in the file open now.
  void add_chain(const Chain& chain);
  // Producer thread: closes the open file with `result` (its op statistics and chains: the whole
  // run's), waits for the closer thread, applies retention. False with `error` when anything was
  // lost or a file failed. Idempotent.
  bool finish(const AnalysisResult* result, std::string& error, const ProgressFn& progress = {});
  // Rolls over now (tests, SIGHUP-style requests); producer thread.
  void roll(const TraceMeta& meta);

  Stats stats() const;
  std::string current_path() const;

 private:
  struct Closing;
  explicit RollingWriter(RolloverOptions options);
  bool open_next(const TraceMeta* meta, std::string& error);
  void closer_loop();
  // Deletes what retention asks (see the writer contract); returns the bytes on disk plus what
  // the files in use may still grow to (the figure held within max_bytes). Closer or producer
  // thread (serialised by retention_mu_).
  uint64_t enforce_retention();
  static uint64_t rolled_bytes(const SpoolingWriter& w, const std::string& path);
  uint64_t set_bytes(std::vector<std::pair<std::string, uint64_t>>* files) const;

  RolloverOptions options_;
  std::unique_ptr<SpoolingWriter> writer_;  // the open file's
  std::string path_;
  uint64_t opened_ns_ = 0, next_check_ns_ = 0, seq_ = 0;
  uint64_t done_in_ = 0, done_written_ = 0, done_lost_ = 0;  // of closed writers (guarded by mu_)
  uint64_t lost_no_file_ = 0;                                // guarded by mu_: events with no file to go to
  uint64_t rolls_deferred_ = 0;                              // guarded by mu_
  uint64_t shed_ = 0;                                        // guarded by mu_: see Stats::shed
  bool shedding_ = false;                                    // producer thread: over the hard bound
  const SpoolingWriter* closing_ = nullptr;                  // guarded by mu_: the writer the closer is finishing

  mutable std::mutex mu_;
  std::vector<Chain> chains_;                                // guarded by mu_: fired while the open file was open
  std::vector<std::pair<std::string, uint64_t>> in_flight_;  // guarded by mu_: being closed (never
                                                             // deleted), with its bytes at roll
  double growth_ = 2.0;                  // guarded by mu_: a closed file's size / its size at roll, measured (x1.1)
  uint64_t last_open_bytes_ = 0;         // producer thread: the open file's size at the last check
  std::atomic<uint64_t> check_step_{0};  // its growth between two checks (read by the closer too)
  std::mutex retention_mu_;
  std::vector<std::unique_ptr<Closing>> queue_;
  std::condition_variable cv_, idle_cv_;
  bool stop_ = false, closer_busy_ = false;
  Stats stats_;
  std::thread closer_;
  bool finished_ = false, finish_ok_ = false;
  std::string finish_error_;
};

}  // namespace ingero
