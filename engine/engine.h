// The engine: runs a compiled Plan over an EventSource on oneTBB workers.
//
// Threading and watermark contract (docs/architecture.md has the picture):
// - threads == 1: everything runs on the calling thread (read a batch, run the pid shard and the
//   global shard on it, next batch); no routing, no TBB.
// - threads >= 2: the calling thread is the source thread: it reads each batch into a pooled work
//   item, routes it (copies every event, while the batch is in its cache, into the list of the
//   pid shard that owns it, and host-wide events into one more list) and hands the item to every
//   shard node. `threads` oneTBB workers run the nodes: a pid shard reads its own compact list
//   (and the host-wide events of other shards, which it gathers), the global shard the whole
//   batch in place. There are more pid shards than threads (2 per thread, at most 16, at least
//   one per thread), so a few busy processes hashed together do not pin one thread while another
//   idles, and not more, since each shard costs a little per batch whatever its share. The source
//   runs at most 16 batches ahead of the slowest shard (a ring of 16 work items, each reused with
//   its buffers once every node is done with it; no barrier between batches), so a node that is
//   busier than the others (e.g. the global shard) lags behind without holding up the rest, as
//   long as no single node carries more than 1/threads of the work.
// - Events are routed to pid shards by pid (every thread of a process lands in one shard, so
//   per-thread joins never cross shards); host-wide events (block I/O, TCP, page allocations,
//   OOM kills) also reach every other pid shard, for joins. The global shard sees every event.
//   Each shard is a serial flow-graph node owning its keyed state: no locks on the data path.
// - Each batch carries the source watermark; windows close on event time only, never the wall
//   clock. Chains are sorted canonically and the shards' final statistics are merged in shard
//   order, so the result does not depend on the number of threads or on batch boundaries.
// - A graph node never lets an exception escape (that would cancel the graph): it counts it in
//   EngineCounters::node_errors and goes on.
// - With threads >= 2 the arena needs threads + 1 slots; when oneTBB's process-wide worker limit
//   is lower (it defaults to the core count) a tbb::global_control raises it for the run.
// - threads == 2 (split by window group, the default there): no flow graph. A router's one pass
//   per batch lists every group's events; the calling thread routes and runs the lighter group
//   set, one thread of the engine's own runs the heaviest group's shard, each waiting for the
//   other spinning, then on a futex (INGERO_TWO_STAGE=0: the graph, as at three threads and more).
//   on_chain is then called from either thread, one call at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/plan.h"
#include "model/result.h"
#include "model/steps.h"
#include "model/trace.h"

namespace ingero {

// How a run of two or more threads splits the work between shards (engine.cpp): by process
// (pid shards, plus one global shard for the pipes not keyed by pid or tid), or by window group
// (each shard runs some of the plan's window groups over every event: no routing copy, no
// second pass for the global pipes, but no more shards than groups to balance). kAuto: by group
// at two threads, by pid beyond.
enum class ShardSplit : uint8_t { kAuto, kByPid, kByGroup };

struct EngineOptions {
  // Engine workers. 0 = automatic (auto_engine_threads in engine.cpp): two where the machine has
  // two cores to spare for the engine (beside the source's own threads, net of its load) and the
  // first batch says the split by window group can pay off (estimated bound >= 1.4x), else one.
  unsigned threads = 1;
  ShardSplit split = ShardSplit::kAuto;
  bool compute_stats = true;  // per-op statistics over the whole trace
  // Bytes of join span blocks the run keeps in memory (shared out between its shards); beyond it,
  // sealed blocks go to an unlinked spill file in $TMPDIR (else /tmp) and are read back when a
  // window closes or a prune passes. 0 = everything in memory. Results do not depend on it; a
  // trace whose one window spans it all (the spans some held call touches grow with its length)
  // stays flat in memory with it. EngineCounters::join_spill_* say what it did.
  size_t join_resident_bytes = 0;
  // The program's own step markers (replay: the trace's ip_annotations): the `steps` stream takes
  // a marked process's steps from them (operators/step_tracker.h). May be null.
  std::shared_ptr<const std::vector<StepMarker>> step_markers;
  // Called as chains are emitted (live view), one call at a time: from the merge node, or at two
  // threads split by group from either stage's thread under a lock; may be empty.
  std::function<void(const Chain&)> on_chain;
  // Chains kept for the result (0 = all): past it, the oldest half is let go (they went to
  // on_chain as they fired). An always-on capture (agent) stores each chain as it fires and
  // keeps only the recent ones in memory, however long it runs and however many processes come
  // and go; a replay keeps them all.
  size_t max_kept_chains = 0;
  // Called on the source thread every 8 batches and after the final one, with the number of
  // events every shard has finished with (progress; non-decreasing, at most the events read).
  std::function<void(uint64_t events)> on_progress;
};

// The join spill budget of a replay (explain, run on a file, export, the MCP server):
// 4 MiB, or INGERO_JOIN_RESIDENT_MB=N MiB (0 keeps every span in memory). Live capture does not
// spill: its windows close and evict.
size_t replay_join_resident_bytes();

// Runs `plan` over every batch of `source` until it ends. Never throws for data problems;
// returns the plan's validation errors in `errors` (and runs nothing) if it is not runnable.
AnalysisResult run_plan(const Plan& plan, EventSource& source, const EngineOptions& opts,
                        std::vector<std::string>* errors = nullptr);

}  // namespace ingero
