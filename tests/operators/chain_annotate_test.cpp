// The chain annotator (operators/chain_annotate.h) on replayed and synthetic traces:
// - the synthetic contention scenario's chain names the preempted thread;
// - stacks of Ingero's recorded traces reach the chains with exactly the stored frames, and
//   Python frames (pf/pfn/pl) of a synthetic trace come out as Python frames with the call site;
// - the launching thread's time split on a throughput drop equals the shares SQL computes
//   independently over the same spans, written to SQLite by the sink (on-CPU, preempted and
//   blocked dominant cases);
// - the built-in launch_gap detector, the live (bounded retention) mode, and the JSON shape;
// - fold_into_findings_over_time against its contract on random chains, and by hand; describe_wait.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/default_plans.h"
#include "engine/engine.h"
#include "model/ops.h"
#include "model/result_json.h"
#include "model/stack.h"
#include "model/synth.h"
#include "operators/chain_annotate.h"
#include "sinks/report/text_report.h"
#include "sinks/store/lmdb_store.h"
#include "sinks/store/sqlite_store.h"
#ifdef INGERO_TEST_RULE_PACK
#include "rules/pack.h"
#endif

using namespace ingero;

namespace {

constexpr uint64_t kMs = 1'000'000, kUs = 1'000;

Plan the_plan() {
#ifdef INGERO_TEST_RULE_PACK
  return rules::default_rule_pack_plan();
#else
  return default_plan();
#endif
}

AnalysisResult analyse(EventSource& src, AnnotateOptions ao = {}) {
  ChainAnnotator a(ao);
  AnnotatingSource tap(src, a);
  std::vector<std::string> errors;
  AnalysisResult r = run_plan(the_plan(), tap, EngineOptions{}, &errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  annotate_result(r, a);
  return r;
}

AnalysisResult analyse(const std::vector<Event>& events, const TraceMeta& meta, AnnotateOptions ao = {}) {
  VectorSource src(events, 4096, meta);
  return analyse(src, ao);
}

const Chain* find_chain(const AnalysisResult& r, const std::string& category) {
  for (const auto& c : r.chains)
    if (c.category == category) return &c;
  return nullptr;
}

StackTrace python_stack(const std::string& file, const std::string& fn, uint32_t line) {
  ParsedStack p;
  StackFrame lib;
  lib.kind = FrameKind::kNative;
  lib.function = "cudaLaunchKernel";
  lib.module = "libcudart.so.13";
  p.frames.push_back(lib);
  StackFrame py;
  py.kind = FrameKind::kPython;
  py.file = file;
  py.function = fn;
  py.line = line;
  p.frames.push_back(py);
  StackFrame outer = py;
  outer.function = "<module>";
  outer.line = 7;
  p.frames.push_back(outer);
  return encode_stack(p);
}

// --- contention: the chain names the preempted thread, with its stacks ------------------------

TEST(ChainAnnotate, ContentionChainNamesThePreemptedThreadAndItsPythonStack) {
  auto t = synth::make_cpu_contention(true);
  constexpr uint64_t kSlowStack = 0x1111, kFastStack = 0x2222, kWaitStack = 0x3333;
  t.meta.stacks[kSlowStack] = python_stack("train.py", "Model.forward", 142);
  t.meta.stacks[kFastStack] = python_stack("train.py", "Model.backward", 200);
  ParsedStack k;
  StackFrame kf;
  kf.kind = FrameKind::kKernel;
  kf.function = "schedule";
  k.frames.push_back(kf);
  t.meta.stacks[kWaitStack] = encode_stack(k);
  t.meta.thread_names[t.tid] = "pt_main_thread";
  for (auto& e : t.events) {
    if (e.source == Source::kCuda && e.tid == t.tid) e.stack_id = e.dur_ns > 1 * kMs ? kSlowStack : kFastStack;
    if (e.source == Source::kHost && e.op == op::kSchedSwitch && e.prev_state == OffCpuState::kPreempted)
      e.stack_id = kWaitStack;
  }
  const auto r = analyse(t.events, t.meta);
  const Chain* c = find_chain(r, "cpu_contention");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->tid, t.tid);
  ASSERT_FALSE(c->threads.empty());
  EXPECT_EQ(c->threads[0].tid, t.tid);
  EXPECT_EQ(c->threads[0].name, "pt_main_thread");
  EXPECT_NEAR(c->threads[0].share, 1.0, 1e-12);
  ASSERT_FALSE(c->stacks.empty());
  EXPECT_EQ(c->stacks[0].role, "call");
  EXPECT_EQ(c->stacks[0].stack_id, kSlowStack);
  EXPECT_GT(c->stacks[0].share, 0.9);
  ASSERT_EQ(c->stacks[0].frames.size(), 3u);
  EXPECT_EQ(c->stacks[0].frames[1].kind, FrameKind::kPython);
  EXPECT_EQ(c->stacks[0].frames[1].file, "train.py");
  EXPECT_EQ(c->stacks[0].frames[1].line, 142u);
  EXPECT_EQ(chain_call_site(*c), "from train.py:142 in Model.forward");
  ASSERT_FALSE(c->recommendations.empty());
  EXPECT_NE(c->recommendations[0].find("train.py:142 in Model.forward"), std::string::npos) << c->recommendations[0];
  bool offcpu = false;
  for (const auto& s : c->stacks)
    if (s.role == "offcpu") {
      offcpu = true;
      EXPECT_EQ(s.stack_id, kWaitStack);
      ASSERT_FALSE(s.frames.empty());
      EXPECT_EQ(s.frames[0].kind, FrameKind::kKernel);
    }
  EXPECT_TRUE(offcpu) << "a cpu_contention chain carries the off-CPU stacks of its thread";
  // The JSON shape of docs/cli.md.
  const auto j = chain_json(*c, r.meta);
  EXPECT_EQ(j["tid"], t.tid);
  EXPECT_EQ(j["threads"][0]["tid"], t.tid);
  EXPECT_EQ(j["stacks"][0]["frames"][1]["kind"], "python");
  EXPECT_EQ(j["stacks"][0]["frames"][1]["line"], 142);
  EXPECT_EQ(j["stacks"][0]["frames"][0]["module"], "libcudart.so.13");
  EXPECT_TRUE(j["time_split"].is_null());
  const std::string text = explain_text(r);
  EXPECT_NE(text.find("from train.py:142 in Model.forward"), std::string::npos) << text;
}

TEST(ChainAnnotate, ChainWithoutStacksStillGetsItsThread) {
  const auto t = synth::make_cpu_contention(true);
  const auto r = analyse(t.events, t.meta);
  const Chain* c = find_chain(r, "cpu_contention");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->tid, t.tid);
  for (const auto& s : c->stacks) EXPECT_NE(s.role, "call");  // no event had a stack
}

