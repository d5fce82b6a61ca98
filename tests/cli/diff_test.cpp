// `ingero-pipeline diff`: generated pairs of traces of one training loop, each AFTER with one
// injected regression, written with the SQLite sink and compared by the real binary. The diff must
// name the injected cause first with the added time per step within 15% of what was injected; two
// runs of the same workload with different seeds must show no significant cause. Also: bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/ops.h"
#include "model/stack.h"
#include "sinks/store/sqlite_store.h"
#include "tests/util/run_command.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ingero;

constexpr uint64_t kUs = 1'000, kMs = 1'000'000, kSec = 1'000'000'000;
constexpr uint64_t kBase = 1'700'000'000 * kSec;
constexpr uint32_t kPid = 100, kTid = 101, kHogPid = 31337, kHogTid = 31338, kBgPid = 77;

enum class Fault { kNone, kCpuContention, kD2hSync, kSlowLoader };

struct Rng {  // splitmix64: the same trace on every platform
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t uni(uint64_t lo, uint64_t hi) { return lo + next() % (hi - lo + 1); }
};

struct Generated {
  std::string path;
  uint64_t steps = 0;
  uint64_t injected_ns = 0;  // the fault's total time
  double injected_per_step() const { return static_cast<double>(injected_ns) / static_cast<double>(steps); }
};

