// --metrics-addr for `run` and `trace`: serve Prometheus /metrics while the pipeline runs
// (sinks/metrics/prometheus_exporter.h has the series). Keeps the commands' own code to a few
// calls: add_metrics_options() on the subcommand, MetricsHook::start() once the sources are open,
// observe() in every source's tap, wrap() around the engine's on_chain, finish() with the result.
//
// Contract:
// - Off unless --metrics-addr is given. "PORT" binds 127.0.0.1:PORT (loopback by default);
//   "HOST:PORT" binds that address (0.0.0.0 exposes it to the network: the caller's choice).
// - --replay-speed X paces a replay at X times its recorded speed (1 = real time), so counters
//   grow as they would live and Prometheus's rate() sees them move; 0 (default) = full speed.
//   Live sources are never paced. --replay-start-at T (Unix seconds) maps the first event to
//   wall time T instead of to the first batch's arrival, so several replays started a few
//   hundred ms apart run in step like the ranks of one job (one behind T catches up at full speed).
// - --metrics-linger D keeps /metrics up D seconds after the run ends (scrapers get the final
//   counts); Ctrl-C/SIGTERM ends the wait.
// - Without prometheus-cpp in the build the options exist and --metrics-addr is an error.
// - Never throws.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "model/result.h"
#include "model/trace.h"

namespace ingero::cli {

struct MetricsCliArgs {
  std::string addr, node, cluster;
  double replay_speed = 0;
  double replay_start_at = 0;  // Unix seconds; 0 = when the first batch arrives
  double linger_s = 0;
};

void add_metrics_options(CLI::App* cmd, MetricsCliArgs& args);

class MetricsHook {
 public:
  MetricsHook();
  ~MetricsHook();
  // No-op (true) when addr is empty. `stop` (Ctrl-C/SIGTERM) ends replay pacing early.
  bool start(const MetricsCliArgs& args, std::string& error, const std::atomic<bool>* stop = nullptr);
  bool active() const;
  int port() const;
  // In a source's tap: counts the batch; paces a replay (live = false) when --replay-speed > 0.
  void observe(const Batch& b, const TraceMeta& meta, bool live);
  std::function<void(const Chain&)> wrap(std::function<void(const Chain&)> inner);
  void finish(const AnalysisResult& result, const std::atomic<bool>& interrupted);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ingero::cli
