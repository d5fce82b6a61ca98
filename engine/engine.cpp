// The flow graph: source thread -> router -> pid shards + one global shard -> collector.
// See engine.h for the threading and watermark contract and docs/architecture.md for the picture.
#include "engine/engine.h"

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "engine/runtime.h"

namespace ingero {
namespace {

using Msg = std::shared_ptr<ShardInput>;
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

  unsigned threads = opts.threads ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
  const unsigned shards = threads;
  result.rules = compiled->rules;
  OpStatsAccumulator stats;
  EngineCounters counters;
  std::vector<Chain> chains;

  tbb::task_arena arena(static_cast<int>(threads));
  arena.execute([&] {
    tbb::flow::graph g;
    // Collector: serial, so it needs no locks; chains are sorted after the run.
    tbb::flow::function_node<Out, tbb::flow::continue_msg> collector(
        g, tbb::flow::serial, [&](const Out& out) {
          try {
            for (auto& c : out->chains) {
              if (opts.on_chain) opts.on_chain(c);
              chains.push_back(std::move(c));
            }
            if (out->stats) stats.merge(*out->stats);
            for (size_t i = 0; i < out->outcomes.size() && i < result.rules.size(); ++i)
              merge_outcome(result.rules[i], out->outcomes[i]);
            if (out->counters.batches) {
              // The global shard sees every event again: count events once, from the pid shards.
              if (!out->global) counters.events_in += out->counters.events_in;
              counters.windows_closed += out->counters.windows_closed;
              counters.late_events += out->counters.late_events;
              counters.node_errors += out->counters.node_errors;
              counters.evicted_spans += out->counters.evicted_spans;
              counters.tail_windows_capped += out->counters.tail_windows_capped;
            }
          } catch (...) {
            ++counters.node_errors;
          }
          return tbb::flow::continue_msg();
        });

    std::vector<std::unique_ptr<Shard>> shard_state;
    std::vector<std::unique_ptr<tbb::flow::function_node<Msg, Out>>> nodes;
    std::atomic<uint64_t> node_errors{0};
    auto make_node = [&](bool global, bool stats_here) {
      shard_state.push_back(std::make_unique<Shard>(*compiled, global, stats_here && opts.compute_stats));
      Shard* shard = shard_state.back().get();
      nodes.push_back(std::make_unique<tbb::flow::function_node<Msg, Out>>(
          g, tbb::flow::serial, [shard, &node_errors](const Msg& in) {
            try {
              return std::make_shared<ShardOutput>(shard->process(*in));
            } catch (...) {
              // An escaping exception would cancel the whole graph: count it and go on.
              node_errors.fetch_add(1);
              return std::make_shared<ShardOutput>();
            }
          }));
      tbb::flow::make_edge(*nodes.back(), collector);
    };
    for (unsigned i = 0; i < shards; ++i) make_node(false, true);
    const bool global = compiled->has_global;
    if (global) make_node(true, false);

    Batch batch;
    bool saw_final = false;
    uint64_t done = 0;
    unsigned pending = 0;
    std::vector<Msg> parts(shards);
    // A source that ends without a final batch still gets one, so every window closes.
    auto next = [&](Batch& b) {
      if (saw_final) return false;
      if (source.next(b)) return true;
      b = Batch{};
      b.final = true;
      b.watermark = UINT64_MAX;
      return true;
    };
    size_t names_known = compiled->process_names.size();
    std::shared_ptr<const std::map<uint32_t, std::string>> names;
    while (next(batch)) {
      saw_final = batch.final;
      ++counters.batches;
      const uint64_t dropped = source.meta().health.dropped_events;
      // A live source names processes as their first events arrive: pass the new names along so
      // chains name the process as a replay of the same trace would.
      if (source.meta().process_names.size() != names_known) {
        names_known = source.meta().process_names.size();
        names = std::make_shared<const std::map<uint32_t, std::string>>(source.meta().process_names);
      }
      // Stack predicates: stacks a live source symbolized since the last batch.
      if (compiled->uses_stacks && source.meta().stacks.size() != compiled->stacks->size())
        compiled->stacks->sync(source.meta().stacks);
      const size_t n_events = batch.events.size();
      auto all_events = std::make_shared<const std::vector<Event>>(std::move(batch.events));
      for (unsigned i = 0; i < shards; ++i) {
        parts[i] = std::make_shared<ShardInput>();
        parts[i]->watermark = batch.watermark;
        parts[i]->final = batch.final;
        parts[i]->dropped = i == 0 ? dropped : 0;
        parts[i]->process_names = names;
      }
      if (shards == 1) {
        parts[0]->owned = all_events;
      } else {
        std::vector<std::vector<Event>> owned(shards), foreign(shards);
        for (const auto& e : *all_events) {
          const unsigned owner = shard_of(e.pid, shards);
          owned[owner].push_back(e);
          if (is_host_wide(e))
            for (unsigned i = 0; i < shards; ++i)
              if (i != owner) foreign[i].push_back(e);
        }
        for (unsigned i = 0; i < shards; ++i) {
          parts[i]->owned = std::make_shared<const std::vector<Event>>(std::move(owned[i]));
          parts[i]->foreign = std::make_shared<const std::vector<Event>>(std::move(foreign[i]));
        }
      }
      for (unsigned i = 0; i < shards; ++i) nodes[i]->try_put(parts[i]);
      if (global) {
        auto all = std::make_shared<ShardInput>();
        all->owned = all_events;
        all->watermark = batch.watermark;
        all->final = batch.final;
        all->process_names = names;
        nodes[shards]->try_put(all);
      }
      batch.events.clear();
      done += n_events;
      // Bound the batches in flight: the source never runs more than a few batches ahead.
      if (++pending >= 8 || batch.final) {
        g.wait_for_all();
        pending = 0;
        if (opts.on_progress) opts.on_progress(done);
      }
      if (batch.final) break;
    }
    g.wait_for_all();
    counters.node_errors += node_errors.load();
  });

  std::sort(chains.begin(), chains.end(), chain_canonical_order);
  result.chains = std::move(chains);
  if (opts.compute_stats) result.ops = stats.results();
  counters.threads = threads;
  result.counters = counters;
  result.meta = source.meta();
  return result;
}

}  // namespace ingero
