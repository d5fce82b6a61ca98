// End to end, onset to alert received: a real Prometheus (5 s scrape and evaluation) and a real
// Alertmanager on loopback (cluster mode off), Alertmanager routing to a webhook receiver this
// test runs. Eight `ingero-pipeline run --metrics-addr --replay-speed 1 --replay-start-at T`
// processes replay one node each at real speed, in step (first events at the same wall instant): cluster c1 (4 ranks,
// 50 ms steps) whose rank 2 turns straggler at 15 s of trace time (arrives 2.5 ms = 5 % of a step late from then on),
// and the balanced control c2 (4 ranks). The shipped rules (prometheus/gpustall_fleet.rules.yml, as shipped) must
// deliver GpuStallStepStraggler to the webhook for c1 / node-2 / rank 2 only, not before the onset, and never for c2.
// The onset is the wall instant node-2's /metrics first covers 15 s of trace (polled every 50 ms; a batch is observed
// at once, so it is early by at most one 64-event batch, ~75 ms: the latency printed is conservative). Prints "onset ->
// alert received: X s" (used by bench/alert_latency.sh). Bounded: 75 s. Skips with the reason when prometheus,
// prometheus-alertmanager or the ingero-pipeline binary is absent.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/sinks/fleet/fleet_synth.h"
#include "tests/sinks/metrics/e2e_util.h"
#include "tests/util/scratch_db.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ingero::test;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// gpustall_trace_seconds_total from a node's /metrics (-1 when not served yet).
double trace_seconds(int port) {
  const std::string body = http_get(port, "/metrics");
  const std::string key = "\ngpustall_trace_seconds_total ";
  const auto p = body.find(key);
  if (p == std::string::npos) return -1;
  return std::strtod(body.c_str() + p + key.size(), nullptr);
}

}  // namespace

