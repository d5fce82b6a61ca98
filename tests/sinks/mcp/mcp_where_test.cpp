// MCP tools on traces whose chains point into the code (operators/chain_annotate.h): synthetic
// traces written to a temporary SQLite database with the sink, served by the real server.
// - explain_chain of a throughput drop carries the launching thread's time split and its thread;
// - explain_chain and get_stacks of a trace with Python frames return structured frames whose
//   keys are plain and whose trace strings are marked untrusted;
// - explain_chain carries the chain's thread's accounting over its window, and thread_accounting
//   gives a thread's accounting over the whole trace or a range, equal to the operator's own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "engine/default_plans.h"
#include "model/ops.h"
#include "model/stack.h"
#include "model/synth.h"
#include "operators/time_accounting.h"
#include "sinks/mcp/server.h"
#include "sinks/store/sqlite_store.h"

namespace ingero::mcp {
namespace {

constexpr uint64_t kMs = 1'000'000, kUs = 1'000;

class McpWhereTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("mcp_where_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  void serve(const synth::SynthTrace& t) {
    const std::string path = (dir_ / "trace.db").string();
    std::string error;
    auto sink = SqliteSink::create(path, error);
    ASSERT_TRUE(sink) << error;
    ASSERT_TRUE(sink->write_meta(t.meta));
    ASSERT_TRUE(sink->write_events(t.events));
    ASSERT_TRUE(sink->close(error)) << error;
    ServerOptions o;
    o.db_path = path;
    o.plan = default_plan();  // the hand-built analyses: this test is about the annotation, not the pack
    server_ = std::make_unique<Server>(o);
    Json init = {{"jsonrpc", "2.0"},
                 {"id", 1},
                 {"method", "initialize"},
                 {"params",
                  {{"protocolVersion", kLatestProtocol},
                   {"capabilities", Json::object()},
                   {"clientInfo", {{"name", "gtest"}, {"version", "1"}}}}}};
    ASSERT_TRUE(server_->handle_line(init.dump()));
    server_->handle_line(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  }
  Json ok(const std::string& tool, const Json& args = Json::object()) {
    Json msg = {{"jsonrpc", "2.0"},
                {"id", ++id_},
                {"method", "tools/call"},
                {"params", {{"name", tool}, {"arguments", args}}}};
    auto reply = server_->handle_line(msg.dump());
    EXPECT_TRUE(reply.has_value());
    if (!reply) return Json();
    Json r = Json::parse(*reply, nullptr, false);
    EXPECT_EQ(r["result"].value("isError", true), false) << r.dump().substr(0, 600);
    return r["result"]["structuredContent"];
  }
  Json chain_of(const std::string& category) {
    Json all = ok("get_causal_chains", {{"limit", 50}});
    for (const auto& c : all["chains"])
      if (c["category"] == category) return ok("explain_chain", {{"chain_id", c["id"]}});
    ADD_FAILURE() << "no " << category << " chain in " << all.dump().substr(0, 600);
    return Json();
  }
  std::string error_text(const std::string& tool, const Json& args) {
    Json msg = {{"jsonrpc", "2.0"},
                {"id", ++id_},
                {"method", "tools/call"},
                {"params", {{"name", tool}, {"arguments", args}}}};
    auto reply = server_->handle_line(msg.dump());
    EXPECT_TRUE(reply.has_value());
    if (!reply) return "";
    Json r = Json::parse(*reply, nullptr, false);
    EXPECT_EQ(r["result"].value("isError", false), true) << args.dump() << ": " << r.dump().substr(0, 600);
    return r["result"]["content"][0]["text"].get<std::string>();
  }
  static bool marked(const Json& v) { return v.is_string() && v.get<std::string>().rfind("<untrusted>", 0) == 0; }

  std::filesystem::path dir_;
  std::unique_ptr<Server> server_;
  int id_ = 1;
};

TEST_F(McpWhereTest, ThroughputDropCarriesTheLaunchingThreadsTimeSplit) {
  auto t = synth::make_throughput_drop(true);
  t.meta.thread_names[t.tid] = "EngineCore";
  // The launching thread sleeps 2 ms after each launch of the drop windows.
  std::vector<Event> extra;
  for (const auto& e : t.events)
    if (e.ts_ns >= t.fault_start && e.source == Source::kCuda && e.op == op::kCudaLaunchKernel) {
      Event s{};
      s.source = Source::kHost;
      s.op = op::kSchedSwitch;
      s.pid = s.tid = t.tid;
      s.ts_ns = e.ts_ns + 400 * kUs;
      s.dur_ns = 2 * kMs;
      s.prev_state = OffCpuState::kSleeping;
      extra.push_back(s);
    }
  t.events.insert(t.events.end(), extra.begin(), extra.end());
  std::stable_sort(t.events.begin(), t.events.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  for (size_t i = 0; i < t.events.size(); ++i) t.events[i].id = i + 1;
  serve(t);
  const Json ex = chain_of("throughput_drop");
  ASSERT_TRUE(ex.contains("time_split")) << ex.dump().substr(0, 800);
  EXPECT_EQ(ex["time_split"]["dominant"], "off_cpu_blocked");
  EXPECT_EQ(ex["time_split"]["tid"], t.tid);
  EXPECT_GT(ex["time_split"]["off_cpu_blocked"].get<double>(), 0.5);
  EXPECT_EQ(ex["tid"], t.tid);
  ASSERT_TRUE(ex["threads"].is_array());
  EXPECT_EQ(ex["threads"][0]["name"], "<untrusted>EngineCore</untrusted>");
}

TEST_F(McpWhereTest, PythonFramesComeOutStructuredAndMarked) {
  auto t = synth::make_cpu_contention(true);
  ParsedStack p;
  StackFrame lib;
  lib.function = "cudaLaunchKernel";
  lib.module = "libcudart.so.13";
  p.frames.push_back(lib);
  StackFrame py;
  py.kind = FrameKind::kPython;
  py.file = "train.py";
  py.function = "Model.forward";
  py.line = 142;
  p.frames.push_back(py);
  constexpr uint64_t kStack = 0x4242;
  t.meta.stacks[kStack] = encode_stack(p);
  for (auto& e : t.events)
    if (e.source == Source::kCuda && e.tid == t.tid) e.stack_id = kStack;
  serve(t);
  const Json ex = chain_of("cpu_contention");
  ASSERT_TRUE(ex["stacks"].is_array() && !ex["stacks"].empty()) << ex.dump().substr(0, 800);
  const Json& st = ex["stacks"][0];
  EXPECT_EQ(st["role"], "call");
  ASSERT_EQ(st["frames"].size(), 2u);
  EXPECT_EQ(st["frames"][1]["kind"], "python");
  EXPECT_EQ(st["frames"][1]["file"], "<untrusted>train.py</untrusted>");
  EXPECT_EQ(st["frames"][1]["function"], "<untrusted>Model.forward</untrusted>");
  EXPECT_EQ(st["frames"][1]["line"], 142);
  EXPECT_EQ(st["frames"][0]["module"], "<untrusted>libcudart.so.13</untrusted>");
  EXPECT_EQ(ex["call_site"], "<untrusted>train.py:142 in Model.forward</untrusted>");

  const Json s = ok("get_stacks", {{"op", "cudaLaunchKernel"}});
  ASSERT_EQ(s["stacks"].size(), 1u) << s.dump().substr(0, 600);
  const Json& f = s["stacks"][0]["frames"];
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[1]["kind"], "python");
  EXPECT_TRUE(marked(f[1]["file"]));
  EXPECT_EQ(f[1]["line"], 142);
  EXPECT_EQ(f[0]["kind"], "native");
  EXPECT_TRUE(marked(f[0]["function"]));
  for (const auto& fr : f)
    for (const auto& [k, v] : fr.items()) EXPECT_EQ(k.find("untrusted"), std::string::npos);
}

// The operator's own answer for one thread over [from, to), from the trace's events.
ThreadAccounting expected_accounting(const synth::SynthTrace& t, uint32_t tid, uint64_t from, uint64_t to) {
  AccountingOptions o;
  o.from_ns = from;
  o.to_ns = to;
  TimeAccounting acc(o);
  acc.observe(t.events.data(), t.events.size());
  for (const auto& a : acc.accounts(t.meta))
    if (a.tid == tid) return a;
  ADD_FAILURE() << "tid " << tid << " has no accounting";
  return {};
}

void expect_same_accounting(const Json& got, const ThreadAccounting& want) {
  EXPECT_EQ(got["tid"], want.tid);
  EXPECT_EQ(got["pid"], want.pid);
  EXPECT_EQ(got["start_ns"], want.start_ns);
  EXPECT_EQ(got["end_ns"], want.end_ns);
  EXPECT_EQ(got["wall_ns"], want.wall_ns);
  EXPECT_EQ(got["in_calls_ns"], Json(want.in_calls_ns));
  EXPECT_EQ(got["blocked_ns"], Json(want.blocked_ns));
  EXPECT_EQ(got["on_cpu_ns"], want.on_cpu_ns);
  EXPECT_EQ(got["preempted_ns"], want.preempted_ns);
  EXPECT_EQ(got["unknown_ns"], want.unknown_ns);
  EXPECT_EQ(got["scheduler_data"], want.scheduler_data);
  ASSERT_EQ(got["preempted_by"].size(), want.preempted_by.size());
  for (size_t i = 0; i < want.preempted_by.size(); ++i) {
    EXPECT_EQ(got["preempted_by"][i]["tid"], want.preempted_by[i].tid);
    EXPECT_EQ(got["preempted_by"][i]["ns"], want.preempted_by[i].ns);
  }
}

TEST_F(McpWhereTest, ExplainChainCarriesTheThreadsAccounting) {
  const auto t = synth::make_cpu_contention(true);
  serve(t);
  const Json ex = chain_of("cpu_contention");
  ASSERT_TRUE(ex.contains("accounting")) << ex.dump().substr(0, 800);
  const Json& a = ex["accounting"];
  EXPECT_EQ(a["tid"], t.tid);
  EXPECT_EQ(a["comm"], "<untrusted>python3 train.py</untrusted>");
  EXPECT_TRUE(a["scheduler_data"].get<bool>());
  uint64_t parts = a["on_cpu_ns"].get<uint64_t>() + a["preempted_ns"].get<uint64_t>() + a["unknown_ns"].get<uint64_t>();
  for (const auto& [k, v] : a["in_calls_ns"].items()) parts += v.get<uint64_t>();
  for (const auto& [k, v] : a["blocked_ns"].items()) parts += v.get<uint64_t>();
  EXPECT_EQ(parts, a["wall_ns"].get<uint64_t>());
  EXPECT_GT(a["preempted_ns"].get<uint64_t>(), 0u);
  ASSERT_FALSE(a["preempted_by"].empty());
  EXPECT_EQ(a["preempted_by"][0]["tid"], 31337);  // the synthetic CPU hog
  EXPECT_EQ(a["preempted_by"][0]["comm"], "<untrusted>stress-ng --cpu 8</untrusted>");
  EXPECT_GT(a["shares"]["preempted"].get<double>(), 0.0);
  EXPECT_FALSE(ex.contains("accounting_caveat"));
  // The list view stays small.
  const Json list = ok("get_causal_chains", {{"category", "cpu_contention"}});
  ASSERT_FALSE(list["chains"].empty());
  EXPECT_FALSE(list["chains"][0].contains("accounting"));
}

TEST_F(McpWhereTest, ThreadAccountingOverTheTraceAndARange) {
  const auto t = synth::make_cpu_contention(true);
  serve(t);
  const uint64_t t0 = t.events.front().ts_ns;
  uint64_t t1 = 0;
  for (const auto& e : t.events) t1 = std::max(t1, e.end_ns());
  // Whole trace, by tid and by pid: the operator's answer over every event.
  const Json whole = ok("thread_accounting", {{"tid", t.tid}});
  EXPECT_TRUE(whole["range"]["whole_trace"].get<bool>());
  EXPECT_EQ(whole["range"]["start_ns"], t0);
  EXPECT_EQ(whole["range"]["end_ns"], t1);
  expect_same_accounting(whole["accounting"], expected_accounting(t, t.tid, 0, UINT64_MAX));
  EXPECT_EQ(ok("thread_accounting", {{"pid", t.pid}})["accounting"], whole["accounting"]);
  EXPECT_FALSE(whole.contains("caveat"));
  // The fault's window, as offsets and as unix ns: exact to the ns, more preempted than overall.
  const Json in = ok("thread_accounting", {{"pid", t.pid}, {"from_s", 10}, {"to_s", 20}});
  EXPECT_FALSE(in["range"]["whole_trace"].get<bool>());
  EXPECT_EQ(in["range"]["start_ns"], t0 + 10'000'000'000);
  EXPECT_EQ(in["range"]["end_ns"], t0 + 20'000'000'000);
  const ThreadAccounting want = expected_accounting(t, t.tid, t0 + 10'000'000'000, t0 + 20'000'000'000);
  expect_same_accounting(in["accounting"], want);
  EXPECT_GT(want.preempted_ns, 0u);
  EXPECT_GT(in["accounting"]["shares"]["preempted"].get<double>(),
            whole["accounting"]["shares"]["preempted"].get<double>());
  const Json ns = ok("thread_accounting",
                     {{"tid", t.tid}, {"start_ns", t0 + 10'000'000'000}, {"end_ns", t0 + 20'000'000'000}});
  EXPECT_EQ(ns["accounting"], in["accounting"]);
  // Before the fault: nothing preempted the thread.
  const Json before = ok("thread_accounting", {{"tid", t.tid}, {"to_s", 9.5}});
  EXPECT_EQ(before["accounting"]["preempted_ns"], 0);
  expect_same_accounting(before["accounting"], expected_accounting(t, t.tid, 0, t0 + 9'500'000'000));
}

TEST_F(McpWhereTest, ThreadAccountingArgumentErrorsSayWhatToDo) {
  const auto t = synth::make_cpu_contention(true);
  serve(t);
  EXPECT_NE(error_text("thread_accounting", Json::object()).find("give `tid`"), std::string::npos);
  EXPECT_NE(error_text("thread_accounting", Json::object()).find("tid 4242"), std::string::npos);  // lists them
  EXPECT_NE(error_text("thread_accounting", {{"tid", 31337}}).find("no GPU-feeding thread matches tid 31337"),
            std::string::npos);
  EXPECT_NE(error_text("thread_accounting", {{"tid", t.tid}, {"pid", 1}}).find("no GPU-feeding thread matches"),
            std::string::npos);
  EXPECT_NE(error_text("thread_accounting", {{"tid", "4242"}}).find("must be an integer"), std::string::npos);
  EXPECT_NE(error_text("thread_accounting", {{"tid", t.tid}, {"from_s", -1}}).find("must be between"),
            std::string::npos);
  EXPECT_NE(error_text("thread_accounting", {{"tid", t.tid}, {"from_s", 100}}).find("outside the trace"),
            std::string::npos);
  EXPECT_NE(error_text("thread_accounting", {{"tid", t.tid}, {"from_s", 5}, {"to_s", 5}}).find("the range is empty"),
            std::string::npos);
  EXPECT_NE(error_text("thread_accounting", {{"tid", t.tid}, {"from_s", 5}, {"start_ns", 1}}).find("range start once"),
            std::string::npos);
  EXPECT_NE(error_text("thread_accounting", {{"tid", t.tid}, {"node", "nope"}}).find("no node named"),
            std::string::npos);
  EXPECT_NE(error_text("thread_accounting", {{"tid", t.tid}, {"bogus", 1}}).find("unknown argument `bogus`"),
            std::string::npos);
}

}  // namespace
}  // namespace ingero::mcp
