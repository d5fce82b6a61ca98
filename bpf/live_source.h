// The live capture source: BPF ring buffers -> poller thread -> lock-free queue -> reorder
// buffer -> engine batches.
//
// Contract:
// - Implements EventSource. Batches are sorted by ts_ns (unix ns, interval start). The watermark
//   is min(poll time - lag, oldest open probed call / off-CPU span (bounded by max_hold),
//   start of the page-allocation interval being aggregated), so a long cudaStreamSynchronize
//   holds the watermark at its entry until it returns and nothing it overlaps arrives late.
//   An idle source still advances: the poll time moves whether or not records arrive, and next()
//   returns a batch (possibly empty) at least every `batch_interval`.
// - An event older than a watermark already handed out (a span open longer than max_hold) is
//   dropped and counted in meta().health ("late" reason), never delivered out of order.
// - Ring overflow is counted per ring in the kernel; when the engine falls behind, the queue
//   (bounded by queue_max) drops and counts too. drops_total() reads the totals and
//   drops_between() says how many were lost in a time range (for chains whose window lost
//   events). meta().health.dropped_events holds the total and meta().health.loss_spans where in
//   time they were lost: a ring drop between two of the poller's counter reads (every 20 ms) is
//   placed in the span between them (the record was submitted then; its event started at most a
//   call's duration earlier), a queue drop in the span of the dropped events' own times.
// - stop() may be called from any thread (signal handler code excepted: set a flag and call it
//   from a normal thread); the next next() calls drain the rings and end with a final batch.
// - Stacks (LiveOptions::probes.stacks): records that carry stacks are resolved on the poller
//   thread (StackResolver: unwind, symbolize, Python frames, dedup) before their events are
//   queued, so an event's stack_id is always in meta().stacks by the time the event is delivered
//   (next() merges the new stacks in). Thread names (comm per tid, read when a thread is first
//   seen) go to meta().thread_names the same way. Every traced process is noted (maps + ELFs
//   kept, Python layout validated) when first seen, or at start with --pid, and forgotten a few
//   seconds after its exit record. The task that runs instead of a traced thread is named too
//   (IP_OP_TASK_NAME records, once per task; a reused tid is named again and the latest name
//   wins), so a CPU hog that never touches the GPU has a name in meta().thread_names; an
//   off-CPU span's arg0 is that task's process (tgid), arg1 its tid.
// - Attach to running processes: a library's return probes go in before its entry probes
//   (BpfProbes::attach_library), so processes already calling it are captured from then on, on
//   every thread. Per process, meta().captures says from when (`attached_at`: the latest attach
//   time of the libraries its calls came through, or its start if later) and whether it was
//   running before the trace (docs/live-capture.md, "Attaching to running processes").
// - Self-check, once a second on the poller: per library, the probe hits the kernel counted
//   (entries, returns, returns without entry, lost entries, ring drops) against the records
//   delivered to user space and the calls still open; per process, the calls its threads lost.
//   Growth past a small tolerance is a warning (take_warnings()), and the totals go to
//   meta().health.missed and LiveStats::missed: a capture that is missing calls never reads as
//   "dropped 0".
// - The poller thread also re-runs library discovery every `rediscover_interval` (bounded cost)
//   and attaches uprobes to new libraries; warnings (missing library/symbol) are queued for the
//   caller (take_warnings()).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bpf/discovery.h"
#include "bpf/probes.h"
#include "bpf/records.h"
#include "bpf/stack_resolver.h"
#include "model/trace.h"

