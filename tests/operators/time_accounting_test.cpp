// Time accounting (operators/time_accounting.h): exact splits on hand-made threads, a
// nanosecond-by-nanosecond reference on random traces (nested calls, threads that start and end
// mid-trace, spans crossing the interval's edges, missing states, calls overlapping preemption),
// invariance under shifts and batch sizes, and conservation on every shared Ingero trace.
#include "operators/time_accounting.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
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

}  // namespace
}  // namespace ingero
