// End to end: a real Prometheus (loopback only) scrapes five `ingero-pipeline run` processes, each
// replaying one node's trace in real time with --metrics-addr; node-3's rank is the injected
// straggler. The shipped rules (prometheus/gpustall_fleet.rules.yml, evaluated every 1 s here
// instead of 30 s) must record the busy-ratio series for all five ranks and put
// GpuStallTrainingStraggler in pending/firing for node-3 and no other node. Bounded: 90 s.
// Skips with the reason when `prometheus` or the ingero-pipeline binary is absent.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/sinks/fleet/fleet_synth.h"
#include "tests/sinks/metrics/e2e_util.h"
#include "tests/util/scratch_db.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ingero::test;

TEST(PrometheusEndToEnd, StragglerAlertForTheSlowNodeOnly) {
  const std::string prom = find_binary({"/usr/bin/prometheus", "/usr/local/bin/prometheus"});
  if (prom.empty()) GTEST_SKIP() << "prometheus is not installed (apt-get install prometheus)";
  const std::string bin = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline";
  if (::access(bin.c_str(), X_OK) != 0) GTEST_SKIP() << bin << " is not built";

  const ScratchDir scratch("fleet_prom");
  const fs::path& dir = scratch.path();

  FleetSpec spec;
  spec.ranks = 5;
  spec.slow_rank = 3;
  spec.steps = 1800;  // 90 s of trace at real-time replay: longer than the test waits
  Children kids;
  std::string scrape_targets;
  for (int r = 0; r < spec.ranks; ++r) {
    const std::string node = "node-" + std::to_string(r);
    const std::string db = (dir / (node + ".db")).string();
    ASSERT_EQ(write_fleet_node(spec, r, node, db), "");
    const std::string cfg = (dir / (node + ".yaml")).string();
    std::ofstream(cfg)
        << "version: 1\nengine:\n  threads: 1\n  batch_size: 256\nsources:\n  - name: n\n    type: sqlite\n    path: "
        << db << "\nanalysis:\n  from: [n]\n  rules: [default]\nsinks: []\n";
    const int port = free_port();
    kids.pids.push_back(
        spawn({bin, "run", "--config", cfg, "--metrics-addr", "127.0.0.1:" + std::to_string(port), "--replay-speed",
               "1", "--metrics-linger", "120", "--node", node, "--cluster", "c1", "-q"},
              (dir / (node + ".log")).string()));
    ASSERT_GT(kids.pids.back(), 0);
    scrape_targets += "      - targets: ['127.0.0.1:" + std::to_string(port) + "']\n        labels: {node: " + node +
                      ", cluster: c1}\n";
  }
  // The shipped rules, evaluated every second.
  std::string rules = slurp(std::string(INGERO_SOURCE_DIR) + "/prometheus/gpustall_fleet.rules.yml");
  ASSERT_FALSE(rules.empty());
  rules = std::regex_replace(rules, std::regex("interval: (30|5)s"), "interval: 1s");
  std::ofstream(dir / "rules.yml") << rules;
  std::ofstream(dir / "prometheus.yml") << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['"
                                        << (dir / "rules.yml").string()
                                        << "']\nscrape_configs:\n  - job_name: gpustall\n    static_configs:\n"
                                        << scrape_targets;
  const int prom_port = free_port();
  kids.pids.push_back(spawn({prom, "--config.file=" + (dir / "prometheus.yml").string(),
                             "--storage.tsdb.path=" + (dir / "tsdb").string(),
                             "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                            (dir / "prometheus.log").string()));
  ASSERT_GT(kids.pids.back(), 0);

  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + std::chrono::seconds(90);
  json alerts;
  bool seen = false;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const std::string body = http_get(prom_port, "/api/v1/alerts");
    if (body.empty()) continue;
    alerts = json::parse(body, nullptr, false);
    if (alerts.is_discarded()) continue;
    for (const auto& a : alerts["data"]["alerts"])
      if (a["labels"]["alertname"] == "GpuStallTrainingStraggler") seen = true;
    if (seen) break;
  }
  ASSERT_TRUE(seen) << "no GpuStallTrainingStraggler alert within 90 s; alerts: " << alerts.dump()
                    << "\nprometheus log tail: " << slurp((dir / "prometheus.log").string()).substr(0, 2000)
                    << "\nnode-0 log: " << slurp((dir / "node-0.log").string());
  std::fprintf(stderr, "alert seen %.1f s after Prometheus started\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  // Give the rule a few more evaluations: a wrong node would show up too.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  alerts = json::parse(http_get(prom_port, "/api/v1/alerts"), nullptr, false);
  ASSERT_FALSE(alerts.is_discarded());
  int straggler_alerts = 0;
  for (const auto& a : alerts["data"]["alerts"]) {
    if (a["labels"]["alertname"] != "GpuStallTrainingStraggler") continue;
    ++straggler_alerts;
    EXPECT_EQ(a["labels"]["node"], "node-3") << a.dump();
    EXPECT_EQ(a["labels"]["rank"], "3") << a.dump();
    EXPECT_TRUE(a["state"] == "pending" || a["state"] == "firing") << a.dump();
  }
  EXPECT_EQ(straggler_alerts, 1) << alerts.dump();
  // The recorded series: one busy ratio per rank, all five nodes scraped.
  const auto q = json::parse(http_get(prom_port,
                                      "/api/v1/query?query=" + url_encode("count(node_rank:gpustall_busy_ratio:5m)")),
                             nullptr, false);
  ASSERT_FALSE(q.is_discarded());
  ASSERT_EQ(q["data"]["result"].size(), 1u) << q.dump();
  EXPECT_EQ(q["data"]["result"][0]["value"][1], "5") << q.dump();
  const auto z = json::parse(http_get(prom_port, "/api/v1/query?query=" +
                                                     url_encode("node_rank:gpustall_busy_ratio:5m_robust_z > 3.5")),
                             nullptr, false);
  ASSERT_EQ(z["data"]["result"].size(), 1u) << z.dump();
  EXPECT_EQ(z["data"]["result"][0]["metric"]["node"], "node-3") << z.dump();
  // Rule health: every rule evaluated without error.
  const auto rules_api = json::parse(http_get(prom_port, "/api/v1/rules"), nullptr, false);
  ASSERT_FALSE(rules_api.is_discarded());
  for (const auto& g : rules_api["data"]["groups"])
    for (const auto& r : g["rules"]) EXPECT_EQ(r["health"], "ok") << r.dump();
}