TEST(ChainAnnotate, EveryScenarioChainNamesItsThread) {
  for (const auto& info : synth::all_scenarios()) {
    const auto t = synth::make_scenario(info.id, true);
    const auto r = analyse(t.events, t.meta);
    size_t found = 0;
    for (const auto& c : r.chains) {
      if (c.category != t.category) continue;
      ++found;
      EXPECT_NE(c.tid, 0u) << info.name << ": " << c.id;
      ASSERT_FALSE(c.threads.empty()) << info.name << ": " << c.id;
      EXPECT_EQ(c.threads[0].tid, c.tid) << info.name;
      double sum = 0;
      for (const auto& th : c.threads) sum += th.share;
      EXPECT_NEAR(sum, 1.0, 1e-9) << info.name;
      if (t.tid && t.rank < 0) {
        EXPECT_EQ(c.tid, t.tid) << info.name << ": " << c.id;
      }
      if (t.rank >= 0) {
        EXPECT_EQ(c.tid, 10000u + static_cast<uint32_t>(t.rank)) << info.name << ": the slow rank's thread";
      }
      EXPECT_EQ(c.time_split.present, c.category == "throughput_drop") << info.name;
    }
    EXPECT_GT(found, 0u) << info.name;
  }
}

// --- Ingero's recorded traces: stacks reach the chains as stored --------------------------------

TEST(ChainAnnotate, IngeroTracesWithStacksCarryTheStoredFrames) {
  std::filesystem::path dir = INGERO_SHARED_DATA;
  if (!std::filesystem::exists(dir / "sample-cluster.db")) dir /= "ingero";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no shared Ingero traces at " << dir;
  size_t with_stacks = 0, traces = 0, demangled = 0;
  for (const char* name :
       {"pytorch-dataloader-starvation.db", "sample-cluster.db", "sample-gpu-node-02.db", "sample-gpu-node-03.db"}) {
    const auto path = (dir / name).string();
    if (!std::filesystem::exists(path)) continue;
    std::string error;
    auto src = open_sqlite_trace(path, error);
    ASSERT_TRUE(src) << error;
    ++traces;
    const auto r = analyse(*src);
    for (const auto& c : r.chains) {
      if (c.pid) {
        EXPECT_NE(c.tid, 0u) << name << " " << c.id << ": a chain whose calls have a thread names it";
      }
      for (const auto& s : c.stacks) {
        auto it = r.meta.stacks.find(s.stack_id);
        ASSERT_NE(it, r.meta.stacks.end()) << name << ": stack " << s.stack_id;
        const ParsedStack p = parse_stack(it->second);
        ASSERT_EQ(s.frames.size(), p.frames.size());
        for (size_t i = 0; i < p.frames.size(); ++i) {
          // Stored mangled (Ingero), shown demangled: "_ZN2at6native5copy_..." -> "at::native::copy_(...)".
          if (p.frames[i].function.rfind("_Z", 0) == 0) {
            EXPECT_NE(s.frames[i].function.find("::"), std::string::npos) << s.frames[i].function;
            ++demangled;
          } else {
            EXPECT_EQ(s.frames[i].function, p.frames[i].function);
          }
          EXPECT_EQ(s.frames[i].module, p.frames[i].module);
        }
        if (s.role == "call" && !s.frames.empty()) ++with_stacks;
      }
    }
  }
  if (traces == 0) GTEST_SKIP() << "no Ingero trace with stacks under " << dir;
  EXPECT_GT(with_stacks, 0u) << "some chain of the recorded traces should carry a call stack";
  std::printf("chains' call stacks with frames: %zu, demangled frames: %zu\n", with_stacks, demangled);
}

// --- time split on a throughput drop vs SQL over the same spans -----------------------------

enum class Fill { kOnCpu, kPreempted, kBlocked };

// The synthetic throughput drop (tid 9000 launches 1000/s, then 300/s from window 6), with the
// time between launches in the drop windows filled as asked: left on CPU (with 99 Hz samples at
// a known function), or 2 ms off-CPU spans after each launch's calls (preempted or sleeping).
synth::SynthTrace drop_with(Fill fill) {
  auto t = synth::make_throughput_drop(true);
  constexpr uint64_t kSampleStack = 0xabc, kLaunchStack = 0xdef;
  t.meta.stacks[kSampleStack] = python_stack("serve.py", "busy_tokenize", 77);
  t.meta.stacks[kLaunchStack] = python_stack("serve.py", "step", 50);
  for (auto& e : t.events)
    if (e.source == Source::kCuda && e.op == op::kCudaLaunchKernel) e.stack_id = kLaunchStack;
  std::vector<Event> extra;
  for (const auto& e : t.events) {
    if (e.ts_ns < t.fault_start || e.op != op::kCudaLaunchKernel || e.source != Source::kCuda) continue;
    if (fill == Fill::kOnCpu) continue;
    Event s{};
    s.source = Source::kHost;
    s.op = op::kSchedSwitch;
    s.pid = s.tid = t.tid;
    s.ts_ns = e.ts_ns + 400 * kUs;  // after the launch and its (every 20th) synchronize
    s.dur_ns = 2 * kMs;
    s.prev_state = fill == Fill::kPreempted ? OffCpuState::kPreempted : OffCpuState::kSleeping;
    extra.push_back(s);
  }
  if (fill == Fill::kOnCpu)
    for (uint64_t ts = t.fault_start; ts < t.fault_end; ts += 1'000'000'000 / 99) {
      Event s{};
      s.source = Source::kHost;
      s.op = op::kCpuSample;
      s.pid = s.tid = t.tid;
      s.ts_ns = ts;
      s.stack_id = kSampleStack;
      extra.push_back(s);
    }
  t.events.insert(t.events.end(), extra.begin(), extra.end());
  std::stable_sort(t.events.begin(), t.events.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  for (size_t i = 0; i < t.events.size(); ++i) t.events[i].id = i + 1;
  return t;
}

double sql_double(sqlite3* db, const std::string& q) {
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, q.c_str(), -1, &st, nullptr), SQLITE_OK) << q << ": " << sqlite3_errmsg(db);
  double v = 0;
  if (st && sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_double(st, 0);
  sqlite3_finalize(st);
  return v;
}

