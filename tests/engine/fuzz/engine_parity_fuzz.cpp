// libFuzzer target for the engine's promise that results do not depend on how a run is cut up
// (engine/engine.h: "the result does not depend on the number of threads or on batch
// boundaries"; engine/runtime.h, ShardTuning: "results do not depend on it"). The unit tests
// check that promise on synthetic traces from fixed seeds; this target lets coverage steer the
// traces instead: odd orders of sched_switch halves, ties, durations past 32 bits, late context
// intervals, windows that close on a batch boundary, call buffers capped at one call.
//
// Each input is a header and 8-byte event records (decode() below): the records become a trace
// in time order, cut into batches of the header's size, with the records the header marks as
// late moved to the start of a later batch and flagged event_flags::kLate (model/trace.h, Batch).
// Every input runs the default rule pack once as the reference (one thread, those batches), and
// once more as the header's variant; the two must agree:
// - engine variants (run_plan over the same batches): two threads as two stages, the same with
//   no spinning (INGERO_TWO_STAGE_SPIN_US=0: every wait sleeps on the futex), two threads through
//   the flow graph (INGERO_TWO_STAGE=0), two threads by pid, three threads by pid and by group,
//   four threads, two threads with no shared router (INGERO_SHARED_ROUTE=0), one thread spilling
//   every sealed join block (join_resident_bytes = 1), and, when nothing is late, one thread over
//   batches of 4096: explain's JSON (counters `threads` and `batches` blanked) and the per-op
//   statistics must be equal;
// - shard variants (one Shard of both tiers, ShardTuning, a call buffer cap of 1-64 from the
//   header so that buffers cap and compact): a tail read off the held calls against the
//   compacted buffer's, narrow calls against full ones, shared join buffers against one per
//   stage, pruning after every batch against none: chains (every value and evidence id), rule
//   outcomes and window counters must be equal.
// A difference aborts with both texts written to stderr.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target engine_parity_fuzz
//   mkdir -p /tmp/engine-corpus
//   ./build-fuzz/tests/engine/fuzz/engine_parity_fuzz -max_total_time=900 -max_len=4096 -rss_limit_mb=4096 \
//       /tmp/engine-corpus tests/engine/fuzz/engine-corpus
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/runtime.h"
#include "model/event.h"
#include "model/ops.h"
#include "model/trace.h"
#include "rules/pack.h"
#include "tests/util/result_text.h"
#include "tests/util/shard_run.h"

