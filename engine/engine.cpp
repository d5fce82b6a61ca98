// The engine's scheduling: the calling thread reads and routes batches; pid shards (more of them
// than threads) and one global shard run as serial oneTBB flow-graph nodes on `threads` workers.
// See engine.h for the threading and watermark contract and docs/architecture.md for the picture.
#include "engine/engine.h"

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "engine/runtime.h"

namespace ingero {
namespace {

using Out = std::shared_ptr<ShardOutput>;

void merge_outcome(RuleOutcome& into, const RuleOutcome& from) {
  into.windows += from.windows;
  into.chains += from.chains;
  if (!from.has_miss) return;
  if (!better_miss(from.miss_stage, from.miss, from.miss_window_start, from.miss_key, into)) return;
  into.has_miss = true;
  into.miss_stage = from.miss_stage;
  into.miss = from.miss;
  into.miss_key = from.miss_key;
  into.miss_window_start = from.miss_window_start;
  into.miss_window_end = from.miss_window_end;
  into.miss_values = from.miss_values;
}

// Folds one shard's final output (statistics, rule outcomes, counters) into the run's totals.
void merge_final(const ShardOutput& out, AnalysisResult& result, OpStatsAccumulator& stats, EngineCounters& counters) {
  if (out.stats) stats.merge(*out.stats);
  for (size_t i = 0; i < out.outcomes.size() && i < result.rules.size(); ++i)
    merge_outcome(result.rules[i], out.outcomes[i]);
  if (!out.counters.batches) return;
  // The global shard sees every event again: count events once, from the pid shards.
  if (!out.global) counters.events_in += out.counters.events_in;
  counters.windows_closed += out.counters.windows_closed;
  counters.late_events += out.counters.late_events;
  counters.node_errors += out.counters.node_errors;
  counters.evicted_spans += out.counters.evicted_spans;
  counters.tail_windows_capped += out.counters.tail_windows_capped;
}

// Pid shards for `threads` workers: one thread, one shard (no routing at all); otherwise two
// shards per thread (at most 16, at least one per thread), so that a few busy processes hashed
// together do not pin one thread while another idles (shard tasks are picked up by whichever
// worker is free). Not more: every shard pays a fixed cost per batch (its streams, window closes
// and join evictions run whatever its share of the batch) and sees every host-wide event: at 2
// threads, 4 shards per thread cost about 6 % (big5m.db) to 15 % (big5m.lmdb, many processes)
// more CPU than 2 per thread, for no better balance.
unsigned shard_count(unsigned threads) {
  if (threads <= 1) return 1;
  return std::max(threads, std::min(2 * threads, 16u));
}

// Routing marks: Work::owner holds the owning shard, with this bit for host-wide events (which
// every other pid shard also receives, for its joins).
constexpr uint16_t kHostWideBit = 0x8000;
constexpr unsigned kMaxShards = 0x7fff;

// One source batch, shared read-only by every shard node. Routing does not copy events: it
// lists each shard's event positions (a counting sort by owner), and each shard gathers its own
// events on its own worker.
struct Work {
  EventsPtr events;                 // the whole batch
  std::vector<uint16_t> owner;      // per event: owning pid shard | kHostWideBit
  std::vector<uint32_t> order;      // event positions grouped by owning shard, in batch order
  std::vector<uint32_t> start;      // shard s owns order[start[s] .. start[s + 1])
  std::vector<uint32_t> host_wide;  // positions of host-wide events, in batch order
  uint64_t watermark = 0;
  bool final = false;
  uint64_t dropped = 0;    // for shard 0 only
  uint64_t trace_end = 0;  // latest event end read so far (ShardInput::trace_end)
  std::shared_ptr<const std::map<uint32_t, std::string>> names;
  std::atomic<unsigned> pending{0};  // shard nodes that have not finished with it yet
};
using WorkPtr = std::shared_ptr<Work>;

// Fills w's routing (owner, order, start, host_wide) for `events` over `shards` pid shards, and
// raises `trace_end` to the latest event end.
void route(const std::vector<Event>& events, unsigned shards, Work& w, uint64_t& trace_end) {
  const size_t n = events.size();
  w.owner.resize(n);
  w.start.assign(shards + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const Event& e = events[i];
    trace_end = std::max(trace_end, e.end_ns());
    const unsigned s = shard_of(e.pid, shards);
    ++w.start[s + 1];
    w.owner[i] = static_cast<uint16_t>(s);
    if (is_host_wide(e)) {
      w.owner[i] |= kHostWideBit;
      w.host_wide.push_back(static_cast<uint32_t>(i));
    }
  }
  for (unsigned s = 0; s < shards; ++s) w.start[s + 1] += w.start[s];
  std::vector<uint32_t> next(w.start.begin(), w.start.end() - 1);
  w.order.resize(n);
  for (size_t i = 0; i < n; ++i) w.order[next[w.owner[i] & ~kHostWideBit]++] = static_cast<uint32_t>(i);
}

// Batches read but not yet processed by every shard: the source runs at most this far ahead.
constexpr int kMaxBatchesInFlight = 32;

// The source side of a run: reads the next batch (a source that ends without a final batch still
// gets one, so every window closes) and passes on what a live source learned since the last
// batch: new process names (so chains name the process as a replay of the same trace would) and
// newly symbolized stacks (for stack predicates).
class SourceFeed {
 public:
  SourceFeed(EventSource& source, CompiledPlan& compiled)
      : source_(source), compiled_(compiled), names_known_(compiled.process_names.size()) {}

