// Time accounting (operators/time_accounting.h): exact splits on hand-made threads, a
// nanosecond-by-nanosecond reference on random traces (nested calls, threads that start and end
// mid-trace, spans crossing the interval's edges, missing states, calls overlapping preemption),
// invariance under shifts and batch sizes, and conservation on every shared Ingero trace.
#include "operators/time_accounting.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/ops.h"
#include "model/result_json.h"
#include "model/stack.h"
#include "sinks/report/text_report.h"
#include "sinks/store/sqlite_store.h"

namespace ingero {
namespace {

Event call(uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, Source s = Source::kCuda,
           uint8_t o = op::kCudaLaunchKernel) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = pid;
  e.tid = tid;
  e.source = s;
  e.op = o;
  return e;
}

Event span(uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, OffCpuState st, uint32_t ran = 0,
           uint64_t stack = 0) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = pid;
  e.tid = tid;
  e.source = Source::kHost;
  e.op = op::kSchedSwitch;
  e.prev_state = st;
  e.arg1 = ran;
  e.stack_id = stack;
  return e;
}

StackFrame frame(FrameKind k, std::string function) {
  StackFrame f;
  f.kind = k;
  f.function = std::move(function);
  return f;
}

uint64_t sum(const ThreadAccounting& a) {
  return a.in_calls_total() + a.on_cpu_ns + a.preempted_ns + a.blocked_total() + a.unknown_ns;
}

std::vector<ThreadAccounting> run(std::vector<Event> ev, const TraceMeta& meta = {}, size_t batch = 4096,
                                  AccountingOptions o = {}) {
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  TimeAccounting acc(o);
  for (size_t i = 0; i < ev.size(); i += batch) acc.observe(ev.data() + i, std::min(batch, ev.size() - i));
  return acc.accounts(meta);
}

const ThreadAccounting* find(const std::vector<ThreadAccounting>& v, uint32_t tid) {
  for (const auto& a : v)
    if (a.tid == tid) return &a;
  return nullptr;
}

// --- hand-made threads ---------------------------------------------------------------------------

TEST(TimeAccounting, NestedCallsCountOnceAndTheOutermostKindOwns) {
  // A runtime copy [100, 200) with a driver copy inside it, a sync [300, 400) whose driver call
  // starts at the same time (and arrives first), a launch [500, 510). Sched data exists: the rest
  // is on CPU.
  std::vector<Event> ev = {
      call(1, 1, 100, 100, Source::kCuda, op::kCudaMemcpy),
      call(1, 1, 120, 50, Source::kDriver, op::kCuLaunchKernel),  // an odd kind inside: copy still owns
      call(1, 1, 300, 50, Source::kDriver, op::kCuMemAlloc),      // same start, shorter, arrives first
      call(1, 1, 300, 100, Source::kCuda, op::kCudaStreamSync),
      call(1, 1, 500, 10),
      span(1, 1, 450, 20, OffCpuState::kSleeping),
  };
  const auto r = run(ev);
  ASSERT_EQ(r.size(), 1u);
  const auto& a = r[0];
  EXPECT_EQ(a.start_ns, 100u);
  EXPECT_EQ(a.end_ns, 510u);
  EXPECT_EQ(a.wall_ns, 410u);
  EXPECT_EQ(a.in_calls_ns.at("copy"), 100u);
  EXPECT_EQ(a.in_calls_ns.at("sync"), 100u);
  EXPECT_EQ(a.in_calls_ns.at("launch"), 10u);
  EXPECT_EQ(a.in_calls_ns.at("alloc"), 0u);
  EXPECT_EQ(a.blocked_ns.at("other"), 20u);  // sleeping, no stack
  EXPECT_EQ(a.on_cpu_ns, 410u - 210u - 20u);
  EXPECT_EQ(a.unknown_ns, 0u);
  EXPECT_EQ(sum(a), a.wall_ns);
}

TEST(TimeAccounting, PrecedencePreemptedCallBlockedUnknownRest) {
  // Thread 1: a sync [0, 1000). Inside it: preempted [100, 200) by tid 9 (preempted wins),
  // blocked [300, 400) (the call wins), unknown [500, 600) (the call wins).
  // After it: blocked [1000, 1100) overlapping unknown [1050, 1200) (blocked wins, then unknown),
  // preempted [1300, 1400) by tid 8 overlapping blocked [1350, 1500) (preempted wins), then a
  // launch [1600, 1610). Rest on CPU: [1200,1300) + [1500,1600) = 200.
  TraceMeta meta;
  meta.thread_names[9] = "kworker/9";
  meta.process_names[7] = "noisy";
  std::vector<Event> ev = {
      call(1, 1, 0, 1000, Source::kCuda, op::kCudaDeviceSync),
      span(1, 1, 100, 100, OffCpuState::kPreempted, 9),
      span(1, 1, 300, 100, OffCpuState::kSleeping),
      span(1, 1, 500, 100, OffCpuState::kUnknown),
      span(1, 1, 1000, 100, OffCpuState::kDiskWait),
      span(1, 1, 1050, 150, OffCpuState::kUnknown),
      span(1, 1, 1300, 100, OffCpuState::kPreempted, 8),
      span(1, 1, 1350, 150, OffCpuState::kSleeping),
      call(1, 1, 1600, 10),
      call(7, 8, 5000, 1),  // tid 8 is a thread of pid 7 ("noisy")
  };
  const auto r = run(ev, meta);
  const auto* a = find(r, 1);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->wall_ns, 1610u);
  EXPECT_EQ(a->preempted_ns, 200u);
  EXPECT_EQ(a->in_calls_ns.at("sync"), 900u);
  EXPECT_EQ(a->in_calls_ns.at("launch"), 10u);
  EXPECT_EQ(a->blocked_ns.at("io"), 100u);
  EXPECT_EQ(a->blocked_ns.at("other"), 100u);  // [1400, 1500)
  EXPECT_EQ(a->unknown_ns, 100u);              // [1100, 1200)
  EXPECT_EQ(a->on_cpu_ns, 200u);
  EXPECT_EQ(sum(*a), a->wall_ns);
  ASSERT_EQ(a->preempted_by.size(), 2u);
  EXPECT_EQ(a->preempted_by[0].tid, 8u);  // ties by ns: lower tid first
  EXPECT_EQ(a->preempted_by[0].pid, 7u);
  EXPECT_EQ(a->preempted_by[0].comm, "noisy");
  EXPECT_EQ(a->preempted_by[0].ns, 100u);
  EXPECT_EQ(a->preempted_by[1].tid, 9u);
  EXPECT_EQ(a->preempted_by[1].pid, 0u);  // never seen in the trace
  EXPECT_EQ(a->preempted_by[1].comm, "kworker/9");
}

TEST(TimeAccounting, NoSchedulerDataMeansUnknownOutsideCalls) {
  // Process 1 has no sched spans at all: time outside calls is unknown, not on CPU. Process 2 has
  // one with a state (on a thread that never calls the GPU): its feeding thread's rest is on CPU.
  // Process 3 has spans without a state only (an Ingero trace: a sample of the switches): its
  // rest is unknown too.
  std::vector<Event> ev = {call(1, 1, 0, 10),
                           call(1, 1, 90, 10),
                           call(2, 2, 0, 10),
                           call(2, 2, 90, 10),
                           span(2, 3, 50, 5, OffCpuState::kSleeping),
                           call(3, 4, 0, 10),
                           call(3, 4, 90, 10),
                           span(3, 4, 50, 5, OffCpuState::kUnknown)};
  const auto r = run(ev);
  ASSERT_EQ(r.size(), 3u);  // tid 3 fed nothing
  EXPECT_EQ(find(r, 1)->unknown_ns, 80u);
  EXPECT_EQ(find(r, 1)->on_cpu_ns, 0u);
  EXPECT_FALSE(find(r, 1)->scheduler_data);
  EXPECT_EQ(find(r, 2)->unknown_ns, 0u);
  EXPECT_EQ(find(r, 2)->on_cpu_ns, 80u);
  EXPECT_TRUE(find(r, 2)->scheduler_data);
  EXPECT_EQ(find(r, 4)->unknown_ns, 80u);
  EXPECT_EQ(find(r, 4)->on_cpu_ns, 0u);
  EXPECT_FALSE(find(r, 4)->scheduler_data);
}

TEST(TimeAccounting, BlockedReasonsFromTheSwitchOutStack) {
  TraceMeta meta;
  auto stack = [&meta](uint64_t id, std::vector<std::string> kernel) {
    ParsedStack p;
    for (auto& f : kernel) p.frames.push_back(frame(FrameKind::kKernel, f));
    p.frames.push_back(frame(FrameKind::kNative, "pthread_cond_wait"));
    meta.stacks[id] = encode_stack(p);
  };
  stack(11, {"schedule", "futex_wait_queue", "futex_wait"});
  stack(12, {"schedule", "schedule_timeout", "sk_wait_data", "tcp_recvmsg"});
  stack(13, {"schedule", "do_nanosleep", "hrtimer_nanosleep"});
  stack(14, {"schedule", "io_schedule", "folio_wait_bit_common"});
  stack(15, {"schedule", "do_epoll_wait_something"});
  std::vector<Event> ev = {
      call(1, 1, 0, 1),
      span(1, 1, 10, 10, OffCpuState::kSleeping, 0, 11),
      span(1, 1, 20, 20, OffCpuState::kSleeping, 0, 12),
      span(1, 1, 40, 30, OffCpuState::kSleeping, 0, 13),
      span(1, 1, 70, 40, OffCpuState::kOther, 0, 14),
      span(1, 1, 110, 50, OffCpuState::kSleeping, 0, 15),
      span(1, 1, 160, 60, OffCpuState::kSleeping, 0, 99),  // a stack the trace does not hold
      call(1, 1, 220, 1),
  };
  const auto r = run(ev, meta);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].blocked_ns.at("lock"), 10u);
  EXPECT_EQ(r[0].blocked_ns.at("network"), 20u);
  EXPECT_EQ(r[0].blocked_ns.at("sleep"), 30u);
  EXPECT_EQ(r[0].blocked_ns.at("io"), 40u);
  EXPECT_EQ(r[0].blocked_ns.at("other"), 110u);
  EXPECT_EQ(r[0].on_cpu_ns, 9u);  // [1, 10)
  EXPECT_EQ(sum(r[0]), r[0].wall_ns);
}

