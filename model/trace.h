// What a source hands the engine: batches of events in timestamp order, with watermarks, plus
// the trace-level metadata (node names, process names, stacks) that sinks and reports need.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/event.h"

namespace ingero {

// A batch moves between flow-graph nodes as one message (never single events).
// Contract: events are sorted by ts_ns; `watermark` promises that no later batch holds an event
// with ts_ns < watermark, with one exception: a context interval (not a probed GPU API call)
// flagged event_flags::kLate, which started before an earlier watermark and ended after it (a
// live source does not hold every result back for a thread asleep for seconds or a slow disk
// request). Such events come first in their batch, so the batch stays sorted; the engine uses
// them wherever their windows and joins are still open (lateness) and counts the rest as late.
// `final` marks the last batch of a source (watermark = +inf).
struct Batch {
  std::vector<Event> events;
  uint64_t watermark = 0;
  uint64_t seq = 0;
  bool final = false;
  // A source that keeps its events in memory for the whole run may lend them instead of copying
  // them into `events` (bench's replay from memory: 400 MB of copies for 5 M events): `lent`
  // then points at the batch's events, which stay valid and unchanged until the run ends, and
  // `events` is left empty. Readers of a batch go through view().
  const std::vector<Event>* lent = nullptr;
  const std::vector<Event>& view() const { return lent ? *lent : events; }
};

struct StackTrace {
  std::string ips;     // JSON array of hex IPs, as Ingero stores it
  std::string frames;  // JSON array of {"s": symbol, "f": file}, as Ingero stores it
};

struct SessionInfo {
  uint64_t started_at = 0, stopped_at = 0;
  std::string gpu_model, gpu_driver, cpu_model, kernel, os_release, cuda_ver, python_ver, tool_ver, pid_filter, flags;
  uint32_t cpu_cores = 0;
  uint64_t mem_total_mb = 0;
};

struct SystemSnapshot {
  uint64_t ts_ns = 0;
  double cpu_pct = 0, mem_pct = 0, load_avg = 0;
  uint64_t mem_avail_mb = 0, swap_mb = 0;
};

// A stretch of capture time in which events were lost before they reached us (live capture: a
// ring buffer was full, or the queue between the poller and the engine). Unix ns. The lost events'
// own times lie inside it (see add_loss): a gap between recorded events that overlaps a loss span
// may be events we lost rather than a pause of the traced program.
struct LossSpan {
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t gpu = 0, host = 0, queue = 0;  // events lost: GPU-call ring, host ring, engine queue
  uint64_t total() const { return gpu + host + queue; }
};

// Counted, never thrown: odd input rows and lost events, reported with the results.
struct InputHealth {
  uint64_t rows_read = 0;
  uint64_t rows_skipped = 0;                // total of the reasons below
  std::map<std::string, uint64_t> reasons;  // "unknown op id (source 1, op 42)" -> count
  uint64_t dropped_events = 0;              // lost before they reached us (ring overflow, sampling)
  // Live capture's self-check: probe hits the kernel counted that never became events, by
  // library or process and why ("libcudart /usr/.../libcudart.so.13: calls entered whose return
  // was not seen") -> count. Not in rows_skipped: these never were rows.
  std::map<std::string, uint64_t> missed;
  // Where in time dropped_events were lost (live capture; empty when unknown, e.g. a trace
  // recorded by Ingero): sorted by start, disjoint (add_loss merges what overlaps or touches),
  // at most kMaxLossSpans (beyond it neighbours are merged, so spans only ever grow).
  std::vector<LossSpan> loss_spans;
  static constexpr size_t kMaxLossSpans = 4096;
  void add_loss(const LossSpan& s);
  // The spans that overlap [t0, t1] summed (start/end = the first's start, the last's end; all
  // zero when none, or when no span is known), and their total.
  LossSpan losses_between(uint64_t t0, uint64_t t1) const;
  uint64_t lost_between(uint64_t t0, uint64_t t1) const { return losses_between(t0, t1).total(); }
  // The input file is damaged where the reader needed it (an SQLite error on a page, an index
  // that disagrees with its table) and the results may differ from the undamaged file's: each
  // entry names the file's table or index and what is wrong. Non-empty: the answer is partial
  // (commands exit with kExitDamaged, docs/cli.md).
  std::vector<std::string> damage;
  uint64_t rows_unreadable = 0;  // rows lost to damage (rowids in ranges that could not be read)
  // Damage worked around without changing any result (a damaged timestamp index: the table was
  // read in rowid order instead). Noted on stderr; the exit status stays 0.
  std::vector<std::string> recovered;
  void damaged(const std::string& what) {
    if (std::find(damage.begin(), damage.end(), what) == damage.end()) damage.push_back(what);
  }
  void skip(const std::string& reason, uint64_t n = 1) {
    rows_skipped += n;
    reasons[reason] += n;
  }
};

// Live capture of one process's probed calls: from when it is complete. A process already running
// when the trace started (`predates`) has no record of its calls before `attached_at`; one that
// started later is captured from its start. A call in flight at attach is not invented: its
// return without an entry is counted (LiveStats::unmatched).
struct ProcessCapture {
  uint64_t attached_at = 0;  // unix ns: calls that start from here on are captured
  uint64_t started_at = 0;   // unix ns the process started (0: unknown)
  bool predates = false;     // running before the trace started
};

struct TraceMeta {
  std::string path;                    // where it came from ("<live>" for capture)
  std::string format;                  // "ingero-0.8", "ingero-0.9", "ingero-pipeline-1", ...
  std::vector<std::string> nodes{""};  // Event::node indexes this; 0 = local / unnamed
  std::map<uint32_t, std::string> process_names;
  std::map<uint32_t, std::string> thread_names;  // tid -> comm, when the source knows it
  std::map<uint32_t, ProcessCapture> captures;   // pid -> when its capture began (live traces)
  std::map<uint64_t, StackTrace> stacks;         // by Event::stack_id (model/stack.h parses them)
  std::vector<SessionInfo> sessions;
  std::vector<SystemSnapshot> snapshots;
  InputHealth health;
  uint64_t first_ts = 0, last_ts = 0;