namespace {

using namespace ingero;

constexpr uint64_t kBase = 1'763'800'000'000'000'000ull;  // 10 s aligned, as model/synth.h's epoch
constexpr size_t kHeader = 4, kRecord = 8, kMaxEvents = 2048;

// A trace cut into batches exactly as the input says (late events first in theirs).
struct Cut {
  std::vector<std::vector<Event>> batches;
  std::vector<uint64_t> watermarks;  // per batch; the last is +inf
  size_t late = 0;                   // events delivered late
  std::vector<Event> in_order;       // every event, sorted by start (for the re-batched run)
};

// One record -> one event (ts is set by the caller). Byte 0 picks the kind; the rest pick the
// thread, the duration (a 16-bit mantissa shifted by 0-21 bits: 0 to ~137 s, past 32 bits), the
// off-CPU state, a stack (groups keyed by site), an error return and a rank.
Event event_of(const uint8_t* r, uint64_t id) {
  Event e;
  e.id = id;
  const uint32_t pid = 100 + (r[1] & 3u);
  const uint32_t sub = (r[1] >> 2) & 3u;
  e.pid = pid;
  e.tid = sub == 0 ? pid : pid * 10 + sub;
  e.dur_ns = (static_cast<uint64_t>(r[3]) | static_cast<uint64_t>(r[4]) << 8) << ((r[5] & 7u) * 3);
  e.prev_state = static_cast<OffCpuState>(((r[5] >> 3) & 7u) % 5);
  e.stack_id = r[5] >> 6;  // 0: no stack
  e.ret = (r[6] & 1u) ? 2 : 0;
  const int rank = (r[6] >> 1) & 7;
  e.rank = static_cast<int16_t>(rank < 4 ? rank : -1);
  e.arg0 = static_cast<uint64_t>(r[6]) << 12;
  e.arg1 = 100 + (r[7] & 3u);
  auto call = [&](Source s, uint8_t op) {
    e.source = s;
    e.op = op;
  };
  switch (r[0] % 16) {
    case 0: call(Source::kCuda, op::kCudaLaunchKernel); break;
    case 1: call(Source::kCuda, op::kCudaMemcpy); break;
    case 2: call(Source::kCuda, op::kCudaStreamSync); break;
    case 3: call(Source::kCuda, op::kCudaMalloc); break;
    case 4: call(Source::kCuda, op::kCudaDeviceSync); break;
    case 5: call(Source::kDriver, op::kCuLaunchKernel); break;
    case 6: call(Source::kDriver, op::kCuCtxSynchronize); break;
    case 7: call(Source::kHost, op::kSchedSwitch); break;  // a paired off-CPU span
    case 8:                                                // a live switch-out half
      call(Source::kHost, op::kSchedSwitch);
      e.dur_ns = 0;
      e.flags = event_flags::kSwitchOut;
      break;
    case 9:  // a live switch-in half
      call(Source::kHost, op::kSchedSwitch);
      e.dur_ns = 0;
      e.flags = event_flags::kSwitchIn;
      break;
    case 10: call(Source::kIo, (r[7] & 4u) ? op::kBlockWrite : op::kBlockRead); break;
    case 11:
      call(Source::kTcp, op::kTcpRetransmit);
      e.dur_ns = 0;
      break;
    case 12: call(Source::kNccl, op::kNcclAllReduce); break;
    case 13:
      call(Source::kHost, op::kPageAlloc);
      e.dur_ns = 0;
      break;
    case 14: call(Source::kNet, (r[7] & 4u) ? op::kNetRecv : op::kNetSend); break;
    default:
      call(Source::kHost, (r[7] & 4u) ? op::kProcessExit : op::kProcessExec);
      e.dur_ns = 0;
      break;
  }
  return e;
}

// A context interval: what a live source may deliver late (never a probed call).
bool may_be_late(const Event& e) {
  return (e.source == Source::kHost && e.op == op::kSchedSwitch && e.flags == 0) || e.source == Source::kIo ||
         e.source == Source::kNet;
}

Cut decode(const uint8_t* data, size_t size, size_t batch) {
  const auto by_start = [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; };
  Cut cut;
  std::vector<Event> main;
  std::vector<std::pair<Event, uint8_t>> late;  // the event and its record's last byte
  uint64_t ts = kBase;
  const size_t n = std::min((size - kHeader) / kRecord, kMaxEvents);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* r = data + kHeader + i * kRecord;
    // Byte 2: the step from the previous start: a tie, microseconds, milliseconds, or quarter
    // seconds (which cross the default 10 s windows).
    const uint64_t v = r[2] & 63u;
    switch (r[2] >> 6) {
      case 0: break;
      case 1: ts += v * 1'000; break;
      case 2: ts += v * 1'000'000; break;
      default: ts += v * 250'000'000; break;
    }
    Event e = event_of(r, i + 1);
    e.ts_ns = ts;
    if (r[7] >= 224 && may_be_late(e)) late.emplace_back(e, r[7]);
    else main.push_back(e);
  }
  for (size_t at = 0; at < main.size() || cut.batches.empty(); at += batch) {
    const size_t end = std::min(main.size(), at + batch);
    cut.batches.emplace_back(main.begin() + static_cast<std::ptrdiff_t>(at),
                             main.begin() + static_cast<std::ptrdiff_t>(end));
    cut.watermarks.push_back(end > at ? main[end - 1].ts_ns : kBase);
    if (end == main.size()) break;
  }
  // A late event goes to the start of batch j >= 1, starting before batch j - 1's watermark and
  // ending after it (model/trace.h); with one batch there is nothing to be late for.
  const size_t nb = cut.batches.size();
  std::vector<std::vector<Event>> firsts(nb);
  for (auto& [e, b] : late) {
    if (nb < 2) {
      cut.batches[0].push_back(e);  // re-sorted below
      continue;
    }
    const size_t j = 1 + (b - 224u) % (nb - 1);
    const uint64_t wm = cut.watermarks[j - 1];
    const uint64_t back = std::min<uint64_t>(e.dur_ns % 4'000'000'000ull + 1, wm - kBase);
    e.ts_ns = wm - back;
    e.dur_ns = back + 1 + e.dur_ns % 1'000'000;
    e.flags |= event_flags::kLate;
    firsts[j].push_back(e);
    ++cut.late;
  }
  for (size_t j = 0; j < nb; ++j) {
    auto& f = firsts[j];
    std::stable_sort(f.begin(), f.end(), by_start);
    cut.batches[j].insert(cut.batches[j].begin(), f.begin(), f.end());
  }
  std::stable_sort(cut.batches[0].begin(), cut.batches[0].end(), by_start);
  cut.watermarks.back() = std::numeric_limits<uint64_t>::max();
  for (const auto& b : cut.batches) cut.in_order.insert(cut.in_order.end(), b.begin(), b.end());
  std::stable_sort(cut.in_order.begin(), cut.in_order.end(), by_start);
  return cut;
}

// Replays a Cut's batches as they are.
class CutSource final : public EventSource {
 public:
  explicit CutSource(const Cut& cut) : cut_(cut) {
    if (!cut.in_order.empty()) {
      meta_.first_ts = cut.in_order.front().ts_ns;
      for (const auto& e : cut.in_order) meta_.last_ts = std::max(meta_.last_ts, e.end_ns());
    }
    meta_.process_names = names();
  }
  static std::map<uint32_t, std::string> names() { return {{100, "trainer"}, {101, "loader"}, {102, "stress-ng"}}; }
  bool next(Batch& out) override {
    if (at_ >= cut_.batches.size()) return false;
    out.events = cut_.batches[at_];
    out.lent = nullptr;
    out.watermark = cut_.watermarks[at_];
    out.seq = at_;
    out.final = at_ + 1 == cut_.batches.size();
    ++at_;
    return true;
  }
  TraceMeta& meta() override { return meta_; }