TEST(TimeAccounting, IntervalClipsThreadsAndSpans) {
  // Interval [100, 200): a call [50, 150) counts from 100, a preemption [180, 260) until 200,
  // a call [300, 310) is outside.
  AccountingOptions o;
  o.from_ns = 100;
  o.to_ns = 200;
  std::vector<Event> ev = {call(1, 1, 50, 100), span(1, 1, 180, 80, OffCpuState::kPreempted, 5), call(1, 1, 300, 10)};
  const auto r = run(ev, {}, 4096, o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].start_ns, 100u);
  EXPECT_EQ(r[0].end_ns, 200u);
  EXPECT_EQ(r[0].in_calls_ns.at("launch"), 50u);
  EXPECT_EQ(r[0].on_cpu_ns, 30u);
  EXPECT_EQ(r[0].preempted_ns, 20u);
}

TEST(TimeAccounting, NcclAndGraphKinds) {
  EXPECT_EQ(call_kind(Source::kNccl, op::kNcclAllReduce), CallKind::kCollective);
  EXPECT_EQ(call_kind(Source::kGraph, op::kGraphLaunch), CallKind::kLaunch);
  EXPECT_EQ(call_kind(Source::kGraph, op::kGraphInstantiate), CallKind::kOther);
  EXPECT_EQ(call_kind(Source::kDriver, op::kCuMemcpyDtoHAsync), CallKind::kCopy);
  EXPECT_EQ(call_kind(Source::kCuda, op::kCudaEventSync), CallKind::kSync);
  EXPECT_EQ(call_kind(Source::kCuda, op::kCudaFree), CallKind::kAlloc);
  EXPECT_EQ(call_kind(Source::kCuda, 200), CallKind::kOther);
}

TEST(TimeAccounting, FinishKeepsTheLongestSixteenFeedingThreads) {
  std::vector<Event> ev;
  for (uint32_t tid = 1; tid <= 20; ++tid) {
    ev.push_back(call(1, tid, 0, 1));
    ev.push_back(call(1, tid, tid * 10, 1));
  }
  ev.push_back(span(1, 100, 0, 1000, OffCpuState::kUnknown));  // no GPU call: never listed
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  TimeAccounting acc;
  acc.observe(ev.data(), ev.size());
  AnalysisResult res;
  acc.finish({}, res);
  ASSERT_EQ(res.accounting.size(), 16u);
  EXPECT_EQ(res.accounting.front().tid, 20u);
  EXPECT_EQ(res.accounting.back().tid, 5u);
  for (size_t i = 1; i < res.accounting.size(); ++i)
    EXPECT_GE(res.accounting[i - 1].wall_ns, res.accounting[i].wall_ns);
}

TEST(TimeAccounting, JsonAndTextSayWhereTheTimeWent) {
  TraceMeta meta;
  meta.thread_names[1] = "trainer";
  meta.thread_names[9] = "stress-ng";
  std::vector<Event> ev = {call(1, 1, 0, 100, Source::kCuda, op::kCudaStreamSync),
                           span(1, 1, 100, 300, OffCpuState::kPreempted, 9), call(1, 1, 900, 100)};
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  TimeAccounting acc;
  acc.observe(ev.data(), ev.size());
  AnalysisResult r;
  r.meta = meta;
  acc.finish(meta, r);
  const auto j = explain_json(r);
  ASSERT_EQ(j["accounting"].size(), 1u);
  const auto& a = j["accounting"][0];
  EXPECT_EQ(a["tid"], 1);
  EXPECT_EQ(a["comm"], "trainer");
  EXPECT_EQ(a["wall_ns"], 1000);
  EXPECT_EQ(a["in_calls_ns"]["sync"], 100);
  EXPECT_EQ(a["in_calls_ns"]["launch"], 100);
  EXPECT_EQ(a["preempted_ns"], 300);
  EXPECT_EQ(a["preempted_by"][0]["comm"], "stress-ng");
  EXPECT_EQ(a["preempted_by"][0]["ns"], 300);
  EXPECT_EQ(a["on_cpu_ns"], 500);
  EXPECT_EQ(a["blocked_ns"]["lock"], 0);
  EXPECT_EQ(a["unknown_ns"], 0);
  for (const char* k : {"pid", "node", "rank", "start_ns", "end_ns", "scheduler_data"}) EXPECT_TRUE(a.contains(k)) << k;
  const std::string text = accounting_text(r);
  EXPECT_NE(text.find("Where the time went"), std::string::npos) << text;
  EXPECT_NE(text.find("preempted 30%"), std::string::npos) << text;
  EXPECT_NE(text.find("stress-ng"), std::string::npos) << text;
  EXPECT_EQ(text.find("cannot"), std::string::npos) << text;
  // The same thread in a trace that records no switch-out state: it says so.
  for (auto& e : ev) e.prev_state = OffCpuState::kUnknown;
  TimeAccounting blind;
  blind.observe(ev.data(), ev.size());
  blind.finish(meta, r);
  const std::string t2 = accounting_text(r);
  EXPECT_NE(t2.find("unknown 80%: this trace does not record why threads were off CPU"), std::string::npos) << t2;
}

// --- random traces against a nanosecond-by-nanosecond reference ---------------------------------

struct Reference {
  std::map<uint32_t, ThreadAccounting> by_tid;
};

// The contract read literally: every nanosecond of each feeding thread's interval, classified by
// the precedence of the header. Events must be in arrival (ts-sorted) order.
Reference reference(const std::vector<Event>& ev, const TraceMeta& meta, uint64_t from, uint64_t to) {
  std::map<uint32_t, std::vector<size_t>> per_tid;
  std::map<uint32_t, bool> sched_pid, feeds;
  for (size_t i = 0; i < ev.size(); ++i) {
    const Event& e = ev[i];
    if (e.ts_ns > to || e.end_ns() < from) continue;
    const bool gpu = is_gpu_api(e.source);
    if (!gpu && !(e.source == Source::kHost && e.op == op::kSchedSwitch)) continue;
    per_tid[e.tid].push_back(i);
    if (gpu) feeds[e.tid] = true;
    else if (e.prev_state != OffCpuState::kUnknown) sched_pid[e.pid] = true;
  }
  Reference ref;
  for (const auto& [tid, idx] : per_tid) {
    if (!feeds[tid]) continue;
    ThreadAccounting a;
    a.tid = tid;
    a.pid = ev[idx[0]].pid;
    uint64_t start = UINT64_MAX, end = 0;
    for (size_t i : idx) {
      start = std::min(start, std::max(ev[i].ts_ns, from));
      end = std::max(end, std::min(ev[i].end_ns(), to));
    }
    a.start_ns = start;
    a.end_ns = end;
    a.wall_ns = end - start;
    for (const char* k : kCallKinds) a.in_calls_ns[k] = 0;
    for (const char* k : kBlockReasons) a.blocked_ns[k] = 0;
    std::map<uint32_t, uint64_t> by;
    for (uint64_t t = start; t < end; ++t) {
      const Event *pre = nullptr, *cl = nullptr, *bl = nullptr, *un = nullptr;
      for (size_t i : idx) {
        const Event& e = ev[i];
        if (!(std::max(e.ts_ns, from) <= t && t < std::min(e.end_ns(), to))) continue;
        if (is_gpu_api(e.source)) {
          // Outermost: earliest start, then the longer, then the first to arrive.
          if (!cl || e.ts_ns < cl->ts_ns || (e.ts_ns == cl->ts_ns && e.dur_ns > cl->dur_ns)) cl = &e;
        } else if (e.prev_state == OffCpuState::kPreempted) {
          if (!pre) pre = &e;
        } else if (e.prev_state == OffCpuState::kUnknown) {
          if (!un) un = &e;
        } else if (!bl) {
          bl = &e;
        }
      }
      if (pre) {
        ++a.preempted_ns;
        ++by[static_cast<uint32_t>(pre->arg1)];
      } else if (cl) {
        ++a.in_calls_ns[kCallKinds[static_cast<size_t>(call_kind(cl->source, cl->op))]];
      } else if (bl) {
        BlockReason r = BlockReason::kOther;
        if (bl->prev_state == OffCpuState::kDiskWait) r = BlockReason::kIo;
        else if (auto it = meta.stacks.find(bl->stack_id); bl->stack_id && it != meta.stacks.end())
          r = block_reason(parse_stack(it->second));
        ++a.blocked_ns[kBlockReasons[static_cast<size_t>(r)]];
      } else if (un) {
        ++a.unknown_ns;
      } else if (sched_pid[a.pid]) {
        ++a.on_cpu_ns;
      } else {
        ++a.unknown_ns;
      }
    }
    for (const auto& [t, ns] : by) a.preempted_by.push_back({0, t, "", ns});
    ref.by_tid[tid] = a;
  }
  return ref;
}

