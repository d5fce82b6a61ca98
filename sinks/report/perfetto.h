// Perfetto / chrome://tracing export: a trace and its causal chains as trace-event JSON
// ({"traceEvents":[...]}), the format ui.perfetto.dev, chrome://tracing and Speedscope open.
//
// Contract:
// - Streaming: events are written as batches arrive; memory holds only per-track state (open
//   slice ends of each lane), per-process counter windows, the name tables and a cache of rendered
//   stacks - never the trace. Output goes to `<path>.partial-<pid>` and is renamed onto `path`
//   only by a successful finish(); abort() (or destroying an unfinished writer) removes it, so a
//   file at `path` is always complete. A path ending in ".gz" is gzip-compressed.
// - Tracks: one process per (node, pid), named "<process name> [pid N]" (+ " @node" on merged
//   traces, where every node's processes carry the node as their label and sort together). Per
//   thread: the thread's track (tid) holds probed API calls (CUDA runtime/driver/graph/NCCL) and
//   instants; "off-CPU" and "I/O" sibling tracks hold off-CPU spans and block/socket requests.
//   Slices on one track must nest for the viewers, so a slice that would overlap its neighbour
//   without nesting goes to the next "(overlap k)" lane of the same kind (at most kMaxLanes).
//   Counters per process: "calls/s <op>" and "p99 ms <op>" per `counter_window_ns` for GPU API
//   ops; host memory (% used, available MiB) from the trace's system snapshots; with
//   set_accounting, per main GPU-feeding thread "time <thread> (ms/s)": where its time went in
//   each window (args "in calls", "on CPU", "preempted", "blocked", "unknown": ms per second,
//   summing to at most 1000; docs/accounting.md), from the per-second bins of the accounting.
// - Every event that passes the filter is written exactly once: a complete slice ("ph":"X") when
//   it has a duration, else an instant ("ph":"i"). args.id is the event id (args.node the node on
//   merged traces), so a reader can match it back to the database.
// - Time: "ts"/"dur" are microseconds relative to `base_ns` (default: the first event's time,
//   rounded down to a whole second; written as metadata.ts_base_unix_ns), printed from integer
//   nanoseconds with exactly 3 fractional digits - never through a double.
// - Chains: one slice per chain on the "ingero chains" process spanning its window (lanes as
//   above), args = summary, root cause, severity, predicates, fix, evidence, threads, stacks; one
//   flow arrow ("ph":"s" at the chain, "ph":"f" bound to the event) per exemplar evidence event
//   found in the written events. Exemplars must be known before the events stream (set_chains),
//   or be found afterwards by a second scan (resolve_flows) for single-pass pipelines.
// - Strings are escaped for JSON; bytes that are not valid UTF-8 become U+FFFD.
// - Never throws: write errors and the size limit are reported by ok()/error() and finish().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/event.h"
#include "model/result.h"
#include "model/trace.h"

namespace ingero {

struct PerfettoFilter {
  uint64_t from_ns = 0;                      // absolute unix ns; an event is kept when its
  uint64_t to_ns = UINT64_MAX;               // start is in [from_ns, to_ns)
  std::set<uint32_t> pids;                   // empty = every process
  std::set<std::pair<Source, uint8_t>> ops;  // empty = every op
  bool matches(const Event& e) const;
  // A chain is kept when its window overlaps [from, to), its pid is in `pids` (when given) and its
  // op is in `ops` (when given; chains about no op are then dropped).
  bool matches(const Chain& c) const;
};

struct PerfettoOptions {
  PerfettoFilter filter;
  uint64_t base_ns = 0;                        // 0 = the first event's second
  uint64_t counter_window_ns = 1'000'000'000;  // calls/s and p99 counters
  uint64_t max_bytes = 0;                      // uncompressed JSON size limit; 0 = none
  std::string max_bytes_hint;                  // appended to the size-limit error ("try --pid 42")
  int gzip_level = 3;                          // for ".gz" paths
};

struct PerfettoCounters {
  uint64_t events = 0;    // events written (slices + instants)
  uint64_t filtered = 0;  // events the filter dropped
  uint64_t slices = 0, instants = 0;
  uint64_t chains = 0, flows = 0;
  uint64_t missing_exemplars = 0;  // exemplar ids of written chains not found in written events
  uint64_t counter_samples = 0;
  uint64_t accounting_tracks = 0;  // threads with a "time ..." counter track
  uint64_t overlap_lanes = 0;      // extra lanes opened for slices that did not nest
  uint64_t lanes_exhausted = 0;    // slices placed on the last lane although they did not nest there
  uint64_t bytes = 0;              // uncompressed JSON bytes
};

class PerfettoWriter {
 public:
  static constexpr int kMaxLanes = 8;

  static std::unique_ptr<PerfettoWriter> create(const std::string& path, const PerfettoOptions& opts,
                                                std::string& error);
  ~PerfettoWriter();
  PerfettoWriter(const PerfettoWriter&) = delete;
  PerfettoWriter& operator=(const PerfettoWriter&) = delete;

  // The chains to draw; their exemplar events get flow arrows as they stream by. Call before the
  // first write_batch (optional: finish() also takes chains).
  void set_chains(const std::vector<Chain>& chains);
  // The main feeding threads' time second by second (AnalysisResult::accounting_series), written
  // by finish() as one counter track per thread (its process's, filtered by pid and time like the
  // events; windows of counter_window_ns rounded to whole seconds). Optional.
  void set_accounting(std::vector<AccountingSeries> series);
  void write_batch(const Batch& b, const TraceMeta& meta);
  // For a single-pass writer: scan `src` (the same trace again) for the exemplar events of
  // `chains` and write their flow ends. False (with the reason in error()) on a write error.
  bool resolve_flows(const std::vector<Chain>& chains, EventSource& src);
  // Writes the chains (those of set_chains when `chains` is null), flushes counters and
  // metadata, closes and renames. False with the reason in `error`; the partial file is removed.
  bool finish(const std::vector<Chain>* chains, const TraceMeta& meta, std::string& error);
  void abort();

  bool ok() const;
  const std::string& error() const;
  const PerfettoCounters& counters() const;
  const std::string& path() const;

 private:
  PerfettoWriter();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// JSON string body (no quotes) of `s`: ", \ and control characters escaped, invalid UTF-8 bytes
// replaced by U+FFFD. Appends to `out`.
void json_escape_append(std::string& out, std::string_view s);
// "123.456": signed nanoseconds as microseconds with exactly three fractional digits.
void append_us(std::string& out, int64_t ns);

}  // namespace ingero