// `seconds` of a training loop on tid 101 ("trainer"): per step an H2D copy, 20 kernel launches
// with host work between them, a stream synchronisation waiting 5-7 ms for the GPU; background
// preemption by a kworker (pid 77) now and then for 50-150 us. Faults, in every step:
// kCpuContention: stress-ng (pid 31337) preempts the thread for 2-4 ms between two launches;
// kD2hSync: a `.item()`: a small D2H cudaMemcpyAsync then a cudaStreamSynchronize of 3-5 ms;
// kSlowLoader: the thread waits for its next batch 0.2-0.4 ms every step (a futex: queue.get());
// with the fault, 2.2-4.4 ms (the loader's workers fell behind). Its switch-out stack is stored.
Generated generate(const std::string& path, Fault fault, uint64_t seed, uint64_t seconds = 15) {
  Rng rng{seed * 7919 + 1};
  Generated g;
  g.path = path;
  std::vector<Event> ev;
  auto call = [&ev](uint64_t ts, uint64_t dur, uint8_t op, uint64_t kind = 0) {
    Event e;
    e.ts_ns = ts;
    e.dur_ns = dur;
    e.pid = kPid;
    e.tid = kTid;
    e.source = Source::kCuda;
    e.op = op;
    e.arg1 = kind;
    ev.push_back(e);
    return ts + dur;
  };
  // An off-CPU span of the trainer: preempted by (pid, tid), or asleep in `stack`.
  auto off_cpu = [&ev](uint64_t ts, uint64_t dur, OffCpuState state, uint32_t pid, uint32_t tid, uint64_t stack) {
    Event e;
    e.ts_ns = ts;
    e.dur_ns = dur;
    e.pid = kPid;
    e.tid = kTid;
    e.source = Source::kHost;
    e.op = op::kSchedSwitch;
    e.prev_state = state;
    e.arg0 = pid;
    e.arg1 = tid;
    e.stack_id = stack;
    ev.push_back(e);
    return ts + dur;
  };
  auto preempt = [&off_cpu](uint64_t ts, uint64_t dur, uint32_t pid, uint32_t tid) {
    return off_cpu(ts, dur, OffCpuState::kPreempted, pid, tid, 0);
  };
  constexpr uint64_t kFutexStack = 0xf07e;
  auto wait_batch = [&off_cpu](uint64_t ts, uint64_t dur) {
    return off_cpu(ts, dur, OffCpuState::kSleeping, 0, 0, kFutexStack);
  };
  uint64_t t = kBase + rng.uni(0, kMs);
  while (t < kBase + seconds * kSec) {
    ++g.steps;
    if (fault == Fault::kNone || fault == Fault::kSlowLoader) {
      const uint64_t usual = rng.uni(200 * kUs, 400 * kUs);
      const uint64_t extra = fault == Fault::kSlowLoader ? rng.uni(2 * kMs, 4 * kMs) : 0;
      g.injected_ns += extra;
      t = wait_batch(t, usual + extra);
    }
    t = call(t, rng.uni(30 * kUs, 50 * kUs), op::kCudaMemcpyAsync, 1);
    t += rng.uni(100 * kUs, 200 * kUs);
    for (int i = 0; i < 20; ++i) {
      t = call(t, rng.uni(10 * kUs, 20 * kUs), op::kCudaLaunchKernel);
      if (rng.uni(0, 99) < 2) t = preempt(t, rng.uni(50 * kUs, 150 * kUs), kBgPid, 7700);
      if (fault == Fault::kCpuContention && i == 10) {
        const uint64_t d = rng.uni(2 * kMs, 4 * kMs);
        g.injected_ns += d;
        t = preempt(t, d, kHogPid, kHogTid);
      }
      t += rng.uni(80 * kUs, 120 * kUs);
    }
    if (fault == Fault::kD2hSync) {
      t = call(t, rng.uni(8 * kUs, 12 * kUs), op::kCudaMemcpyAsync, 2);
      const uint64_t d = rng.uni(3 * kMs, 5 * kMs);
      g.injected_ns += d;
      t = call(t, d, op::kCudaStreamSync);
      t += rng.uni(20 * kUs, 40 * kUs);
    }
    t = call(t, rng.uni(5 * kMs, 7 * kMs), op::kCudaStreamSync);
    t += rng.uni(50 * kUs, 100 * kUs);
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  for (size_t i = 0; i < ev.size(); ++i) ev[i].id = i + 1;
  TraceMeta meta;
  {
    ParsedStack st;
    for (const char* f : {"futex_wait_queue", "futex_wait", "do_futex", "__x64_sys_futex"}) {
      StackFrame k;
      k.kind = FrameKind::kKernel;
      k.function = f;
      st.frames.push_back(k);
    }
    meta.stacks[kFutexStack] = encode_stack(st);
  }
  meta.process_names[kPid] = "trainer";
  meta.process_names[kHogPid] = "stress-ng";
  meta.process_names[kBgPid] = "kworker";
  meta.thread_names[kTid] = "trainer";
  meta.thread_names[kHogTid] = "stress-ng";
  meta.first_ts = ev.front().ts_ns;
  meta.last_ts = ev.back().ts_ns;
  std::string error;
  auto sink = SqliteSink::create(path, error);
  EXPECT_TRUE(sink) << error;
  if (!sink) return g;
  EXPECT_TRUE(sink->write_meta(meta));
  EXPECT_TRUE(sink->write_events(ev));
  EXPECT_TRUE(sink->close(error)) << error;
  return g;
}

test::CommandRun run(const std::string& args) {
  return test::run_command(std::string(INGERO_BINARY_DIR) + "/ingero-pipeline " + args);
}

class Diff : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ip-diff-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {  // INGERO_DIFF_KEEP=1 keeps the generated traces (docs/cli.md's walk-through)
    if (!std::getenv("INGERO_DIFF_KEEP")) fs::remove_all(dir_);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  json diff_json(const std::string& before, const std::string& after) {
    const auto r = run("diff " + before + " " + after + " --json");
    EXPECT_EQ(r.status, 0) << r.err;
    return r.status == 0 ? json::parse(r.out) : json();
  }
  fs::path dir_;
};

// The first cause is the injected one, significant, within 15% of the injected time per step; no
// other cause is significant by more than a tenth of it.
void expect_named_first(const json& j, const std::string& category, double injected_per_step) {
  ASSERT_EQ(j["unit"], "step") << j.dump(1);
  ASSERT_FALSE(j["causes"].empty());
  const json& first = j["causes"][0];
  EXPECT_EQ(first["category"], category) << j["verdict"];
  EXPECT_TRUE(first["significant"].get<bool>()) << j["verdict"];
  const double added = first["added_ns_per_step"].get<double>();
  EXPECT_NEAR(added, injected_per_step, 0.15 * injected_per_step) << j["verdict"];
  EXPECT_TRUE(j["step_significant"].get<bool>());
  EXPECT_NEAR(j["step_delta_ns"].get<double>(), injected_per_step, 0.15 * injected_per_step);
  for (size_t i = 1; i < j["causes"].size(); ++i) {
    if (j["causes"][i]["significant"].get<bool>() && j["causes"][i]["added_ns_per_step"].get<double>() > 0) {
      EXPECT_LT(j["causes"][i]["added_ns_per_step"].get<double>(), 0.1 * injected_per_step) << j["causes"][i].dump();
    }
  }
  // The verdict names it first.
  const std::string v = j["verdict"];
  EXPECT_EQ(v.rfind('+', 0), 0u) << v;
  EXPECT_NE(v.find(first["what"].get<std::string>()), std::string::npos) << v;
}

TEST_F(Diff, NamesCpuContentionOnTheFeedingThread) {
  const auto before = generate(file("base.db"), Fault::kNone, 1);
  const auto after = generate(file("cpu.db"), Fault::kCpuContention, 2);
  const json j = diff_json(before.path, after.path);
  expect_named_first(j, "cpu_contention", after.injected_per_step());
  EXPECT_NE(j["causes"][0]["what"].get<std::string>().find("stress-ng"), std::string::npos) << j["causes"][0];
  EXPECT_EQ(j["before"]["process"], "trainer");
  EXPECT_GT(j["after"]["step_ns"].get<double>(), j["before"]["step_ns"].get<double>());
}

// Incidents side by side: the hog of the CPU-contention trace (26% from its first second) is an
// incident on AFTER only: one row, "appeared", on trainer/trainer, naming stress-ng, its time lost
// per step within 15% of the injected; the cause cites it. Text and HTML carry the same row. Two
// runs of the same workload (different seeds): no row.
TEST_F(Diff, IncidentsThatAppeared) {
  const auto before = generate(file("base.db"), Fault::kNone, 21);
  const auto after = generate(file("cpu.db"), Fault::kCpuContention, 22);
  const std::string page = file("diff.html");
  const auto r = run("diff " + before.path + " " + after.path + " --json --html " + page);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["incidents"].size(), 1u) << j["incidents"].dump(1);
  const json& in = j["incidents"][0];
  EXPECT_EQ(in["change"], "appeared");
  EXPECT_EQ(in["rule"], "cpu_preempted");
  EXPECT_EQ(in["category"], "cpu_contention");
  EXPECT_EQ(in["process"], "trainer");
  EXPECT_EQ(in["thread"], "trainer");
  EXPECT_TRUE(in["before"].is_null()) << in.dump(1);
  EXPECT_EQ(in["after"]["severity"], "HIGH");
  EXPECT_EQ(in["after"]["incidents"], 1);
  const double per_step = in["after"]["lost_ns_per_unit"].get<double>();
  EXPECT_NEAR(per_step, after.injected_per_step(), 0.15 * after.injected_per_step()) << in.dump(1);
  EXPECT_EQ(in["added_ns_per_step"].get<double>(), per_step);
  ASSERT_EQ(in["evidence"].size(), 1u);
  EXPECT_NE(in["evidence"][0].get<std::string>().find("stress-ng (pid 31337) ran instead"), std::string::npos)
      << in["evidence"][0];
  bool cited = false;
  for (const auto& e : j["causes"][0]["evidence"])
    cited = cited || e.get<std::string>().find("incident cpu_preempted (cpu_contention) on trainer/trainer appeared") !=
                         std::string::npos;
  EXPECT_TRUE(cited) << j["causes"][0].dump(1);
  std::ifstream f(page);
  const std::string h{std::istreambuf_iterator<char>(f), {}};
  const size_t table = h.find("<table id=\"incidents\">");
  ASSERT_NE(table, std::string::npos);
  EXPECT_NE(h.find("appeared</td>", table), std::string::npos);
  const auto text = run("diff " + before.path + " " + after.path);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("appeared "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("cpu_preempted (cpu_contention) on trainer/trainer  - -> HIGH"), std::string::npos)
      << text.out;
  // Reversed, the same incident vanished.
  const json back = diff_json(after.path, before.path);
  ASSERT_EQ(back["incidents"].size(), 1u) << back["incidents"].dump(1);
  EXPECT_EQ(back["incidents"][0]["change"], "vanished");
  // Same workload, other seeds: no incident on either side, so no row.
  const auto a = generate(file("a.db"), Fault::kNone, 23);
  const auto b = generate(file("b.db"), Fault::kNone, 123);
  const json same = diff_json(a.path, b.path);
  EXPECT_TRUE(same["incidents"].is_array());
  EXPECT_TRUE(same["incidents"].empty()) << same["incidents"].dump(1);
}

