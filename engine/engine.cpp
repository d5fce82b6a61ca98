// The engine's scheduling: the calling thread reads and routes batches; pid shards (more of them
// than threads) and one global shard run as serial oneTBB flow-graph nodes on `threads` workers,
// and two threads split by window group run as two stages on two threads of their own.
// See engine.h for the threading and watermark contract and docs/architecture.md for the picture.
#include "engine/engine.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "engine/runtime.h"
#include "operators/spill_file.h"

namespace ingero {
namespace {

using Out = std::shared_ptr<ShardOutput>;

// EngineOptions::max_kept_chains: the oldest half goes once the cap is passed (amortised O(1)).
void keep_chain(std::vector<Chain>& chains, Chain&& c, size_t cap) {
  chains.push_back(std::move(c));
  if (cap && chains.size() > cap)
    chains.erase(chains.begin(), chains.begin() + static_cast<std::ptrdiff_t>(chains.size() - cap / 2));
}

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
  counters.join_spilled_blocks += out.counters.join_spilled_blocks;
  counters.join_spill_peak_bytes += out.counters.join_spill_peak_bytes;
  counters.join_spill_errors += out.counters.join_spill_errors;
  counters.join_spill_read_errors += out.counters.join_spill_read_errors;
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

// Maps a pid to its shard as shard_of() does (the same hash, and the same remainder computed with
// multiplications instead of a division: the router runs this once per event on the source
// thread, the one serial part of a run). Results do not depend on which shard a pid lands in
// (Engine.ManyShardsPerThreadGiveTheOneThreadResult); this keeps the assignment shard_of()'s.
class ShardOfPid {
 public:
  explicit ShardOfPid(unsigned shards) : shards_(shards ? shards : 1), magic_(UINT64_MAX / shards_ + 1) {}
  unsigned operator()(uint32_t pid) const {
    // shard_of's hash: the high 32 bits of pid * the golden-ratio constant.
    const auto h = static_cast<uint32_t>((static_cast<uint64_t>(pid) * 0x9E3779B97F4A7C15ull) >> 32);
    // h % shards_ for 32-bit h and shards_ (Lemire, Kaser and Kurz, "Faster remainder by direct
    // computation", 2019): exact for every 32-bit dividend and divisor.
    const uint64_t low = magic_ * h;
    return static_cast<unsigned>((static_cast<unsigned __int128>(low) * shards_) >> 64);
  }