std::vector<Event> random_trace(std::mt19937_64& rng, TraceMeta& meta) {
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  const uint8_t cuda_ops[] = {op::kCudaLaunchKernel, op::kCudaMemcpy, op::kCudaStreamSync, op::kCudaMalloc};
  const uint8_t drv_ops[] = {op::kCuLaunchKernel, op::kCuMemcpyHtoD, op::kCuStreamSynchronize, op::kCuMemAlloc};
  const OffCpuState states[] = {OffCpuState::kPreempted, OffCpuState::kSleeping, OffCpuState::kDiskWait,
                                OffCpuState::kUnknown, OffCpuState::kOther};
  ParsedStack futex;
  futex.frames.push_back(frame(FrameKind::kKernel, "futex_wait"));
  meta.stacks[1] = encode_stack(futex);
  std::vector<Event> ev;
  const uint32_t threads = static_cast<uint32_t>(uni(1, 6));
  for (uint32_t tid = 1; tid <= threads; ++tid) {
    const uint32_t pid = tid <= 2 ? 1 : tid <= 4 ? 2 : 3;     // pid 3 may have no sched spans
    const uint64_t t0 = uni(0, 800), t1 = t0 + uni(0, 1500);  // threads start and end mid-trace
    const bool sched = pid != 3 || uni(0, 1) == 0;
    for (int k = 0, n = static_cast<int>(uni(0, 25)); k < n; ++k) {
      const uint64_t ts = uni(t0, t1), dur = uni(0, 150);
      if (uni(0, 2) == 0) {
        ev.push_back(call(pid, tid, ts, dur, Source::kCuda, cuda_ops[uni(0, 3)]));
        if (uni(0, 1)) {  // a nested driver call, sometimes at the same start, sometimes outliving it
          const uint64_t in = ts + (uni(0, 2) == 0 ? 0 : uni(0, dur));
          ev.push_back(call(pid, tid, in, uni(0, dur + 20), Source::kDriver, drv_ops[uni(0, 3)]));
        }
      } else if (uni(0, 5) == 0) {
        ev.push_back(call(pid, tid, ts, dur, Source::kNccl, op::kNcclAllReduce));
      } else if (sched) {
        const OffCpuState st = states[uni(0, 4)];
        ev.push_back(span(pid, tid, ts, dur, st, static_cast<uint32_t>(uni(1, 8)), uni(0, 1) ? uni(0, 1) : 0));
      }
    }
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return ev;
}

void expect_equal(const ThreadAccounting& got, const ThreadAccounting& want, const std::string& what) {
  SCOPED_TRACE(what + " tid " + std::to_string(want.tid));
  EXPECT_EQ(got.start_ns, want.start_ns);
  EXPECT_EQ(got.end_ns, want.end_ns);
  EXPECT_EQ(got.wall_ns, want.wall_ns);
  EXPECT_EQ(got.in_calls_ns, want.in_calls_ns);
  EXPECT_EQ(got.blocked_ns, want.blocked_ns);
  EXPECT_EQ(got.on_cpu_ns, want.on_cpu_ns);
  EXPECT_EQ(got.preempted_ns, want.preempted_ns);
  EXPECT_EQ(got.unknown_ns, want.unknown_ns);
  EXPECT_EQ(sum(got), got.wall_ns);
}

TEST(TimeAccounting, RandomTracesMatchTheNanosecondReference) {
  std::mt19937_64 rng(40);
  for (int round = 0; round < 400; ++round) {
    TraceMeta meta;
    const std::vector<Event> ev = random_trace(rng, meta);
    uint64_t from = 0, to = UINT64_MAX;
    if (round % 3 == 1) {  // an interval that cuts calls and spans
      from = std::uniform_int_distribution<uint64_t>(0, 900)(rng);
      to = from + std::uniform_int_distribution<uint64_t>(0, 1500)(rng);
    }
    AccountingOptions o;
    o.from_ns = from;
    o.to_ns = to;
    o.top_preemptors = 100;
    const Reference ref = reference(ev, meta, from, to == UINT64_MAX ? 1'000'000 : to);
    const size_t batch = round % 4 == 0 ? 1 : round % 4 == 1 ? 3 : 4096;
    const auto got = run(ev, meta, batch, o);
    const std::string what = "round " + std::to_string(round);
    ASSERT_EQ(got.size(), ref.by_tid.size()) << what;
    for (const auto& g : got) {
      auto it = ref.by_tid.find(g.tid);
      ASSERT_NE(it, ref.by_tid.end()) << what;
      expect_equal(g, it->second, what);
      uint64_t by = 0;
      for (const auto& p : g.preempted_by) {
        by += p.ns;
        const auto w = std::find_if(it->second.preempted_by.begin(), it->second.preempted_by.end(),
                                    [&](const PreemptedBy& x) { return x.tid == p.tid; });
        ASSERT_NE(w, it->second.preempted_by.end());
        EXPECT_EQ(p.ns, w->ns);
      }
      EXPECT_EQ(by, g.preempted_ns) << what;  // every preemptor listed (top_preemptors = 100)
    }
    if (HasFailure()) {
      for (const auto& e : ev)
        std::printf("tid %u src %d op %d ts %llu dur %llu state %d\n", e.tid, static_cast<int>(e.source), e.op,
                    static_cast<unsigned long long>(e.ts_ns), static_cast<unsigned long long>(e.dur_ns),
                    static_cast<int>(e.prev_state));
      return;
    }
  }
}

TEST(TimeAccounting, ShiftAndBatchSizeInvariance) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 100; ++round) {
    TraceMeta meta;
    std::vector<Event> ev = random_trace(rng, meta);
    const auto base = run(ev, meta, 4096);
    const uint64_t shift = 1'700'000'000'000'000'000ull + static_cast<uint64_t>(round) * 977;
    for (auto& e : ev) e.ts_ns += shift;
    for (size_t batch : {size_t{1}, size_t{2}, size_t{5}, size_t{64}, size_t{4096}}) {
      const auto got = run(ev, meta, batch);
      ASSERT_EQ(got.size(), base.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ThreadAccounting want = base[i];
        want.start_ns += shift;
        want.end_ns += shift;
        expect_equal(got[i], want, "shift, batch " + std::to_string(batch));
        ASSERT_EQ(got[i].preempted_by.size(), want.preempted_by.size());
        for (size_t k = 0; k < got[i].preempted_by.size(); ++k) {
          EXPECT_EQ(got[i].preempted_by[k].tid, want.preempted_by[k].tid);
          EXPECT_EQ(got[i].preempted_by[k].ns, want.preempted_by[k].ns);
        }
      }
    }
  }
}

TEST(TimeAccounting, ManyEventsPerThreadStillConserve) {
  // Long runs of events per thread (many settles), with long calls that outlive many others.
  std::mt19937_64 rng(3);
  std::vector<Event> ev;
  uint64_t t = 0;
  for (int i = 0; i < 200'000; ++i) {
    t += rng() % 50;
    const uint32_t tid = 1 + static_cast<uint32_t>(rng() % 4);
    if (rng() % 3) ev.push_back(call(1, tid, t, rng() % (rng() % 100 == 0 ? 100'000 : 100)));
    else ev.push_back(span(1, tid, t, rng() % 200, static_cast<OffCpuState>(rng() % 5), 42));
  }
  const auto r = run(ev, {}, 777);
  ASSERT_EQ(r.size(), 4u);
  for (const auto& a : r) {
    EXPECT_EQ(sum(a), a.wall_ns);
    EXPECT_GT(a.in_calls_total(), 0u);
    EXPECT_GT(a.preempted_ns, 0u);
    EXPECT_GT(a.on_cpu_ns, 0u);
  }
}

// --- every shared Ingero trace -------------------------------------------------------------------

TEST(TimeAccounting, SharedIngeroTracesConserveTime) {
  const std::filesystem::path dir = INGERO_SHARED_DATA;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) GTEST_SKIP() << "no shared Ingero traces at " << dir;
  int traces = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".db") continue;
    const std::string path = entry.path().string();
    SCOPED_TRACE(path);
    std::string error;
    auto src = open_sqlite_trace(path, error);  // read-only
    ASSERT_TRUE(src) << error;
    TimeAccounting acc;
    TimeAccounting acc_small;  // the same events in batches of 3
    Batch b;
    uint64_t first = UINT64_MAX, last = 0, gpu = 0;
    while (src->next(b)) {
      const auto& v = b.view();
      acc.observe(v.data(), v.size());
      for (size_t i = 0; i < v.size(); i += 3) acc_small.observe(v.data() + i, std::min<size_t>(3, v.size() - i));
      for (const Event& e : v) {
        first = std::min(first, e.ts_ns);
        last = std::max(last, e.end_ns());
        gpu += is_gpu_api(e.source);
      }
    }
    const auto all = acc.accounts(src->meta());
    const auto small = acc_small.accounts(src->meta());
    ASSERT_EQ(all.size(), small.size());
    if (gpu) {
      EXPECT_FALSE(all.empty());
    }
    for (size_t i = 0; i < all.size(); ++i) {
      const auto& a = all[i];
      EXPECT_EQ(sum(a), a.wall_ns) << "tid " << a.tid;
      EXPECT_EQ(a.wall_ns, a.end_ns - a.start_ns);
      EXPECT_GE(a.start_ns, first);
      EXPECT_LE(a.end_ns, last);
      EXPECT_EQ(a.in_calls_ns.size(), kCallKindCount);
      EXPECT_EQ(a.blocked_ns.size(), kBlockReasonCount);
      EXPECT_LE(a.preempted_by.size(), 5u);
      if (a.wall_ns > 0) {
        EXPECT_GT(a.in_calls_total(), 0u) << "a feeding thread spends time in calls";
      }
      if (i) {
        EXPECT_GE(all[i - 1].wall_ns, a.wall_ns);
      }
      if (!a.scheduler_data) {
        EXPECT_EQ(a.on_cpu_ns, 0u) << "no switch-out state: nothing says the thread was on CPU";
      }
      if (src->meta().format.rfind("ingero-0.", 0) == 0) {  // Ingero records no state
        EXPECT_FALSE(a.scheduler_data);
        EXPECT_EQ(a.preempted_ns + a.blocked_total(), 0u);
        EXPECT_EQ(a.in_calls_total() + a.unknown_ns, a.wall_ns);
      }
      EXPECT_EQ(a.tid, small[i].tid);
      EXPECT_EQ(a.in_calls_ns, small[i].in_calls_ns);
      EXPECT_EQ(a.unknown_ns, small[i].unknown_ns);
      EXPECT_EQ(a.on_cpu_ns, small[i].on_cpu_ns);
    }
    ++traces;
  }
  EXPECT_GT(traces, 0);
}

// --- slices (enable_slices, flush_slices): the `from accounting` stream ------------------------

