// Inference replicas judged at the step (sinks/fleet/replica_steps.h), on generated serving
// replicas: decode steps of 8-50 ms with jitter, prefill-like steps 3-5x longer at random
// (0-30% of steps, a different mix per replica), 4-16 replicas. A replica whose decode step is
// 15% or more slower is named, as decode; one whose prefill steps alone are slower is named as
// prefill; balanced replicas, and a replica that only takes more prompts, are not named. Then the
// same through `explain` on a merged trace of generated node traces.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/ops.h"
#include "sinks/fleet/merge.h"
#include "sinks/fleet/replica_steps.h"
#include "sinks/store/sqlite_store.h"
#include "tests/util/scratch_db.h"

using namespace ingero;

namespace {

struct ReplicaSpec {
  uint64_t decode_ns = 20'000'000;
  double jitter = 0.05;        // uniform +- share of the step
  double prefill_share = 0.1;  // of the steps
  double prefill_factor = 4;   // a prefill step's length / the decode step
  double decode_slow = 0;      // this replica's decode step is (1 + decode_slow) x longer
  double prefill_slow = 0;     // its prefill steps alone
};

// Step boundaries of one replica: `steps` steps from t0.
std::vector<uint64_t> boundaries(const ReplicaSpec& r, int steps, uint64_t seed, uint64_t t0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<uint64_t> b{t0};
  for (int k = 0; k < steps; ++k) {
    const bool prefill = u(rng) < r.prefill_share;
    double len = static_cast<double>(r.decode_ns) * (1 + r.decode_slow);
    if (prefill) len = static_cast<double>(r.decode_ns) * r.prefill_factor * (1 + r.prefill_slow);
    len *= 1 + r.jitter * (2 * u(rng) - 1);
    b.push_back(b.back() + static_cast<uint64_t>(len));
  }
  return b;
}

ProcessSteps steps_of(const ReplicaSpec& r, uint16_t node, int steps, uint64_t seed) {
  ProcessSteps s;
  s.pid = 5000 + node;
  s.node = node;
  s.boundaries = boundaries(r, steps, seed, 1'760'000'000'000'000'000ULL + node * 1'000'000ULL);
  s.count = s.boundaries.size() - 1;
  s.period_ns = r.decode_ns;
  s.method = "cudaStreamSynchronize x1";
  return s;
}

TEST(ReplicaSteps, SweepNamesTheSlowReplicaByKindAndNobodyElse) {
  int cases = 0, named_right = 0;
  for (uint64_t decode : {8'000'000ull, 20'000'000ull, 50'000'000ull})
    for (int replicas : {4, 8, 16})
      for (int fault = 0; fault < 5; ++fault) {  // none, decode +15%, decode +40%, more prompts, prefill +50%
        const uint64_t seed = decode / 1000 + static_cast<uint64_t>(replicas * 10 + fault);
        std::mt19937_64 rng(seed);
        std::uniform_real_distribution<double> mix(0.0, 0.3);
        std::vector<ProcessSteps> all;
        std::vector<std::string> names;
        const int slow = static_cast<int>(seed % static_cast<uint64_t>(replicas));
        for (int n = 0; n < replicas; ++n) {
          ReplicaSpec r;
          r.decode_ns = decode;
          r.prefill_share = fault == 4 ? 0.2 : mix(rng);  // prefill judged: every replica has enough
          if (n == slow) {
            if (fault == 1) r.decode_slow = 0.15;
            if (fault == 2) r.decode_slow = 0.40;
            if (fault == 3) r.prefill_share = 0.45;
            if (fault == 4) r.prefill_slow = 0.5;
          }
          all.push_back(steps_of(r, static_cast<uint16_t>(n), 400, seed * 31 + static_cast<uint64_t>(n)));
          names.push_back("n" + std::to_string(n));
        }
        const auto found = slow_replicas(all, names);
        const std::string tag = std::to_string(decode / 1'000'000) + "ms x" + std::to_string(replicas) + " fault " +
                                std::to_string(fault);
        ++cases;
        if (fault == 0 || fault == 3) {
          EXPECT_TRUE(found.empty()) << tag << ": named " << (found.empty() ? "" : found[0].node + " " + found[0].kind);
          if (found.empty()) ++named_right;
          continue;
        }
        ASSERT_EQ(found.size(), 1u) << tag;
        EXPECT_EQ(found[0].node, "n" + std::to_string(slow)) << tag;
        EXPECT_EQ(found[0].kind, fault == 4 ? "prefill" : "decode") << tag;
        const double truth = fault == 1 ? 0.15 : fault == 2 ? 0.40 : 0.5;
        EXPECT_NEAR(found[0].excess, truth, 0.05) << tag;
        if (found[0].node == "n" + std::to_string(slow)) ++named_right;
      }
  std::printf("replica sweep: %d of %d cases right\n", named_right, cases);
}

TEST(ReplicaSteps, TooFewReplicasOrStepsJudgeNothing) {
  std::vector<ProcessSteps> all;
  std::vector<std::string> names;
  for (int n = 0; n < 3; ++n) {
    ReplicaSpec r;
    if (n == 0) r.decode_slow = 0.5;
    all.push_back(steps_of(r, static_cast<uint16_t>(n), 400, 7 + static_cast<uint64_t>(n)));
    names.push_back("n" + std::to_string(n));
  }
  EXPECT_TRUE(slow_replicas(all, names).empty()) << "3 replicas: no peers to judge against";
  ReplicaSpec r;
  all.push_back(steps_of(r, 3, 10, 11));  // a fourth with 10 steps only
  names.push_back("n3");
  EXPECT_TRUE(slow_replicas(all, names).empty()) << "the fourth has too few steps";
}

// End to end: node traces of serving replicas (a sync at the end of each step, launches before
// it), merged, then `explain --json` on the merged trace.
std::string write_replica_node(const ReplicaSpec& r, int node, int steps, uint64_t seed, const std::string& path) {
  std::string error;
  auto sink = SqliteSink::create(path, error);
  if (!sink) return error;
  TraceMeta meta;
  meta.nodes = {"replica-" + std::to_string(node)};
  const uint32_t pid = 7000 + static_cast<uint32_t>(node);
  meta.process_names[pid] = "python3 -m vllm.entrypoints.api_server";
  const auto b = boundaries(r, steps, seed, 1'760'000'000'000'000'000ULL + static_cast<uint64_t>(node) * 3'000'000ULL);
  std::vector<Event> ev;
  uint64_t id = 1;
  for (size_t k = 1; k < b.size(); ++k) {
    const uint64_t len = b[k] - b[k - 1];
    for (uint64_t t = b[k - 1] + 50'000; t + 400'000 < b[k - 1] + len / 3; t += 400'000) {
      Event e;
      e.ts_ns = t;
      e.dur_ns = 9'000;
      e.pid = e.tid = pid;
      e.id = id++;
      e.source = Source::kCuda;
      e.op = op::kCudaLaunchKernel;
      ev.push_back(e);
    }
    Event s;  // the step's sync: waits for the GPU until the step's end
    s.ts_ns = b[k - 1] + len / 3;
    s.dur_ns = b[k] - s.ts_ns - 20'000;
    s.pid = s.tid = pid;
    s.id = id++;
    s.source = Source::kCuda;
    s.op = op::kCudaStreamSync;
    ev.push_back(s);
  }
  if (!sink->write_meta(meta) || !sink->write_events(ev)) return sink->error();
  if (!sink->close(error)) return error;
  return "";
}

nlohmann::json explain_merged(const std::vector<ReplicaSpec>& specs, const test::ScratchDir& dir,
                              const std::string& tag) {
  std::vector<MergeInput> in;
  for (size_t n = 0; n < specs.size(); ++n) {
    const std::string path = dir(tag + "_r" + std::to_string(n) + ".db");
    EXPECT_EQ(write_replica_node(specs[n], static_cast<int>(n), 300, 100 + n, path), "");
    in.push_back({path, ""});
  }
  MergeOptions o;
  o.out = dir(tag + "_merged.db");
  MergeReport rep;
  std::string error;
  EXPECT_TRUE(merge_traces(in, o, rep, error)) << error;
  std::string out;
  const std::string cmd = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline explain --json --db '" + o.out +
                          "' 2>/dev/null";
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, k);
    pclose(p);
  }
  return nlohmann::json::parse(out, nullptr, false);
}