  uint16_t node_index(const std::string& name) {
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i] == name) return static_cast<uint16_t>(i);
    nodes.push_back(name);
    return static_cast<uint16_t>(nodes.size() - 1);
  }
};

// A range of memory to prefetch (EventSource::upcoming): a hint, never read through.
struct PrefetchHint {
  const void* data = nullptr;
  size_t bytes = 0;
};

// A pull source of batches. Replay readers and the live poller both implement it.
// next() returns false after the final batch. It must not throw: problems go to meta().health
// or, if fatal before the first batch, to the reader's open() result.
class EventSource {
 public:
  virtual ~EventSource() = default;
  virtual bool next(Batch& out) = 0;
  virtual TraceMeta& meta() = 0;
  // Where the events of the next next() already lie in memory, when the source holds them (a
  // replay from memory, a batch a reader thread has queued): the engine has them fetched into
  // its core's cache while it works on the current batch, so that its first pass over them does
  // not wait on memory (docs/history/issue-12.md, part 19). Only a hint: nothing reads through it
  // (a prefetch never faults), so it may go stale. Empty (the default) when the source cannot
  // tell; pass-through sources forward their input's.
  virtual PrefetchHint upcoming() { return {}; }
  // Threads of its own this source keeps busy while it is read (a reader thread, fetch threads):
  // the engine's automatic thread count leaves them their cores. 0 (the default) when it reads on
  // the caller's thread; pass-through sources forward their input's.
  virtual unsigned busy_threads() const { return 0; }
};

// A source over events already in memory (tests, benchmarks, synthetic demos). Sorts by ts_ns.
class VectorSource final : public EventSource {
 public:
  explicit VectorSource(std::vector<Event> events, size_t batch_size = 4096, TraceMeta meta = {});
  bool next(Batch& out) override;
  TraceMeta& meta() override { return meta_; }
  PrefetchHint upcoming() override;

 private:
  std::vector<Event> events_;
  size_t batch_size_;
  size_t pos_ = 0;
  uint64_t seq_ = 0;
  bool done_ = false;
  TraceMeta meta_;
};

// A source over events already sorted by ts_ns that it does not own (benchmarks replaying one
// in-memory trace many times): batches are copied out, the vector never is.
class BorrowedSource final : public EventSource {
 public:
  explicit BorrowedSource(const std::vector<Event>& sorted, size_t batch_size = 4096)
      : events_(sorted), batch_size_(batch_size ? batch_size : 4096) {}
  bool next(Batch& out) override;
  TraceMeta& meta() override { return meta_; }
  PrefetchHint upcoming() override;

 private:
  const std::vector<Event>& events_;
  size_t batch_size_;
  size_t pos_ = 0;
  uint64_t seq_ = 0;
  bool done_ = false;
  TraceMeta meta_;
};

}  // namespace ingero