// A generated trace for slices, with its ground truth: feeding threads of three processes, each
// starting with a GPU call at a random time and ending at a random time (mid-trace), nested
// runtime + driver calls (same start, outliving the outer one), NCCL calls, preempted spans by
// hog tasks (with and without the hog's pid), sleeping spans with a futex stack, a stack the
// trace does not hold, and none, disk waits, other and unknown-state spans; every span and call
// may cross cell boundaries of `grid`. Processes 1 and 2 have scheduler data from the start (a
// stated span of a thread that never calls the GPU at the trace's first instant); process 3 has
// none (unknown-state spans only). With `late_state`, those stated spans come at a random time
// instead, so the processes' first switch-out state may follow some of their threads' rest time.
// With `prelude`, some threads have off-CPU spans before their first call (time that is not
// sliced: the thread was not known to feed the GPU then).
// The time scale is the grid's: durations up to ~1.5 cells.
struct SliceTrace {
  std::vector<Event> ev;  // sorted by ts
  TraceMeta meta;
  uint64_t grid = 100;
};

constexpr uint64_t kFutexStack = 1, kMissingStack = 99, kNanosleepStack = 2;

SliceTrace slice_trace(std::mt19937_64& rng, uint64_t grid, bool late_state = false, bool prelude = false) {
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  SliceTrace t;
  t.grid = grid;
  ParsedStack futex, sleep;
  futex.frames.push_back(frame(FrameKind::kKernel, "futex_wait_queue"));
  futex.frames.push_back(frame(FrameKind::kKernel, "futex_wait"));
  sleep.frames.push_back(frame(FrameKind::kKernel, "do_nanosleep"));
  t.meta.stacks[kFutexStack] = encode_stack(futex);
  t.meta.stacks[kNanosleepStack] = encode_stack(sleep);
  const uint8_t cuda_ops[] = {op::kCudaLaunchKernel, op::kCudaMemcpy, op::kCudaStreamSync, op::kCudaMalloc};
  const uint8_t drv_ops[] = {op::kCuLaunchKernel, op::kCuMemcpyHtoD, op::kCuStreamSynchronize, op::kCuMemAlloc};
  const uint64_t stacks[] = {0, kFutexStack, kNanosleepStack, kMissingStack};
  const uint64_t span_len = grid * 3 / 2;
  // Stated spans (at the first instant unless late_state), on threads that never call the GPU.
  t.ev.push_back(span(1, 1001, late_state ? uni(0, 20 * grid) : 0, 1, OffCpuState::kSleeping));
  t.ev.push_back(span(2, 1002, late_state ? uni(0, 20 * grid) : 0, 1, OffCpuState::kOther));
  const uint32_t threads = static_cast<uint32_t>(uni(2, 7));
  for (uint32_t tid = 1; tid <= threads; ++tid) {
    const uint32_t pid = tid <= 3 ? 1 : tid <= 5 ? 2 : 3;
    const uint64_t t0 = uni(0, 8 * grid), t1 = t0 + uni(0, 30 * grid);
    if (prelude && t0 > 0 && uni(0, 1))
      for (int k = 0, n = static_cast<int>(uni(1, 4)); k < n; ++k)
        t.ev.push_back(span(pid, tid, uni(t0 > 4 * grid ? t0 - 4 * grid : 0, t0 - 1), uni(0, 2 * grid),
                            pid == 3 ? OffCpuState::kUnknown : static_cast<OffCpuState>(uni(0, 4)),
                            static_cast<uint32_t>(uni(900, 905)), stacks[uni(0, 3)]));
    t.ev.push_back(call(pid, tid, t0, uni(0, span_len)));  // the thread's first call
    for (int k = 0, n = static_cast<int>(uni(0, 40)); k < n; ++k) {
      const uint64_t ts = uni(t0 + 1, t1 + 1), dur = uni(0, span_len);
      uint64_t kind = uni(0, 9);
      if (pid == 3 && kind > 3 && uni(0, 1)) kind = 0;  // process 3: calls and unknown-state spans only
      if (kind < 3) {
        t.ev.push_back(call(pid, tid, ts, dur, Source::kCuda, cuda_ops[uni(0, 3)]));
        if (uni(0, 1)) {  // a nested driver call: at the same start, inside, or outliving it
          const uint64_t in = ts + (uni(0, 2) == 0 ? 0 : uni(0, dur));
          const Event inner = call(pid, tid, in, uni(0, dur + grid / 4), Source::kDriver, drv_ops[uni(0, 3)]);
          // At the same start, the inner call may arrive first (the order of equal starts is free).
          if (in == ts && uni(0, 1)) t.ev.insert(t.ev.end() - 1, inner);
          else t.ev.push_back(inner);
        }
      } else if (kind == 3) {
        t.ev.push_back(call(pid, tid, ts, dur, Source::kNccl, op::kNcclAllReduce));
      } else if (pid == 3) {
        t.ev.push_back(span(pid, tid, ts, dur, OffCpuState::kUnknown));
      } else {
        const OffCpuState st = static_cast<OffCpuState>(uni(0, 4));
        Event e = span(pid, tid, ts, dur, st, static_cast<uint32_t>(uni(900, 905)), stacks[uni(0, 3)]);
        if (st == OffCpuState::kPreempted && uni(0, 2)) e.arg0 = 9000 + e.arg1 % 3;  // the hog's pid, when named
        t.ev.push_back(e);
      }
    }
  }
  std::stable_sort(t.ev.begin(), t.ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return t;
}

SliceOptions slice_options(const TraceMeta& meta, uint64_t grid, uint64_t gap) {
  SliceOptions o;
  o.grid_ns = grid;
  o.gap_ns = gap;
  o.reason_of = [&meta](uint64_t id, BlockReason& r) {
    auto it = meta.stacks.find(id);
    if (it == meta.stacks.end()) return false;
    r = block_reason(parse_stack(it->second));
    return true;
  };
  return o;
}

constexpr uint64_t kNoGap = uint64_t{1} << 50;  // gap_ns larger than any silence in the traces

// The trace observed in batches of `batch` (0: all at once), flushed after each batch at its last
// start (the Batch contract's watermark), then finally. Slices in (node, tid, ts) order;
// `acc_out`, when given, gets the accounting (for accounts()).
std::vector<Event> slices_of(const std::vector<Event>& ev, const SliceOptions& so, size_t batch,
                             std::unique_ptr<TimeAccounting>* acc_out = nullptr) {
  auto acc = std::make_unique<TimeAccounting>();
  acc->enable_slices(so);
  std::vector<Event> out;
  if (!batch) batch = ev.size() ? ev.size() : 1;
  for (size_t i = 0; i < ev.size(); i += batch) {
    const size_t n = std::min(batch, ev.size() - i);
    acc->observe(ev.data() + i, n);
    acc->flush_slices(ev[i + n - 1].ts_ns, false, out);
  }
  acc->flush_slices(UINT64_MAX, true, out);
  std::stable_sort(out.begin(), out.end(), [](const Event& a, const Event& b) {
    return std::tie(a.node, a.tid, a.ts_ns) < std::tie(b.node, b.tid, b.ts_ns);
  });
  if (acc_out) *acc_out = std::move(acc);
  return out;
}

std::string slice_text(const Event& e) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "tid %u pid %u node %u rank %d [%llu, +%llu) %s arg0 %llu arg1 %llu stack %llu src %d fl %d", e.tid,
                e.pid, e.node, e.rank, static_cast<unsigned long long>(e.ts_ns),
                static_cast<unsigned long long>(e.dur_ns), acct::bucket_name(e.op),
                static_cast<unsigned long long>(e.arg0), static_cast<unsigned long long>(e.arg1),
                static_cast<unsigned long long>(e.stack_id), static_cast<int>(e.source), e.flags);
  return buf;
}

std::string trace_text(const std::vector<Event>& ev) {
  std::string s;
  char buf[200];
  for (const auto& e : ev) {
    std::snprintf(buf, sizeof buf,
                  "tid %u pid %u src %d op %d ts %llu dur %llu state %d arg0 %llu arg1 %llu stack %llu\n", e.tid, e.pid,
                  static_cast<int>(e.source), e.op, static_cast<unsigned long long>(e.ts_ns),
                  static_cast<unsigned long long>(e.dur_ns), static_cast<int>(e.prev_state),
                  static_cast<unsigned long long>(e.arg0), static_cast<unsigned long long>(e.arg1),
                  static_cast<unsigned long long>(e.stack_id));
    s += buf;
  }
  return s;
}

// The slices the contract describes, nanosecond by nanosecond: every instant of a feeding
// thread's interval from its first GPU call on gets (bucket, task, stack) by the header's
// precedence; slices are the maximal runs of one (bucket, task, stack) within one grid cell.
// Rest time is on_cpu from the first switch-out state of the thread's process on (any of its
// threads' spans with a recorded state), unknown before it and in processes without one.
std::vector<Event> reference_slices(const std::vector<Event>& ev, const TraceMeta& meta, uint64_t grid) {
  std::map<uint32_t, std::vector<size_t>> per_tid;
  std::map<uint32_t, bool> feeds;
  std::map<uint32_t, uint64_t> stated_at;  // pid -> its first span with a state
  for (size_t i = 0; i < ev.size(); ++i) {
    const Event& e = ev[i];
    per_tid[e.tid].push_back(i);
    if (is_gpu_api(e.source)) feeds[e.tid] = true;
    else if (e.prev_state != OffCpuState::kUnknown && !stated_at.count(e.pid)) stated_at[e.pid] = e.ts_ns;
  }
  std::vector<Event> out;
  for (const auto& [tid, idx] : per_tid) {
    if (!feeds[tid]) continue;
    const Event& first = ev[idx[0]];
    uint64_t end = 0, first_call = UINT64_MAX;
    for (size_t i : idx) {
      end = std::max(end, ev[i].end_ns());
      if (is_gpu_api(ev[i].source)) first_call = std::min(first_call, ev[i].ts_ns);
    }
    Event cur;
    bool open = false;
    for (uint64_t t = first_call; t < end; ++t) {
      const Event *pre = nullptr, *cl = nullptr, *bl = nullptr, *un = nullptr;
      for (size_t i : idx) {
        const Event& e = ev[i];
        if (!(e.ts_ns <= t && t < e.end_ns())) continue;
        if (is_gpu_api(e.source)) {
          if (!cl || e.ts_ns < cl->ts_ns || (e.ts_ns == cl->ts_ns && e.dur_ns > cl->dur_ns)) cl = &e;
        } else if (e.prev_state == OffCpuState::kPreempted) {
          if (!pre) pre = &e;
        } else if (e.prev_state == OffCpuState::kUnknown) {
          if (!un) un = &e;
        } else if (!bl) {
          bl = &e;
        }
      }
      uint8_t bucket = 0;
      uint64_t a0 = 0, a1 = 0, stack = 0;
      if (pre) {
        bucket = acct::kPreempted;
        a0 = pre->arg0;
        a1 = pre->arg1;
      } else if (cl) {
        bucket = acct::call_bucket(call_kind(cl->source, cl->op));
      } else if (bl) {
        BlockReason r = BlockReason::kOther;
        if (bl->prev_state == OffCpuState::kDiskWait) {
          r = BlockReason::kIo;
        } else if (bl->stack_id) {
          stack = bl->stack_id;
          if (auto it = meta.stacks.find(bl->stack_id); it != meta.stacks.end())
            r = block_reason(parse_stack(it->second));
        }
        bucket = acct::blocked_bucket(r);
      } else if (un) {
        bucket = acct::kUnknown;
      } else {
        auto st = stated_at.find(first.pid);
        bucket = st != stated_at.end() && t >= st->second ? acct::kOnCpu : acct::kUnknown;
      }
      if (open && cur.op == bucket && cur.arg0 == a0 && cur.arg1 == a1 && cur.stack_id == stack && cur.end_ns() == t &&
          cur.ts_ns / grid == t / grid) {
        ++cur.dur_ns;
        continue;
      }
      if (open) out.push_back(cur);
      cur = Event{};
      cur.ts_ns = t;
      cur.dur_ns = 1;
      cur.pid = first.pid;
      cur.tid = tid;
      cur.rank = -1;
      cur.source = Source::kAccount;
      cur.op = bucket;
      cur.arg0 = a0;
      cur.arg1 = a1;
      cur.stack_id = stack;
      cur.flags = event_flags::kSynthetic;
      open = true;
    }
    if (open) out.push_back(cur);
  }
  return out;
}