 private:
  const Cut& cut_;
  size_t at_ = 0;
  TraceMeta meta_;
};

const Plan& pack() {
  static const Plan plan = rules::default_rule_pack_plan();
  return plan;
}

void setenv_or_clear(const char* name, const char* value) {
  if (value) ::setenv(name, value, 1);
  else ::unsetenv(name);
}

// What a run reports, as text: explain's JSON (counters `threads` and `batches` blanked) and the
// per-op statistics.
std::string run_engine(EventSource& src, const EngineOptions& o) {
  std::vector<std::string> errors;
  auto r = run_plan(pack(), src, o, &errors);
  if (!errors.empty()) {
    std::fprintf(stderr, "default pack does not compile: %s\n", errors.front().c_str());
    std::abort();
  }
  if (r.counters.node_errors != 0) {
    std::fprintf(stderr, "%llu node errors at %u threads\n", static_cast<unsigned long long>(r.counters.node_errors),
                 o.threads);
    std::abort();
  }
  return test::result_text(r) + "\n" + test::ops_text(r);
}

// The cut through one Shard of both tiers with `tuning`: everything it reports but the span
// counters (tests/util/shard_run.h).
std::string run_shard(const CompiledPlan& cp, const Cut& cut, const ShardTuning& tuning) {
  Shard shard(cp, ShardTier::kBoth, false, tuning);
  uint64_t trace_end = 0;
  for (const auto& e : cut.in_order) trace_end = std::max(trace_end, e.end_ns());
  std::vector<ShardOutput> outs;
  for (size_t j = 0; j < cut.batches.size(); ++j) {
    ShardInput in;
    in.owned = std::make_shared<const std::vector<Event>>(cut.batches[j]);
    in.final = j + 1 == cut.batches.size();
    in.watermark = cut.watermarks[j];
    in.trace_end = trace_end;
    outs.push_back(shard.process(in));
  }
  return test::shard_text(outs);
}

// Reports where two result texts part (400 characters of each from a little before), and aborts.
[[noreturn]] void differ(const char* what, const std::string& a, const std::string& b) {
  size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  const size_t from = at > 100 ? at - 100 : 0;
  std::fprintf(stderr, "engine_parity_fuzz: %s differs at character %zu\n--- reference\n%s\n--- variant\n%s\n", what,
               at, a.substr(from, 400).c_str(), b.substr(from, 400).c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kHeader) return 0;
  static const size_t kBatches[] = {1, 2, 3, 7, 16, 64, 4096};
  static const size_t kCaps[] = {1, 2, 3, 8, 16, 64};
  const size_t batch = kBatches[data[1] % 7];
  const Cut cut = decode(data, size, batch);
  // The engine variants: each against the one-thread run over the same batches.
  struct EngineVariant {
    const char* what;
    unsigned threads;
    ShardSplit split;
    const char* env = nullptr;  // an engine switch set to "0" for the run (engine.cpp)
    size_t resident = 0;        // EngineOptions::join_resident_bytes
  };
  static const EngineVariant kEngine[] = {
      {"two stages", 2, ShardSplit::kAuto},
      {"two threads through the flow graph", 2, ShardSplit::kAuto, "INGERO_TWO_STAGE"},
      {"two threads by pid", 2, ShardSplit::kByPid},
      {"three threads by pid", 3, ShardSplit::kAuto},
      {"three threads by group", 3, ShardSplit::kByGroup},
      {"four threads", 4, ShardSplit::kAuto},
      {"two threads with no shared router", 2, ShardSplit::kAuto, "INGERO_SHARED_ROUTE"},
      {"one thread spilling every join block", 1, ShardSplit::kAuto, nullptr, 1},
      {"one thread over batches of 4096", 1, ShardSplit::kAuto},
      {"two stages that never spin (every wait sleeps)", 2, ShardSplit::kAuto, "INGERO_TWO_STAGE_SPIN_US"},
  };
  constexpr unsigned kRebatched = 8;
  constexpr unsigned kEngineVariants = sizeof kEngine / sizeof kEngine[0];
  const unsigned variant = data[0] % (kEngineVariants + 4);
  if (variant < kEngineVariants) {
    const EngineVariant& v = kEngine[variant];
    if (variant == kRebatched && cut.late) return 0;  // lateness depends on the cut: nothing to compare
    CutSource ref_src(cut);
    const std::string ref = run_engine(ref_src, EngineOptions{});
    EngineOptions o;
    o.threads = v.threads;
    o.split = v.split;
    o.join_resident_bytes = v.resident;
    if (v.env) setenv_or_clear(v.env, "0");
    std::string got;
    if (variant == kRebatched) {
      TraceMeta meta;
      meta.process_names = CutSource::names();
      VectorSource src(cut.in_order, 4096, std::move(meta));  // first and last ts as CutSource's
      got = run_engine(src, o);
    } else {
      CutSource src(cut);
      got = run_engine(src, o);
    }
    if (v.env) setenv_or_clear(v.env, nullptr);
    if (got != ref) differ(v.what, ref, got);
    return 0;
  }

  static const std::unique_ptr<CompiledPlan> cp = [] {
    std::vector<std::string> errors;
    auto c = compile_plan(pack(), errors);
    if (!c) {
      std::fprintf(stderr, "default pack does not compile: %s\n", errors.empty() ? "" : errors.front().c_str());
      std::abort();
    }
    return c;
  }();
  ShardTuning a, b;
  a.max_tail_calls = b.max_tail_calls = kCaps[data[2] % 6];
  const char* what = "";
  switch (variant - kEngineVariants) {
    case 0:
      b.tail_from_held = false;
      what = "tail read off the held calls vs the compacted buffer";
      break;
    case 1:
      b.narrow_calls = false;
      what = "narrow vs full call buffers";
      break;
    case 2:
      b.share_join_buffers = false;
      what = "shared join buffers vs one per stage";
      break;
    default:
      a.prune_every_batch = true;
      a.prune_min_spans = 0;
      b.prune_spans = false;
      what = "pruning after every batch vs none";
      break;
  }
  const std::string ra = run_shard(*cp, cut, a), rb = run_shard(*cp, cut, b);
  if (ra != rb) differ(what, ra, rb);
  return 0;
}