  // Fills `batch` and counts it; returns batch.final.
  bool next(Batch& batch, EngineCounters& counters) {
    if (!source_.next(batch)) {
      batch = Batch{};
      batch.final = true;
      batch.watermark = UINT64_MAX;
    }
    ++counters.batches;
    const TraceMeta& meta = source_.meta();
    if (meta.process_names.size() != names_known_) {
      names_known_ = meta.process_names.size();
      names_ = std::make_shared<const std::map<uint32_t, std::string>>(meta.process_names);
    }
    if (compiled_.uses_stacks && meta.stacks.size() != compiled_.stacks->size()) compiled_.stacks->sync(meta.stacks);
    return batch.final;
  }

  // Null until the source names a process the plan did not know at compile time.
  const std::shared_ptr<const std::map<uint32_t, std::string>>& names() const { return names_; }

 private:
  EventSource& source_;
  CompiledPlan& compiled_;
  size_t names_known_;
  std::shared_ptr<const std::map<uint32_t, std::string>> names_;
};

// The whole run on the calling thread: one pid shard and the global shard, no routing, no TBB.
void run_serial(CompiledPlan& compiled, EventSource& source, const EngineOptions& opts, AnalysisResult& result,
                OpStatsAccumulator& stats, EngineCounters& counters, std::vector<Chain>& chains) {
  std::vector<std::unique_ptr<Shard>> shards;
  shards.push_back(std::make_unique<Shard>(compiled, false, opts.compute_stats));
  if (compiled.has_global) shards.push_back(std::make_unique<Shard>(compiled, true, false));
  std::vector<ShardOutput> finals(shards.size());
  Batch batch;
  bool saw_final = false;
  uint64_t done = 0;
  SourceFeed feed(source, compiled);
  while (!saw_final) {
    saw_final = feed.next(batch, counters);
    const size_t n_events = batch.events.size();
    ShardInput in;
    // Borrowed for the duration of the calls below (aliasing pointer, owns nothing).
    in.owned = EventsPtr(EventsPtr(), &batch.events);
    in.watermark = batch.watermark;
    in.final = batch.final;
    in.process_names = feed.names();
    for (size_t i = 0; i < shards.size(); ++i) {
      in.dropped = i == 0 ? source.meta().health.dropped_events : 0;
      try {
        ShardOutput out = shards[i]->process(in);
        for (auto& c : out.chains) {
          if (opts.on_chain) opts.on_chain(c);
          chains.push_back(std::move(c));
        }
        if (batch.final) finals[i] = std::move(out);
      } catch (...) {
        ++counters.node_errors;
      }
    }
    batch.events.clear();
    done += n_events;
    if (opts.on_progress && (counters.batches % 8 == 0 || batch.final)) opts.on_progress(done);
  }
  for (const auto& f : finals) merge_final(f, result, stats, counters);
}

// `threads` workers run the shards; the calling thread is the source: it reads a batch, marks
// each event's owner and hands the batch to every shard node, blocking only when
// kMaxBatchesInFlight batches are still being processed (no barrier between batches).
void run_parallel(CompiledPlan& compiled, EventSource& source, const EngineOptions& opts, unsigned threads,
                  AnalysisResult& result, OpStatsAccumulator& stats, EngineCounters& counters,
                  std::vector<Chain>& chains) {
  const unsigned n_pid = std::min(shard_count(threads), kMaxShards);
  const bool global = compiled.has_global;
  const unsigned n_nodes = n_pid + (global ? 1 : 0);

  // The source thread blocks while workers run: give the arena `threads` workers of its own.
  // oneTBB's default pool has hardware_concurrency - 1 workers; raise it when that is fewer.
  std::optional<tbb::global_control> more_workers;
  const size_t want = static_cast<size_t>(threads) + 1;
  if (tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism) < want)
    more_workers.emplace(tbb::global_control::max_allowed_parallelism, want);
  tbb::task_arena arena(static_cast<int>(threads) + 1, 1);