 private:
  uint64_t shards_;
  uint64_t magic_;
};

// One source batch and its routing, shared read-only by every shard node while in flight. Works
// are pooled (a ring of kMaxBatchesInFlight): the source reuses one, and the capacity of every
// vector in it, once every node is done with it, so a run allocates no event memory per batch.
// Routing copies each event once, on the source thread, into the list of its owning pid shard
// (the batch is in that core's cache, having just been read): each pid shard then reads only its
// own compact events, in batch order. The global shard reads the whole batch in place.
struct Work {
  Batch batch;                            // the whole batch, as read
  std::vector<std::vector<Event>> owned;  // per pid shard: the events it owns, in batch order
  std::vector<Event> host_wide;           // host-wide events (every pid shard's joins see them)
  std::vector<uint16_t> host_wide_owner;  // per host_wide entry: its owning pid shard
  RoutedBatch routed;                     // by group: the batch's one routing pass, for every shard
  uint64_t dropped = 0;                   // for shard 0 only
  uint64_t trace_end = 0;                 // latest event end read so far (ShardInput::trace_end)
  std::shared_ptr<const std::map<uint32_t, std::string>> names;
  PrefetchHint upcoming;             // the source's next batch, as it knew it (EventSource::upcoming)
  std::atomic<unsigned> pending{0};  // shard nodes that have not finished with it yet
};

// Fills w.owned (one list per pid shard of shard_of_pid) and w.host_wide from w.batch, and raises
// `trace_end` to the latest event end.
void route(Work& w, const ShardOfPid& shard_of_pid, uint64_t& trace_end) {
  for (auto& v : w.owned) v.clear();
  w.host_wide.clear();
  w.host_wide_owner.clear();
  uint64_t end = trace_end;
  for (const Event& e : w.batch.view()) {
    end = std::max(end, e.end_ns());
    const unsigned s = shard_of_pid(e.pid);
    std::vector<Event>& list = w.owned[s];
    // Grown by a quarter, not doubled: a list keeps its capacity from batch to batch, so this
    // holds it near the largest share seen (pooled lists are most of a run's buffer memory).
    if (list.size() == list.capacity()) list.reserve(list.size() + list.size() / 4 + 64);
    list.push_back(e);
    if (is_host_wide(e)) {
      w.host_wide.push_back(e);
      w.host_wide_owner.push_back(static_cast<uint16_t>(s));
    }
  }
  trace_end = end;
}

// Batches read but not yet processed by every shard: the source runs at most this far ahead (the
// work pool's size). Each pooled work holds a batch and its routed copy (~0.7 MB at 4096 events):
// 32 of them raised explain's peak RSS at 2 threads on big5m.db from 99-104 MB to 114-120 MB; 16
// (with the lists grown by a quarter) gave 102-108 MB.
constexpr int kMaxBatchesInFlight = 16;
// When the ring is full, the source sleeps until this many Works are free and then refills them
// in a row: one wake-up of the source thread per kRefillBatches batches instead of one per batch
// (a third busy thread on two cores otherwise preempts a worker at every batch; part 18 of
// docs/history/issue-12.md: about 5x fewer context switches, 3 % less CPU at two threads).
constexpr int kRefillBatches = kMaxBatchesInFlight / 2;
// Two stages on two threads (run_parallel): how long one spins for the other before it sleeps.
constexpr int64_t kTwoStageSpinNs = 200'000;

// Waits while `word` holds `seen`, at most `timeout_ns`; false when the time ran out. A wake-up
// may be spurious: callers check the word again. (std::atomic::wait has no timeout.)
bool futex_wait_for(std::atomic<unsigned>& word, unsigned seen, long timeout_ns) {
  static_assert(sizeof(std::atomic<unsigned>) == sizeof(uint32_t));
  timespec ts{timeout_ns / 1'000'000'000, timeout_ns % 1'000'000'000};
  const long rc = ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
  return !(rc == -1 && errno == ETIMEDOUT);
}
void futex_wake_all(std::atomic<unsigned>& word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// A hint to the core that this thread is spinning (frees the pipeline, and the sibling
// hyper-thread where there is one).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

// Whether a by-group run of two shard sets, one of them beside the router (in_router >= 0), runs
// as two stages on two threads of its own instead of the flow graph (INGERO_TWO_STAGE=0: the
// graph; benchmarks and the tests that compare both).
bool two_stage_threads(int in_router, unsigned n_nodes) {
  if (in_router < 0 || n_nodes != 2) return false;
  const char* env = std::getenv("INGERO_TWO_STAGE");
  return !(env && std::string_view(env) == "0");
}

// How long a stage of a two-stage run spins before it sleeps when the other has nothing for it
// yet (INGERO_TWO_STAGE_SPIN_US overrides, for benchmarks).
int64_t two_stage_spin_ns() {
  if (const char* env = std::getenv("INGERO_TWO_STAGE_SPIN_US")) return std::atoll(env) * 1000;
  return kTwoStageSpinNs;
}

// Waits until ready(word) holds: spins (a pause per look) for up to `spin` first, then sleeps on
// the word's futex with `asleep` raised, so that the waker knows to wake it (the waker stores the
// word and then reads `asleep`, both sequentially consistent: no wake-up is lost). Each time
// 20 ms pass asleep, calls nudge().
// `spin` adapts (SpinBudget): a wait that ends while spinning keeps the full budget; one that had
// to sleep cuts it by 4 (down to 1/64), so a stage that keeps waiting long for the other (a run
// bound by its reader) stops burning a core the reader's threads could use.
struct SpinBudget {
  int64_t max_ns = 0;
  int64_t now_ns = 0;
};
template <class Ready>
void spin_then_sleep(std::atomic<unsigned>& word, std::atomic<unsigned>& asleep, SpinBudget& spin, Ready ready,
                     const std::function<void()>& nudge) {
  if (ready(word.load(std::memory_order_acquire))) return;
  if (spin.now_ns > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin.now_ns);
    for (unsigned n = 1;; ++n) {
      cpu_relax();
      if (ready(word.load(std::memory_order_acquire))) {
        spin.now_ns = spin.max_ns;
        return;
      }
      if (n % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
    }
    spin.now_ns = std::max(spin.now_ns / 4, spin.max_ns / 64);
  }
  for (;;) {
    asleep.fetch_add(1, std::memory_order_seq_cst);
    const unsigned seen = word.load(std::memory_order_seq_cst);
    if (ready(seen)) {
      asleep.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    const bool woken = futex_wait_for(word, seen, 20'000'000);
    asleep.fetch_sub(1, std::memory_order_relaxed);
    if (ready(word.load(std::memory_order_acquire))) return;
    if (!woken) nudge();
  }
}

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

// The whole run on the calling thread: one shard that runs the pid shards' and the global
// shard's pipes together (ShardTier::kBoth: one routing pass over each batch for both), no
// routing between shards, no TBB.
void run_serial(CompiledPlan& compiled, EventSource& source, const EngineOptions& opts, AnalysisResult& result,
                OpStatsAccumulator& stats, EngineCounters& counters, std::vector<Chain>& chains) {
  std::vector<std::unique_ptr<Shard>> shards;
  ShardTuning tuning;
  tuning.join_resident_bytes = opts.join_resident_bytes;
  shards.push_back(std::make_unique<Shard>(compiled, ShardTier::kBoth, opts.compute_stats, tuning));
  std::vector<ShardOutput> finals(shards.size());
  Batch batch;
  bool saw_final = false;
  uint64_t done = 0;
  SourceFeed feed(source, compiled);
  // The source's count of lost events is a running total; each batch carries what it added.
  uint64_t dropped_seen = 0;
  while (!saw_final) {
    saw_final = feed.next(batch, counters);
    const uint64_t dropped_now = source.meta().health.dropped_events;
    const uint64_t dropped_new = dropped_now > dropped_seen ? dropped_now - dropped_seen : 0;
    dropped_seen = std::max(dropped_seen, dropped_now);
    const size_t n_events = batch.view().size();
    ShardInput in;
    // Borrowed for the duration of the calls below (aliasing pointer, owns nothing).
    in.owned = EventsPtr(EventsPtr(), &batch.view());
    in.watermark = batch.watermark;
    in.final = batch.final;
    in.process_names = feed.names();
    in.prefetch = source.upcoming();
    for (size_t i = 0; i < shards.size(); ++i) {
      in.dropped = i == 0 ? dropped_new : 0;
      try {
        ShardOutput out = shards[i]->process(in);
        for (auto& c : out.chains) {
          if (opts.on_chain) opts.on_chain(c);
          keep_chain(chains, std::move(c), opts.max_kept_chains);
        }
        if (batch.final) finals[i] = std::move(out);
      } catch (...) {
        ++counters.node_errors;
      }
    }
    batch.events.clear();
    batch.lent = nullptr;
    done += n_events;
    if (opts.on_progress && (counters.batches % 8 == 0 || batch.final)) opts.on_progress(done);
  }
  for (const auto& f : finals) merge_final(f, result, stats, counters);
}

// The window groups split into `bins` sets for shards of ShardSplit::kByGroup, balanced by their
// estimated cost on `sample` (the run's first batch): the events routed to each group (routed
// groups; any other group counts as the whole batch) times a cost per event by what its states do,
// from a callgrind profile of the rule pack on /tmp/big5m.db (docs/history/issue-12.md, part 8): a count
// 1, duration sum/min/max 2, a duration quantile 1.6, both 2.6, a call buffer for joins 3 more.
// Heaviest first into the lightest bin. Returns one mask per bin and, in `stats_bin`, the bin of
// the heaviest group whose states can carry the per-op statistics' durations (keyed by source and
// op, with a duration quantile: Shard::Impl::choose_stats_group), and in `router_bin` the bin
// whose shard runs beside the router (run_parallel).
std::vector<std::vector<char>> split_groups(const CompiledPlan& plan, unsigned bins, unsigned& stats_bin,
                                            unsigned& router_bin, const std::vector<Event>& sample,
                                            std::vector<double>* bin_loads = nullptr) {
  const size_t n = plan.groups.size();
  std::vector<uint64_t> events(n, 0);
  for (size_t g = 0; g < n; ++g)
    if (!plan.routed[g]) events[g] = sample.size();
  for (const Event& e : sample) {
    const unsigned code = static_cast<unsigned>(e.source) << 8 | e.op;
    for (const Routes& r : plan.routes)
      if (code + 1 < r.begin.size())
        for (uint32_t t = r.begin[code]; t < r.begin[code + 1]; ++t) ++events[r.targets[t].group];
  }
  std::vector<double> weight(n, 0);
  std::vector<size_t> order(n);
  for (size_t g = 0; g < n; ++g) {
    const PipeDef& first = plan.pipes[plan.groups[g].pipes.front()];
    using Shape = AggregateLayout::Shape;
    const auto shape = first.layout ? first.layout->shape() : Shape::kCount;
    const double per_event = (shape == Shape::kCount         ? 1.0
                              : shape == Shape::kDurStats    ? 2.0
                              : shape == Shape::kDurQuantile ? 1.6
                                                             : 2.6) +
                             (plan.groups[g].needs_calls ? 3.0 : 0.0);
    weight[g] = 1.0 + per_event * static_cast<double>(events[g]);
    order[g] = g;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weight[a] > weight[b]; });
  std::vector<std::vector<char>> masks(bins, std::vector<char>(n, 0));
  std::vector<double> load(bins, 0);
  stats_bin = 0;
  double stats_weight = 0;
  for (const size_t g : order) {
    const auto bin = static_cast<unsigned>(std::min_element(load.begin(), load.end()) - load.begin());
    masks[bin][g] = 1;
    load[bin] += weight[g];
    const PipeDef& first = plan.pipes[plan.groups[g].pipes.front()];
    const auto shape = first.layout ? first.layout->shape() : AggregateLayout::Shape::kCount;
    const bool carries = first.keys.has(Field::kSource) && first.keys.has(Field::kOp) &&
                         (shape == AggregateLayout::Shape::kDurQuantile || shape == AggregateLayout::Shape::kDurBoth);
    if (carries && weight[g] > stats_weight) {
      stats_weight = weight[g];
      stats_bin = bin;
    }
  }
  // The lightest bin but the heaviest group's (bin 0, where the first placement put it): that
  // group costs more than the model says (on big5m.db the tail group's shard took 0.107 s
  // against 0.047 s for the other five groups', weighed 19.9 k and 20.6 k), so it never runs
  // beside the router.
  router_bin = bins > 1 ? 1 : 0;
  for (unsigned b = 2; b < bins; ++b)
    if (load[b] < load[router_bin]) router_bin = b;
  if (bin_loads) *bin_loads = load;
  return masks;
}

// A source whose first batch was read ahead (to choose the thread count on it): hands that batch
// out first, then reads on.
class PeekedSource final : public EventSource {
 public:
  explicit PeekedSource(EventSource& in) : in_(in) { has_ = in_.next(first_); }
  const Batch* first() const { return has_ ? &first_ : nullptr; }
  bool next(Batch& out) override {
    if (!given_) {
      given_ = true;
      if (!has_) return false;
      out = std::move(first_);
      return true;
    }
    return in_.next(out);
  }
  TraceMeta& meta() override { return in_.meta(); }
  PrefetchHint upcoming() override { return given_ ? in_.upcoming() : PrefetchHint{}; }
  unsigned busy_threads() const override { return in_.busy_threads(); }

 private:
  EventSource& in_;
  Batch first_;
  bool has_ = false, given_ = false;
};

// CPUs this process may run on (its affinity mask), else the hardware's count.
unsigned usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// The automatic thread count (EngineOptions::threads == 0): 2 or 1. Two only when
// - the machine has two cores for the engine: usable CPUs minus the source's busy threads, and
//   minus the load of the last minute beyond this process's own (INGERO_AUTO_IGNORE_LOAD=1 skips
//   that part: benchmarks that measure the machine themselves), leaves at least 2; on a shared
//   2-vCPU machine under load, or with a file reader's threads on it, the second stage would
//   wait for a core and run slower than one thread (docs/performance.md, "Speed on any shape");
// - the split by window group can pay off: on the first batch, the estimated work of all groups
//   over that of the heavier of the two stages (split_groups) is at least 1.4. The estimate
//   under-weighs the heaviest group (split_groups), so the bound is kept well above 1.
// More than two is never chosen: the pid split beyond two threads has no measured gain here.
unsigned auto_engine_threads(const CompiledPlan& plan, const EventSource& source, const Batch* first) {
  const unsigned cpus = usable_cpus();
  double spare = static_cast<double>(cpus) - static_cast<double>(source.busy_threads());
  const char* ignore = std::getenv("INGERO_AUTO_IGNORE_LOAD");
  if (!(ignore && std::string_view(ignore) == "1")) {
    double load[1] = {0};
    if (::getloadavg(load, 1) == 1) {
      const double others = std::max(0.0, load[0] - 1.0 - static_cast<double>(source.busy_threads()));
      spare = std::min(spare, static_cast<double>(cpus) - others);
    }
  }
  if (spare < 2.0 || !first || first->view().empty() || plan.groups.size() < 2) return 1;
  unsigned stats_bin = 0, router_bin = 0;
  std::vector<double> loads;
  split_groups(plan, 2, stats_bin, router_bin, first->view(), &loads);
  double total = 0, heaviest = 0;
  for (const double l : loads) {
    total += l;
    heaviest = std::max(heaviest, l);
  }
  return heaviest > 0 && total / heaviest >= 1.4 ? 2 : 1;
}

// `threads` workers run the shards; the calling thread is the source: it reads a batch into a
// pooled Work, routes it by pid (pid shards) or hands it to the router node (by group), which
// routes it once for every shard node, blocking only when the Work it would reuse next
// (kMaxBatchesInFlight batches back) is still being processed (no barrier between batches).
void run_parallel(CompiledPlan& compiled, EventSource& source, const EngineOptions& opts, unsigned threads,
                  AnalysisResult& result, OpStatsAccumulator& stats, EngineCounters& counters,
                  std::vector<Chain>& chains) {
  // By group: shards of both tiers, each over every event and some of the window groups (no pid
  // shards, nothing to route). By pid: pid shards and the global shard.
  ShardSplit split = opts.split;
  if (split == ShardSplit::kAuto) {  // INGERO_SHARD_SPLIT=pid|group overrides the default (benchmarks)
    const char* env = std::getenv("INGERO_SHARD_SPLIT");
    const std::string_view v = env ? env : "";
    split = v == "pid" ? ShardSplit::kByPid : v == "group" ? ShardSplit::kByGroup : ShardSplit::kAuto;
  }
  const bool by_group = split == ShardSplit::kByGroup || (split == ShardSplit::kAuto && threads == 2);
  const unsigned n_pid = by_group ? 0 : std::min(shard_count(threads), 0x7fffu);
  std::vector<std::unique_ptr<Work>> pool(kMaxBatchesInFlight);
  for (auto& w : pool) {
    w = std::make_unique<Work>();
    w->owned.resize(n_pid);
  }
  // The first batch is read here, before the shards exist: by group, it is what the groups are
  // balanced on.
  SourceFeed feed(source, compiled);
  uint64_t dropped_seen = 0;  // the source's running total of lost events, as far as batches carried it
  const bool first_final = feed.next(pool[0]->batch, counters);
  unsigned stats_bin = 0, router_bin = 0;
  const std::vector<std::vector<char>> group_sets = by_group ? split_groups(compiled, threads, stats_bin, router_bin,
                                                                            pool[0]->batch.view())
                                                             : std::vector<std::vector<char>>{};
  // By group, a router walks each batch once for every shard (Shard::route), unless
  // INGERO_SHARED_ROUTE=0 (benchmarks: docs/history/issue-12.md, part 17).
  const char* shared_env = std::getenv("INGERO_SHARED_ROUTE");
  const bool use_router = by_group && !(shared_env && std::string_view(shared_env) == "0");
  const bool global = !by_group && compiled.has_global;
  const unsigned n_nodes = by_group ? static_cast<unsigned>(group_sets.size()) : n_pid + (global ? 1 : 0);

  // The join spill budget is the run's: shared out between the shards (at least 1 MiB each).
  ShardTuning tuning;
  if (opts.join_resident_bytes > 0)
    tuning.join_resident_bytes = std::max<size_t>(opts.join_resident_bytes / std::max(n_nodes, 1U), size_t{1} << 20);
  // The router: a shard of every group that only routes (its own node, below). It keeps the
  // per-op statistics but for the durations the carrying group's window states hold: the shard
  // that runs that group adds those.
  std::unique_ptr<Shard> router;
  std::vector<char> stats_nodes(group_sets.size(), 0);
  if (stats_bin < group_sets.size()) stats_nodes[stats_bin] = 1;
  if (use_router) {
    router = std::make_unique<Shard>(compiled, ShardTier::kBoth, opts.compute_stats, tuning);
    const int carried = router->carried_stats_group();
    for (unsigned i = 0; i < group_sets.size(); ++i)
      stats_nodes[i] = carried >= 0 && group_sets[i][static_cast<size_t>(carried)] ? 1 : 0;
  }

  // The source thread blocks while workers run: give the arena `threads` workers of its own.
  // oneTBB's default pool has hardware_concurrency - 1 workers; raise it when that is fewer.
  std::optional<tbb::global_control> more_workers;
  const size_t want = static_cast<size_t>(threads) + 1;
  if (tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism) < want)
    more_workers.emplace(tbb::global_control::max_allowed_parallelism, want);
  tbb::task_arena arena(static_cast<int>(threads) + 1, 1);
  std::vector<std::unique_ptr<Shard>> shards;
  for (unsigned i = 0; i < n_pid; ++i)
    shards.push_back(std::make_unique<Shard>(compiled, ShardTier::kPid, opts.compute_stats, tuning));
  if (global) shards.push_back(std::make_unique<Shard>(compiled, ShardTier::kGlobal, false, tuning));
  for (unsigned i = 0; i < group_sets.size(); ++i)
    shards.push_back(std::make_unique<Shard>(compiled, ShardTier::kBoth, opts.compute_stats && stats_nodes[i], tuning,
                                             group_sets[i]));
  // Written by each shard's own node at the final batch, read after the graph is done.
  std::vector<ShardOutput> finals(n_nodes);
  std::atomic<uint64_t> node_errors{0}, done_events{0};

  // With a router, the shard of a light group set (split_groups) runs right after the routing
  // pass, on the batch that pass has just brought into this core's cache (run apart, it read every
  // event again from the other core: 0.047-0.049 s of shard time on big5m.db against 0.027-0.028
  // beside the router). Routing plus that shard is one stage, the heaviest shard the other
  // (docs/history/issue-12.md, part 18).
  const int in_router = router && n_nodes > 1 ? static_cast<int>(router_bin) : -1;
  // Chains a shard found go to `deliver`: the graph's collector node, or, with two stages on
  // threads of their own (below), collect() under a lock (chains are sorted after the run
  // either way). collect() runs one call at a time.
  std::function<void(const Out&)> deliver;
  auto collect = [&](const Out& out) {
    try {
      for (auto& c : out->chains) {
        if (opts.on_chain) opts.on_chain(c);
        keep_chain(chains, std::move(c), opts.max_kept_chains);
      }
    } catch (...) {
      node_errors.fetch_add(1);
    }
  };
  // The source, when it waits for a Work to come back, says so here; the last shard done with a
  // Work wakes it only then (a futex wake is a system call per batch otherwise).
  std::atomic<unsigned> source_asleep{0};
  // What each shard does with a Work: run by its own node or thread, or, for the shard the router
  // runs (below), right after the routing pass.
  std::vector<std::function<void(Work*)>> bodies;
  for (unsigned idx = 0; idx < n_nodes; ++idx) {
    // A global shard or a shard of some groups: reads the whole batch in place.
    const bool is_global = by_group || idx == n_pid;
    Shard* shard = shards[idx].get();
    // The host-wide events of other pid shards, gathered per batch into a buffer this node
    // reuses (its batches run one at a time).
    auto foreign = std::make_shared<std::vector<Event>>();
    bodies.emplace_back([&, idx, is_global, shard, foreign](Work* w) {
      const size_t n_events = w->batch.view().size();
      try {
        ShardInput in;
        in.watermark = w->batch.watermark;
        in.final = w->batch.final;
        in.dropped = idx == 0 ? w->dropped : 0;
        in.process_names = w->names;
        in.trace_end = w->trace_end;
        // Borrowed (aliasing pointers that own nothing): the shard keeps no pointer into
        // its input past process().
        if (is_global) {
          in.owned = EventsPtr(EventsPtr(), &w->batch.view());
          if (router) in.routed = &w->routed;
          // The next batch into this core's cache while this one is worked on (the router's
          // routing pass does it for the shard that runs beside it). Pid shards read copies.
          if (static_cast<int>(idx) != in_router) in.prefetch = w->upcoming;
        } else {
          foreign->clear();
          for (size_t i = 0; i < w->host_wide.size(); ++i)
            if (w->host_wide_owner[i] != idx) foreign->push_back(w->host_wide[i]);
          in.owned = EventsPtr(EventsPtr(), &w->owned[idx]);
          in.foreign = EventsPtr(EventsPtr(), foreign.get());
        }
        ShardOutput out = shard->process(in);
        if (in.final) {
          finals[idx].stats = std::move(out.stats);
          finals[idx].outcomes = std::move(out.outcomes);
          finals[idx].counters = out.counters;
          // Every by-group shard counts every event: the run counts them from the first.
          finals[idx].global = out.global || (by_group && idx != 0);
        }
        if (!out.chains.empty()) {
          auto o = std::make_shared<ShardOutput>();
          o->chains = std::move(out.chains);
          deliver(o);
        }
      } catch (...) {
        // An escaping exception would cancel the whole graph: count it and go on.
        node_errors.fetch_add(1);
      }
      // The last node done with the Work hands it back to the source (which may reuse it
      // at once: nothing here touches *w after the decrement but the wake-up).
      if (w->pending.fetch_sub(1, std::memory_order_seq_cst) == 1) {
        done_events.fetch_add(n_events, std::memory_order_relaxed);
        if (source_asleep.load(std::memory_order_seq_cst)) futex_wake_all(w->pending);
      }
    });
  }
  auto route_work = [&](Work* w) {
    try {
      router->route(w->batch.view(), w->routed, w->upcoming, w->batch.final);
    } catch (...) {
      // Counted; the shards then see no event of this batch (no half-made lists).
      node_errors.fetch_add(1);
      std::fill(w->routed.sizes.begin(), w->routed.sizes.end(), size_t{0});
      for (auto& spans : w->routed.spans) spans.clear();
      w->routed.exits.clear();
      w->routed.gave_up_stats = false;
    }
  };

  // The source's part of batch `seq` (Work w): waits until every shard is done with w (spinning
  // first when `spin` allows; nudge() each time 20 ms pass asleep) and, when w is busy, until the
  // next `refill` - 1 Works are free too (they come back in order), reads the next batch into it
  // and fills in what every shard reads. Returns whether it is the run's last batch.
  uint64_t trace_end = 0;
  const ShardOfPid shard_of_pid(n_pid);
  auto prepare = [&](size_t seq, Work& w, SpinBudget& spin, size_t refill, const std::function<void()>& nudge) {
    bool last = first_final;  // seq 0 was read before the shards were made
    if (seq != 0) {
      // Bound the batches in flight (memory): wait until every node is done with this Work.
      auto wait_idle = [&](Work& x) {
        spin_then_sleep(
            x.pending, source_asleep, spin, [](unsigned p) { return p == 0; }, nudge);
      };
      if (refill > 1 && w.pending.load(std::memory_order_acquire) != 0)
        wait_idle(*pool[(seq + refill - 1) % pool.size()]);
      wait_idle(w);
      // A source may append to the batch it is given: hand it an empty one (capacity kept).
      w.batch.events.clear();
      w.batch.lent = nullptr;
      w.batch.watermark = 0;
      w.batch.seq = 0;
      w.batch.final = false;
      last = feed.next(w.batch, counters);
    }
    // A running total at the source; each batch carries what it added.
    const uint64_t dropped_now = source.meta().health.dropped_events;
    w.dropped = dropped_now > dropped_seen ? dropped_now - dropped_seen : 0;
    dropped_seen = std::max(dropped_seen, dropped_now);
    w.names = feed.names();
    w.upcoming = source.upcoming();
    if (!by_group) route(w, shard_of_pid, trace_end);  // by group: the router, or each shard, reads it
    w.trace_end = trace_end;
    w.pending.store(n_nodes, std::memory_order_release);
    return last;
  };

  if (two_stage_threads(in_router, n_nodes)) {
    // Two stages on two threads of their own, no graph: this thread reads each batch, routes it
    // and runs the light shard beside the router; one thread runs the heavy shard, taking the
    // Works in order as they are handed on. Each waits for the other spinning first (a stage's
    // batch is about 0.1 ms of work; a futex sleep and wake on a VM costs a fair part of that).
    // In the graph the same two stages ran on two workers beside this thread, a third one that
    // needed a core to hand on each batch (docs/history/issue-12.md, parts 18 and 19).
    std::mutex chains_mutex;
    deliver = [&](const Out& out) {
      const std::lock_guard<std::mutex> lock(chains_mutex);
      collect(out);
    };
    const auto heavy = static_cast<size_t>(1 - in_router);
    SpinBudget heavy_spin{two_stage_spin_ns(), two_stage_spin_ns()};
    SpinBudget source_spin = heavy_spin;
    std::atomic<unsigned> handed{0};           // Works handed on to the heavy stage: seq < handed
    std::atomic<unsigned> heavy_asleep{0};     // the heavy stage sleeps on `handed`
    std::atomic<unsigned> last_seq{UINT_MAX};  // the last batch's seq, once read
    std::atomic<bool> stop{false};             // the source gave up (an exception): nothing more comes
    auto heavy_stage = [&] {
      for (unsigned seq = 0;; ++seq) {
        spin_then_sleep(
            handed, heavy_asleep, heavy_spin,
            [&stop, seq](unsigned h) { return h > seq || stop.load(std::memory_order_relaxed); }, [] {});
        if (handed.load(std::memory_order_acquire) <= seq) return;          // stopped
        const bool last = last_seq.load(std::memory_order_acquire) == seq;  // w may be reused after the body
        bodies[heavy](pool[seq % pool.size()].get());
        if (last) return;
      }
    };
    std::thread heavy_thread;
    try {
      heavy_thread = std::thread(heavy_stage);
    } catch (...) {
      // No thread to be had: this one runs the heavy shard too, after the light one.
    }
    // An exception out of this loop (the source, a progress callback) must not leave the heavy
    // thread waiting: it is told to stop and joined, then the exception goes on, as it would out
    // of the graph.
    struct JoinOnThrow {
      std::thread& t;
      std::atomic<bool>& stop;
      std::atomic<unsigned>& handed;
      ~JoinOnThrow() {
        if (!t.joinable()) return;
        stop.store(true, std::memory_order_seq_cst);
        futex_wake_all(handed);
        t.join();
      }
    } join_on_throw{heavy_thread, stop, handed};
    if (!heavy_thread.joinable()) source_spin = SpinBudget{};  // nobody to spin for
    bool last = false;
    for (size_t seq = 0; !last; ++seq) {
      Work& w = *pool[seq % pool.size()];
      // One Work at a time: no third thread here to keep off the cores by refilling in a row.
      last = prepare(seq, w, source_spin, 1, [] {});
      route_work(&w);
      if (heavy_thread.joinable()) {
        if (last) last_seq.store(static_cast<unsigned>(seq), std::memory_order_release);
        handed.store(static_cast<unsigned>(seq + 1), std::memory_order_seq_cst);
        if (heavy_asleep.load(std::memory_order_seq_cst)) futex_wake_all(handed);
      }
      bodies[static_cast<size_t>(in_router)](&w);
      if (!heavy_thread.joinable()) bodies[heavy](&w);
      if (opts.on_progress && (counters.batches % 8 == 0 || last)) opts.on_progress(done_events.load());
    }
    if (heavy_thread.joinable()) heavy_thread.join();
  } else {
    arena.execute([&] {
      tbb::flow::graph g;
      // Collector: serial, so it needs no locks; chains are sorted after the run.
      tbb::flow::function_node<Out, tbb::flow::continue_msg> collector(g, tbb::flow::serial, [&](const Out& out) {
        collect(out);
        return tbb::flow::continue_msg();
      });
      deliver = [&](const Out& out) { collector.try_put(out); };
      std::vector<std::unique_ptr<tbb::flow::function_node<Work*, tbb::flow::continue_msg>>> nodes;
      for (unsigned idx = 0; idx < n_nodes; ++idx) {
        if (static_cast<int>(idx) == in_router) continue;
        auto run = [&bodies, idx](Work* w) {
          bodies[idx](w);
          return tbb::flow::continue_msg();
        };
        nodes.push_back(
            std::make_unique<tbb::flow::function_node<Work*, tbb::flow::continue_msg>>(g, tbb::flow::serial, run));
      }
      // By group: a node of its own routes each batch (serial, so in order), hands it on to the
      // other shard nodes and runs the shard beside it. The workers share the routing with the
      // shards: routing on the source thread made it a third busy thread on two cores
      // (docs/history/issue-12.md, part 17).
      std::unique_ptr<tbb::flow::function_node<Work*, tbb::flow::continue_msg>> router_node;
      if (router)
        router_node = std::make_unique<tbb::flow::function_node<Work*, tbb::flow::continue_msg>>(
            g, tbb::flow::serial, [&](Work* w) {
              route_work(w);
              for (auto& node : nodes) node->try_put(w);
              if (in_router >= 0) bodies[static_cast<size_t>(in_router)](w);
              return tbb::flow::continue_msg();
            });
      // With a nudge: oneTBB can miss waking its workers when this thread spawns a task
      // (try_put below) and then blocks outside the scheduler, leaving the task in this thread's
      // pool while every worker sleeps (uxlfoundation/oneTBB#1684; seen here once in about 15
      // two-thread runs of big5m.db). After 20 ms without a Work coming back, an empty enqueued
      // task wakes a worker, which then steals the stranded one. No spinning: this thread is a
      // third one beside the workers.
      const std::function<void()> nudge = [&] { arena.enqueue([] {}); };
      SpinBudget no_spin;
      bool last = false;
      for (size_t seq = 0; !last; ++seq) {
        Work& w = *pool[seq % pool.size()];
        // When the Work it would reuse is busy, this thread sleeps until kRefillBatches are free
        // and refills them in a row: one wake-up of a third busy thread on two cores per
        // kRefillBatches batches, not one per batch (docs/history/issue-12.md, part 18).
        last = prepare(seq, w, no_spin, kRefillBatches, nudge);
        if (router_node) {
          router_node->try_put(&w);
        } else {
          for (auto& node : nodes) node->try_put(&w);
        }
        if (opts.on_progress && (counters.batches % 8 == 0 || last)) opts.on_progress(done_events.load());
      }
      g.wait_for_all();
    });
  }
  counters.node_errors += node_errors.load();
  for (const auto& f : finals) merge_final(f, result, stats, counters);
  if (router)
    if (const auto rs = router->take_stats()) stats.merge(*rs);
}

}  // namespace

size_t replay_join_resident_bytes() { return SpillFile::budget_from_env("INGERO_JOIN_RESIDENT_MB", size_t{4} << 20); }

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
  compiled->step_markers = opts.step_markers;
  if (compiled->uses_stacks) compiled->stacks->sync(source.meta().stacks);

  result.rules = compiled->rules;
  OpStatsAccumulator stats;
  EngineCounters counters;
  std::vector<Chain> chains;
  unsigned threads = opts.threads;
  std::optional<PeekedSource> peeked;
  if (threads == 0) {
    peeked.emplace(source);
    threads = auto_engine_threads(*compiled, source, peeked->first());
  }
  EventSource& in = peeked ? static_cast<EventSource&>(*peeked) : source;
  if (threads == 1) run_serial(*compiled, in, opts, result, stats, counters, chains);
  else run_parallel(*compiled, in, opts, threads, result, stats, counters, chains);

  merge_window_runs(*compiled, chains);
  std::sort(chains.begin(), chains.end(), chain_canonical_order);
  result.chains = std::move(chains);
  if (opts.compute_stats) result.ops = stats.results();
  counters.threads = threads;
  result.counters = counters;
  result.meta = source.meta();
  return result;
}

}  // namespace ingero