void check_split_against_sql(Fill fill, const char* dominant) {
  const auto t = drop_with(fill);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("annotate_split_" + std::to_string(::getpid()) + "_" + dominant + ".db"))
                               .string();
  {
    std::string error;
    auto sink = SqliteSink::create(path, error);
    ASSERT_TRUE(sink) << error;
    ASSERT_TRUE(sink->write_meta(t.meta));
    ASSERT_TRUE(sink->write_events(t.events));
    ASSERT_TRUE(sink->close(error)) << error;
  }
  std::string error;
  auto src = open_sqlite_trace(path, error);
  ASSERT_TRUE(src) << error;
  const auto r = analyse(*src);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  size_t checked = 0;
  for (const auto& c : r.chains) {
    if (c.category != "throughput_drop") continue;
    ++checked;
    const TimeSplit& s = c.time_split;
    ASSERT_TRUE(s.present) << c.id;
    EXPECT_EQ(s.tid, t.tid);
    EXPECT_EQ(s.dominant, dominant) << c.summary;
    const std::string ws = std::to_string(c.window_start), we = std::to_string(c.window_end);
    const std::string tid = std::to_string(t.tid);
    const double span = static_cast<double>(c.window_end - c.window_start);
    // Calls do not overlap one another in this trace, nor do spans overlap calls: plain sums.
    const double in_calls = sql_double(db, "SELECT TOTAL(MIN(timestamp + duration, " + we + ") - MAX(timestamp, " + ws +
                                               ")) FROM events WHERE tid = " + tid +
                                               " AND source IN (1, 4, 8, 9) AND timestamp < " + we +
                                               " AND timestamp + duration > " + ws);
    auto off = [&](const std::string& states) {
      // sched_switch rows are stored at the switch-in: the span is [timestamp - duration, timestamp).
      return sql_double(db, "SELECT TOTAL(MIN(timestamp, " + we + ") - MAX(timestamp - duration, " + ws +
                                ")) FROM events WHERE tid = " + tid + " AND source = 3 AND op = 1 AND prev_state IN (" +
                                states + ") AND timestamp - duration < " + we + " AND timestamp > " + ws);
    };
    const double pre = off("1"), blocked = off("2, 3, 4"), unknown = off("0");
    EXPECT_NEAR(s.in_calls, in_calls / span, 1e-9);
    EXPECT_NEAR(s.off_cpu_preempted, pre / span, 1e-9);
    EXPECT_NEAR(s.off_cpu_blocked, blocked / span, 1e-9);
    EXPECT_NEAR(s.off_cpu_unknown, unknown / span, 1e-9);
    EXPECT_NEAR(s.on_cpu, 1.0 - (in_calls + pre + blocked + unknown) / span, 1e-9);
    EXPECT_NEAR(s.in_calls + s.off_cpu_preempted + s.off_cpu_blocked + s.off_cpu_unknown + s.on_cpu, 1.0, 1e-9);
    EXPECT_EQ(c.tid, t.tid);
    EXPECT_EQ(c.explanation.find("input starvation"), std::string::npos) << c.explanation;
    if (fill == Fill::kOnCpu) {
      EXPECT_NE(c.root_cause.find("CPU-bound work in the launching thread"), std::string::npos) << c.root_cause;
      EXPECT_NE(c.root_cause.find("serve.py:77 in busy_tokenize"), std::string::npos) << c.root_cause;
      bool sample = false;
      for (const auto& st : c.stacks) sample = sample || (st.role == "sample" && st.share > 0.99);
      EXPECT_TRUE(sample);
      EXPECT_EQ(chain_call_site(c), "from serve.py:77 in busy_tokenize")
          << "on CPU: the sampled stack, not the launches'";
    } else if (fill == Fill::kPreempted) {
      EXPECT_NE(c.root_cause.find("CPU contention"), std::string::npos) << c.root_cause;
    } else {
      EXPECT_NE(c.root_cause.find("blocked"), std::string::npos) << c.root_cause;
    }
  }
  sqlite3_close(db);
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  EXPECT_GE(checked, 1u) << "the synthetic drop must give a throughput_drop chain";
}

TEST(ChainAnnotate, TimeSplitOnCpuDominantMatchesSql) { check_split_against_sql(Fill::kOnCpu, "on_cpu"); }
TEST(ChainAnnotate, TimeSplitPreemptedDominantMatchesSql) {
  check_split_against_sql(Fill::kPreempted, "off_cpu_preempted");
}
TEST(ChainAnnotate, TimeSplitBlockedDominantMatchesSql) { check_split_against_sql(Fill::kBlocked, "off_cpu_blocked"); }

// --- time split arithmetic on nested calls and a span across a call ----------------------------

TEST(ChainAnnotate, TimeSplitCountsNestedCallsOnceAndSpansOutsideCalls) {
  std::vector<Event> ev;
  auto call = [&](Source s, uint8_t o, uint64_t ts, uint64_t dur) {
    Event e{};
    e.source = s;
    e.op = o;
    e.pid = e.tid = 7;
    e.ts_ns = ts;
    e.dur_ns = dur;
    ev.push_back(e);
  };
  call(Source::kCuda, op::kCudaLaunchKernel, 100, 100);  // [100, 200)
  call(Source::kDriver, op::kCuLaunchKernel, 120, 50);   // nested: counted once
  Event off{};
  off.source = Source::kHost;
  off.op = op::kSchedSwitch;
  off.pid = off.tid = 7;
  off.ts_ns = 150;  // [150, 400): 50 inside the call, 200 outside
  off.dur_ns = 250;
  off.prev_state = OffCpuState::kDiskWait;
  ev.push_back(off);
  ChainAnnotator a;
  a.add(std::span<const Event>(ev));
  const TimeSplit s = a.time_split(0, 7, 0, 1000);
  ASSERT_TRUE(s.present);
  EXPECT_DOUBLE_EQ(s.in_calls, 0.1);
  EXPECT_DOUBLE_EQ(s.off_cpu_blocked, 0.2);
  EXPECT_DOUBLE_EQ(s.on_cpu, 0.7);
  EXPECT_EQ(s.dominant, "on_cpu");
  EXPECT_FALSE(a.time_split(0, 8, 0, 1000).present) << "an unknown thread has no split";
  EXPECT_FALSE(a.time_split(0, 7, 10, 10).present) << "an empty window has no split";
}

TEST(ChainAnnotate, ChainWithoutANodeFindsThreadsOfAnyNode) {
  // A 0.9 cluster trace: events of node 2; the pid-keyed rule's chain has node 0.
  std::vector<Event> ev;
  for (int i = 0; i < 20; ++i) {
    Event e{};
    e.source = Source::kCuda;
    e.op = op::kCudaMemcpy;
    e.pid = 50;
    e.tid = 51;
    e.node = 2;
    e.ts_ns = 1000 + static_cast<uint64_t>(i) * 1000;
    e.dur_ns = i == 7 ? 900 : 100;
    ev.push_back(e);
  }
  ChainAnnotator a;
  a.add(std::span<const Event>(ev));
  Chain c;
  c.category = "unexplained_tail";
  c.source = Source::kCuda;
  c.op = op::kCudaMemcpy;
  c.pid = 50;
  c.window_start = 0;
  c.window_end = 100000;
  c.values = {{"p50", 100.0}, {"p95", 900.0}};
  a.annotate(c, TraceMeta{});
  EXPECT_EQ(c.tid, 51u);
  c.node = 1;  // a chain of another node: not these threads
  c.tid = 0;
  a.annotate(c, TraceMeta{});
  EXPECT_EQ(c.tid, 0u);
  EXPECT_TRUE(c.threads.empty());
}

