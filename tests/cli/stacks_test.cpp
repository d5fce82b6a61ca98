// `ingero-pipeline stacks`: runs the real binary on a synthetic trace with Python frames (written
// with the SQLite sink, so the expected ranking, shares and folded lines are known exactly) and on
// the shared Ingero traces (opened read-only by the reader; checked against SQL over the same
// file, opened immutable).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/ops.h"
#include "model/stack.h"
#include "sinks/store/sqlite_store.h"
#include "tests/util/run_command.h"

namespace {

using Run = ingero::test::CommandRun;

Run run(const std::string& args) {
  return ingero::test::run_command(std::string(INGERO_BINARY_DIR) + "/ingero-pipeline " + args);
}

using namespace ingero;

StackFrame py(const std::string& file, uint32_t line, const std::string& fn) {
  StackFrame f;
  f.kind = FrameKind::kPython;
  f.file = file;
  f.line = line;
  f.function = fn;
  return f;
}
StackFrame native(const std::string& fn, const std::string& module, uint64_t off = 0x10) {
  StackFrame f;
  f.kind = FrameKind::kNative;
  f.function = fn;
  f.module = module;
  f.offset = off;
  return f;
}

// The synthetic trace (pid 100; times in ns):
//   A  train.py:42 in train_step (under main.py:10 in main), innermost native cudaStreamSynchronize:
//      10 cudaStreamSynchronize x 10ms = 100ms, none slow (all equal).
//   B  model.py:17 in forward: 200 cudaLaunchKernel x 10us + 10 x 1ms (the slow ones) = 12ms.
//   C  native only: cudaMemcpy <- at::native::copy_ in libtorch_cpu.so: 5 cudaMemcpy x 4ms = 20ms.
//   50 more cudaLaunchKernel x 10us without a stack.
// cudaLaunchKernel: 260 calls, p50 = p95 = 10us, slow >= 30us: the 10 calls of 1ms.
class StacksCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = (std::filesystem::temp_directory_path() / ("ip-stacks-" + std::to_string(getpid()) + ".db")).string();
    ParsedStack a, b, c, d;
    a.frames = {native("cudaStreamSynchronize", "libcudart.so.13"), py("train.py", 42, "train_step"),
                py("main.py", 10, "main")};
    b.frames = {native("cudaLaunchKernel", "libcudart.so.13"), py("model.py", 17, "forward"),
                py("train.py", 40, "train_step"), py("main.py", 10, "main")};
    c.frames = {native("cudaMemcpy", "libcudart.so.13"),
                native("_ZN2at6native5copy_ERNS_6TensorERKS1_b", "libtorch_cpu.so", 0x57)};
    d.frames = {py("model.py", 30, "spin"), py("train.py", 40, "train_step")};
    TraceMeta meta;
    meta.process_names[100] = "python3 train.py";
    ida_ = stack_content_hash(a);
    idb_ = stack_content_hash(b);
    idc_ = stack_content_hash(c);
    meta.stacks[ida_] = encode_stack(a);
    meta.stacks[idb_] = encode_stack(b);
    meta.stacks[idc_] = encode_stack(c);
    meta.stacks[stack_content_hash(d)] = encode_stack(d);
    std::vector<Event> ev;
    uint64_t ts = 1'700'000'000'000'000'000ull, id = 1;
    auto add = [&](uint8_t opid, uint64_t dur, uint64_t stack, int n) {
      for (int i = 0; i < n; ++i) {
        Event e;
        e.ts_ns = ts;
        ts += 20'000'000;
        e.dur_ns = dur;
        e.id = id++;
        e.pid = e.tid = 100;
        e.source = Source::kCuda;
        e.op = opid;
        e.stack_id = stack;
        ev.push_back(e);
      }
    };
    add(op::kCudaStreamSync, 10'000'000, ida_, 10);
    add(op::kCudaLaunchKernel, 10'000, idb_, 200);
    add(op::kCudaLaunchKernel, 1'000'000, idb_, 10);
    add(op::kCudaMemcpy, 4'000'000, idc_, 5);
    add(op::kCudaLaunchKernel, 10'000, 0, 50);
    // 7 on-CPU samples in spin() (HOST cpu_sample, no duration): not GPU calls, only --op cpu_sample.
    for (int i = 0; i < 7; ++i) {
      Event e;
      e.ts_ns = ts;
      ts += 20'000'000;
      e.id = id++;
      e.pid = e.tid = 100;
      e.source = Source::kHost;
      e.op = op::kCpuSample;
      e.stack_id = stack_content_hash(d);
      ev.push_back(e);
    }
    std::string err;
    auto sink = SqliteSink::create(path_, err);
    ASSERT_TRUE(sink) << err;
    ASSERT_TRUE(sink->write_meta(meta)) << sink->error();
    ASSERT_TRUE(sink->write_events(ev)) << sink->error();
    ASSERT_TRUE(sink->close(err)) << err;
  }
  static void TearDownTestSuite() { std::filesystem::remove(path_); }

  static inline std::string path_;
  static inline uint64_t ida_ = 0, idb_ = 0, idc_ = 0;
};

TEST_F(StacksCli, RanksSitesByTotalTimeWithSharesAndTopStack) {
  const auto r = run("stacks --json --db " + path_);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["calls"], 275);
  EXPECT_EQ(j["calls_with_stack"], 225);
  EXPECT_EQ(j["total_with_stack"], 132'000'000);
  EXPECT_EQ(j["slow_calls"], 10);
  EXPECT_EQ(j["stacks_in_trace"], 4);
  const auto& s = j["sites"];
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0]["site"], "train.py:42 in train_step");
  EXPECT_EQ(s[0]["calls"], 10);
  EXPECT_EQ(s[0]["total"], 100'000'000);
  EXPECT_NEAR(s[0]["total_share"].get<double>(), 100.0 / 132.0, 1e-9);
  EXPECT_EQ(s[0]["slow_calls"], 0);
  EXPECT_EQ(s[0]["p50"], 10'000'000);
  // The native-only site is the caller outside libcudart, demangled.
  EXPECT_EQ(s[1]["site"], "at::native::copy_(at::Tensor&, at::Tensor const&, bool) in libtorch_cpu.so");
  EXPECT_EQ(s[1]["frame"]["kind"], "native");
  EXPECT_EQ(s[2]["site"], "model.py:17 in forward");
  EXPECT_EQ(s[2]["calls"], 210);
  EXPECT_EQ(s[2]["total"], 12'000'000);
  EXPECT_EQ(s[2]["slow_calls"], 10);
  EXPECT_EQ(s[2]["slow"], 10'000'000);
  EXPECT_DOUBLE_EQ(s[2]["slow_share"].get<double>(), 1.0);
  EXPECT_EQ(s[2]["rank_slow"], 1);
  EXPECT_EQ(s[2]["p50"], 10'000);
  EXPECT_EQ(s[2]["p99"], 1'000'000);
  // Full top stack, innermost first, with kinds.
  const auto& fr = s[0]["top_stack"]["frames"];
  ASSERT_EQ(fr.size(), 3u);
  EXPECT_EQ(fr[0]["kind"], "native");
  EXPECT_EQ(fr[0]["function"], "cudaStreamSynchronize");
  EXPECT_EQ(fr[0]["module"], "libcudart.so.13");
  EXPECT_EQ(fr[1]["kind"], "python");
  EXPECT_EQ(fr[1]["file"], "train.py");
  EXPECT_EQ(fr[1]["line"], 42);
  EXPECT_EQ(fr[1]["function"], "train_step");
  EXPECT_EQ(fr[2]["function"], "main");
  EXPECT_EQ(s[0]["top_stack"]["stack_id"].get<uint64_t>(), ida_);
}

