// The live capture of `trace`, shared with `agent` (cli/cmd_agent.cpp): the arguments and the run.
// `agent` is a service profile of `trace` (docs/deploy.md "Why agent is trace"): the same capture,
// engine, rule pack, metrics and database code, with rolled files (sinks/store/rollover.h) and a
// status callback for its health endpoint. Defined in cli/cmd_trace.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cli/metrics_cli.h"
#include "cli/pipeline_common.h"
#include "sinks/store/rollover.h"

namespace ingero::cli {

// What the capture is doing, about once a second (TraceArgs::on_status), from the main thread.
struct LiveStatus {
  double elapsed_s = 0;
  uint64_t events = 0;  // delivered to the engine
  uint64_t dropped_gpu = 0, dropped_host = 0, dropped_queue = 0, late = 0;
  size_t libraries = 0, uprobes = 0;
  uint64_t chains = 0;
  bool storing = false;                                  // --db or --db-dir
  RollingWriter::Stats rolled;                           // --db-dir
  uint64_t db_written = 0, db_backlog = 0, db_lost = 0;  // either
  bool stopping = false;                                 // SIGTERM/--duration seen
};

struct TraceArgs {
  std::string duration;
  std::vector<uint32_t> pids;
  std::string cgroup;
  std::string db;
  // Rolled files instead of one database (agent): the directory and bounds in `roll`.
  bool rolled = false;
  RolloverOptions roll;
  std::vector<std::string> rules, params;  // --rules, --param NAME=VALUE
  bool no_default_rules = false;
  CostArgs cost;  // --gpus, --gpu-hour-price, --rates: what an incident costs
  std::vector<std::string> cuda_libs;
  std::vector<std::string> disable;
  unsigned threads = 1;
  unsigned ring_mb = 4;
  std::string lag = "50ms", max_hold = "2s";
  bool quiet = false, classic = false;
  // Stacks (docs/live-capture.md "Stacks").
  std::string stack_min = "1ms";
  bool no_stacks = false, no_samples = false;
  unsigned sample_hz = 49, stack_bytes = 16384, stack_rate = 100;
  // Fleet (docs/fleet.md): --metrics-addr, --node (names this node in the trace; default: the id
  // persisted in $INGERO_STATE_DIR/node-id), --cluster.
  MetricsCliArgs metrics;
  // Explicit step markers (docs/steps.md): --annotate[=PATH] opens Ingero's annotation socket;
  // --annotate-uid lets more users' programs send.
  bool annotate = false;
  std::string annotate_path;
  std::vector<uint32_t> annotate_uids;
  // Service mode (agent): a status line on stderr every `log_every_s` seconds instead of the live
  // view, no report at the end; `on_status` (may be empty) gets the status about once a second.
  bool service = false;
  double log_every_s = 60;
  std::function<void(const LiveStatus&)> on_status;
};

// Runs the capture until --duration, SIGINT or SIGTERM; the exit status.
int run_trace(const TraceArgs& a);

}  // namespace ingero::cli
