// The engine: a oneTBB flow graph that runs a Plan over an EventSource.
//
// Threading and watermark contract (docs/architecture.md has the picture):
// - One source thread pulls batches and pushes them into the graph in order.
// - Events are routed to `threads` shards by pid (every thread of a process lands in one shard, so
//   per-thread joins never cross shards); host-wide events (block I/O, TCP, NET, memory) are
//   broadcast to every shard. Each shard is a serial flow-graph node owning its keyed state:
//   no locks on the data path.
// - Each batch carries the source watermark; windows close on event time only, never the wall
//   clock. Results are merged in a serial node and sorted canonically, so the result does not
//   depend on the number of threads or on batch boundaries.
// - A graph node never lets an exception escape (that would cancel the graph): it counts it in
//   EngineCounters::node_errors and goes on.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/plan.h"
#include "engine/result.h"
#include "engine/trace.h"

namespace ingero {

struct EngineOptions {
  unsigned threads = 1;             // shards; 0 = hardware concurrency
  bool compute_stats = true;        // per-op statistics over the whole trace
  // Called from the merge node as chains are emitted (live view); may be empty.
  std::function<void(const Chain&)> on_chain;
  // Called after every batch with the number of events processed so far (progress).
  std::function<void(uint64_t events)> on_progress;
};

// Runs `plan` over every batch of `source` until it ends. Never throws for data problems;
// returns the plan's validation errors in `errors` (and runs nothing) if it is not runnable.
AnalysisResult run_plan(const Plan& plan, EventSource& source, const EngineOptions& opts,
                        std::vector<std::string>* errors = nullptr);

}  // namespace ingero