TEST(AlertmanagerEndToEnd, StepStragglerAlertReachesTheWebhookForTheLateRankOnly) {
  const std::string prom = find_binary({"/usr/bin/prometheus", "/usr/local/bin/prometheus"});
  if (prom.empty()) GTEST_SKIP() << "prometheus is not installed (apt-get install prometheus)";
  const std::string am = find_binary(
      {"/usr/bin/prometheus-alertmanager", "/usr/local/bin/alertmanager", "/usr/bin/alertmanager"});
  if (am.empty()) GTEST_SKIP() << "alertmanager is not installed (apt-get install prometheus-alertmanager)";
  const std::string bin = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline";
  if (::access(bin.c_str(), X_OK) != 0) GTEST_SKIP() << bin << " is not built";

  const ScratchDir scratch("fleet_am");
  const fs::path& dir = scratch.path();

  constexpr int kRanks = 4, kSlow = 2, kOnsetStep = 300;
  constexpr double kOnsetS = kOnsetStep * 0.050;  // trace seconds at the onset
  // All replays map their first event to the same wall instant (--replay-start-at), so the ranks
  // run in step as in one job, whatever each process's start-up time.
  const double start_at = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() +
                          3.0;
  char start_at_arg[32];
  std::snprintf(start_at_arg, sizeof start_at_arg, "%.3f", start_at);
  WebhookListener hook;
  ASSERT_GT(hook.port(), 0);
  Children kids;
  std::string targets;
  int slow_port = 0;
  for (const std::string cluster : {"c1", "c2"}) {
    FleetSpec spec;
    spec.ranks = kRanks;
    spec.steps = 1200;  // 60 s of trace: longer than the test waits
    spec.slow_rank = cluster == "c1" ? kSlow : -1;
    spec.slow_extra_ns = 2'500'000;  // 5 % of the 50 ms step
    spec.slow_from_step = kOnsetStep;
    spec.seed = cluster == "c1" ? 11 : 12;
    for (int r = 0; r < kRanks; ++r) {
      const std::string node = "node-" + std::to_string(r);
      const std::string stem = cluster + "-" + node;
      const std::string db = (dir / (stem + ".db")).string();
      ASSERT_EQ(write_fleet_node(spec, r, node, db), "");
      const std::string cfg = (dir / (stem + ".yaml")).string();
      std::ofstream(cfg) << "version: 1\nengine:\n  threads: 1\n  batch_size: 64\nsources:\n  - name: n\n    type: "
                            "sqlite\n    path: "
                         << db << "\nanalysis:\n  from: [n]\n  rules: [default]\nsinks: []\n";
      const int port = free_port();
      if (cluster == "c1" && r == kSlow) slow_port = port;
      kids.pids.push_back(spawn({bin, "run", "--config", cfg, "--metrics-addr", "127.0.0.1:" + std::to_string(port),
                                 "--replay-speed", "1", "--replay-start-at", start_at_arg, "--metrics-linger", "120",
                                 "--node", node, "--cluster", cluster, "-q"},
                                (dir / (stem + ".log")).string()));
      ASSERT_GT(kids.pids.back(), 0);
      targets += "      - targets: ['127.0.0.1:" + std::to_string(port) + "']\n        labels: {node: " + node +
                 ", cluster: " + cluster + "}\n";
    }
  }
  const int am_port = free_port();
  std::ofstream(dir / "alertmanager.yml")
      << "route:\n  receiver: hook\n  group_by: [alertname, cluster, node, rank]\n  group_wait: 0s\n"
         "  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: hook\n    webhook_configs:\n"
         "      - url: 'http://127.0.0.1:"
      << hook.port() << "/alerts'\n        send_resolved: false\n";
  kids.pids.push_back(
      spawn({am, "--config.file=" + (dir / "alertmanager.yml").string(), "--storage.path=" + (dir / "am").string(),
             "--web.listen-address=127.0.0.1:" + std::to_string(am_port), "--cluster.listen-address="},
            (dir / "alertmanager.log").string()));
  ASSERT_GT(kids.pids.back(), 0);
  std::ofstream(dir / "prometheus.yml") << "global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\nrule_files: ['"
                                        << INGERO_SOURCE_DIR << "/prometheus/gpustall_fleet.rules.yml']\n"
                                        << "alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: "
                                           "['127.0.0.1:"
                                        << am_port
                                        << "']\nscrape_configs:\n  - job_name: gpustall\n    static_configs:\n"
                                        << targets;
  const int prom_port = free_port();
  kids.pids.push_back(spawn({prom, "--config.file=" + (dir / "prometheus.yml").string(),
                             "--storage.tsdb.path=" + (dir / "tsdb").string(),
                             "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                            (dir / "prometheus.log").string()));
  ASSERT_GT(kids.pids.back(), 0);

  // The onset: node-2 of c1 covers 15 s of trace.
  const auto started = Clock::now();
  Clock::time_point onset{};
  double onset_wall = 0;  // the same instant, Unix seconds (Prometheus's timestamps)
  while (Clock::now() < started + std::chrono::seconds(40)) {
    if (trace_seconds(slow_port) >= kOnsetS) {
      onset = Clock::now();
      onset_wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(onset, Clock::time_point{}) << "node-2 never reached the onset; log: "
                                        << slurp((dir / "c1-node-2.log").string());
  // Nothing before the onset (the balanced phase of c1, and c2).
  for (const auto& p : hook.posts()) ADD_FAILURE() << "alert before the onset: " << p.body;

  auto straggler_posts = [&] {
    std::vector<std::pair<double, json>> out;  // (seconds after the onset, alert)
    for (const auto& p : hook.posts()) {
      const auto j = json::parse(p.body, nullptr, false);
      if (j.is_discarded()) continue;
      for (const auto& a : j["alerts"])
        if (a["labels"]["alertname"] == "GpuStallStepStraggler") out.emplace_back(seconds(p.at - onset), a);
    }
    return out;
  };
  std::vector<std::pair<double, json>> got;
  while (Clock::now() < onset + std::chrono::seconds(40)) {
    got = straggler_posts();
    if (!got.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(got.empty()) << "no GpuStallStepStraggler at the webhook within 40 s of the onset\nprometheus alerts: "
                            << http_get(prom_port, "/api/v1/alerts") << "\nlateness: "
                            << http_get(prom_port,
                                        "/api/v1/query?query=" + url_encode("node_rank:gpustall_step_lateness:ratio"))
                            << "\nalertmanager log: " << slurp((dir / "alertmanager.log").string()).substr(0, 3000);
  std::fprintf(stderr, "onset -> alert received: %.2f s (scrape 5 s, evaluation 5 s)\n", got.front().first);
  // Where the time went: node-2's scrapes (median wait) and the rule's evaluations (lateness), as
  // raw samples of the last 40 s, in seconds after the onset.
  for (const char* series : {"gpustall_step_wait_median_seconds{cluster=\"c1\",node=\"node-2\"}[40s]",
                             "node_rank:gpustall_step_lateness:ratio{cluster=\"c1\",node=\"node-2\"}[40s]"}) {
    const auto r = json::parse(http_get(prom_port, "/api/v1/query?query=" + url_encode(series)), nullptr, false);
    std::string line = std::string(series) + ":";
    if (!r.is_discarded() && !r["data"]["result"].empty())
      for (const auto& v : r["data"]["result"][0]["values"]) {
        char b[64];
        std::snprintf(b, sizeof b, " %+.2f s=%.6s", v[0].get<double>() - onset_wall, v[1].get<std::string>().c_str());
        line += b;
      }
    std::fprintf(stderr, "  %s\n", line.c_str());
  }
  RecordProperty("onset_to_alert_ms", static_cast<int>(got.front().first * 1000));
  EXPECT_LT(got.front().first, 30.0) << "target 15 s; 30 s leaves room for a loaded machine";

  // Two more scrape + evaluation rounds: a wrong rank or the control would show up now.
  std::this_thread::sleep_for(std::chrono::seconds(11));
  got = straggler_posts();
  for (const auto& [t, a] : got) {
    EXPECT_EQ(a["labels"]["cluster"], "c1") << a.dump();
    EXPECT_EQ(a["labels"]["node"], "node-2") << a.dump();
    EXPECT_EQ(a["labels"]["rank"], "2") << a.dump();
    EXPECT_EQ(a["status"], "firing") << a.dump();
  }
  // Prometheus agrees: the step-lateness series exist for all 8 ranks and only c1's rank 2 is >= 2 %.
  const auto q = json::parse(http_get(prom_port, "/api/v1/query?query=" +
                                                     url_encode("count(node_rank:gpustall_step_lateness:ratio)")),
                             nullptr, false);
  ASSERT_FALSE(q.is_discarded());
  ASSERT_EQ(q["data"]["result"].size(), 1u) << q.dump();
  EXPECT_EQ(q["data"]["result"][0]["value"][1], "8") << q.dump();
  const auto late = json::parse(http_get(prom_port, "/api/v1/query?query=" +
                                                        url_encode("node_rank:gpustall_step_lateness:ratio >= 0.02")),
                                nullptr, false);
  ASSERT_EQ(late["data"]["result"].size(), 1u) << late.dump();
  EXPECT_EQ(late["data"]["result"][0]["metric"]["cluster"], "c1") << late.dump();
  EXPECT_EQ(late["data"]["result"][0]["metric"]["rank"], "2") << late.dump();
  const double lateness = std::stod(late["data"]["result"][0]["value"][1].get<std::string>());
  EXPECT_NEAR(lateness, 0.05, 0.01) << "2.5 ms of a 50 ms step";
  // Rule health: the 5 s group evaluated without error; the 30 s groups may not have run yet.
  const auto rules_api = json::parse(http_get(prom_port, "/api/v1/rules"), nullptr, false);
  ASSERT_FALSE(rules_api.is_discarded());
  for (const auto& g : rules_api["data"]["groups"])
    for (const auto& r : g["rules"]) {
      if (g["name"] == "gpustall_step_straggler") {
        EXPECT_EQ(r["health"], "ok") << r.dump();
      }
      EXPECT_NE(r["health"], "err") << r.dump();
    }
}