TEST_F(Diff, NamesAnAddedDeviceToHostSync) {
  const auto before = generate(file("base.db"), Fault::kNone, 3);
  const auto after = generate(file("d2h.db"), Fault::kD2hSync, 4);
  const json j = diff_json(before.path, after.path);
  expect_named_first(j, "gpu_bound", after.injected_per_step());
  // Evidence: one more stream synchronisation per step (Ingero's name: cudaStreamSync), and the
  // D2H copy is not taken for a sync.
  bool more_syncs = false;
  for (const auto& e : j["causes"][0]["evidence"]) {
    more_syncs = more_syncs || e.get<std::string>().find("cudaStreamSync: 1.00 -> 2.00") != std::string::npos;
    EXPECT_EQ(e.get<std::string>().find("cudaMemcpyAsync"), std::string::npos) << e;
  }
  EXPECT_TRUE(more_syncs) << j["causes"][0].dump(1);
}

TEST_F(Diff, NamesASlowerDataLoader) {
  const auto before = generate(file("base.db"), Fault::kNone, 7);
  const auto after = generate(file("loader.db"), Fault::kSlowLoader, 8);
  const json j = diff_json(before.path, after.path);
  expect_named_first(j, "input_starvation", after.injected_per_step());
  EXPECT_NE(j["causes"][0]["what"].get<std::string>().find("lock"), std::string::npos) << j["causes"][0];
}

