// MCP tools on traces whose chains point into the code (operators/chain_annotate.h): synthetic
// traces written to a temporary SQLite database with the sink, served by the real server.
// - explain_chain of a throughput drop carries the launching thread's time split and its thread;
// - explain_chain and get_stacks of a trace with Python frames return structured frames whose
//   keys are plain and whose trace strings are marked untrusted.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "engine/default_plans.h"
#include "model/ops.h"
#include "model/stack.h"
#include "model/synth.h"
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

}  // namespace
}  // namespace ingero::mcp