bool same_slice(const Event& a, const Event& b) {
  return a.ts_ns == b.ts_ns && a.dur_ns == b.dur_ns && a.pid == b.pid && a.tid == b.tid && a.node == b.node &&
         a.rank == b.rank && a.source == b.source && a.op == b.op && a.arg0 == b.arg0 && a.arg1 == b.arg1 &&
         a.stack_id == b.stack_id && a.flags == b.flags && a.prev_state == b.prev_state;
}

// Equal slices, in order; the first difference when not.
::testing::AssertionResult same_slices(const std::vector<Event>& got, const std::vector<Event>& want) {
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    if (!same_slice(got[i], want[i]))
      return ::testing::AssertionFailure() << "slice " << i << " of " << got.size() << "/" << want.size() << ":\n got  "
                                           << slice_text(got[i]) << "\n want " << slice_text(want[i]);
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " slices, want " << want.size() << "; next: "
                                         << slice_text(got.size() > want.size() ? got[want.size()] : want[got.size()]);
  return ::testing::AssertionSuccess();
}

// Per (tid, bucket) ns of slices, and per (tid, preempting tid).
struct SliceSums {
  std::map<std::pair<uint32_t, uint8_t>, uint64_t> by_bucket;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> by_task;
  std::map<uint32_t, uint64_t> total;
};

SliceSums sums_of(const std::vector<Event>& slices) {
  SliceSums s;
  for (const Event& e : slices) {
    s.by_bucket[{e.tid, e.op}] += e.dur_ns;
    s.total[e.tid] += e.dur_ns;
    if (e.op == acct::kPreempted) s.by_task[{e.tid, static_cast<uint32_t>(e.arg1)}] += e.dur_ns;
  }
  return s;
}

// A ThreadAccounting's ns in slice bucket b.
uint64_t bucket_ns(const ThreadAccounting& a, uint8_t b) {
  if (b == acct::kPreempted) return a.preempted_ns;
  if (b >= acct::kLaunch && b <= acct::kOtherCall) return a.in_calls_ns.at(kCallKinds[b - acct::kLaunch]);
  if (b == acct::kOnCpu) return a.on_cpu_ns;
  if (b >= acct::kLock && b <= acct::kBlockedOther) return a.blocked_ns.at(kBlockReasons[b - acct::kLock]);
  return a.unknown_ns;
}

TEST(TimeAccountingSlices, RandomTracesMatchTheNanosecondReferenceAndTheTotals) {
  std::mt19937_64 rng(4040);
  size_t preempted_named = 0, blocked_by_stack = 0, cells_crossed = 0;
  for (int round = 0; round < 300; ++round) {
    const uint64_t grid = round % 3 == 0 ? 64 : round % 3 == 1 ? 100 : 37;
    const bool late_state = round % 4 == 3, prelude = round % 5 == 4;
    const SliceTrace t = slice_trace(rng, grid, late_state, prelude);
    std::map<uint32_t, uint64_t> first_event, prelude_ns;  // prelude: from its first event to its first call
    for (const Event& e : t.ev) {
      first_event.try_emplace(e.tid, e.ts_ns);
      if (is_gpu_api(e.source)) prelude_ns.try_emplace(e.tid, e.ts_ns - first_event[e.tid]);
    }
    const SliceOptions so = slice_options(t.meta, grid, kNoGap);
    std::unique_ptr<TimeAccounting> acc;
    const std::vector<Event> got = slices_of(t.ev, so, 0, &acc);
    const std::string what = "round " + std::to_string(round) + ", grid " + std::to_string(grid);
    SCOPED_TRACE(what);
    // The nanosecond reference, exactly: same slices, same count.
    const std::vector<Event> want = reference_slices(t.ev, t.meta, grid);
    EXPECT_TRUE(same_slices(got, want));
    // Per-thread per-bucket sums are accounts()'s totals, in integer ns, and every preempting task's.
    AccountingOptions ao;
    ao.top_preemptors = 100;
    TimeAccounting plain(ao);
    plain.observe(t.ev.data(), t.ev.size());
    const auto accounts = plain.accounts(t.meta);
    const SliceSums sums = sums_of(got);
    size_t feeding = 0;
    for (const auto& a : accounts) {
      feeding += a.wall_ns > prelude_ns.at(a.tid);
      auto sum_of = [&](uint8_t b) {
        auto it = sums.by_bucket.find({a.tid, b});
        return it == sums.by_bucket.end() ? uint64_t{0} : it->second;
      };
      EXPECT_EQ(sums.total.count(a.tid) ? sums.total.at(a.tid) : 0, a.wall_ns - prelude_ns.at(a.tid))
          << "tid " << a.tid;
      if (prelude_ns.at(a.tid)) continue;  // the buckets of its sliced part: the reference above
      for (uint8_t b = 0; b < acct::kBuckets; ++b) {
        // accounts() calls a process's rest time on CPU if it has a switch-out state anywhere in
        // the interval; slices only from that state on: with late states, the two together.
        if (late_state && (b == acct::kOnCpu || b == acct::kUnknown)) continue;
        EXPECT_EQ(sum_of(b), bucket_ns(a, b)) << "tid " << a.tid << " bucket " << acct::bucket_name(b);
      }
      EXPECT_EQ(sum_of(acct::kOnCpu) + sum_of(acct::kUnknown), a.on_cpu_ns + a.unknown_ns) << "tid " << a.tid;
      for (const auto& p : a.preempted_by) EXPECT_EQ((sums.by_task.at({a.tid, p.tid})), p.ns) << "tid " << a.tid;
    }
    EXPECT_EQ(sums.total.size(), feeding);  // no slice of a thread that never fed the GPU
    // The slices' own accounts() is the same (slice mode changes nothing of the totals).
    const auto again = acc->accounts(t.meta);
    ASSERT_EQ(again.size(), accounts.size());
    for (size_t i = 0; i < again.size(); ++i) expect_equal(again[i], accounts[i], what);
    // No slice crosses a grid multiple; one thread's slices never overlap (they tile its interval).
    for (size_t i = 0; i < got.size(); ++i) {
      const Event& e = got[i];
      ASSERT_GT(e.dur_ns, 0u) << slice_text(e);
      EXPECT_EQ(e.ts_ns / grid, (e.end_ns() - 1) / grid) << slice_text(e);
      if (i && got[i - 1].tid == e.tid) {
        EXPECT_EQ(got[i - 1].end_ns(), e.ts_ns) << slice_text(got[i - 1]) << " / " << slice_text(e);
        cells_crossed += got[i - 1].ts_ns / grid != e.ts_ns / grid;
      }
      if (e.op == acct::kPreempted) {
        // arg1 is the tid that ran, arg0 its pid as the span itself named it (0 when it did not).
        EXPECT_GE(e.arg1, 900u) << slice_text(e);
        EXPECT_LE(e.arg1, 905u) << slice_text(e);
        EXPECT_TRUE(e.arg0 == 0 || e.arg0 == 9000 + e.arg1 % 3) << slice_text(e);
        preempted_named += e.arg0 != 0;
      }
      blocked_by_stack += e.op == acct::kLock || e.op == acct::kSleep;
    }
    if (HasFailure()) {
      std::printf("%s", trace_text(t.ev).c_str());
      return;
    }
  }
  // The generator reached what the test is about.
  EXPECT_GT(preempted_named, 100u);
  EXPECT_GT(blocked_by_stack, 100u);
  EXPECT_GT(cells_crossed, 1000u);
}

TEST(TimeAccountingSlices, IdenticalWhateverTheBatchesAndUnderGridShifts) {
  std::mt19937_64 rng(17);
  for (int round = 0; round < 200; ++round) {
    const uint64_t grid = round % 2 ? 100 : 64;
    SliceTrace t = slice_trace(rng, grid, round % 4 >= 2, round % 3 == 2);
    const SliceOptions so = slice_options(t.meta, grid, kNoGap);
    const std::vector<Event> base = slices_of(t.ev, so, 0);
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_FALSE(base.empty());
    for (size_t batch : {size_t{1}, size_t{7}, size_t{777}}) {
      EXPECT_TRUE(same_slices(slices_of(t.ev, so, batch), base)) << "batch " << batch;
    }
    // Shifting every timestamp by a multiple of the grid shifts the slices, nothing else.
    const uint64_t shift = (1'700'000'000'000'000'000ull / grid + static_cast<uint64_t>(round) * 977) * grid;
    std::vector<Event> shifted_ev = t.ev;
    for (auto& e : shifted_ev) e.ts_ns += shift;
    std::vector<Event> want = base;
    for (auto& e : want) e.ts_ns += shift;
    for (size_t batch : {size_t{0}, size_t{7}}) {
      EXPECT_TRUE(same_slices(slices_of(shifted_ev, so, batch), want)) << "shifted, batch " << batch;
    }
    if (HasFailure()) {
      std::printf("%s", trace_text(t.ev).c_str());
      return;
    }
  }
}