TEST_F(Diff, SameWorkloadDifferentSeedsIsNoFinding) {
  for (uint64_t seed : {5u, 7u}) {
    const auto a = generate(file("a.db"), Fault::kNone, seed);
    const auto b = generate(file("b.db"), Fault::kNone, seed + 100);
    const json j = diff_json(a.path, b.path);
    ASSERT_EQ(j["unit"], "step");
    EXPECT_FALSE(j["step_significant"].get<bool>()) << j["verdict"];
    for (const auto& c : j["causes"]) EXPECT_FALSE(c["significant"].get<bool>()) << c.dump(1);
    for (const auto& o : j["ops"]) EXPECT_FALSE(o["significant"].get<bool>()) << o.dump(1);
    EXPECT_NE(j["verdict"].get<std::string>().find("no cause stands out"), std::string::npos) << j["verdict"];
  }
}

// The MCP tool compare_traces (`mcp --db AFTER --baseline BEFORE`, over stdio) gives the same
// verdict and causes as the command, with the names from the traces marked untrusted.
TEST_F(Diff, McpToolComparesLikeTheCommand) {
  const auto before = generate(file("base.db"), Fault::kNone, 11);
  const auto after = generate(file("cpu.db"), Fault::kCpuContention, 12);
  const json cli = diff_json(before.path, after.path);
  const std::string req = file("req.jsonl");
  {
    std::ofstream o(req);
    o << json{{"jsonrpc", "2.0"},
              {"id", 1},
              {"method", "initialize"},
              {"params",
               {{"protocolVersion", "2025-11-25"},
                {"capabilities", json::object()},
                {"clientInfo", {{"name", "t"}, {"version", "1"}}}}}}
             .dump()
      << "\n"
      << json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}.dump() << "\n"
      << json{{"jsonrpc", "2.0"},
              {"id", 2},
              {"method", "tools/call"},
              {"params", {{"name", "compare_traces"}, {"arguments", json::object()}}}}
             .dump()
      << "\n"
      << json{{"jsonrpc", "2.0"},
              {"id", 3},
              {"method", "tools/call"},
              {"params", {{"name", "compare_traces"}, {"arguments", {{"before_range", "soon"}}}}}}
             .dump()
      << "\n"
      << json{{"jsonrpc", "2.0"},
              {"id", 4},
              {"method", "tools/call"},
              {"params", {{"name", "get_causal_chains"}, {"arguments", json::object()}}}}
             .dump()
      << "\n";
  }
  const auto r = run("mcp --db " + after.path + " --baseline " + before.path + " --gpus 2 --gpu-hour-price 3 < " + req);
  ASSERT_EQ(r.status, 0) << r.err;
  json reply, bad, chains;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    const json m = json::parse(line, nullptr, false);
    if (m.is_object() && m.value("id", 0) == 2) reply = m;
    if (m.is_object() && m.value("id", 0) == 3) bad = m;
    if (m.is_object() && m.value("id", 0) == 4) chains = m;
  }
  // The server's price flags (as explain's): the hog's incident carries 2 GPUs and its cost; the
  // task that ran instead, named in the verdict, is marked as a name from the trace.
  ASSERT_TRUE(chains.contains("result")) << r.out.substr(0, 2000);
  const json& cc = chains["result"]["structuredContent"];
  ASSERT_FALSE(cc["incidents"].empty()) << cc.dump(1).substr(0, 2000);
  const json& hog = cc["incidents"][0];
  EXPECT_EQ(hog["rule"], "cpu_preempted");
  EXPECT_EQ(hog["gpus"].get<double>(), 2.0);
  EXPECT_EQ(hog["gpus_from"], "--gpus");
  EXPECT_NEAR(hog["cost"].get<double>(), hog["lost_ns"].get<double>() / 3.6e12 * 2 * 3, 1e-12);
  EXPECT_NE(cc["verdict"].get<std::string>().find(
                "mostly <untrusted>stress-ng</untrusted> (pid 31337) running instead"),
            std::string::npos)
      << cc["verdict"];
  ASSERT_TRUE(reply.contains("result")) << r.out.substr(0, 2000);
  ASSERT_FALSE(reply["result"].value("isError", false)) << reply.dump(1);
  const json& d = reply["result"]["structuredContent"];
  EXPECT_EQ(d["verdict"], "<untrusted>" + cli["verdict"].get<std::string>() + "</untrusted>");
  ASSERT_EQ(d["causes"].size(), cli["causes"].size());
  for (size_t i = 0; i < d["causes"].size(); ++i) {
    EXPECT_EQ(d["causes"][i]["category"], cli["causes"][i]["category"]) << i;
    EXPECT_EQ(d["causes"][i]["added_ns_per_step"], cli["causes"][i]["added_ns_per_step"]) << i;
    EXPECT_EQ(d["causes"][i]["significant"], cli["causes"][i]["significant"]) << i;
  }
  EXPECT_EQ(d["causes"][0]["category"], "cpu_contention");
  // The incidents too: the hog's appeared on AFTER.
  ASSERT_EQ(d["incidents"].size(), cli["incidents"].size()) << d["incidents"].dump(1);
  ASSERT_EQ(d["incidents"].size(), 1u) << d["incidents"].dump(1);
  EXPECT_EQ(d["incidents"][0]["change"], "appeared");
  EXPECT_EQ(d["incidents"][0]["rule"], cli["incidents"][0]["rule"]);
  EXPECT_EQ(d["incidents"][0]["added_ns_per_step"], cli["incidents"][0]["added_ns_per_step"]);
  ASSERT_TRUE(bad.contains("result")) << r.out.substr(0, 2000);
  EXPECT_TRUE(bad["result"].value("isError", false));
  EXPECT_NE(bad["result"].dump().find("before_range: expected START:END"), std::string::npos) << bad.dump();
  // Without a baseline, no before_range: an error that says what to give.
  const auto none = run("mcp --db " + after.path + " < " + req);
  EXPECT_NE(none.out.find("start the server with --baseline"), std::string::npos) << none.out.substr(0, 2000);
}

