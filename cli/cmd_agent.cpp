// `ingero-pipeline agent`: the always-on service of a GPU host (docs/deploy.md). A service profile
// of `trace` (cli/live_trace.h): the same live capture, rule pack, engine and metrics, written to
// rolled files within a disk bound (sinks/store/rollover.h), with MCP over HTTP and a health
// endpoint on one listener, a log line a minute instead of the live view, and SIGTERM ending it
// cleanly (the open file flushed, indexed and closed; exit status 0).
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/config.h"
#include "cli/live_trace.h"
#include "cli/pipeline_common.h"
#include "model/format.h"
#include "sinks/fleet/process_identity.h"
#include "sinks/mcp/server.h"
#include "sinks/mcp/transport.h"

namespace ingero::cli {
namespace {

struct AgentArgs {
  TraceArgs trace;
  std::string dir;                // default: <state dir>/traces
  std::string max_disk = "1GiB";  // all rolled files together
  std::string file_size;          // default: max_disk / 8
  std::string file_age = "1h";    // roll a file open this long
  std::string retention;          // delete files older than this (default: only the disk bound)
  std::string http_addr = "127.0.0.1:9465";
  bool no_http = false, no_metrics = false;
  std::string token_file;
};

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  std::ifstream in("/dev/urandom", std::ios::binary);
  in.read(raw.data(), static_cast<std::streamsize>(bytes));
  if (!in) return "";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char b : raw) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

// The bearer token: --mcp-token-file, else $INGERO_MCP_TOKEN, else <state dir>/mcp-token (created
// 0600 on first run, so clients on the host can read it as root).
bool load_token(const AgentArgs& a, const std::string& state_dir, std::string& token, std::string& where,
                std::string& error) {
  const auto read_first_line = [](const std::string& path, std::string& out) {
    std::ifstream in(path);
    if (!in) return false;
    std::getline(in, out);
    while (!out.empty() && (out.back() == '\r' || out.back() == ' ')) out.pop_back();
    return true;
  };
  if (!a.token_file.empty()) {
    if (!read_first_line(a.token_file, token) || token.empty()) {
      error = "--mcp-token-file " + a.token_file + ": cannot read a token (expected one line)";
      return false;
    }
    where = a.token_file;
    return true;
  }
  if (const char* env = std::getenv("INGERO_MCP_TOKEN"); env && *env) {
    token = env;
    where = "$INGERO_MCP_TOKEN";
    return true;
  }
  where = state_dir + "/mcp-token";
  if (read_first_line(where, token) && !token.empty()) return true;
  token = random_hex(24);
  if (token.empty()) {
    error = "cannot generate a bearer token (/dev/urandom unreadable); pass --mcp-token-file";
    return false;
  }
  const mode_t old = ::umask(077);
  std::ofstream out(where);
  out << token << "\n";
  ::umask(old);
  if (!out) {
    error = where + ": cannot write the generated bearer token; pass --mcp-token-file";
    return false;
  }
  return true;
}

bool split_addr(const std::string& s, std::string& host, uint16_t& port) {
  const auto colon = s.rfind(':');
  std::string p = colon == std::string::npos ? s : s.substr(colon + 1);
  host = colon == std::string::npos ? "127.0.0.1" : s.substr(0, colon);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  const unsigned long v = std::stoul(p);
  if (v > 65535) return false;
  port = static_cast<uint16_t>(v);
  return !host.empty();
}

// The health endpoint's answer: 200 while the capture runs and stores what it gets, 503 when the
// status is stale (the main loop stuck), the store lost events, or the agent is stopping.
class Health {
 public:
  void update(const LiveStatus& s) {
    std::lock_guard<std::mutex> lk(mu_);
    last_ = s;
    seen_ = std::chrono::steady_clock::now();
    have_ = true;
  }
  std::pair<int, std::string> answer() const {
    std::lock_guard<std::mutex> lk(mu_);
    nlohmann::json j;
    if (!have_) {
      j = {{"status", "starting"}};
      return {503, j.dump()};
    }
    const double age = std::chrono::duration<double>(std::chrono::steady_clock::now() - seen_).count();
    std::string status = "ok";
    std::string why;
    if (last_.stopping) status = "stopping";
    else if (age > 10) status = "stalled", why = "no status for " + std::to_string(static_cast<int>(age)) + " s";
    else if (last_.db_lost) status = "degraded", why = "events lost on the way to disk";
    else if (!last_.rolled.error.empty()) status = "degraded", why = last_.rolled.error;
    j = {{"status", status},
         {"uptime_s", last_.elapsed_s},
         {"events", last_.events},
         {"dropped", {{"gpu", last_.dropped_gpu}, {"host", last_.dropped_host}, {"queue", last_.dropped_queue}}},
         {"late", last_.late},
         {"libraries", last_.libraries},
         {"uprobes", last_.uprobes},
         {"chains", last_.chains},
         {"store",
          {{"written", last_.db_written},
           {"backlog", last_.db_backlog},
           {"lost", last_.db_lost},
           {"current_file", last_.rolled.current},
           {"files_opened", last_.rolled.files_opened},
           {"files_deleted", last_.rolled.files_deleted},
           {"bytes_on_disk", last_.rolled.bytes_on_disk}}}};
    if (!why.empty()) j["reason"] = why;
    return {status == "ok" ? 200 : 503, j.dump()};
  }