// --- launch_gap ---------------------------------------------------------------------------

std::vector<Event> bursty_launcher(TraceMeta& meta) {
  // tid 300 launches every 1 ms; from 2 s to 2.5 s it runs pure Python instead (samples at
  // spin_loop), then launches again until 4 s. A second thread of the process never launches.
  constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull, kStack = 0x5151;
  meta.stacks[kStack] = python_stack("bench.py", "spin_loop", 31);
  meta.process_names[300] = "python3 bench.py";
  std::vector<Event> ev;
  for (uint64_t t = 0; t < 4000 * kMs; t += 1 * kMs) {
    if (t >= 2000 * kMs && t < 2500 * kMs) {
      if (t % (10 * kMs) == 0) {
        Event s{};
        s.source = Source::kHost;
        s.op = op::kCpuSample;
        s.pid = s.tid = 300;
        s.ts_ns = kT0 + t;
        s.stack_id = kStack;
        ev.push_back(s);
      }
      continue;
    }
    Event e{};
    e.source = Source::kCuda;
    e.op = op::kCudaLaunchKernel;
    e.pid = e.tid = 300;
    e.ts_ns = kT0 + t;
    e.dur_ns = 10 * kUs;
    ev.push_back(e);
  }
  for (size_t i = 0; i < ev.size(); ++i) ev[i].id = i + 1;
  meta.first_ts = ev.front().ts_ns;
  meta.last_ts = ev.back().ts_ns;
  return ev;
}

TEST(ChainAnnotate, LaunchGapChainPointsAtTheBusyFunction) {
  TraceMeta meta;
  const auto ev = bursty_launcher(meta);
  const auto r = analyse(ev, meta);
  const Chain* c = find_chain(r, "launch_gap");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->tid, 300u);
  EXPECT_EQ(c->pid, 300u);
  EXPECT_EQ(c->window_end - c->window_start, 500 * kMs + 990 * kUs);  // last launch's end to the next launch
  ASSERT_TRUE(c->time_split.present);
  EXPECT_EQ(c->time_split.dominant, "on_cpu");
  EXPECT_GT(c->time_split.on_cpu, 0.99);
  const ChainStack* sample = nullptr;
  for (const auto& s : c->stacks)
    if (s.role == "sample") sample = &s;
  ASSERT_NE(sample, nullptr);
  EXPECT_EQ(sample->calls, 50u);
  EXPECT_EQ(chain_call_site(*c), "from bench.py:31 in spin_loop");
  EXPECT_NE(c->root_cause.find("bench.py:31 in spin_loop"), std::string::npos) << c->root_cause;
  size_t gaps = 0;
  for (const auto& ch : r.chains) gaps += ch.category == "launch_gap";
  EXPECT_EQ(gaps, 1u);
  const std::string text = explain_text(r);
  EXPECT_NE(text.find("from bench.py:31 in spin_loop"), std::string::npos) << text;
  EXPECT_NE(text.find("Launching thread tid 300"), std::string::npos) << text;
  if (std::getenv("INGERO_TEST_SHOW")) std::printf("%s\n", text.c_str());
}

TEST(ChainAnnotate, NoLaunchGapWithoutLaunchesAroundIt) {
  // Three launches after the pause (fewer than gap_min_launches): the job wound down, no gap chain.
  TraceMeta meta;
  auto ev = bursty_launcher(meta);
  const uint64_t resume = meta.first_ts + 2500 * kMs;
  size_t after = 0;
  std::erase_if(ev, [&](const Event& e) { return e.source == Source::kCuda && e.ts_ns >= resume && ++after > 3; });
  const auto r = analyse(ev, meta);
  EXPECT_EQ(find_chain(r, "launch_gap"), nullptr);
}

// --- losses: a gap the capture's own drops can explain is not a cause (issue 43, item 4) -----

// One thread launching every 3 us for 4 s (a tight loop, ~330k calls/s) that never pauses; the
// capture lost every launch from 2 s to 2.186 s (a full ring), so the recorded stream has a
// 186 ms hole. With `lost` the loss span is recorded in the trace's health as live capture does.
std::vector<Event> tight_loop_with_hole(TraceMeta& meta, bool lost, uint64_t span_shift = 0) {
  constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;
  meta.process_names[400] = "tight-loop";
  std::vector<Event> ev;
  uint64_t dropped = 0;
  for (uint64_t t = 0; t < 4000 * kMs; t += 3 * kUs) {
    if (t >= 2000 * kMs && t < 2186 * kMs) {
      ++dropped;
      continue;
    }
    Event e{};
    e.source = Source::kCuda;
    e.op = op::kCudaLaunchKernel;
    e.pid = e.tid = 400;
    e.ts_ns = kT0 + t;
    e.dur_ns = 1 * kUs;
    ev.push_back(e);
  }
  for (size_t i = 0; i < ev.size(); ++i) ev[i].id = i + 1;
  meta.first_ts = ev.front().ts_ns;
  meta.last_ts = ev.back().end_ns();
  if (lost) {
    // The poller's counter reads are 20 ms apart: the span runs from the read before the first
    // drop to the read after the last one.
    LossSpan l;
    l.start_ns = kT0 + 1990 * kMs + span_shift;
    l.end_ns = kT0 + 2190 * kMs + span_shift;
    l.gpu = dropped;
    meta.health.add_loss(l);
    meta.health.dropped_events = dropped;
  }
  return ev;
}

TEST(ChainAnnotate, LaunchGapOverALossSpanIsNotACause) {
  TraceMeta clean_meta;
  const auto clean = analyse(tight_loop_with_hole(clean_meta, false), clean_meta);
  const Chain* real = find_chain(clean, "launch_gap");
  ASSERT_NE(real, nullptr) << "without a recorded loss the hole reads as a gap";
  EXPECT_EQ(real->severity, Severity::kMedium);
  EXPECT_EQ(real->dropped_events, 0u);
  EXPECT_EQ(real->summary.find("lossy capture"), std::string::npos);

  TraceMeta meta;
  const auto r = analyse(tight_loop_with_hole(meta, true), meta);
  for (const auto& c : r.chains) EXPECT_LT(c.severity, Severity::kMedium) << c.category << ": " << c.summary;
  const Chain* c = find_chain(r, "launch_gap");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->severity, Severity::kLow);
  EXPECT_EQ(c->summary.rfind("lossy capture (", 0), 0u) << c->summary;
  EXPECT_EQ(c->root_cause.rfind("Not established: the capture lost", 0), 0u) << c->root_cause;
  EXPECT_EQ(c->dropped_events, 62000u);  // every launch of the 186 ms
  bool value = false;
  for (const auto& [k, v] : c->values) value |= k == "lost_events" && v == 62000.0;
  EXPECT_TRUE(value);
  const auto j = health_json(r.meta.health);
  ASSERT_TRUE(j.contains("loss_spans")) << j.dump();
  EXPECT_EQ(j["loss_spans"][0]["gpu"], 62000u);
  EXPECT_EQ(chain_json(*c, r.meta)["dropped_events"], 62000u);
}