TEST(ReplicaSteps, ExplainOnAMergedTraceNamesTheSlowReplica) {
  test::ScratchDir dir("replica_steps");
  std::vector<ReplicaSpec> specs(5);
  for (size_t n = 0; n < specs.size(); ++n) specs[n].prefill_share = 0.05 + 0.04 * static_cast<double>(n);
  specs[2].decode_slow = 0.25;
  const auto j = explain_merged(specs, dir, "slow");
  ASSERT_TRUE(j.is_object() && j.contains("chains")) << "explain gave no JSON";
  int found = 0;
  for (const auto& c : j["chains"]) {
    if (c.value("rule", "") != "fleet_replica_step") continue;
    ++found;
    EXPECT_NE(c.value("summary", "").find("replica-2"), std::string::npos) << c.value("summary", "");
    EXPECT_NE(c.value("summary", "").find("decode"), std::string::npos) << c.value("summary", "");
  }
  EXPECT_EQ(found, 1);
  specs[2].decode_slow = 0;
  const auto even = explain_merged(specs, dir, "even");
  ASSERT_TRUE(even.is_object() && even.contains("chains"));
  for (const auto& c : even["chains"]) EXPECT_NE(c.value("rule", ""), "fleet_replica_step") << c.value("summary", "");
}

}  // namespace