TEST_F(StacksCli, SortBySlowTimeAndLimit) {
  const auto r = run("stacks --json --sort slow --limit 1 --db " + path_);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["sites"].size(), 1u);
  EXPECT_EQ(j["sites_total"], 3);
  EXPECT_EQ(j["sites"][0]["site"], "model.py:17 in forward");
  EXPECT_EQ(j["sites"][0]["rank_total"], 3);
}

TEST_F(StacksCli, OpAndMinFilters) {
  auto r = run("stacks --json --op cudaLaunchKernel --db " + path_);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["calls"], 260);
  ASSERT_EQ(j["sites"].size(), 1u);
  EXPECT_EQ(j["sites"][0]["site"], "model.py:17 in forward");
  // The API symbol works as well as Ingero's name; --min keeps the 1ms launches only.
  r = run("stacks --json --op cudaLaunchKernel --min 500us --db " + path_);
  ASSERT_EQ(r.status, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["calls"], 10);
  EXPECT_EQ(j["sites"][0]["total"], 10'000'000);
  r = run("stacks --json --op cudaStreamSynchronize --db " + path_);
  ASSERT_EQ(r.status, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["sites"].size(), 1u);
  EXPECT_EQ(j["sites"][0]["site"], "train.py:42 in train_step");
}

TEST_F(StacksCli, FoldedStacksOutermostFirstWithTotalNs) {
  const auto r = run("stacks --folded --db " + path_);
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream in(r.out);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[0],
            "main.py:10 in main;train.py:42 in train_step;cudaStreamSynchronize in libcudart.so.13 100000000");
  EXPECT_EQ(lines[1],
            "at::native::copy_(at::Tensor&, at::Tensor const&, bool) in libtorch_cpu.so;cudaMemcpy in libcudart.so.13 "
            "20000000");
  EXPECT_EQ(lines[2],
            "main.py:10 in main;train.py:40 in train_step;model.py:17 in forward;cudaLaunchKernel in libcudart.so.13 "
            "12000000");
}

