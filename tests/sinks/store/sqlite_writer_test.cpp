// The SQLite sink: round trips, Ingero compatibility, stored results, crash safety.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/ops.h"
#include "model/result_json.h"
#include "sinks/store/sql_query.h"
#include "sinks/store/sqlite_store.h"
#include "tests/sinks/store/sqlite_test_util.h"

namespace ingero {
namespace {

using test::TempDir;

#define REQUIRE_SAMPLE(var, name)                    \
  const std::string var = test::shared_sample(name); \
  if (var.empty())                                   \
  GTEST_SKIP() << "Ingero sample " << name << " not found under INGERO_SHARED_DATA (" << INGERO_SHARED_DATA << ")"

constexpr uint64_t kT0 = 1'760'000'000'000'000'000ull;

Event call(uint64_t ts, uint64_t dur, Source s, uint8_t op, uint64_t id) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.source = s;
  e.op = op;
  e.id = id;
  e.pid = 4242;
  e.tid = 4243;
  return e;
}

// A little of everything the reader must give back bit for bit.
std::vector<Event> varied_events() {
  std::vector<Event> v;
  uint64_t id = 1;
  for (int i = 0; i < 40; ++i) {
    const uint64_t ts = kT0 + static_cast<uint64_t>(i) * 1'000'000;
    Event launch = call(ts, 7'000 + static_cast<uint64_t>(i), Source::kCuda, op::kCudaLaunchKernel, id++);
    launch.arg0 = 0xffff'8000'dead'beefull;  // kernel pointer with the top bit set
    launch.stack_id = 0x9e37'79b9'7f4a'7c15ull;
    launch.cgroup_id = 0x8000'0000'0000'0001ull;
    launch.node = static_cast<uint16_t>(i % 3);
    launch.rank = static_cast<int16_t>(i % 3 == 0 ? -1 : i % 3 - 1);
    launch.gpu_id = static_cast<uint8_t>(i % 2);
    launch.ret = i == 7 ? 700 : 0;  // one failed launch
    v.push_back(launch);

    Event off = call(ts + 100, 250'000, Source::kHost, op::kSchedSwitch, id++);
    off.arg1 = 999;  // who ran instead
    off.prev_state = static_cast<OffCpuState>(i % 5);
    off.flags = i == 39 ? event_flags::kTruncated : 0;
    off.node = launch.node;
    off.rank = launch.rank;
    v.push_back(off);
  }
  // Two events at the same instant: order must survive (stable by insertion).
  v.push_back(call(kT0 + 50'000'000, 10, Source::kNccl, op::kNcclAllReduce, id++));
  v.push_back(call(kT0 + 50'000'000, 20, Source::kDriver, op::kCuMemcpyHtoD, id++));
  v.back().arg0 = std::numeric_limits<uint64_t>::max();
  v.back().ret = -1;
  std::stable_sort(v.begin(), v.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return v;
}

TraceMeta varied_meta() {
  TraceMeta m;
  m.path = "capture";
  m.format = "live";
  m.nodes = {"", "gpu-a", "rack:7:gpu-b"};  // a colon in a node name must not confuse ids
  m.process_names = {{4242, "python3"}, {1, "systemd"}};
  m.stacks[0x9e37'79b9'7f4a'7c15ull] = {"[\"0x7f00\"]", "[{\"s\":\"cudaLaunchKernel\",\"f\":\"libcudart.so\"}]"};
  SessionInfo s;
  s.started_at = kT0 - 5;
  s.stopped_at = kT0 + 1'000'000'000;
  s.gpu_model = "Test GPU";
  s.cpu_cores = 16;
  s.mem_total_mb = 64000;
  s.tool_ver = "ingero-pipeline 0.1.0";
  s.flags = "record";
  m.sessions.push_back(s);
  m.snapshots.push_back({kT0, 12.5, 40.25, 1.5, 2048, 0});
  m.snapshots.push_back({kT0 + 1'000'000'000, 99.0, 41.0, 3.75, 1024, 8});
  m.health.skip("unknown op id (source 1 CUDA, op 42)", 3);
  m.health.dropped_events = 17;
  return m;
}

void expect_same_events(const std::vector<Event>& got, const std::vector<Event>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_TRUE(test::same_event(got[i], want[i]))
        << "event " << i << "\n got  " << test::describe(got[i]) << "\n want " << test::describe(want[i]);
}

TEST(SqliteSink, RoundTripGivesIdenticalEventsAndMeta) {
  TempDir dir;
  const std::string p = dir.file("out.db");
  const auto events = varied_events();
  const auto meta = varied_meta();
  std::string error;
  SqliteSink::Options opt;
  opt.commit_every = 7;  // several transactions, the last one partial
  auto sink = SqliteSink::create(p, error, opt);
  ASSERT_NE(sink, nullptr) << error;
  ASSERT_TRUE(sink->write_meta(meta)) << sink->error();
  ASSERT_TRUE(sink->write_events(std::span(events).first(30))) << sink->error();
  ASSERT_TRUE(sink->write_events(std::span(events).subspan(30))) << sink->error();
  EXPECT_EQ(sink->events_written(), events.size());
  ASSERT_TRUE(sink->close(error)) << error;
  EXPECT_EQ(sink->events_committed(), events.size());

  auto src = open_sqlite_trace(p, error, 16);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);
  expect_same_events(d.events, events);
  const TraceMeta& m = src->meta();
  EXPECT_EQ(m.format, "ingero-pipeline-1");
  EXPECT_EQ(m.nodes, meta.nodes);
  EXPECT_EQ(m.process_names, meta.process_names);
  ASSERT_EQ(m.stacks.size(), 1u);
  EXPECT_EQ(m.stacks.begin()->first, meta.stacks.begin()->first);
  EXPECT_EQ(m.stacks.begin()->second.ips, meta.stacks.begin()->second.ips);
  EXPECT_EQ(m.stacks.begin()->second.frames, meta.stacks.begin()->second.frames);
  ASSERT_EQ(m.sessions.size(), 1u);
  EXPECT_EQ(m.sessions[0].gpu_model, "Test GPU");
  EXPECT_EQ(m.sessions[0].tool_ver, "ingero-pipeline 0.1.0");
  EXPECT_EQ(m.sessions[0].started_at, meta.sessions[0].started_at);
  EXPECT_EQ(m.sessions[0].mem_total_mb, 64000u);
  ASSERT_EQ(m.snapshots.size(), 2u);
  EXPECT_EQ(m.snapshots[1].cpu_pct, 99.0);
  EXPECT_EQ(m.snapshots[1].load_avg, 3.75);
  EXPECT_EQ(m.snapshots[1].swap_mb, 8u);
  // The recorded health travels with the trace: its results stay qualified on replay.
  EXPECT_EQ(m.health.reasons, meta.health.reasons);
  EXPECT_EQ(m.health.dropped_events, 17u);
  EXPECT_EQ(m.health.rows_read, events.size());
  EXPECT_EQ(m.first_ts, events.front().ts_ns);
}

TEST(SqliteSink, EmptyTraceReplaysAsOneFinalBatch) {
  TempDir dir;
  const std::string p = dir.file("empty.db");
  std::string error;
  auto sink = SqliteSink::create(p, error);
  ASSERT_NE(sink, nullptr) << error;
  ASSERT_TRUE(sink->close(error)) << error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);
  ASSERT_EQ(d.batches.size(), 1u);
  EXPECT_TRUE(d.batches[0].final);
  EXPECT_TRUE(d.events.empty());
  EXPECT_EQ(src->meta().format, "ingero-pipeline-1");
  EXPECT_EQ(src->meta().health.rows_read, 0u);
}

TEST(SqliteSink, WritesIngeroConventionsAndTables) {
  TempDir dir;
  const std::string p = dir.file("compat.db");
  std::string error;
  auto sink = SqliteSink::create(p, error);
  ASSERT_NE(sink, nullptr) << error;
  const auto events = varied_events();
  ASSERT_TRUE(sink->write_meta(varied_meta()));
  ASSERT_TRUE(sink->write_events(events));
  ASSERT_TRUE(sink->close(error)) << error;

  // sched_switch is stored at its END, as Ingero does.
  const Event& off = events[1];
  ASSERT_EQ(off.op, op::kSchedSwitch);
  EXPECT_EQ(test::query_int(p, "SELECT timestamp FROM events WHERE source=3 AND op=1 ORDER BY timestamp LIMIT 1"),
            static_cast<int64_t>(off.end_ns()));
  // Ids: "{node}:{seq}", plain "{seq}" for the unnamed node; rank NULL when unknown.
  EXPECT_EQ(test::query_text(p, "SELECT id FROM events WHERE node='gpu-a' ORDER BY timestamp LIMIT 1"), "gpu-a:3");
  EXPECT_EQ(test::query_text(p, "SELECT id FROM events WHERE node='' ORDER BY timestamp LIMIT 1"), "1");
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM events WHERE rank IS NULL AND node=''"), 30);
  EXPECT_EQ(test::query_text(p, "SELECT value FROM schema_info WHERE key='version'"), "0.9");
  EXPECT_EQ(test::query_text(p, "SELECT value FROM ip_meta WHERE key='format'"), "ingero-pipeline-1");
  // Ingero's own example query names every row through sources/ops.
  EXPECT_EQ(test::query_int(p,
                            "SELECT count(*) FROM events e JOIN sources s ON e.source = s.id "
                            "JOIN ops o ON e.source = o.source_id AND e.op = o.op_id"),
            static_cast<int64_t>(events.size()));
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM ops"), static_cast<int64_t>(all_ops().size()));
  EXPECT_EQ(test::query_text(p, "SELECT name FROM ops WHERE source_id=9 AND op_id=1"), "ncclAllReduce");
  // WAL is persistent: the header's read/write version bytes (offsets 18, 19) are 2.
  const std::string header = test::read_file(p).substr(0, 100);
  EXPECT_EQ(header[18], 2);
  EXPECT_EQ(header[19], 2);

  REQUIRE_SAMPLE(sample, "sample-cluster.db");
  // Every table and column of Ingero 0.9 exists in ours, so SQL written for Ingero runs here.
  const char* tables[] = {"events",        "stack_traces",     "causal_chains",    "sources",
                          "ops",           "schema_info",      "system_snapshots", "sessions",
                          "process_names", "event_aggregates", "cgroup_metadata",  "cgroup_schedstat"};
  for (const char* t : tables) {
    const std::string cols_sql = std::string(
                                     "SELECT group_concat(name, ',') FROM (SELECT name FROM pragma_table_info('") +
                                 t + "') ORDER BY name)";
    const std::string theirs = test::query_text(sample, cols_sql);
    ASSERT_FALSE(theirs.empty()) << t;
    std::string missing;
    size_t start = 0;
    while (start <= theirs.size()) {
      const size_t comma = std::min(theirs.find(',', start), theirs.size());
      const std::string col = theirs.substr(start, comma - start);
      if (test::query_int(p, std::string("SELECT count(*) FROM pragma_table_info('") + t + "') WHERE name='" + col +
                                 "'") != 1)
        missing += col + " ";
      start = comma + 1;
    }
    EXPECT_EQ(missing, "") << "table " << t;
  }
}

TEST(SqliteSink, ReplayOfRealTraceSurvivesRoundTrip) {
  REQUIRE_SAMPLE(sample, "sample-cluster.db");
  std::string error;
  auto in = open_sqlite_trace(sample, error);
  ASSERT_NE(in, nullptr) << error;
  const auto original = test::drain(*in);
  TempDir dir;
  const std::string p = dir.file("copy.db");
  auto sink = SqliteSink::create(p, error);
  ASSERT_NE(sink, nullptr) << error;
  ASSERT_TRUE(sink->write_meta(in->meta()));
  ASSERT_TRUE(sink->write_events(original.events));
  ASSERT_TRUE(sink->close(error)) << error;
  auto again = open_sqlite_trace(p, error);
  ASSERT_NE(again, nullptr) << error;
  expect_same_events(test::drain(*again).events, original.events);
  EXPECT_EQ(again->meta().nodes, in->meta().nodes);
  EXPECT_EQ(again->meta().stacks.size(), in->meta().stacks.size());
}

AnalysisResult sample_result() {
  AnalysisResult r;
  r.meta = varied_meta();
  OpStats o;
  o.source = Source::kCuda;
  o.op = op::kCudaLaunchKernel;
  o.count = 40;
  o.p50_ns = 7'020;
  o.p95_ns = 7'038;
  o.p99_ns = 7'039;
  o.min_ns = 7'000;
  o.max_ns = 7'039;
  o.total_ns = 280'780;
  o.tail_ratio = 7039.0 / 7020.0;
  o.errors = 1;
  r.ops.push_back(o);
  o.source = Source::kHost;
  o.op = op::kSchedSwitch;
  o.exact = false;
  o.rel_error = 0.01;
  r.ops.push_back(o);
  Chain c;
  c.id = "launch_tail_offcpu:4242/4243:1760000000000000000";
  c.rule = "launch_tail_offcpu";
  c.rule_hash = "ab12cd34";
  c.severity = Severity::kHigh;
  c.category = "cpu_contention";
  c.source = Source::kCuda;
  c.op = op::kCudaLaunchKernel;
  c.pid = 4242;
  c.tid = 4243;
  c.node = 1;
  c.rank = 0;
  c.window_start = kT0;
  c.window_end = kT0 + 10'000'000'000;
  c.summary = "cudaLaunchKernel p99=25.8ms (352x p50): thread 4243 off CPU for 91% of the tail";
  c.root_cause = "CPU contention";
  c.explanation = "The launching thread was preempted.";
  c.recommendations = {"pin the thread with taskset", "renice background work"};
  c.evidence = {{"tail", "16 slow launches", 25'800'000, "ns", {1, 3, 5}},
                {"offcpu", "preempted 34 times", 23'500'000, "ns", {2, 4}}};
  c.predicates = {{"p99 / p50 >= 10", 352.5, 10, 342.5, true, "352.5x", "10x"},
                  {"share >= 50%", 0.91, 0.5, 0.41, true, "91%", "50%"}};
  c.values = {{"p50", 73'194}, {"p99", 25'799'899}, {"share", 0.91}};
  c.p50_ns = 73'194;
  c.p99_ns = 25'799'899;
  c.tail_ratio = 352.48;
  c.dropped_events = 2;
  r.chains.push_back(c);
  Chain c2 = c;
  c2.id = "io:1";
  c2.rule = "block_io";
  c2.severity = Severity::kLow;
  c2.node = 0;
  c2.rank = -1;
  c2.op = 0;
  c2.source = Source::kIo;
  c2.evidence = {{"block_io", "reads", 1000, "bytes", {}}};
  c2.predicates.clear();
  c2.values.clear();
  r.chains.push_back(c2);
  RuleOutcome fired;
  fired.rule = "launch_tail_offcpu";
  fired.rule_hash = "ab12cd34";
  fired.category = "cpu_contention";
  fired.windows = 9;
  fired.chains = 1;
  RuleOutcome missed;
  missed.rule = "memcpy_pageable";
  missed.rule_hash = "77";
  missed.category = "memory";
  missed.windows = 4;
  missed.has_miss = true;
  missed.miss_stage = 2;
  missed.miss = {"p99 / p50 >= 10", 3.5, 10, -6.5, false, "3.5x", "10x"};
  missed.miss_key = "pid=2233 op=cudaMemcpyAsync";
  missed.miss_window_start = kT0;
  missed.miss_window_end = kT0 + 10'000'000'000;
  missed.miss_values = {{"p50", 1200}, {"p99", 4200}};
  r.rules = {fired, missed};
  r.counters.events_in = 82;
  r.counters.late_events = 1;
  r.counters.threads = 2;
  return r;
}

TEST(SqliteSink, ResultRoundTripAndIngeroChainRows) {
  TempDir dir;
  const std::string p = dir.file("result.db");
  const AnalysisResult r = sample_result();
  std::string error;
  auto sink = SqliteSink::create(p, error);
  ASSERT_NE(sink, nullptr) << error;
  ASSERT_TRUE(sink->write_result(r)) << sink->error();  // writes meta too (none written yet)
  ASSERT_TRUE(sink->close(error)) << error;

  // Ingero's causal_chains view of the first chain.
  const std::string where = " FROM causal_chains WHERE id='" + r.chains[0].id + "'";
  EXPECT_EQ(test::query_text(p, "SELECT severity" + where), "HIGH");
  EXPECT_EQ(test::query_text(p, "SELECT cuda_op" + where), "cudaLaunchKernel");
  EXPECT_EQ(test::query_int(p, "SELECT cuda_p99_us" + where), 25'799);
  EXPECT_EQ(test::query_int(p, "SELECT cuda_p50_us" + where), 73);
  EXPECT_EQ(test::query_int(p, "SELECT detected_at" + where), static_cast<int64_t>(r.chains[0].window_end));
  EXPECT_EQ(test::query_text(p, "SELECT node" + where), "gpu-a");
  const auto recs = nlohmann::json::parse(test::query_text(p, "SELECT recommendations" + where));
  EXPECT_EQ(recs, nlohmann::json(r.chains[0].recommendations));
  const auto timeline = nlohmann::json::parse(test::query_text(p, "SELECT timeline" + where));
  ASSERT_EQ(timeline.size(), 2u);
  EXPECT_EQ(timeline[0]["layer"], "CUDA");
  EXPECT_EQ(timeline[0]["op"], "cudaLaunchKernel");
  EXPECT_EQ(timeline[0]["dur_us"], 25'800);
  EXPECT_EQ(timeline[1]["layer"], "HOST");
  EXPECT_EQ(timeline[1]["op"], "sched_switch");
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM ip_op_stats"), 2);

  AnalysisResult back;
  ASSERT_TRUE(read_result(p, back, error)) << error;
  EXPECT_EQ(back.meta.format, "ingero-pipeline-1");
  EXPECT_EQ(back.meta.nodes, r.meta.nodes);
  ASSERT_EQ(back.ops.size(), 2u);
  EXPECT_EQ(back.ops[1].op, op::kSchedSwitch);
  EXPECT_FALSE(back.ops[1].exact);
  EXPECT_EQ(back.ops[1].rel_error, 0.01);
  EXPECT_EQ(back.ops[0].tail_ratio, r.ops[0].tail_ratio);
  EXPECT_EQ(back.ops[0].errors, 1u);
  EXPECT_EQ(back.counters.events_in, 82u);
  EXPECT_EQ(back.counters.late_events, 1u);
  EXPECT_EQ(back.counters.threads, 2u);
  ASSERT_EQ(back.chains.size(), 2u);
  const Chain& a = back.chains[0];
  const Chain& b = r.chains[0];
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.rule, b.rule);
  EXPECT_EQ(a.rule_hash, b.rule_hash);
  EXPECT_EQ(a.severity, b.severity);
  EXPECT_EQ(a.category, b.category);
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.pid, b.pid);
  EXPECT_EQ(a.tid, b.tid);
  EXPECT_EQ(a.node, b.node);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.window_start, b.window_start);
  EXPECT_EQ(a.window_end, b.window_end);
  EXPECT_EQ(a.summary, b.summary);
  EXPECT_EQ(a.root_cause, b.root_cause);
  EXPECT_EQ(a.explanation, b.explanation);
  EXPECT_EQ(a.recommendations, b.recommendations);
  ASSERT_EQ(a.evidence.size(), b.evidence.size());
  for (size_t i = 0; i < a.evidence.size(); ++i) {
    EXPECT_EQ(a.evidence[i].kind, b.evidence[i].kind);
    EXPECT_EQ(a.evidence[i].detail, b.evidence[i].detail);
    EXPECT_EQ(a.evidence[i].value, b.evidence[i].value);
    EXPECT_EQ(a.evidence[i].unit, b.evidence[i].unit);
    EXPECT_EQ(a.evidence[i].event_ids, b.evidence[i].event_ids);
  }
  ASSERT_EQ(a.predicates.size(), 2u);
  EXPECT_EQ(a.predicates[0].label, b.predicates[0].label);
  EXPECT_EQ(a.predicates[0].lhs, b.predicates[0].lhs);
  EXPECT_EQ(a.predicates[1].margin, b.predicates[1].margin);
  EXPECT_TRUE(a.predicates[1].passed);
  // The sides as the rule printed them, with their units (html and text reports show these).
  EXPECT_EQ(a.predicates[0].lhs_text, "352.5x");
  EXPECT_EQ(a.predicates[1].lhs_text, b.predicates[1].lhs_text);
  EXPECT_EQ(a.predicates[1].rhs_text, "50%");
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.p50_ns, b.p50_ns);
  EXPECT_EQ(a.p99_ns, b.p99_ns);
  EXPECT_EQ(a.tail_ratio, b.tail_ratio);
  EXPECT_EQ(a.dropped_events, b.dropped_events);
  ASSERT_EQ(back.rules.size(), 2u);
  EXPECT_EQ(back.rules[0].rule, "launch_tail_offcpu");
  EXPECT_EQ(back.rules[0].chains, 1u);
  EXPECT_FALSE(back.rules[0].has_miss);
  const RuleOutcome& m = back.rules[1];
  EXPECT_EQ(m.rule, "memcpy_pageable");
  EXPECT_EQ(m.category, "memory");
  EXPECT_EQ(m.windows, 4u);
  EXPECT_TRUE(m.has_miss);
  EXPECT_EQ(m.miss_stage, 2);
  EXPECT_EQ(m.miss.label, "p99 / p50 >= 10");
  EXPECT_EQ(m.miss.lhs, 3.5);
  EXPECT_EQ(m.miss.margin, -6.5);
  EXPECT_FALSE(m.miss.passed);
  EXPECT_EQ(m.miss.lhs_text, "3.5x");
  EXPECT_EQ(m.miss.rhs_text, "10x");
  EXPECT_EQ(m.miss_key, "pid=2233 op=cudaMemcpyAsync");
  EXPECT_EQ(m.miss_window_end, kT0 + 10'000'000'000);
  EXPECT_EQ(m.miss_values, r.rules[1].miss_values);
  EXPECT_EQ(back.chains[1].id, "io:1");
  EXPECT_EQ(back.chains[1].rank, -1);
  EXPECT_EQ(test::query_text(p, "SELECT exemplars FROM ip_chains WHERE id='" + b.id + "'"), "[1,3,5,2,4]");
}

TEST(SqliteSink, ReadResultOfIngeroTraceUsesCausalChains) {
  REQUIRE_SAMPLE(sample, "pytorch-dataloader-starvation.db");
  AnalysisResult r;
  std::string error;
  ASSERT_TRUE(read_result(sample, r, error)) << error;
  ASSERT_EQ(r.chains.size(), 316u);
  const Chain& c = r.chains[0];
  EXPECT_EQ(c.id, "chain-001");
  EXPECT_EQ(c.rule, "ingero");
  EXPECT_EQ(c.source, Source::kCuda);
  EXPECT_EQ(c.op, op::kCudaLaunchKernel);
  EXPECT_EQ(c.p99_ns, 25'799'000u);
  EXPECT_EQ(c.recommendations.size(), 2u);
  ASSERT_EQ(c.evidence.size(), 2u);
  EXPECT_EQ(c.evidence[0].kind, "offcpu");
  EXPECT_EQ(c.evidence[1].kind, "tail");

  TempDir dir;
  const std::string p = dir.file("plain.db");
  ASSERT_EQ(test::run_sql(p, "CREATE TABLE t(x)"), "");
  EXPECT_FALSE(read_result(p, r, error));
  EXPECT_EQ(error, p + ": no stored results (neither ip_chains nor causal_chains table)");
}

// The time accounting (whole trace and per chain) and the steps travel with the result:
// ip_accounting, ip_steps and ip_chains.accounting/over_time, given back by read_result exactly as
// explain --json shows them; a database written before they existed reads back without them.
TEST(SqliteSink, AccountingAndStepsRoundTrip) {
  constexpr uint64_t kS = 1'000'000'000;
  TempDir dir;
  const std::string p = dir.file("acct.db");
  AnalysisResult r = sample_result();
  ThreadAccounting a;
  a.pid = 4242;
  a.tid = 4243;
  a.comm = "python3";
  a.node = 1;
  a.rank = 0;
  a.start_ns = kT0;
  a.end_ns = kT0 + 10 * kS;
  a.wall_ns = 10 * kS;
  a.in_calls_ns = {{"launch", kS}, {"copy", 0}, {"sync", 3 * kS}, {"alloc", 1}, {"collective", 0}, {"other", 0}};
  a.on_cpu_ns = 2 * kS;
  a.preempted_ns = 1'500'000'000;
  a.preempted_by = {{1, 1, "systemd", kS}, {0, 999, "", 400'000'000}};
  a.blocked_ns = {{"lock", kS}, {"io", 0}, {"network", 0}, {"sleep", kS / 2 - 1}, {"other", 0}};
  a.unknown_ns = a.wall_ns - a.in_calls_total() - a.on_cpu_ns - a.preempted_ns - a.blocked_total();
  a.scheduler_data = true;
  ThreadAccounting b;
  b.pid = 7;
  b.tid = 8;
  b.node = 2;
  b.start_ns = kT0 + kS;
  b.end_ns = kT0 + 3 * kS;
  b.wall_ns = 2 * kS;
  for (const char* k : kCallKinds) b.in_calls_ns[k] = 0;
  for (const char* k : kBlockReasons) b.blocked_ns[k] = 0;
  b.in_calls_ns["collective"] = kS / 4;
  b.unknown_ns = b.wall_ns - kS / 4;
  r.accounting = {a, b};
  ProcessSteps s;
  s.pid = 4242;
  s.rank = 0;
  s.node = 1;
  s.count = 120;
  s.period_ns = 80'000'000;
  s.p50_ns = 79'000'000;
  s.p99_ns = 120'000'000;
  s.method = "annotated (step)";
  s.epochs = 3;
  s.confidence = 0.93;
  s.boundaries = {kT0 + 80'000'000, kT0 + 160'000'000, kT0 + 241'000'000};
  s.first_ns = kT0 + 1'000;
  s.last_ns = kT0 + 9 * kS;
  ProcessSteps n;
  n.pid = 7;
  n.node = 2;
  n.method = "none";
  n.reason = "fewer than 8 calls";
  n.fallback_interval_ns = kS;
  n.boundaries = {kT0 + kS, kT0 + 2 * kS};
  n.first_ns = kT0 + kS;
  n.last_ns = kT0 + 3 * kS;
  r.steps = {s, n};
  ThreadAccounting w = a;  // the chain's thread over its window
  w.start_ns = kT0 + 2 * kS;
  w.end_ns = kT0 + 4 * kS;
  w.wall_ns = 2 * kS;
  w.in_calls_ns = {{"launch", kS / 2}, {"copy", 0}, {"sync", kS / 2}, {"alloc", 0}, {"collective", 0}, {"other", 0}};
  w.on_cpu_ns = kS / 4;
  w.preempted_ns = kS / 2;
  w.preempted_by = {{1, 1, "systemd", kS / 2}};
  w.blocked_ns = {{"lock", kS / 4}, {"io", 0}, {"network", 0}, {"sleep", 0}, {"other", 0}};
  w.unknown_ns = 0;
  r.chains[0].accounting = w;
  r.chains[0].over_time = true;
  r.rules[1].over_time = true;

  std::string error;
  auto sink = SqliteSink::create(p, error);
  ASSERT_NE(sink, nullptr) << error;
  ASSERT_TRUE(sink->write_result(r)) << sink->error();
  ASSERT_TRUE(sink->close(error)) << error;

  // Plain SQL: totals as columns, the maps as JSON, the parts adding up to the wall time.
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM ip_accounting"), 2);
  EXPECT_EQ(test::query_int(p,
                            "SELECT count(*) FROM ip_accounting WHERE wall_ns != in_calls_total_ns + on_cpu_ns + "
                            "preempted_ns + blocked_total_ns + unknown_ns"),
            0);
  EXPECT_EQ(test::query_int(p, "SELECT tid FROM ip_accounting ORDER BY position LIMIT 1"), 4243);
  EXPECT_EQ(test::query_text(p, "SELECT node FROM ip_accounting WHERE tid = 4243"), "gpu-a");
  EXPECT_EQ(test::query_int(p, "SELECT json_extract(blocked_ns, '$.lock') FROM ip_accounting WHERE tid = 4243"),
            static_cast<int64_t>(kS));
  EXPECT_EQ(test::query_int(p, "SELECT in_calls_total_ns FROM ip_accounting WHERE tid = 4243"),
            static_cast<int64_t>(4 * kS + 1));
  EXPECT_EQ(test::query_text(p, "SELECT json_extract(preempted_by, '$[0].comm') FROM ip_accounting WHERE tid = 4243"),
            "systemd");
  EXPECT_EQ(test::query_int(p, "SELECT rank IS NULL FROM ip_accounting WHERE tid = 8"), 1);
  EXPECT_EQ(test::query_int(p, "SELECT scheduler_data FROM ip_accounting WHERE tid = 8"), 0);
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM ip_steps"), 2);
  EXPECT_EQ(test::query_text(p, "SELECT method FROM ip_steps WHERE pid = 4242"), "annotated (step)");
  EXPECT_EQ(test::query_int(p, "SELECT epochs FROM ip_steps WHERE pid = 4242"), 3);
  EXPECT_EQ(test::query_text(p, "SELECT node FROM ip_steps WHERE pid = 7"), "rack:7:gpu-b");
  EXPECT_EQ(test::query_int(p, "SELECT json_array_length(boundaries) FROM ip_steps WHERE pid = 4242"), 3);
  const std::string chain0 = " FROM ip_chains WHERE id='" + r.chains[0].id + "'";
  EXPECT_EQ(test::query_int(p, "SELECT over_time" + chain0), 1);
  EXPECT_EQ(test::query_int(p, "SELECT json_extract(accounting, '$.preempted_ns')" + chain0),
            static_cast<int64_t>(kS / 2));
  EXPECT_EQ(test::query_text(p, "SELECT accounting FROM ip_chains WHERE id='io:1'"), "null");
  // Ingero's table is the same as before.
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM causal_chains"), 2);

  AnalysisResult back;
  ASSERT_TRUE(read_result(p, back, error)) << error;
  const auto want = explain_json(r), got = explain_json(back);
  EXPECT_EQ(got["accounting"], want["accounting"]);
  EXPECT_EQ(got["steps"], want["steps"]);
  ASSERT_EQ(got["chains"].size(), want["chains"].size());
  EXPECT_EQ(got["rules"], want["rules"]);  // over_time included
  EXPECT_TRUE(back.rules[1].over_time);
  for (size_t i = 0; i < want["chains"].size(); ++i) {
    EXPECT_EQ(got["chains"][i]["accounting"], want["chains"][i]["accounting"]) << i;
    EXPECT_EQ(got["chains"][i]["over_time"], want["chains"][i]["over_time"]) << i;
  }
  ASSERT_TRUE(back.chains[0].accounting.has_value());
  EXPECT_EQ(back.chains[0].accounting->node, 1);
  EXPECT_FALSE(back.chains[1].accounting.has_value());
  // What the JSON leaves out survives too.
  ASSERT_EQ(back.accounting.size(), 2u);
  EXPECT_EQ(back.accounting[1].node, 2);
  ASSERT_EQ(back.steps.size(), 2u);
  EXPECT_EQ(back.steps[0].boundaries, s.boundaries);
  EXPECT_EQ(back.steps[0].first_ns, s.first_ns);
  EXPECT_EQ(back.steps[0].last_ns, s.last_ns);
  EXPECT_EQ(back.steps[0].epochs, 3u);
  EXPECT_EQ(back.steps[1].fallback_interval_ns, kS);
  EXPECT_EQ(back.steps[1].boundaries, n.boundaries);
  EXPECT_EQ(back.steps[1].node, 2);

  // A database from before: no ip_accounting/ip_steps, no accounting/over_time columns.
  // (Rebuilt rather than ALTER TABLE DROP COLUMN: SQLite cannot drop the last column of a table
  // whose previous column line ends in a comment.)
  ASSERT_EQ(test::run_sql(p,
                          "DROP TABLE ip_accounting; DROP TABLE ip_steps; "
                          "ALTER TABLE ip_chains DROP COLUMN accounting; "
                          "CREATE TABLE old AS SELECT * FROM ip_chains; ALTER TABLE old DROP COLUMN over_time; "
                          "DROP TABLE ip_chains; ALTER TABLE old RENAME TO ip_chains; "
                          "CREATE TABLE old_ro AS SELECT * FROM ip_rule_outcomes; "
                          "ALTER TABLE old_ro DROP COLUMN over_time; DROP TABLE ip_rule_outcomes; "
                          "ALTER TABLE old_ro RENAME TO ip_rule_outcomes"),
            "");
  ASSERT_EQ(test::query_int(p,
                            "SELECT count(*) FROM pragma_table_info('ip_chains') WHERE name IN "
                            "('accounting', 'over_time')"),
            0);
  AnalysisResult old;
  ASSERT_TRUE(read_result(p, old, error)) << error;
  EXPECT_TRUE(old.accounting.empty());
  EXPECT_TRUE(old.steps.empty());
  ASSERT_EQ(old.chains.size(), 2u);
  EXPECT_FALSE(old.chains[0].accounting.has_value());
  EXPECT_FALSE(old.chains[0].over_time);
  EXPECT_EQ(old.chains[0].summary, r.chains[0].summary);
  ASSERT_EQ(old.rules.size(), 2u);
  EXPECT_FALSE(old.rules[1].over_time);
  EXPECT_EQ(old.rules[1].miss_key, r.rules[1].miss_key);
}

TEST(SqliteSink, RefusesToClobberNonSqliteFilesAndReplacesOldDatabases) {
  TempDir dir;
  const std::string notes = dir.file("notes.txt");
  test::write_file(notes, "precious\n");
  std::string error;
  EXPECT_EQ(SqliteSink::create(notes, error), nullptr);
  EXPECT_EQ(error, notes + ": exists and is not a SQLite database; refusing to overwrite it");
  EXPECT_EQ(test::read_file(notes), "precious\n");
  EXPECT_EQ(SqliteSink::create(dir.path(), error), nullptr);
  EXPECT_EQ(error, dir.path() + ": is a directory; give a file path for the database");

  const std::string p = dir.file("old.db");
  {
    auto sink = SqliteSink::create(p, error);
    ASSERT_NE(sink, nullptr) << error;
    const auto ev = varied_events();
    ASSERT_TRUE(sink->write_events(ev));
  }  // destructor commits and closes
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM events"), 82);
  SqliteSink::Options keep;
  keep.overwrite = false;
  EXPECT_EQ(SqliteSink::create(p, error, keep), nullptr);
  EXPECT_EQ(error, p + ": already exists (refusing to overwrite)");
  auto fresh = SqliteSink::create(p, error);
  ASSERT_NE(fresh, nullptr) << error;
  ASSERT_TRUE(fresh->close(error));
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM events"), 0);
}

TEST(SqliteSink, UnrepresentableEventsAreCountedNotWritten) {
  TempDir dir;
  const std::string p = dir.file("far.db");
  std::string error;
  auto sink = SqliteSink::create(p, error);
  ASSERT_NE(sink, nullptr) << error;
  std::vector<Event> ev = {call(kT0, 5, Source::kCuda, op::kCudaMalloc, 1),
                           call(std::numeric_limits<uint64_t>::max() - 3, 1, Source::kCuda, op::kCudaMalloc, 2)};
  ASSERT_TRUE(sink->write_events(ev));
  EXPECT_EQ(sink->events_rejected(), 1u);
  ASSERT_TRUE(sink->close(error)) << error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  EXPECT_EQ(test::drain(*src).events.size(), 1u);
  EXPECT_EQ(src->meta().health.reasons.at("writer: time past year 2262 (not representable as a SQLite integer)"), 1u);
}

TEST(SqliteSink, ReaderSeesCommittedEventsWhileWriterIsOpen) {
  TempDir dir;
  const std::string p = dir.file("live.db");
  std::string error;
  SqliteSink::Options opt;
  opt.commit_every = 0;  // commit only when asked
  auto sink = SqliteSink::create(p, error, opt);
  ASSERT_NE(sink, nullptr) << error;
  const auto events = varied_events();
  ASSERT_TRUE(sink->write_events(std::span(events).first(60)));
  ASSERT_TRUE(sink->commit());
  ASSERT_TRUE(sink->write_events(std::span(events).subspan(60)));  // pending, not committed
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  EXPECT_EQ(test::drain(*src).events.size(), 60u);
  ASSERT_TRUE(sink->close(error)) << error;
  auto after = open_sqlite_trace(p, error);
  ASSERT_NE(after, nullptr) << error;
  EXPECT_EQ(test::drain(*after).events.size(), events.size());
}

TEST(SqliteSink, ReplayLeavesNoFilesBesideAClosedDatabase) {
  REQUIRE_SAMPLE(sample, "pytorch-dataloader-starvation.db");
  TempDir dir;
  const std::string p = dir.file("copy.db");
  test::write_file(p, test::read_file(sample));  // WAL-mode file, no -wal beside it
  std::string error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  EXPECT_EQ(test::drain(*src).events.size(), 3807u);
  src.reset();
  // Opened immutable: no -shm/-wal appears (read-only media and the shared folder stay intact).
  EXPECT_FALSE(std::filesystem::exists(p + "-shm"));
  EXPECT_FALSE(std::filesystem::exists(p + "-wal"));
}

int64_t event_index_count(const std::string& p) {
  return test::query_int(p,
                         "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN "
                         "('idx_events_timestamp', 'idx_events_pid', 'idx_events_id', "
                         "'idx_events_source_op_stack')");
}

// Deferred indexes: absent while the sink writes (readers and SQL work without them), built by
// close() after the last commit, announced through the progress callback.
TEST(SqliteSink, DeferredIndexesAreBuiltByClose) {
  TempDir dir;
  const std::string p = dir.file("deferred.db");
  std::string error;
  auto sink = SqliteSink::create(p, error);
  ASSERT_NE(sink, nullptr) << error;
  const auto events = varied_events();
  ASSERT_TRUE(sink->write_meta(varied_meta()));
  ASSERT_TRUE(sink->write_events(events));
  ASSERT_TRUE(sink->commit());

  EXPECT_EQ(event_index_count(p), 0);
  {
    auto src = open_sqlite_trace(p, error);
    ASSERT_NE(src, nullptr) << error;
    expect_same_events(test::drain(*src).events, events);
    auto runner = SqlQueryRunner::open(p, error);
    ASSERT_NE(runner, nullptr) << error;
    const SqlResult q = runner->run("SELECT id FROM events WHERE id = 'gpu-a:3'", {});
    ASSERT_TRUE(q.ok) << q.error;
    ASSERT_EQ(q.rows.size(), 1u);
  }

  std::vector<std::string> lines;
  ASSERT_TRUE(sink->close(error, [&](const std::string& l) { lines.push_back(l); })) << error;
  EXPECT_EQ(lines, (std::vector<std::string>{"indexing 82 events"}));
  EXPECT_EQ(event_index_count(p), 4);
  EXPECT_EQ(test::query_text(p, "PRAGMA integrity_check"), "ok");
  EXPECT_EQ(test::query_int(p, "PRAGMA page_size"), 16384);
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM pragma_index_list('events')"), 4);
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  expect_same_events(test::drain(*src).events, events);
}

TEST(SqliteSink, EagerIndexesAndPageSizeOption) {
  TempDir dir;
  const std::string p = dir.file("eager.db");
  std::string error;
  SqliteSink::Options opt;
  opt.defer_indexes = false;
  opt.page_size = 4096;
  auto sink = SqliteSink::create(p, error, opt);
  ASSERT_NE(sink, nullptr) << error;
  EXPECT_EQ(event_index_count(p), 4);
  std::vector<std::string> lines;
  ASSERT_TRUE(sink->close(error, [&](const std::string& l) { lines.push_back(l); })) << error;
  EXPECT_TRUE(lines.empty());
  EXPECT_EQ(test::query_int(p, "PRAGMA page_size"), 4096);

  opt.page_size = 1000;
  EXPECT_EQ(SqliteSink::create(dir.file("bad.db"), error, opt), nullptr);
  EXPECT_NE(error.find("page_size 1000"), std::string::npos) << error;
}

TEST(SqliteSink, RecordedDropsReachTheReader) {
  TempDir dir;
  const std::string p = dir.file("drops.db");
  std::string error;
  auto sink = SqliteSink::create(p, error);
  ASSERT_NE(sink, nullptr) << error;
  ASSERT_TRUE(sink->write_meta(varied_meta()));  // 17 dropped at capture
  ASSERT_TRUE(sink->record_drops("writer: spill failed", 5));
  ASSERT_TRUE(sink->record_drops("writer: spill failed", 2));
  ASSERT_TRUE(sink->close(error)) << error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  EXPECT_EQ(src->meta().health.dropped_events, 17u + 7u);
}

// The sink's crash-safety promise: kill -9 mid-write leaves a database that opens, passes
// integrity_check and holds a prefix of the events including every committed transaction.
Event crash_event(uint64_t i) {
  Event e = call(kT0 + i * 1000, 400, i % 2 ? Source::kHost : Source::kCuda,
                 i % 2 ? op::kSchedSwitch : op::kCudaLaunchKernel, i + 1);
  e.prev_state = i % 2 ? OffCpuState::kPreempted : OffCpuState::kUnknown;
  e.node = static_cast<uint16_t>(i % 2);
  e.arg0 = i * 3;
  return e;
}

TEST(SqliteSink, KillDashNineLeavesReadablePrefix) {
  TempDir dir;
  const std::string p = dir.file("crash.db");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    std::string err;
    SqliteSink::Options opt;
    opt.commit_every = 100;
    auto sink = SqliteSink::create(p, err, opt);
    if (!sink) ::_exit(2);
    TraceMeta meta;
    meta.nodes = {"", "n1"};
    if (!sink->write_meta(meta)) ::_exit(3);
    uint64_t reported = 0;
    for (uint64_t i = 0;; ++i) {
      const Event e = crash_event(i);
      if (!sink->write_events(std::span(&e, 1))) ::_exit(4);
      if (sink->events_committed() != reported) {
        reported = sink->events_committed();
        if (::write(fds[1], &reported, sizeof reported) != sizeof reported) ::_exit(5);
      }
    }
  }
  ::close(fds[1]);
  uint64_t committed = 0, msg = 0;
  // Let it get well into the run (many transactions), then kill it in the middle of one.
  while (committed < 5000 && ::read(fds[0], &msg, sizeof msg) == sizeof msg) committed = msg;
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(fds[0]);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "writer exited early with status " << status;
  ASSERT_GE(committed, 5000u);

  EXPECT_EQ(test::query_text(p, "PRAGMA integrity_check"), "ok");
  // Killed before close(): the deferred indexes were never built, and SQL still works.
  EXPECT_EQ(test::query_int(p, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'idx_events_%'"), 0);
  std::string error;
  auto runner = SqlQueryRunner::open(p, error);
  ASSERT_NE(runner, nullptr) << error;
  const SqlResult q = runner->run("SELECT count(*) FROM events WHERE pid = 4242 AND op = 3", {});
  ASSERT_TRUE(q.ok) << q.error;
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_GT(q.rows[0][0].integer, 0);
  runner.reset();
  AnalysisResult stored;
  EXPECT_TRUE(read_result(p, stored, error)) << error;
  auto src = open_sqlite_trace(p, error);
  ASSERT_NE(src, nullptr) << error;
  const auto d = test::drain(*src);
  EXPECT_EQ(src->meta().health.rows_skipped, 0u);
  EXPECT_EQ(src->meta().nodes, (std::vector<std::string>{"", "n1"}));
  ASSERT_GE(d.events.size(), committed);
  EXPECT_EQ(d.events.size() % 100, 0u) << "only whole transactions survive";
  // Sort back to write order (off-CPU spans start earlier than their row) and compare.
  auto got = d.events;
  std::sort(got.begin(), got.end(), [](const Event& a, const Event& b) { return a.id < b.id; });
  for (uint64_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(test::same_event(got[i], crash_event(i)))
        << i << ": " << test::describe(got[i]) << " vs " << test::describe(crash_event(i));
}

}  // namespace
}  // namespace ingero