// flush_cells (SliceOptions::totals, the engine's `from accounting` stream): per (cell, thread) the
// totals of every flush add up to the slices' sums, bucket by bucket and preempting task by task,
// whatever the batches; and a cell the watermark passed by more than gap_ns has all of its time.
using CellKey = std::tuple<uint64_t, uint32_t, uint8_t, uint64_t>;  // cell, tid, bucket, task (preempted)
std::map<CellKey, uint64_t> cell_sums_of_slices(const std::vector<Event>& slices, uint64_t grid) {
  std::map<CellKey, uint64_t> m;
  for (const Event& e : slices) {
    m[{e.ts_ns / grid, e.tid, e.op, 0}] += e.dur_ns;
    if (e.op == acct::kPreempted) m[{e.ts_ns / grid, e.tid, e.op, e.arg0 << 32 | e.arg1}] += e.dur_ns;
  }
  return m;
}

std::map<CellKey, uint64_t> cell_sums(const std::vector<Event>& ev, SliceOptions so, size_t batch,
                                      bool& complete_when_due) {
  so.totals = true;
  TimeAccounting acc;
  acc.enable_slices(so);
  std::map<CellKey, uint64_t> m;
  std::map<std::pair<uint64_t, uint32_t>, uint64_t> due;  // (cell, tid) -> its total when first due
  std::vector<CellTotals> out;
  auto fold = [&](uint64_t watermark) {
    for (const CellTotals& c : out) {
      for (uint8_t b = 0; b < acct::kBuckets; ++b)
        if (c.b[b]) m[{c.cell, c.tid, b, 0}] += c.b[b];
      for (const auto& [task, ns] : c.by) m[{c.cell, c.tid, acct::kPreempted, task}] += ns;
    }
    out.clear();
    for (const auto& [k, ns] : m) {
      const uint64_t cell = std::get<0>(k);
      if (std::get<3>(k) || watermark <= (cell + 1) * so.grid_ns + so.gap_ns) continue;
      uint64_t total = 0;
      for (uint8_t b = 0; b < acct::kBuckets; ++b) {
        auto it = m.find({cell, std::get<1>(k), b, 0});
        if (it != m.end()) total += it->second;
      }
      due.try_emplace({cell, std::get<1>(k)}, total);
    }
  };
  if (!batch) batch = ev.size() ? ev.size() : 1;
  for (size_t i = 0; i < ev.size(); i += batch) {
    const size_t n = std::min(batch, ev.size() - i);
    acc.observe(ev.data() + i, n);
    acc.flush_cells(ev[i + n - 1].ts_ns, false, out);
    fold(ev[i + n - 1].ts_ns);
  }
  acc.flush_cells(UINT64_MAX, true, out);
  fold(0);
  complete_when_due = true;
  for (const auto& [k, total] : due) {
    uint64_t final_total = 0;
    for (uint8_t b = 0; b < acct::kBuckets; ++b) {
      auto it = m.find({k.first, k.second, b, 0});
      if (it != m.end()) final_total += it->second;
    }
    complete_when_due = complete_when_due && final_total == total;
  }
  return m;
}

TEST(TimeAccountingCells, TotalsAreTheSlicesSumsWhateverTheBatches) {
  std::mt19937_64 rng(4141);
  for (int round = 0; round < 150; ++round) {
    const uint64_t grid = round % 2 ? 100 : 64;
    SliceTrace t = slice_trace(rng, grid, round % 4 >= 2, round % 3 == 2);
    // Without silences, and with a gap short enough that silences are skipped.
    const SliceOptions so = slice_options(t.meta, grid, round % 5 == 4 ? 2 * grid : kNoGap);
    const auto want = cell_sums_of_slices(slices_of(t.ev, so, 0), grid);
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_FALSE(want.empty());
    for (size_t batch : {size_t{0}, size_t{1}, size_t{7}, size_t{777}}) {
      bool complete = false;
      EXPECT_EQ(cell_sums(t.ev, so, batch, complete), want) << "batch " << batch;
      EXPECT_TRUE(complete) << "batch " << batch << ": a cell got time after the watermark passed it by gap_ns";
    }
    if (HasFailure()) return;
  }
}

// Silences longer than gap_ns (nothing of the thread seen: no call, no span) are not sliced, and
// which slices come out still does not depend on where batches were cut.
TEST(TimeAccountingSlices, SilencesLongerThanTheGapAreNotSliced) {
  std::mt19937_64 rng(99);
  const uint64_t grid = 100, gap = 250;
  size_t silences = 0;
  for (int round = 0; round < 200; ++round) {
    SliceTrace t = slice_trace(rng, grid, round % 2 == 1);
    // Open silences: every event of a thread from a random instant on moves later by up to 8 gaps.
    std::map<uint32_t, std::pair<uint64_t, uint64_t>> cut;  // tid -> (from, by)
    for (auto& e : t.ev) {
      if (e.tid > 100) continue;
      auto [it, fresh] = cut.try_emplace(e.tid, std::uniform_int_distribution<uint64_t>(0, 30 * grid)(rng),
                                         std::uniform_int_distribution<uint64_t>(0, 8 * gap)(rng));
      if (e.ts_ns >= it->second.first) e.ts_ns += it->second.second;
    }
    std::stable_sort(t.ev.begin(), t.ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
    // Ground truth: per thread, the stretches of more than `gap` that no event of it covers.
    std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> silent;
    std::map<uint32_t, uint64_t> reach, silent_ns;
    for (const auto& e : t.ev) {
      if (auto it = reach.find(e.tid); it != reach.end() && e.ts_ns > it->second + gap) {
        silent[e.tid].emplace_back(it->second, e.ts_ns);
        silent_ns[e.tid] += e.ts_ns - it->second;
      }
      reach[e.tid] = std::max(reach[e.tid], e.end_ns());
    }
    const SliceOptions so = slice_options(t.meta, grid, gap);
    std::unique_ptr<TimeAccounting> acc;
    const std::vector<Event> base = slices_of(t.ev, so, 0, &acc);
    SCOPED_TRACE("round " + std::to_string(round));
    for (size_t batch : {size_t{1}, size_t{7}, size_t{777}})
      EXPECT_TRUE(same_slices(slices_of(t.ev, so, batch), base)) << "batch " << batch;
    for (const Event& e : base)
      for (const auto& [s, end] : silent[e.tid]) EXPECT_TRUE(e.end_ns() <= s || e.ts_ns >= end) << slice_text(e);
    // What is sliced is the thread's wall time less its silences (rest time only: nothing covers them).
    const SliceSums sums = sums_of(base);
    for (const auto& a : acc->accounts(t.meta)) {
      silences += silent[a.tid].size();
      const uint64_t total = sums.total.count(a.tid) ? sums.total.at(a.tid) : 0;
      EXPECT_EQ(total + silent_ns[a.tid], a.wall_ns) << "tid " << a.tid;
      for (uint8_t b = 0; b < acct::kBuckets; ++b) {
        if (b == acct::kOnCpu || b == acct::kUnknown) continue;
        auto it = sums.by_bucket.find({a.tid, b});
        EXPECT_EQ(it == sums.by_bucket.end() ? 0 : it->second, bucket_ns(a, b))
            << "tid " << a.tid << " bucket " << acct::bucket_name(b);
      }
    }
    if (HasFailure()) {
      std::printf("%s", trace_text(t.ev).c_str());
      return;
    }
  }
  EXPECT_GT(silences, 100u);
}

// Found by the tests above: rest time was on_cpu or unknown depending on whether the process's
// first switch-out state had been observed when the time was settled, i.e. on where batches were
// cut; now it is unknown before the first stated span's start and on_cpu from it on.
TEST(TimeAccountingSlices, RestTimeBeforeTheProcessFirstStateIsUnknownWhateverTheBatches) {
  // Thread 1 calls at 0, 100, 200; thread 2 of the same process sleeps at 150 (the process's
  // first switch-out state). One cell (grid 1000).
  const std::vector<Event> ev = {call(1, 1, 0, 10), call(1, 1, 100, 10), span(1, 2, 150, 5, OffCpuState::kSleeping),
                                 call(1, 1, 200, 10)};
  TraceMeta meta;
  const SliceOptions so = slice_options(meta, 1000, kNoGap);
  const std::vector<Event> base = slices_of(ev, so, 0);
  std::vector<std::tuple<uint64_t, uint64_t, uint8_t>> got;
  for (const Event& e : base) got.emplace_back(e.ts_ns, e.dur_ns, e.op);
  const std::vector<std::tuple<uint64_t, uint64_t, uint8_t>> want = {
      {0, 10, acct::kLaunch},    {10, 90, acct::kUnknown}, {100, 10, acct::kLaunch},
      {110, 40, acct::kUnknown}, {150, 50, acct::kOnCpu},  {200, 10, acct::kLaunch}};
  EXPECT_EQ(got, want);
  for (size_t batch : {size_t{1}, size_t{2}, size_t{3}}) EXPECT_TRUE(same_slices(slices_of(ev, so, batch), base));
}

// Found by the tests above: a thread's time before its first GPU call was sliced when it was
// still pending at that call (the contract says it is not).
TEST(TimeAccountingSlices, TimeBeforeTheFirstCallIsNotSliced) {
  const std::vector<Event> ev = {span(1, 1, 0, 50, OffCpuState::kSleeping),
                                 span(1, 1, 60, 20, OffCpuState::kPreempted, 9), call(1, 1, 100, 10),
                                 call(1, 1, 150, 10)};
  TraceMeta meta;
  const SliceOptions so = slice_options(meta, 1000, kNoGap);
  std::unique_ptr<TimeAccounting> acc;
  for (size_t batch : {size_t{0}, size_t{1}, size_t{3}}) {
    const std::vector<Event> sl = slices_of(ev, so, batch, &acc);
    ASSERT_FALSE(sl.empty());
    EXPECT_EQ(sl.front().ts_ns, 100u) << "batch " << batch;
    uint64_t total = 0;
    for (const Event& e : sl) total += e.dur_ns;
    EXPECT_EQ(total, 60u) << "batch " << batch;
    // accounts() still counts the thread from its first event.
    const auto a = acc->accounts(meta);
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].wall_ns, 160u);
    EXPECT_EQ(a[0].preempted_ns, 20u);
  }
}