TEST(ChainAnnotate, ALossElsewhereInTheTraceLeavesTheGapAlone) {
  // The same hole, but the recorded loss is 1 s later: it cannot explain the gap.
  TraceMeta meta;
  const auto r = analyse(tight_loop_with_hole(meta, true, 1000 * kMs), meta);
  const Chain* c = find_chain(r, "launch_gap");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->severity, Severity::kMedium);
  EXPECT_EQ(c->dropped_events, 0u);  // the window's losses, not the trace's
  EXPECT_EQ(c->summary.find("lossy capture"), std::string::npos);
}

TEST(ChainAnnotate, LossSpansMergeAndSum) {
  InputHealth h;
  h.add_loss({100, 200, 5, 0, 0});
  h.add_loss({300, 400, 0, 2, 0});
  h.add_loss({200, 250, 1, 0, 0});  // touches the first: merged
  h.add_loss({500, 500, 0, 0, 0});  // nothing lost: ignored
  ASSERT_EQ(h.loss_spans.size(), 2u);
  EXPECT_EQ(h.loss_spans[0].start_ns, 100u);
  EXPECT_EQ(h.loss_spans[0].end_ns, 250u);
  EXPECT_EQ(h.loss_spans[0].gpu, 6u);
  EXPECT_EQ(h.lost_between(0, 99), 0u);
  EXPECT_EQ(h.lost_between(0, 100), 6u);
  EXPECT_EQ(h.lost_between(251, 299), 0u);
  EXPECT_EQ(h.lost_between(240, 310), 8u);
  h.add_loss({50, 350, 0, 0, 3});  // spans both: one span
  ASSERT_EQ(h.loss_spans.size(), 1u);
  EXPECT_EQ(h.loss_spans[0].total(), 11u);
  EXPECT_EQ(h.loss_spans[0].end_ns, 400u);
  // Beyond the cap, neighbours merge: no loss is forgotten, spans only grow.
  InputHealth many;
  for (uint64_t i = 0; i <= InputHealth::kMaxLossSpans; ++i) many.add_loss({i * 10, i * 10 + 1, 1, 0, 0});
  EXPECT_LE(many.loss_spans.size(), InputHealth::kMaxLossSpans);
  EXPECT_EQ(many.lost_between(0, UINT64_MAX), InputHealth::kMaxLossSpans + 1);
  for (uint64_t i = 0; i <= InputHealth::kMaxLossSpans; ++i) EXPECT_GE(many.lost_between(i * 10, i * 10), 1u);
  // Stored the way our databases keep them, and read back.
  LossSpan back;
  ASSERT_TRUE(parse_loss_span(loss_span_text({7, 9, 1, 2, 3}), back));
  EXPECT_EQ(back.start_ns, 7u);
  EXPECT_EQ(back.end_ns, 9u);
  EXPECT_EQ(back.total(), 6u);
  EXPECT_FALSE(parse_loss_span("7 9 gpu=1 host=2", back));
  EXPECT_FALSE(parse_loss_span("9 7 gpu=1 host=2 queue=3", back));
}

TEST(ChainAnnotate, LossSpansSurviveTheDatabaseAndJudgeTheReplay) {
  // A recorded trace with its loss span: `explain` on it (open_trace -> read_loss_spans) judges
  // the gap as the live run did.
  TraceMeta meta;
  const auto ev = tight_loop_with_hole(meta, true);
  const auto dir = std::filesystem::temp_directory_path() / ("annotate_losses_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string db = (dir / "t.db").string();
  std::string error;
  {
    auto sink = SqliteSink::create(db, error);
    ASSERT_TRUE(sink) << error;
    ASSERT_TRUE(sink->write_meta(meta));
    ASSERT_TRUE(sink->write_events(ev));
    ASSERT_TRUE(sink->close(error)) << error;
  }
  auto src = open_sqlite_trace(db, error);
  ASSERT_TRUE(src) << error;
  EXPECT_TRUE(src->meta().health.loss_spans.empty());  // the reader itself does not load them
  EXPECT_EQ(read_loss_spans(db, src->meta().health), 1u);
  ASSERT_EQ(src->meta().health.loss_spans.size(), 1u);
  EXPECT_EQ(src->meta().health.loss_spans[0].gpu, 62000u);
  const auto r = analyse(*src);
  const Chain* c = find_chain(r, "launch_gap");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->severity, Severity::kLow);
  EXPECT_EQ(c->dropped_events, 62000u);
  std::filesystem::remove_all(dir);
}

TEST(ChainAnnotate, LiveModeKeepsOnlyTheHorizonAndRefusesOlderWindows) {
  TraceMeta meta;
  const auto ev = bursty_launcher(meta);
  AnnotateOptions ao;
  ao.retention_ns = 2600 * kMs;  // >= gap window + context + the gap: the gap is judged whole
  ao.gap_window_ns = 1000 * kMs;
  ChainAnnotator a(ao);
  size_t peak = 0;
  std::vector<Chain> gaps;
  for (size_t i = 0; i < ev.size(); i += 256) {
    a.add(std::span<const Event>(ev).subspan(i, std::min<size_t>(256, ev.size() - i)));
    peak = std::max(peak, a.retained());
    for (auto& c : a.take_gap_chains(meta, false)) gaps.push_back(std::move(c));
  }
  for (auto& c : a.take_gap_chains(meta, true)) gaps.push_back(std::move(c));
  EXPECT_LE(peak, 2600u + 256u) << "the horizon's 1 kHz launches and samples, plus a batch";
  EXPECT_GT(a.counters().evicted, 0u);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_TRUE(gaps[0].time_split.present) << "the gap was inside the horizon when it was judged";
  Chain old;
  old.category = "throughput_drop";
  old.pid = 300;
  old.window_start = meta.first_ts;
  old.window_end = meta.first_ts + 1000 * kMs;
  a.annotate(old, meta);
  EXPECT_FALSE(old.time_split.present);
  EXPECT_EQ(a.counters().too_old, 1u);
}