TEST_F(StacksCli, CpuSamplesAreCountedNotTimed) {
  const auto r = run("stacks --json --op cpu_sample --db " + path_);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["unit"], "samples");
  EXPECT_EQ(j["calls"], 7);
  ASSERT_EQ(j["sites"].size(), 1u);
  EXPECT_EQ(j["sites"][0]["site"], "model.py:30 in spin");
  EXPECT_EQ(j["sites"][0]["total"], 7);
  EXPECT_EQ(j["sites"][0]["slow_calls"], 0);
  const auto f = run("stacks --folded --op cpu_sample --db " + path_);
  ASSERT_EQ(f.status, 0) << f.err;
  EXPECT_EQ(f.out, "train.py:40 in train_step;model.py:30 in spin 7\n");
}

TEST_F(StacksCli, TextTableNamesTheSitesAndTheTopStack) {
  const auto r = run("stacks --db " + path_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("275 calls, 225 with a stack"), std::string::npos) << r.out;
  const auto a = r.out.find("train.py:42 in train_step");
  const auto c = r.out.find("model.py:17 in forward");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(c, std::string::npos);
  EXPECT_LT(a, c);                                             // ranked by total time
  EXPECT_NE(r.out.find("75.8%"), std::string::npos) << r.out;  // 100 / 132
  EXPECT_NE(r.out.find("Top stack of #1"), std::string::npos);
  EXPECT_NE(r.out.find("main.py:10 in main"), std::string::npos);
}

TEST_F(StacksCli, LmdbTraceGivesTheSameSites) {
  const std::string lmdb = path_ + ".lmdb";
  const auto c = run("convert " + path_ + " " + lmdb);
  ASSERT_EQ(c.status, 0) << c.err;
  const auto a = run("stacks --json --db " + path_);
  const auto b = run("stacks --json --db " + lmdb);
  std::filesystem::remove_all(lmdb);
  std::filesystem::remove(lmdb + "-lock");  // the writer's LMDB lock file, beside the data file
  ASSERT_EQ(b.status, 0) << b.err;
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_NE(jb["format"].get<std::string>().find("lmdb"), std::string::npos) << jb["format"];
  for (auto* j : {&ja, &jb}) j->erase("trace"), j->erase("format");
  EXPECT_EQ(ja, jb);
}

TEST_F(StacksCli, NoMatchingCallsIsAMessageNotAnError) {
  const auto r = run("stacks --pid 999 --db " + path_);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("None of the selected calls has a stack"), std::string::npos) << r.out;
}