namespace ingero::bpf {

struct LiveOptions {
  ProbeOptions probes;
  DiscoveryOptions discovery;
  uint64_t lag_ns = 50'000'000;          // in-flight records (per-CPU commit order)
  uint64_t max_hold_ns = 2'000'000'000;  // longest an open probed call may hold the watermark
  // Longest an open context interval (off-CPU span, block request, socket call) holds it: one open
  // longer is delivered late (flagged event_flags::kLate) instead, so a thread asleep for seconds
  // or a slow disk never holds every other event in memory (reorder memory ~ rate x this).
  uint64_t context_hold_ns = 250'000'000;
  uint64_t batch_interval_ns = 100'000'000;  // a batch at least this often
  size_t batch_max = 16384;                  // events per batch at most
  uint64_t page_interval_ns = 50'000'000;    // page-allocation aggregation interval
  uint64_t rediscover_interval_ns = 2'000'000'000;
  int poll_timeout_ms = 10;
  size_t queue_max = 65536;  // events between poller and engine (5 MiB)
};

struct LiveStats {
  uint64_t records = 0;                 // consumed from the rings
  uint64_t delivered = 0;               // handed to the engine
  uint64_t late = 0;                    // probed calls dropped for arriving behind the watermark
  uint64_t late_delivered = 0;          // context intervals delivered behind it (flagged kLate)
  uint64_t dropped[IP_NUM_RINGS] = {};  // ring overflow (kernel side)
  uint64_t queue_dropped = 0;           // engine too slow: dropped before the queue (user side)
  uint64_t depth_overflow = 0, unmatched = 0, no_slot = 0;
  size_t reorder_size = 0, reorder_peak = 0;  // events held for ordering (now, at most)
  size_t libraries = 0, uprobes = 0;
  // Stacks
  uint64_t stack_records = 0;        // records with stacks emitted by BPF
  uint64_t stacks_lost = 0;          // stack ring full: event sent without its stack / sample lost
  uint64_t stacks_rate_limited = 0;  // slow calls whose stack the per-thread rate limit skipped
  uint64_t samples = 0;              // CPU-clock samples of traced threads
  uint64_t stacks_resolved = 0, stacks_unique = 0, python_stacks = 0, python_procs = 0;
  uint64_t python_self = 0;  // of them, registered by BPF itself at their first stack (py_bins)
  // Self-check: probe hits counted in the kernel that did not become events (the library rows of
  // meta().health.missed, plus the hits the kernel skipped), as of the last check.
  uint64_t missed = 0;
};

class LiveSource final : public EventSource {
 public:
  // Loads the probes, finds and attaches the libraries, starts the poller. Null with `error` when
  // BPF cannot be used.
  static std::unique_ptr<LiveSource> start(const LiveOptions& opts, std::string& error);
  ~LiveSource() override;

  bool next(Batch& out) override;
  TraceMeta& meta() override { return meta_; }

  void stop();
  bool stopping() const { return stop_.load(); }
  // Stops, joins the poller, and hands the probes' slow detach to a child that outlives this
  // process (BpfProbes::detach_in_background): for a process about to exit (agent, SIGTERM).
  void detach_in_background();
  LiveStats stats() const;
  uint64_t drops_total() const;
  uint64_t drops_between(uint64_t t0_unix, uint64_t t1_unix) const;
  std::vector<CudaLibrary> libraries() const;
  std::vector<std::string> take_warnings();
  const RecordConverter& converter() const { return conv_; }
  const BpfProbes& probes() const { return *probes_; }
  // Asks the poller to detach one uprobe (BpfProbes::detach_probe): a planted fault for the
  // self-check's tests. Takes effect within a poll.
  void request_detach(const std::string& symbol, bool retprobe);

 private:
  explicit LiveSource(const LiveOptions& opts);
  void poller();
  void attach_found(const std::vector<CudaLibrary>& libs);
  void warn(std::string w);
  void late(const Event& e);
  // Poller: process/thread first sight (thread name from `comm16` when BPF read it), then into
  // pending_.
  void on_event(Event& e, const char* comm16 = nullptr);
  // Poller: the name of a task that ran instead of a traced thread (an IP_OP_TASK_NAME record).
  void note_task_name(const ip_record& r);
  // Poller: a probed call of `pid` through library `slot`: when its capture began.
  void note_capture(uint32_t pid, uint32_t slot);
  // Poller: compares the kernel's probe-hit counts with what was delivered (see the contract).
  void self_check(uint64_t now_mono);