  std::vector<std::unique_ptr<Shard>> shards;
  for (unsigned i = 0; i < n_pid; ++i) shards.push_back(std::make_unique<Shard>(compiled, false, opts.compute_stats));
  if (global) shards.push_back(std::make_unique<Shard>(compiled, true, false));
  // Written by each shard's own node at the final batch, read after the graph is done.
  std::vector<ShardOutput> finals(n_nodes);
  std::atomic<uint64_t> node_errors{0}, done_events{0};
  std::atomic<int> in_flight{0};

  arena.execute([&] {
    tbb::flow::graph g;
    // Collector: serial, so it needs no locks; chains are sorted after the run.
    tbb::flow::function_node<Out, tbb::flow::continue_msg> collector(g, tbb::flow::serial, [&](const Out& out) {
      try {
        for (auto& c : out->chains) {
          if (opts.on_chain) opts.on_chain(c);
          chains.push_back(std::move(c));
        }
      } catch (...) {
        node_errors.fetch_add(1);
      }
      return tbb::flow::continue_msg();
    });

    std::vector<std::unique_ptr<tbb::flow::function_node<WorkPtr, tbb::flow::continue_msg>>> nodes;
    for (unsigned idx = 0; idx < n_nodes; ++idx) {
      const bool is_global = idx == n_pid;
      Shard* shard = shards[idx].get();
      // The events this pid shard owns and the host-wide events it sees, gathered per batch
      // into buffers this node reuses (its batches run one at a time). The copy pays for itself:
      // the shard then makes several passes over compact events (statistics, streams, windows,
      // joins), which read fewer cache lines than positions scattered over the shared batch
      // (reading through positions instead cost 4 % more CPU on big5m.db, 20 % on big5m.lmdb).
      auto owned = std::make_shared<std::vector<Event>>();
      auto foreign = std::make_shared<std::vector<Event>>();
      nodes.push_back(std::make_unique<tbb::flow::function_node<WorkPtr, tbb::flow::continue_msg>>(
          g, tbb::flow::serial, [&, idx, is_global, shard, owned, foreign](const WorkPtr& w) {
            try {
              ShardInput in;
              in.watermark = w->watermark;
              in.final = w->final;
              in.dropped = idx == 0 ? w->dropped : 0;
              in.process_names = w->names;
              in.trace_end = w->trace_end;
              if (is_global) {
                in.owned = w->events;
              } else {
                owned->clear();
                foreign->clear();
                const Event* ev = w->events->data();
                for (uint32_t j = w->start[idx]; j < w->start[idx + 1]; ++j) owned->push_back(ev[w->order[j]]);
                for (const uint32_t i : w->host_wide)
                  if ((w->owner[i] & ~kHostWideBit) != idx) foreign->push_back(ev[i]);
                // Borrowed (aliasing pointers that own nothing): the shard keeps no pointer
                // into its input past process().
                in.owned = EventsPtr(EventsPtr(), owned.get());
                in.foreign = EventsPtr(EventsPtr(), foreign.get());
              }
              ShardOutput out = shard->process(in);
              if (w->final) {
                finals[idx].stats = std::move(out.stats);
                finals[idx].outcomes = std::move(out.outcomes);
                finals[idx].counters = out.counters;
                finals[idx].global = out.global;
              }
              if (!out.chains.empty()) {
                auto o = std::make_shared<ShardOutput>();
                o->chains = std::move(out.chains);
                collector.try_put(o);
              }
            } catch (...) {
              // An escaping exception would cancel the whole graph: count it and go on.
              node_errors.fetch_add(1);
            }
            if (w->pending.fetch_sub(1) == 1) {
              done_events.fetch_add(w->events->size());
              in_flight.fetch_sub(1);
              in_flight.notify_all();
            }
            return tbb::flow::continue_msg();
          }));
    }

    Batch batch;
    bool saw_final = false;
    uint64_t trace_end = 0;
    SourceFeed feed(source, compiled);
    while (!saw_final) {
      saw_final = feed.next(batch, counters);
      auto w = std::make_shared<Work>();
      w->watermark = batch.watermark;
      w->final = batch.final;
      w->dropped = source.meta().health.dropped_events;
      w->names = feed.names();
      route(batch.events, n_pid, *w, trace_end);
      w->trace_end = trace_end;
      w->events = std::make_shared<const std::vector<Event>>(std::move(batch.events));
      batch.events = {};
      w->pending.store(n_nodes);
      in_flight.fetch_add(1);
      for (auto& node : nodes) node->try_put(w);
      // Bound the batches in flight (memory), without waiting for the graph to drain.
      for (int cur = in_flight.load(); cur >= kMaxBatchesInFlight; cur = in_flight.load()) in_flight.wait(cur);
      if (opts.on_progress && (counters.batches % 8 == 0 || saw_final)) opts.on_progress(done_events.load());
    }
    g.wait_for_all();
  });
  counters.node_errors += node_errors.load();
  for (const auto& f : finals) merge_final(f, result, stats, counters);
}

}  // namespace

AnalysisResult run_plan(const Plan& plan, EventSource& source, const EngineOptions& opts,
                        std::vector<std::string>* errors) {
  AnalysisResult result;
  std::vector<std::string> errs;
  auto compiled = compile_plan(plan, errs);
  if (!compiled) {
    if (errors) *errors = errs;
    result.meta = source.meta();
    return result;
  }
  compiled->node_names = source.meta().nodes;
  compiled->process_names = source.meta().process_names;
  if (compiled->uses_stacks) compiled->stacks->sync(source.meta().stacks);

  const unsigned threads = opts.threads ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
  result.rules = compiled->rules;
  OpStatsAccumulator stats;
  EngineCounters counters;
  std::vector<Chain> chains;
  if (threads == 1) run_serial(*compiled, source, opts, result, stats, counters, chains);
  else run_parallel(*compiled, source, opts, threads, result, stats, counters, chains);

  std::sort(chains.begin(), chains.end(), chain_canonical_order);
  result.chains = std::move(chains);
  if (opts.compute_stats) result.ops = stats.results();
  counters.threads = threads;
  result.counters = counters;
  result.meta = source.meta();
  return result;
}

}  // namespace ingero