TEST_F(StacksCli, UsageAndInputErrors) {
  auto r = run("stacks --op cudaNoSuchCall --db " + path_);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("cudaNoSuchCall"), std::string::npos) << r.err;
  r = run("stacks --min soon --db " + path_);
  EXPECT_EQ(r.status, 2);
  r = run("stacks --json --folded --db " + path_);
  EXPECT_EQ(r.status, 2);
  r = run("stacks --db /nonexistent/trace.db");
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("/nonexistent/trace.db"), std::string::npos) << r.err;
}

// --- the shared Ingero traces ----------------------------------------------------------------

const std::string kShared = INGERO_SHARED_DATA;

// Counts via SQL over the file itself (immutable: the shared data stays byte-for-byte untouched):
// GPU API calls whose stack_hash names a stored stack, and their total duration.
std::pair<int64_t, int64_t> sql_stacked(const std::string& db) {
  sqlite3* h = nullptr;
  std::pair<int64_t, int64_t> out{-1, -1};
  if (sqlite3_open_v2(("file:" + db + "?immutable=1").c_str(), &h, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) ==
      SQLITE_OK) {
    sqlite3_stmt* s = nullptr;
    const char*
        q = "SELECT count(*), coalesce(sum(duration), 0) FROM events WHERE source IN (1, 4, 8, 9) AND stack_hash != 0 "
            "AND stack_hash IN (SELECT hash FROM stack_traces)";
    if (sqlite3_prepare_v2(h, q, -1, &s, nullptr) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
      out = {sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1)};
    sqlite3_finalize(s);
  }
  sqlite3_close(h);
  return out;
}

TEST(StacksShared, IngeroTraceSitesAddUpToTheStackedCalls) {
  for (const char* name : {"pytorch-dataloader-starvation.db", "sample-cluster.db"}) {
    const std::string db = kShared + "/" + name;
    if (!std::filesystem::exists(db)) GTEST_SKIP() << "missing " << db;
    const auto [n, total] = sql_stacked(db);
    ASSERT_GT(n, 0) << name;
    const auto r = run("stacks --json --limit 0 --db " + db);
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["calls_with_stack"].get<int64_t>(), n) << name;
    EXPECT_EQ(j["total_with_stack"].get<int64_t>(), total) << name;
    ASSERT_FALSE(j["sites"].empty()) << name;
    int64_t calls = 0, sum = 0;
    double share = 0;
    for (const auto& s : j["sites"]) {
      calls += s["calls"].get<int64_t>();
      sum += s["total"].get<int64_t>();
      share += s["total_share"].get<double>();
      EXPECT_FALSE(s["top_stack"]["frames"].empty());
    }
    EXPECT_EQ(calls, n) << name;
    EXPECT_EQ(sum, total) << name;
    EXPECT_NEAR(share, 1.0, 1e-9) << name;
    // Folded: one line per distinct stack, the values add up to the same total.
    const auto f = run("stacks --folded --db " + db);
    ASSERT_EQ(f.status, 0) << f.err;
    std::istringstream in(f.out);
    int64_t folded = 0;
    for (std::string l; std::getline(in, l);) {
      const auto sp = l.rfind(' ');
      ASSERT_NE(sp, std::string::npos) << l;
      folded += std::stoll(l.substr(sp + 1));
      EXPECT_EQ(l.find('\n'), std::string::npos);
    }
    EXPECT_EQ(folded, total) << name;
  }
}

TEST(StacksShared, StacksNoCallReferencesSaySo) {
  // sample-gpu-node-01.db stores stacks, but no event references one.
  const std::string db = kShared + "/sample-gpu-node-01.db";
  if (!std::filesystem::exists(db)) GTEST_SKIP() << "missing " << db;
  auto r = run("stacks --db " + db);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("None of the selected calls has a stack"), std::string::npos) << r.out;
  r = run("stacks --json --db " + db);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["sites"].empty());
}

TEST(StacksShared, EmbeddedSampleWhenNoDb) {
  const auto r = run("stacks --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["calls"].get<int64_t>(), 0);
  EXPECT_FALSE(j["sites"].empty());
}

}  // namespace