  struct Queue;
  LiveOptions opts_;
  RecordConverter conv_;
  std::unique_ptr<BpfProbes> probes_;
  std::unique_ptr<Queue> queue_;
  LibraryDiscovery discovery_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, poller_done_{false};
  std::atomic<uint64_t> wm_mono_{0};
  std::atomic<uint64_t> records_{0}, unknown_{0};
  std::atomic<uint64_t> dropped_[IP_NUM_RINGS] = {};
  std::atomic<uint64_t> depth_{0}, unmatched_{0}, no_slot_{0}, queue_drops_{0};
  std::vector<Event> pending_;                              // poller-local: converted, not yet enqueued
  std::unique_ptr<StackResolver> resolver_;                 // poller-owned; null when no stacks are captured
  std::set<uint32_t> seen_pids_, named_tids_, tried_tids_;  // poller-local
  std::map<uint32_t, uint64_t> forget_at_;                  // poller-local: pid -> mono ns to forget it
  std::unordered_map<uint32_t, uint32_t> capture_slots_;    // poller-local: pid -> library slots seen (bits)
  std::unordered_map<uint32_t, uint64_t> started_of_;       // poller-local: pid -> its start, unix ns (0 unknown)
  uint64_t trace_started_unix_ = 0;
  uint64_t loss_scan_mono_ = 0, loss_gpu_ = 0, loss_host_ = 0;  // poller-local: the last scan's drop counters
  std::atomic<uint64_t> lib_received_[IP_MAX_LIBS] = {};        // probed-call records received, per library slot
  struct CheckState {                                           // poller-local: per library slot
    uint64_t unmatched_base = 0;  // returns without entry once the library's first second had passed
    bool based = false;
    uint64_t warned_returns = 0, warned_entries = 0, warned_records = 0;
  };
  CheckState check_[IP_MAX_LIBS];
  std::map<uint32_t, uint64_t> warned_procs_;  // poller-local: pid -> calls lost already warned about
  uint64_t warned_skipped_ = 0;                // poller-local: kernel-skipped hits already warned about
  std::atomic<uint64_t> missed_{0};
  std::atomic<uint64_t> stacks_resolved_{0}, stacks_unique_{0}, python_stacks_{0}, python_procs_{0}, python_self_{0},
      stack_records_{0}, stacks_rate_{0}, samples_{0};

  mutable std::mutex mu_;  // guards the members below
  std::vector<std::string> warnings_;
  std::vector<CudaLibrary> libs_;
  InputHealth losses_;           // loss_spans only: where events were lost (unix ns), for meta_.health
  uint64_t losses_version_ = 0;  // bumped on every change; meta_ copies the spans when it moved
  std::vector<std::pair<uint64_t, StackTrace>> new_stacks_;        // for meta_.stacks
  std::vector<std::pair<uint32_t, std::string>> new_threads_;      // for meta_.thread_names
  std::vector<std::pair<uint32_t, ProcessCapture>> new_captures_;  // for meta_.captures
  std::vector<std::pair<uint32_t, std::string>> new_task_names_;   // IP_OP_TASK_NAME, for meta_.thread_names
  std::map<std::string, uint64_t> missed_now_;                     // for meta_.health.missed
  std::vector<std::pair<std::string, bool>> detach_requests_;      // request_detach(), for the poller

  // Engine-thread state (next()).
  ReorderBuffer reorder_;
  std::vector<Event> dequeued_;      // next()'s bulk-dequeue buffer
  std::vector<Event> late_context_;  // context intervals behind the watermark, for the next batch
  std::atomic<uint64_t> late_delivered_{0};
  TraceMeta meta_;
  uint64_t seq_ = 0, next_id_ = 0, last_wm_ = 0, delivered_ = 0, late_ = 0;
  uint64_t losses_copied_ = 0;  // losses_version_ last copied into meta_.health.loss_spans
  std::atomic<size_t> reorder_size_{0}, reorder_peak_{0};
  bool finished_ = false;
};

}  // namespace ingero::bpf