// `--html`: one page, no script, the verdict first, every cause of the JSON in its table.
TEST_F(Diff, HtmlOpensWithTheVerdict) {
  const auto before = generate(file("base.db"), Fault::kNone, 13);
  const auto after = generate(file("loader.db"), Fault::kSlowLoader, 14);
  const std::string page = file("diff.html");
  const auto r = run("diff " + before.path + " " + after.path + " --json --html " + page);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  std::ifstream f(page);
  const std::string h{std::istreambuf_iterator<char>(f), {}};
  const size_t body = h.find("<body>");
  ASSERT_NE(body, std::string::npos);
  EXPECT_EQ(h.find("<h1 id=\"verdict\">", body), body + 7) << h.substr(body, 200);  // the first element
  std::string verdict = j["verdict"];
  EXPECT_NE(h.find(verdict.substr(0, verdict.find('('))), std::string::npos) << verdict;
  EXPECT_EQ(h.find("<script"), std::string::npos);
  size_t rows = 0;
  for (size_t at = h.find("<table id=\"causes\">");
       (at = h.find("<tr", at + 1)) < h.find("</table>", h.find("<table id=\"causes\">"));)
    ++rows;
  EXPECT_EQ(rows, j["causes"].size() + 1);  // + the header
  EXPECT_FALSE(fs::exists(page + ".tmp"));
  // Chromium renders it with the verdict on top, when it is installed.
  for (const char* chromium : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (::access(chromium, X_OK) != 0) continue;
    const auto dom = test::run_command(std::string(chromium) +
                                       " --headless --no-sandbox --disable-gpu --dump-dom file://" + page);
    EXPECT_NE(dom.out.find("<h1 id=\"verdict\">"), std::string::npos) << dom.err.substr(0, 500);
    break;
  }
}

TEST_F(Diff, TwoRangesOfOneTrace) {
  // Two halves of one steady trace: the per-step comparison runs, and nothing stands out.
  const auto base = generate(file("base.db"), Fault::kNone, 9, 8);
  const auto text = run("diff " + base.path + " --before-range 0:4 --after-range 4:8");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("per step"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("no cause stands out"), std::string::npos) << text.out;
}

TEST_F(Diff, BadInputIsAClearError) {
  const auto missing = run("diff /nonexistent/a.db /nonexistent/b.db");
  EXPECT_EQ(missing.status, 3);
  EXPECT_NE(missing.err.find("/nonexistent/a.db"), std::string::npos) << missing.err;
  const auto one = run("diff /nonexistent/a.db");
  EXPECT_EQ(one.status, 2);
  EXPECT_NE(one.err.find("two traces"), std::string::npos) << one.err;
  const auto base = generate(file("base.db"), Fault::kNone, 1, 2);
  const auto range = run("diff " + base.path + " --before-range 5 --after-range 0:1");
  EXPECT_EQ(range.status, 2);
  EXPECT_NE(range.err.find("START:END"), std::string::npos) << range.err;
  const auto help = run("diff --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("Examples"), std::string::npos);
}

}  // namespace