TEST(ChainAnnotate, LiveAnnotatorAnnotatesChainsAsTheEngineEmitsThem) {
  // Small batches, as a live source hands out (a replay batch of 4096 events would run the source
  // minutes of trace time ahead of the emitted windows); two engine threads; 30 s horizon.
  const auto t = drop_with(Fill::kOnCpu);
  VectorSource src(t.events, 256, t.meta);
  AnnotateOptions ao = LiveChainAnnotator::defaults();
  ao.retention_ns = 30'000'000'000ull;
  LiveChainAnnotator live(ao);
  std::vector<Chain> emitted;
  EngineOptions eo;
  eo.threads = 2;
  eo.on_chain = [&](const Chain& c) { emitted.push_back(live.annotate(c)); };  // the serial collector
  std::vector<std::string> errors;
  AnalysisResult r = run_plan(the_plan(), live.tap(src), eo, &errors);
  ASSERT_TRUE(errors.empty());
  live.finish(r);
  EXPECT_GT(live.counters().evicted, 0u) << "the horizon is shorter than the trace";
  size_t drops = 0;
  for (const auto* list : {&emitted, &r.chains})
    for (const auto& c : *list) {
      if (c.category != "throughput_drop") continue;
      ++drops;
      EXPECT_TRUE(c.time_split.present) << c.id;
      EXPECT_EQ(c.time_split.dominant, "on_cpu") << c.id;
      EXPECT_EQ(c.tid, t.tid);
    }
  EXPECT_GE(drops, 2u);
  EXPECT_EQ(live.counters().too_old, 0u);
}

TEST(ChainAnnotate, BoundedReplayGivesTheSameChainsAsTheWholeTrace) {
  // The replay path (explain, mcp): annotate as chains are emitted, evicting past a floor of kept
  // events. The floor (40k) is above the source's look-ahead (8 batches of 4096), so every chain's
  // window is still kept when it is annotated, and the result equals the whole-trace annotation.
  const auto t = drop_with(Fill::kBlocked);
  const auto whole = analyse(t.events, t.meta);
  AnnotateOptions ao = LiveChainAnnotator::replay_defaults();
  ao.min_records = 40'000;
  LiveChainAnnotator live(ao);
  VectorSource src(t.events, 4096, t.meta);
  EngineOptions eo;
  eo.on_chain = [&](const Chain& c) { live.annotate(c); };
  std::vector<std::string> errors;
  AnalysisResult r = run_plan(the_plan(), live.tap(src), eo, &errors);
  ASSERT_TRUE(errors.empty()) << errors.front();
  live.finish(r);
  EXPECT_GT(live.counters().evicted, 0u);
  EXPECT_EQ(live.counters().too_old, 0u);
  ASSERT_EQ(r.chains.size(), whole.chains.size());
  for (size_t i = 0; i < r.chains.size(); ++i) {
    EXPECT_EQ(r.chains[i].id, whole.chains[i].id);
    EXPECT_EQ(r.chains[i].tid, whole.chains[i].tid);
    EXPECT_EQ(r.chains[i].summary, whole.chains[i].summary);
    EXPECT_EQ(r.chains[i].time_split.present, whole.chains[i].time_split.present);
    EXPECT_DOUBLE_EQ(r.chains[i].time_split.off_cpu_blocked, whole.chains[i].time_split.off_cpu_blocked);
  }
}

TEST(ChainAnnotate, SpilledRecordsGiveTheSameChains) {
  // The annotator's sealed blocks in a spill file (a 1-byte resident budget: every sealed block
  // goes out) give the same annotated chains - threads, stacks, time split, launch gaps - as all in
  // memory; also under a record cap and a horizon that evict through blocks that are in the file.
  struct Trace {
    std::string name;
    std::vector<Event> events;
    TraceMeta meta;
  };
  std::vector<Trace> traces;
  for (const auto& info : synth::all_scenarios()) {
    auto t = synth::make_scenario(info.id, true);
    traces.push_back(Trace{std::string(info.name), std::move(t.events), std::move(t.meta)});
  }
  {
    Trace t{"bursty launcher", {}, {}};
    t.events = bursty_launcher(t.meta);
    traces.push_back(std::move(t));
  }
  uint64_t spilled_blocks = 0, capped = 0, evicted = 0;
  for (const auto& t : traces) {
    const std::string& name = t.name;
    // Everything kept; a cap of a third of the events; a 2 s horizon (retention evicts).
    for (int mode = 0; mode < 3; ++mode) {
      const size_t cap = mode == 1 ? t.events.size() / 3 + 1 : size_t{8} << 20;
      AnnotateOptions in_memory;
      in_memory.max_records = cap;
      if (mode == 2) in_memory.retention_ns = 2'000'000'000;
      AnnotateOptions spilled = in_memory;
      spilled.resident_bytes = 1;
      const std::string want = explain_json(analyse(t.events, t.meta, in_memory)).dump();
      ChainAnnotator a(spilled);
      VectorSource src(t.events, 4096, t.meta);
      AnnotatingSource tap(src, a);
      std::vector<std::string> errors;
      AnalysisResult r = run_plan(the_plan(), tap, EngineOptions{}, &errors);
      ASSERT_TRUE(errors.empty()) << errors.front();
      annotate_result(r, a);
      EXPECT_EQ(explain_json(r).dump(), want) << name << ", mode " << mode;
      EXPECT_EQ(a.spill_counters().read_errors, 0u);
      spilled_blocks += a.spill_counters().blocks_out;
      capped += a.counters().capped;
      if (mode == 2) evicted += a.counters().evicted;
    }
  }
  EXPECT_GT(spilled_blocks, 1000u) << "the traces must reach sealed blocks";
  EXPECT_GT(capped, 0u) << "the small cap must evict";
  EXPECT_GT(evicted, 0u) << "the 2 s horizon must evict";
}

// --- stores: the SQLite ip_chains row and the LMDB chain keep threads, stacks and time split ----

void expect_same_where(const Chain& a, const Chain& b) {
  ASSERT_EQ(a.threads.size(), b.threads.size());
  for (size_t i = 0; i < a.threads.size(); ++i) {
    EXPECT_EQ(a.threads[i].tid, b.threads[i].tid);
    EXPECT_EQ(a.threads[i].name, b.threads[i].name);
    EXPECT_DOUBLE_EQ(a.threads[i].share, b.threads[i].share);
  }
  ASSERT_EQ(a.stacks.size(), b.stacks.size());
  for (size_t i = 0; i < a.stacks.size(); ++i) {
    EXPECT_EQ(a.stacks[i].role, b.stacks[i].role);
    EXPECT_EQ(a.stacks[i].stack_id, b.stacks[i].stack_id);
    EXPECT_EQ(a.stacks[i].calls, b.stacks[i].calls);
    ASSERT_EQ(a.stacks[i].frames.size(), b.stacks[i].frames.size());
    for (size_t f = 0; f < a.stacks[i].frames.size(); ++f) {
      EXPECT_EQ(a.stacks[i].frames[f].kind, b.stacks[i].frames[f].kind);
      EXPECT_EQ(a.stacks[i].frames[f].function, b.stacks[i].frames[f].function);
      EXPECT_EQ(a.stacks[i].frames[f].file, b.stacks[i].frames[f].file);
      EXPECT_EQ(a.stacks[i].frames[f].line, b.stacks[i].frames[f].line);
      EXPECT_EQ(a.stacks[i].frames[f].module, b.stacks[i].frames[f].module);
    }
  }
  EXPECT_EQ(a.time_split.present, b.time_split.present);
  EXPECT_EQ(a.time_split.tid, b.time_split.tid);
  EXPECT_DOUBLE_EQ(a.time_split.on_cpu, b.time_split.on_cpu);
  EXPECT_DOUBLE_EQ(a.time_split.in_calls, b.time_split.in_calls);
  EXPECT_EQ(a.time_split.dominant, b.time_split.dominant);
}