 private:
  mutable std::mutex mu_;
  LiveStatus last_;
  std::chrono::steady_clock::time_point seen_;
  bool have_ = false;
};

int run_agent(AgentArgs a) {
#ifndef INGERO_HAVE_BPF
  (void)a;
  print_error("this ingero-pipeline was built without eBPF support: `agent` captures live and cannot run");
  return kExitRuntime;
#else
  // systemd's StateDirectory= sets $STATE_DIRECTORY; else $INGERO_STATE_DIR, else /var/lib/ingero-pipeline.
  std::string state_dir = default_state_dir();
  if (const char* sd = std::getenv("STATE_DIRECTORY"); sd && *sd && !std::getenv("INGERO_STATE_DIR")) {
    state_dir = sd;
    const auto colon = state_dir.find(':');  // several directories: the first
    if (colon != std::string::npos) state_dir.resize(colon);
    ::setenv("INGERO_STATE_DIR", state_dir.c_str(), 1);  // node-id goes there too
  }
  TraceArgs& t = a.trace;
  t.rolled = true;
  t.service = true;
  t.roll.dir = a.dir.empty() ? state_dir + "/traces" : a.dir;
  uint64_t max_disk = 0, file_bytes = 0, age_ns = 0, retention_ns = 0;
  if (!parse_size(a.max_disk, max_disk) || max_disk < (uint64_t{8} << 20)) {
    print_error("--max-disk '" + a.max_disk + "': expected a size of at least 8MiB, such as 200MB or 10GiB");
    return kExitUsage;
  }
  if (a.file_size.empty()) file_bytes = max_disk / 8;
  else if (!parse_size(a.file_size, file_bytes) || file_bytes < (uint64_t{1} << 20) || file_bytes > max_disk / 4) {
    // The open file and one being closed, each with room for its indexes, must leave room for data.
    print_error("--file-size '" + a.file_size + "': expected a size from 1MiB to a quarter of --max-disk");
    return kExitUsage;
  }
  if (!parse_duration(a.file_age, age_ns) || age_ns < 1'000'000'000) {
    print_error("--file-age '" + a.file_age + "': expected a duration of at least 1s, such as 15m or 1h");
    return kExitUsage;
  }
  if (!a.retention.empty() && (!parse_duration(a.retention, retention_ns) || retention_ns == 0)) {
    print_error("--retention '" + a.retention + "': expected a duration such as 168h (a week) or 30m");
    return kExitUsage;
  }
  t.roll.max_bytes = max_disk;
  t.roll.file_bytes = file_bytes;
  t.roll.file_age_ns = age_ns;
  t.roll.max_age_ns = retention_ns;
  t.roll.writer.memory_cap_bytes = size_t{4} << 20;
  if (a.no_metrics) t.metrics.addr.clear();

  // MCP over HTTP + /healthz on one listener, reading the rolled files as one trace.
  Health health;
  t.on_status = [&health](const LiveStatus& s) { health.update(s); };
  std::atomic<bool> http_stop{false};
  std::thread http_thread;
  std::unique_ptr<mcp::Server> server;
  if (!a.no_http) {
    mcp::HttpOptions http;
    if (!split_addr(a.http_addr, http.bind, http.port)) {
      print_error("--http-addr '" + a.http_addr + "': expected PORT or HOST:PORT (IPv4), e.g. 127.0.0.1:9465");
      return kExitUsage;
    }
    std::string error, where;
    if (!load_token(a, state_dir, http.token, where, error)) {
      print_error(error);
      return kExitUsage;
    }
    http.health = [&health] { return health.answer(); };
    mcp::ServerOptions opts;
    opts.db_path = t.roll.dir;
    opts.refresh_on_initialize = true;
    AnalysisSpec spec;
    spec.use_default = !t.no_default_rules;
    spec.rule_files = t.rules;
    AnalysisPlan analysis;
    if (const int rc = prepare_analysis(t.params, spec, analysis); rc != kExitOk) return rc;
    opts.plan = std::move(analysis.plan);
    opts.params = spec.params;
    opts.annotate = annotate_options(analysis, LiveChainAnnotator::replay_defaults());
    opts.rule_files = t.rules;
    opts.default_pack = !t.no_default_rules;
    server = std::make_unique<mcp::Server>(std::move(opts));
    ::signal(SIGPIPE, SIG_IGN);
    std::atomic<uint16_t> port{0};
    std::atomic<bool> failed{false};
    std::string http_error;
    http_thread = std::thread([&, http] {
      if (mcp::run_http(*server, http, http_stop, &port, http_error) != 0) failed.store(true);
    });
    for (int i = 0; i < 300 && port.load() == 0 && !failed.load(); ++i) ::usleep(10'000);
    if (failed.load() || port.load() == 0) {
      http_stop.store(true);
      http_thread.join();
      print_error("--http-addr: " + (http_error.empty() ? std::string("the listener did not start") : http_error));
      return kExitRuntime;
    }
    std::fprintf(stderr,
                 "agent: MCP on http://%s:%u/mcp (Authorization: Bearer <token in %s>), health on "
                 "http://%s:%u/healthz\n",
                 http.bind.c_str(), port.load(), where.c_str(), http.bind.c_str(), port.load());
  }
  std::fprintf(stderr, "agent: rolled files in %s (at most %s in all, files of %s or %s)\n", t.roll.dir.c_str(),
               a.max_disk.c_str(), format_count(static_cast<double>(file_bytes) / 1e6).c_str(), a.file_age.c_str());
  const int rc = run_trace(t);
  http_stop.store(true);
  if (http_thread.joinable()) http_thread.join();
  return rc;
#endif
}

Registrar reg{
    "agent", 6, [](CLI::App& app, int& rc) {
      auto args = std::make_shared<AgentArgs>();
      auto* cmd = app.add_subcommand(
          "agent",
          "The always-on service of a GPU host (root; docs/deploy.md): live capture of every CUDA\n"
          "process, including those that start later, analysed with the rule pack as `trace` does,\n"
          "written to rolled SQLite files that stay within --max-disk (the oldest deleted first);\n"
          "Prometheus /metrics, MCP over HTTP with a bearer token and /healthz. Runs until SIGTERM,\n"
          "which closes the open file and exits 0. Read what it wrote with any replay command, the\n"
          "directory as one trace:\n"
          "  ingero-pipeline explain --db /var/lib/ingero-pipeline/traces\n"
          "  ingero-pipeline query --db '/var/lib/ingero-pipeline/traces/ingero-20261129T1*.db' 'SELECT ...'\n"
          "Examples:\n"
          "  sudo ingero-pipeline agent                                   # defaults below\n"
          "  sudo ingero-pipeline agent --max-disk 200MB --file-age 15m --metrics-addr 0.0.0.0:9464\n"
          "  systemctl enable --now ingero-pipeline-agent                 # deploy/systemd/");
      cmd->add_option("--dir", args->dir,
                      "Directory of the rolled files (default: $STATE_DIRECTORY or $INGERO_STATE_DIR or "
                      "/var/lib/ingero-pipeline, + /traces)");
      cmd->add_option("--max-disk", args->max_disk,
                      "Disk bound of all the rolled files together: beyond it the oldest closed files are "
                      "deleted, never the open one (default 1GiB)");
      cmd->add_option("--file-size", args->file_size,
                      "Roll over to a new file at this size (default: --max-disk / 8; at most a quarter of it)");
      cmd->add_option("--file-age", args->file_age, "Roll over to a new file after this long (default 1h)");
      cmd->add_option("--retention", args->retention,
                      "Also delete files whose last write is older than this (e.g. 168h); default: only "
                      "the disk bound");
      cmd->add_option("--http-addr", args->http_addr,
                      "MCP (POST /mcp, bearer token) and health (GET /healthz) listener, PORT or HOST:PORT "
                      "(default 127.0.0.1:9465; 0.0.0.0 only where the network is trusted)");
      cmd->add_flag("--no-http", args->no_http, "No MCP or health listener");
      cmd->add_option("--mcp-token-file", args->token_file,
                      "File holding the MCP bearer token (default: $INGERO_MCP_TOKEN, else <state "
                      "dir>/mcp-token, created 0600 on first run)");
      add_metrics_options(cmd, args->trace.metrics);
      args->trace.metrics.addr = "127.0.0.1:9464";
      cmd->add_flag("--no-metrics", args->no_metrics, "No Prometheus /metrics (default: on 127.0.0.1:9464)");
      cmd->add_option("--cgroup", args->trace.cgroup,
                      "Trace only the processes of this cgroup v2 directory (default: every process "
                      "that calls CUDA)");
      cmd->add_option("--rules", args->trace.rules, "Rule files to load (in addition to the default pack)");
      cmd->add_flag("--no-default-rules", args->trace.no_default_rules, "Use only the --rules files");
      add_param_option(cmd, &args->trace.params);
      cmd->add_option("--cuda-lib", args->trace.cuda_libs,
                      "A libcudart/libcuda/libnccl file or directory to probe (besides discovery, which "
                      "re-runs every 2 s and finds the libraries of processes started later)");
      cmd->add_option("--disable", args->trace.disable,
                      "Probe families to switch off: cuda, driver, graph, nccl, sched, wakeup, process, "
                      "memory, block, tcp, net")
          ->delimiter(',');
      cmd->add_option("--threads", args->trace.threads, "Engine threads (default 1)")->check(CLI::Range(1u, 256u));
      cmd->add_option("--ring-mb", args->trace.ring_mb, "Size of each BPF ring buffer in MiB (default 4)")
          ->check(CLI::Range(1u, 1024u));
      cmd->add_option("--stack-min", args->trace.stack_min,
                      "Stacks of calls and off-CPU spans at least this long (default 1ms)");
      cmd->add_flag("--no-stacks", args->trace.no_stacks, "Capture no call or off-CPU stacks");
      cmd->add_flag("--no-samples", args->trace.no_samples, "No on-CPU stack samples");
      cmd->add_option("--log-every", args->trace.log_every_s, "Seconds between status lines on stderr (default 60)")
          ->check(CLI::Range(1.0, 86400.0));
      cmd->add_option("--duration", args->trace.duration,
                      "Stop after this long (tests, soaks); default: until SIGTERM");
      auto* annotate = cmd->add_option("--annotate", args->trace.annotate_path,
                                       "Accept step markers on Ingero's annotation socket (default "
                                       "/run/ingero/annotate.sock)")
                           ->expected(0, 1);
      cmd->callback([args, annotate, &rc] {
        args->trace.annotate = annotate->count() > 0;
        rc = run_agent(*args);
      });
    }};

}  // namespace
}  // namespace ingero::cli