// --- chain accounting: per-second bins and range() ---------------------------------------------

constexpr uint64_t kSec = 1'000'000'000, kMs = 1'000'000;

// A few seconds of feeding threads at realistic scale, with its ground truth. Each thread's first
// and last events are calls, with calls at most 40 ms apart between (so any window that overlaps
// its life has one of its calls); spans of every state (preempted by six hog tids, with their pid
// or not; sleeping on a futex, an unknown stack or none; disk; unknown) lie within its life and
// cross second boundaries. Process 1 has a switch-out state from the start, process 2 from a
// random time, process 3 never.
struct SecondsTrace {
  std::vector<Event> ev;
  TraceMeta meta;
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> life;  // tid -> [first start, last end)
  std::map<uint32_t, uint32_t> hog_pid;                    // hog tid -> its pid when some span named it
  uint64_t base = 0;
};

SecondsTrace seconds_trace(std::mt19937_64& rng) {
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  SecondsTrace t;
  t.base = 1'700'000'000 * kSec;
  const uint64_t b = t.base;
  ParsedStack futex;
  futex.frames.push_back(frame(FrameKind::kKernel, "futex_wait"));
  t.meta.stacks[kFutexStack] = encode_stack(futex);
  t.ev.push_back(span(1, 1001, b, 1, OffCpuState::kSleeping));
  t.ev.push_back(span(2, 1002, b + uni(0, 3 * kSec), 1, OffCpuState::kSleeping));
  const uint64_t stacks[] = {0, kFutexStack, kMissingStack};
  for (uint32_t tid = 1; tid <= 5; ++tid) {
    const uint32_t pid = tid <= 2 ? 1 : tid <= 4 ? 2 : 3;
    const uint64_t t0 = b + uni(0, 2 * kSec), until = t0 + uni(0, 5 * kSec);
    uint64_t ts = t0, t1 = t0;
    std::vector<Event> calls;
    while (true) {
      const Event c = call(pid, tid, ts, uni(0, 15 * kMs), Source::kCuda,
                           uni(0, 1) ? op::kCudaLaunchKernel : op::kCudaStreamSync);
      calls.push_back(c);
      if (uni(0, 3) == 0) calls.push_back(call(pid, tid, ts, c.dur_ns / 2, Source::kDriver, op::kCuMemcpyHtoD));
      t1 = std::max(t1, c.end_ns());
      ts += uni(1, 40 * kMs);
      if (ts > until) break;
    }
    for (int k = 0, n = static_cast<int>(uni(0, (t1 - t0) / (20 * kMs))); k < n; ++k) {
      const uint64_t s = uni(t0 + 1, t1), d = std::min(uni(0, 30 * kMs), t1 - s);
      OffCpuState st = pid == 3 ? OffCpuState::kUnknown : static_cast<OffCpuState>(uni(0, 4));
      Event e = span(pid, tid, s, d, st, static_cast<uint32_t>(uni(900, 905)), stacks[uni(0, 2)]);
      if (st == OffCpuState::kPreempted && uni(0, 3) == 0) {
        e.arg0 = 9000 + e.arg1 % 3;
        t.hog_pid[static_cast<uint32_t>(e.arg1)] = static_cast<uint32_t>(e.arg0);
      }
      t.ev.push_back(e);
    }
    t.ev.insert(t.ev.end(), calls.begin(), calls.end());
    t.life[tid] = {t0, t1};
  }
  std::stable_sort(t.ev.begin(), t.ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return t;
}

std::unique_ptr<TimeAccounting> chain_accounting(const SecondsTrace& t, size_t batch, AnalysisResult& result) {
  AccountingOptions o;
  o.chain_accounting = true;
  o.meta = &t.meta;
  o.top_preemptors = 100;
  auto acc = std::make_unique<TimeAccounting>(o);
  for (size_t i = 0; i < t.ev.size(); i += batch) acc->observe(t.ev.data() + i, std::min(batch, t.ev.size() - i));
  acc->finish(t.meta, result);
  return acc;
}

// range() over windows aligned to seconds against accounts() with from/to on the same window.
// Exact, in integer ns: preempted, each call kind, each blocked reason and every preempting task's
// time (fewer than the 8 tasks a bin keeps); their sum of on_cpu and unknown differs by exactly
// the edge time in the window that no event of the thread covers (accounts() starts a thread at
// its first event in the window and ends it at its last; range() counts the thread's time in the
// whole seconds, from the start of its life), so range()'s wall is the overlap of the window and
// the thread's life. Not compared alone: on_cpu against unknown (accounts() calls rest time on CPU
// when the process has a switch-out state in the window, bins from the process's first one on).
TEST(TimeAccountingBins, RangeOverWholeSecondsIsAccountsOverTheWindow) {
  std::mt19937_64 rng(2040);
  size_t compared = 0, edges = 0, named = 0;
  for (int round = 0; round < 30; ++round) {
    const SecondsTrace t = seconds_trace(rng);
    AnalysisResult res;
    const auto acc = chain_accounting(t, round % 2 ? 500 : 4096, res);
    EXPECT_EQ(acc->bins_dropped(), 0u);
    for (uint64_t k = 0; k < 8; ++k)
      for (uint64_t w = 1; w <= 3; ++w) {
        const uint64_t from = t.base + k * kSec, to = from + w * kSec;
        AccountingOptions wo;
        wo.from_ns = from;
        wo.to_ns = to;
        wo.top_preemptors = 100;
        TimeAccounting ref(wo);
        ref.observe(t.ev.data(), t.ev.size());
        const auto want_all = ref.accounts(t.meta);
        for (const auto& [tid, life] : t.life) {
          SCOPED_TRACE("round " + std::to_string(round) + " tid " + std::to_string(tid) + " window +" +
                       std::to_string(k) + "s, " + std::to_string(w) + "s");
          const uint64_t lo = std::max(from, life.first), hi = std::min(to, life.second);
          const auto got = acc->range(t.meta, 0, tid, from, to);
          const ThreadAccounting* want = find(want_all, tid);
          if (hi <= lo) {  // the window misses the thread's life
            EXPECT_FALSE(got.has_value());
            EXPECT_TRUE(!want || want->wall_ns == 0);
            continue;
          }
          ASSERT_TRUE(got.has_value());
          ASSERT_TRUE(want) << "a window that overlaps the life has one of its calls";
          ++compared;
          EXPECT_EQ(got->wall_ns, hi - lo);
          EXPECT_EQ(got->start_ns, lo / kSec * kSec == lo ? lo : std::max(from, lo / kSec * kSec));
          EXPECT_EQ(sum(*got), got->wall_ns);
          EXPECT_EQ(got->preempted_ns, want->preempted_ns);
          EXPECT_EQ(got->in_calls_ns, want->in_calls_ns);
          EXPECT_EQ(got->blocked_ns, want->blocked_ns);
          EXPECT_EQ(got->on_cpu_ns + got->unknown_ns - (want->on_cpu_ns + want->unknown_ns),
                    got->wall_ns - want->wall_ns);
          edges += got->wall_ns != want->wall_ns;
          ASSERT_EQ(got->preempted_by.size(), want->preempted_by.size());
          for (size_t i = 0; i < got->preempted_by.size(); ++i) {
            const auto &g = got->preempted_by[i], &x = want->preempted_by[i];
            EXPECT_EQ(g.tid, x.tid);  // in the same order: the top task first (ns desc, then tid)
            EXPECT_EQ(g.ns, x.ns);
            // Its pid, from any span of the trace that named it (range() sees the whole trace).
            auto hp = t.hog_pid.find(g.tid);
            EXPECT_EQ(g.pid, hp == t.hog_pid.end() ? 0u : hp->second);
            named += g.pid != 0;
          }
          if (!got->preempted_by.empty()) {
            // The top task is the one with the most preempted time (ties: the smaller tid).
            const auto& top = got->preempted_by.front();
            for (const auto& p : got->preempted_by) EXPECT_TRUE(p.ns < top.ns || (p.ns == top.ns && p.tid >= top.tid));
          }
        }
        if (HasFailure()) return;
      }
  }
  EXPECT_GT(compared, 200u);
  EXPECT_GT(edges, 50u);  // windows whose edges fall between calls: the exactness above is not vacuous
  EXPECT_GT(named, 50u);
}

// finish() gives each chain the accounting of its thread over its window (edges rounded out to
// whole seconds), and a process-wide chain (no tid) that of its thread with the most time there;
// the same whatever the batches.
TEST(TimeAccountingBins, FinishGivesChainsTheirThreadsAccounting) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 20; ++round) {
    const SecondsTrace t = seconds_trace(rng);
    std::vector<Chain> chains;
    for (uint32_t tid = 1; tid <= 5; ++tid) {
      Chain c;
      c.id = "c" + std::to_string(tid);
      c.pid = tid <= 2 ? 1 : tid <= 4 ? 2 : 3;
      c.tid = tid;
      c.window_start = t.base + 1 * kSec + 250 * kMs;  // rounded out to [+1 s, +4 s)
      c.window_end = t.base + 3 * kSec + 500 * kMs;
      chains.push_back(c);
    }
    for (uint32_t pid = 1; pid <= 3; ++pid) {
      Chain c;
      c.id = "p" + std::to_string(pid);
      c.pid = pid;
      c.window_start = t.base + 2 * kSec;
      c.window_end = t.base + 4 * kSec;
      chains.push_back(c);
    }
    std::string first;
    for (size_t batch : {size_t{4096}, size_t{1}, size_t{333}}) {
      AnalysisResult res;
      res.chains = chains;
      const auto acc = chain_accounting(t, batch, res);
      std::string text;
      for (const Chain& c : res.chains) {
        SCOPED_TRACE(c.id + " round " + std::to_string(round));
        uint32_t tid = c.tid;
        if (!tid) {  // the thread of the process with the most time in the window, ties to the smaller tid
          uint64_t best = 0;
          for (const auto& [th, life] : t.life) {
            if ((th <= 2 ? 1u : th <= 4 ? 2u : 3u) != c.pid) continue;
            const uint64_t lo = std::max(c.window_start, life.first), hi = std::min(c.window_end, life.second);
            if (hi > lo && hi - lo > best) {
              best = hi - lo;
              tid = th;
            }
          }
        }
        const auto want = tid ? acc->range(t.meta, 0, tid, c.window_start / kSec * kSec,
                                           (c.window_end + kSec - 1) / kSec * kSec)
                              : std::nullopt;
        ASSERT_EQ(c.accounting.has_value(), want.has_value());
        if (!want) continue;
        EXPECT_EQ(c.accounting->tid, tid);
        EXPECT_EQ(c.accounting->wall_ns, want->wall_ns);
        EXPECT_EQ(c.accounting->preempted_ns, want->preempted_ns);
        EXPECT_EQ(c.accounting->in_calls_ns, want->in_calls_ns);
        EXPECT_EQ(c.accounting->blocked_ns, want->blocked_ns);
        text += c.id + ":" + std::to_string(c.accounting->tid) + "/" + std::to_string(c.accounting->wall_ns) + " ";
      }
      if (first.empty()) first = text;
      EXPECT_EQ(text, first) << "batch " << batch;
      if (HasFailure()) return;
    }
  }
}