TEST(ChainAnnotate, StoresKeepThreadsStacksAndTimeSplit) {
  TraceMeta meta;
  const auto ev = bursty_launcher(meta);
  const auto r = analyse(ev, meta);
  ASSERT_NE(find_chain(r, "launch_gap"), nullptr);
  const auto dir = std::filesystem::temp_directory_path() / ("annotate_store_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string error;
  {
    auto sink = SqliteSink::create((dir / "t.db").string(), error);
    ASSERT_TRUE(sink) << error;
    ASSERT_TRUE(sink->write_result(r));
    ASSERT_TRUE(sink->close(error)) << error;
    AnalysisResult back;
    ASSERT_TRUE(read_result((dir / "t.db").string(), back, error)) << error;
    ASSERT_EQ(back.chains.size(), r.chains.size());
    for (size_t i = 0; i < r.chains.size(); ++i) expect_same_where(r.chains[i], back.chains[i]);
  }
  {
    // A database written before the columns existed reads back without them.
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir / "t.db").string().c_str(), &db), SQLITE_OK);
    for (const char* col : {"threads", "stacks", "time_split"})
      ASSERT_EQ(sqlite3_exec(db, (std::string("ALTER TABLE ip_chains DROP COLUMN ") + col).c_str(), nullptr, nullptr,
                             nullptr),
                SQLITE_OK)
          << sqlite3_errmsg(db);
    sqlite3_close(db);
    AnalysisResult old;
    ASSERT_TRUE(read_result((dir / "t.db").string(), old, error)) << error;
    ASSERT_EQ(old.chains.size(), r.chains.size());
    for (const auto& c : old.chains) {
      EXPECT_TRUE(c.stacks.empty());
      EXPECT_FALSE(c.time_split.present);
    }
  }
  {
    auto sink = LmdbSink::create((dir / "t.lmdb").string(), error);
    ASSERT_TRUE(sink) << error;
    ASSERT_TRUE(sink->write_result(r));
    ASSERT_TRUE(sink->close(error)) << error;
    std::vector<Chain> back;
    ASSERT_TRUE(read_lmdb_chains((dir / "t.lmdb").string(), back, error)) << error;
    ASSERT_EQ(back.size(), r.chains.size());
    for (const auto& c : r.chains)
      for (const auto& b : back)
        if (b.id == c.id) expect_same_where(c, b);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// --- findings over time absorb the tail chains of the same cause -------------------------------

// Random chains: findings over time (some with no thread: never a target) and tail chains of
// random category, node, pid, thread and window (some touching a finding's window without
// overlapping it), against the contract read literally: a tail chain with a thread is folded into
// the first finding over time (in the chains' order) with a thread, of its category, node, pid and
// tid whose window overlaps its own; the finding gets a "folded" evidence item quoting it and the
// higher of the two severities; everything else is kept, in order.
TEST(ChainAnnotate, FoldIntoFindingsOverTimeAgainstTheContract) {
  std::mt19937_64 rng(7);
  auto uni = [&rng](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  const char* categories[] = {"cpu_contention", "input_starvation", "blocking"};
  constexpr uint64_t kSec = 1'000'000'000;
  size_t folded_total = 0, kept_same_thread = 0, touching = 0;
  for (int round = 0; round < 300; ++round) {
    std::vector<Chain> chains;
    const int n = static_cast<int>(uni(0, 25));
    for (int i = 0; i < n; ++i) {
      Chain c;
      c.id = "c" + std::to_string(i);
      c.over_time = uni(0, 3) == 0;
      c.rule = c.over_time ? "cpu_preempted" : "tail_" + std::to_string(uni(0, 2));
      c.category = categories[uni(0, 2)];
      c.node = static_cast<uint16_t>(uni(0, 1));
      c.pid = static_cast<uint32_t>(uni(1, 2));
      c.tid = uni(0, 4) == 0 ? 0 : static_cast<uint32_t>(uni(11, 12));
      c.severity = static_cast<Severity>(uni(0, 2));
      if (c.over_time) {
        c.window_start = uni(0, 8) * kSec;
        c.window_end = c.window_start + uni(1, 4) * kSec;
      } else if (!chains.empty() && uni(0, 3) == 0) {  // touching an earlier chain's window, not overlapping
        const Chain& o = chains[uni(0, chains.size() - 1)];
        c.window_start = o.window_end;
        c.window_end = c.window_start + uni(1, 3) * kSec;
        if (uni(0, 1) && o.window_start >= 1) {
          c.window_end = o.window_start;
          c.window_start = c.window_end - std::min<uint64_t>(c.window_end, uni(1, 3) * kSec);
        }
        ++touching;
      } else {
        c.window_start = uni(0, 12'000) * 1'000'000;
        c.window_end = c.window_start + uni(1, 5'000) * 1'000'000;
      }
      if (!c.over_time && uni(0, 1)) {  // often on the key of an earlier finding
        for (const Chain& o : chains)
          if (o.over_time && uni(0, 1)) {
            c.category = o.category;
            c.node = o.node;
            c.pid = o.pid;
            c.tid = o.tid;
          }
      }
      c.summary = "summary of " + c.id;
      if (!c.over_time && uni(0, 1)) {  // exemplar evidence, which must follow the chain when folded
        EvidenceItem ev;
        ev.kind = "tail";
        ev.detail = "evidence of " + c.id;
        ev.event_ids = {static_cast<uint64_t>(chains.size()), 7};
        c.evidence.push_back(ev);
      }
      chains.push_back(c);
    }
    // The reference.
    std::vector<Chain> want = chains;
    std::vector<bool> drop(want.size(), false);
    for (size_t i = 0; i < want.size(); ++i) {
      const Chain& c = want[i];
      if (c.over_time || !c.tid) continue;
      for (size_t o = 0; o < want.size(); ++o) {
        Chain& f = want[o];
        if (!f.over_time || !f.tid || f.category != c.category || f.node != c.node || f.pid != c.pid ||
            f.tid != c.tid || !(c.window_end > f.window_start && c.window_start < f.window_end))
          continue;
        EvidenceItem e;
        e.kind = "folded";
        e.detail = c.rule + "|" + c.summary;  // compared by parts below
        f.evidence.push_back(e);
        for (const auto& item : c.evidence) f.evidence.push_back(item);
        f.severity = std::max(f.severity, c.severity);
        drop[i] = true;
        break;
      }
      if (!drop[i])
        for (const Chain& f : want)
          kept_same_thread += f.over_time && f.tid == c.tid && f.pid == c.pid && f.category == c.category;
    }
    std::vector<Chain> kept;
    for (size_t i = 0; i < want.size(); ++i)
      if (!drop[i]) kept.push_back(want[i]);

    std::vector<Chain> got = chains;
    fold_into_findings_over_time(got);
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_EQ(got.size(), kept.size());
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(got[i].id);
      EXPECT_EQ(got[i].id, kept[i].id);
      EXPECT_EQ(got[i].severity, kept[i].severity);
      ASSERT_EQ(got[i].evidence.size(), kept[i].evidence.size());
      for (size_t k = 0; k < got[i].evidence.size(); ++k) {
        if (kept[i].evidence[k].kind != "folded") {  // a folded chain's own evidence, as it was
          EXPECT_EQ(got[i].evidence[k].kind, kept[i].evidence[k].kind);
          EXPECT_EQ(got[i].evidence[k].detail, kept[i].evidence[k].detail);
          EXPECT_EQ(got[i].evidence[k].event_ids, kept[i].evidence[k].event_ids);
          continue;
        }
        const std::string& want_detail = kept[i].evidence[k].detail;
        const std::string rule = want_detail.substr(0, want_detail.find('|'));
        const std::string summary = want_detail.substr(want_detail.find('|') + 1);
        EXPECT_EQ(got[i].evidence[k].kind, "folded");
        EXPECT_EQ(got[i].evidence[k].detail.rfind("also seen by rule " + rule + " over ", 0), 0u)
            << got[i].evidence[k].detail;
        EXPECT_NE(got[i].evidence[k].detail.find(": " + summary), std::string::npos) << got[i].evidence[k].detail;
        ++folded_total;
      }
    }
    if (HasFailure()) return;
  }
  EXPECT_GT(folded_total, 100u);
  EXPECT_GT(kept_same_thread, 100u);  // tail chains on a finding's thread that stay (window, node)
  EXPECT_GT(touching, 100u);
}

TEST(ChainAnnotate, FoldIntoFindingsOverTimeByHand) {
  constexpr uint64_t kSec = 1'000'000'000;
  auto chain = [](std::string id, bool over, const char* cat, uint32_t tid, uint64_t s, uint64_t e, Severity sev) {
    Chain c;
    c.id = std::move(id);
    c.rule = over ? "input_wait" : "blocking_tail";
    c.over_time = over;
    c.category = cat;
    c.pid = 7;
    c.tid = tid;
    c.window_start = s;
    c.window_end = e;
    c.severity = sev;
    c.summary = "s-" + c.id;
    return c;
  };
  std::vector<Chain> v = {
      chain("tail_in", false, "input_starvation", 70, 3 * kSec + 500'000'000, 4 * kSec, Severity::kHigh),
      chain("finding", true, "input_starvation", 70, 2 * kSec, 5 * kSec, Severity::kMedium),
      chain("tail_after", false, "input_starvation", 70, 5 * kSec, 6 * kSec, Severity::kHigh),  // touches
      chain("tail_other_cat", false, "blocking", 70, 3 * kSec, 4 * kSec, Severity::kLow),
      chain("tail_other_tid", false, "input_starvation", 71, 3 * kSec, 4 * kSec, Severity::kLow),
      chain("tail_no_tid", false, "input_starvation", 0, 3 * kSec, 4 * kSec, Severity::kLow),
  };
  fold_into_findings_over_time(v);
  std::vector<std::string> ids;
  for (const auto& c : v) ids.push_back(c.id);
  EXPECT_EQ(ids,
            (std::vector<std::string>{"finding", "tail_after", "tail_other_cat", "tail_other_tid", "tail_no_tid"}));
  ASSERT_EQ(v[0].evidence.size(), 1u);
  EXPECT_EQ(v[0].evidence[0].kind, "folded");
  EXPECT_EQ(v[0].evidence[0].detail, "also seen by rule blocking_tail over 500 ms of this window: s-tail_in");
  EXPECT_EQ(v[0].severity, Severity::kHigh);  // the folded chain's, higher
}

// describe_wait: an input_starvation finding over time says where it waited (the call site of its
// top off-CPU stack), once; other findings and chains without such a stack are left as they are.
TEST(ChainAnnotate, DescribeWaitNamesTheWaitSiteOnce) {
  auto frame = [](FrameKind k, const char* fn, const char* file = "", uint32_t line = 0) {
    StackFrame f;
    f.kind = k;
    f.function = fn;
    f.file = file;
    f.line = line;
    return f;
  };
  Chain c;
  c.over_time = true;
  c.category = "input_starvation";
  c.summary = "thread 7 waited";
  ChainStack st;
  st.role = "offcpu";
  st.share = 0.9;
  st.frames = {frame(FrameKind::kKernel, "futex_wait"), frame(FrameKind::kNative, "pthread_cond_wait"),
               frame(FrameKind::kPython, "get", "queue.py", 171), frame(FrameKind::kPython, "main", "train.py", 40)};
  c.stacks.push_back(st);
  describe_wait(c);
  EXPECT_EQ(c.summary.rfind("thread 7 waited; waiting in ", 0), 0u) << c.summary;
  EXPECT_NE(c.summary.find("queue.py:171"), std::string::npos) << c.summary;  // the innermost Python frame
  EXPECT_NE(c.explanation.find("futex_wait"), std::string::npos) << c.explanation;
  const std::string once = c.summary, explanation = c.explanation;
  describe_wait(c);
  EXPECT_EQ(c.summary, once);
  EXPECT_EQ(c.explanation, explanation);
  for (auto [over, cat] : {std::pair<bool, const char*>{false, "input_starvation"}, {true, "cpu_contention"}}) {
    Chain o = c;
    o.summary = "s";
    o.explanation.clear();
    o.over_time = over;
    o.category = cat;
    describe_wait(o);
    EXPECT_EQ(o.summary, "s");
    EXPECT_TRUE(o.explanation.empty());
  }
  Chain none = c;
  none.summary = "s";
  none.stacks.clear();
  describe_wait(none);
  EXPECT_EQ(none.summary, "s");
}

}  // namespace