// series(): the per-second bins behind Chain::accounting as a series (the HTML report's and the
// Perfetto export's charts): each second is what range() gives for it, the seconds add up to the
// range over all of them, and a thread without bins (or a run without chain_accounting) has none.
TEST(TimeAccounting, SeriesIsThePerSecondBins) {
  constexpr uint64_t kS = 1'000'000'000, kMs = 1'000'000;
  const uint64_t t0 = 1'000 * kS + 300 * kMs;
  std::vector<Event> ev;
  for (uint64_t t = t0; t < t0 + 3 * kS; t += 100 * kMs) ev.push_back(call(1, 2, t, 10 * kMs));
  ev.push_back(span(1, 2, t0 + 1'050 * kMs, 40 * kMs, OffCpuState::kPreempted, 9));
  ev.push_back(span(1, 2, t0 + 2'020 * kMs, 70 * kMs, OffCpuState::kSleeping));
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  AccountingOptions o;
  o.chain_accounting = true;
  TimeAccounting acc(o);
  acc.observe(ev.data(), ev.size());
  TraceMeta meta;
  AnalysisResult r;
  acc.finish(meta, r);
  const auto s = acc.series(0, 2);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->pid, 1u);
  EXPECT_EQ(s->tid, 2u);
  EXPECT_EQ(s->first_sec, 1'000u);
  ASSERT_EQ(s->bins.size(), 4u);  // +0.3 s .. +3.3 s: seconds 1000..1003
  std::array<uint64_t, acct::kBuckets> total{};
  for (size_t i = 0; i < s->bins.size(); ++i) {
    const auto& b = s->bins[i];
    uint64_t second = 0;
    for (size_t k = 0; k < acct::kBuckets; ++k) {
      second += b[k];
      total[k] += b[k];
    }
    EXPECT_LE(second, kS) << i;
    const auto one = acc.range(meta, 0, 2, (1'000 + i) * kS, (1'001 + i) * kS);
    ASSERT_TRUE(one.has_value()) << i;
    EXPECT_EQ(one->in_calls_ns.at("launch"), b[acct::kLaunch]) << i;
    EXPECT_EQ(one->preempted_ns, b[acct::kPreempted]) << i;
    EXPECT_EQ(one->on_cpu_ns, b[acct::kOnCpu]) << i;
    EXPECT_EQ(one->blocked_ns.at("other"), b[acct::kBlockedOther]) << i;
    EXPECT_EQ(one->wall_ns, second) << i;
  }
  EXPECT_EQ(s->bins[1][acct::kPreempted], 40 * kMs);
  EXPECT_EQ(s->bins[2][acct::kBlockedOther], 70 * kMs);
  const auto all = acc.range(meta, 0, 2, 1'000 * kS, 1'004 * kS);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->preempted_ns, total[acct::kPreempted]);
  EXPECT_EQ(all->on_cpu_ns, total[acct::kOnCpu]);
  EXPECT_EQ(all->in_calls_total(), total[acct::kLaunch]);
  EXPECT_FALSE(acc.series(0, 3).has_value());
  TimeAccounting plain;  // no chain_accounting: no bins
  plain.observe(ev.data(), ev.size());
  EXPECT_FALSE(plain.series(0, 2).has_value());
}

// --- a service's churn (AccountingOptions::evict, bin_horizon_ns) ---------------------------------

// 400 short processes of two feeding threads each over 10 minutes (most end with a process_exit
// of their leader, every 10th without: those go by idle_ns), with preemptions and unknown spans,
// and one process calling through all of it.
std::vector<Event> churn_trace(std::mt19937_64& rng) {
  std::vector<Event> ev;
  constexpr uint64_t kMs = 1'000'000, kSec = 1'000 * kMs;
  for (uint64_t ts = 0; ts < 600 * kSec; ts += 100 * kMs) ev.push_back(call(7, 7, ts, 30 * kMs));
  for (uint32_t p = 0; p < 400; ++p) {
    const uint32_t pid = 1000 + p * 10;
    const uint64_t start = rng() % (580 * kSec), life = kSec / 2 + rng() % (19 * kSec);
    uint64_t last = start;
    for (uint32_t tid : {pid, pid + 1}) {
      for (uint64_t ts = start + rng() % (10 * kMs); ts < start + life; ts += 5 * kMs + rng() % (40 * kMs)) {
        ev.push_back(call(pid, tid, ts, 1 * kMs + rng() % (3 * kMs), Source::kCuda,
                          rng() % 3 ? op::kCudaLaunchKernel : op::kCudaStreamSync));
        if (rng() % 4 == 0)
          ev.push_back(span(pid, tid, ts + 4 * kMs, 1 * kMs,
                            rng() % 2 ? OffCpuState::kPreempted : OffCpuState::kUnknown,
                            static_cast<uint32_t>(50 + rng() % 5)));
        last = std::max(last, ts + 6 * kMs);
      }
    }
    if (p % 10 == 0) continue;  // no exit seen
    Event x;
    x.ts_ns = last;
    x.pid = x.tid = pid;
    x.source = Source::kHost;
    x.op = op::kProcessExit;
    ev.push_back(x);
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return ev;
}

TEST(TimeAccounting, EvictionUnderChurnKeepsTheTopAccountsAndBoundsTheThreads) {
  std::mt19937_64 rng(44);
  const std::vector<Event> ev = churn_trace(rng);
  for (bool chains : {false, true}) {
    SCOPED_TRACE(chains ? "chain_accounting" : "plain");
    AccountingOptions plain_opt;
    plain_opt.chain_accounting = chains;
    AccountingOptions evict_opt = plain_opt;
    evict_opt.evict = true;
    evict_opt.max_finished = 4;  // kept: max(4, max_threads = 16)
    evict_opt.bin_horizon_ns = 60'000'000'000;
    TimeAccounting plain(plain_opt), evicting(evict_opt);
    size_t most_live = 0, most_finished = 0;
    for (size_t i = 0; i < ev.size(); i += 2048) {
      const size_t n = std::min<size_t>(2048, ev.size() - i);
      plain.observe(ev.data() + i, n);
      evicting.observe(ev.data() + i, n);
      most_live = std::max(most_live, evicting.live_threads());
      most_finished = std::max(most_finished, evicting.finished_threads());
    }
    EXPECT_EQ(plain.live_threads(), 801u);  // every thread of the run, and the long one
    // At most a few processes overlap at a time (~7 on average), each held for its exit grace
    // (5 s) or, without an exit, for its idle time (60 s, looked for every 15 s).
    EXPECT_LT(most_live, 200u);
    EXPECT_LE(most_finished, 32u);
    EXPECT_GT(evicting.threads_evicted(), 700u);
    AnalysisResult want, got;
    plain.finish({}, want);
    evicting.finish({}, got);
    ASSERT_EQ(want.accounting.size(), 16u);
    ASSERT_EQ(got.accounting.size(), want.accounting.size());
    for (size_t i = 0; i < want.accounting.size(); ++i) {
      EXPECT_EQ(got.accounting[i].tid, want.accounting[i].tid);
      EXPECT_EQ(got.accounting[i].pid, want.accounting[i].pid);
      EXPECT_EQ(got.accounting[i].scheduler_data, want.accounting[i].scheduler_data);
      ASSERT_EQ(got.accounting[i].preempted_by.size(), want.accounting[i].preempted_by.size());
      for (size_t j = 0; j < want.accounting[i].preempted_by.size(); ++j) {
        EXPECT_EQ(got.accounting[i].preempted_by[j].tid, want.accounting[i].preempted_by[j].tid);
        EXPECT_EQ(got.accounting[i].preempted_by[j].ns, want.accounting[i].preempted_by[j].ns);
      }
      expect_equal(got.accounting[i], want.accounting[i], "evict");
    }
    EXPECT_EQ(got.accounting.front().tid, 7u);  // the long one is at the top
    if (chains) {
      // The long thread's bins: all 600 seconds without a horizon, the last minute (and at most
      // the 10 s between trims) with one.
      ASSERT_TRUE(plain.series(0, 7).has_value());
      ASSERT_TRUE(evicting.series(0, 7).has_value());
      EXPECT_GE(plain.series(0, 7)->bins.size(), 599u);
      EXPECT_LE(evicting.series(0, 7)->bins.size(), 71u);
      EXPECT_GE(evicting.series(0, 7)->bins.size(), 60u);
    }
  }
}

}  // namespace
}  // namespace ingero
