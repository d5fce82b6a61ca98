// `ingero-pipeline mcp`: an MCP server over one recorded trace, for AI agents (docs/mcp.md).
// stdio by default (stdout carries protocol only; everything else goes to stderr); --http serves
// Streamable HTTP on 127.0.0.1 with a bearer token.
#include <csignal>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/pipeline_common.h"
#include "sinks/mcp/server.h"
#include "sinks/mcp/transport.h"

namespace ingero::cli {
namespace {

struct McpArgs {
  std::string db;
  std::string baseline;                    // compare_traces' BEFORE
  std::vector<std::string> rules, params;  // --rules, --param NAME=VALUE
  bool no_default = false;
  int http_port = -1;
  std::string token;
  unsigned threads = 1;
  size_t max_rows = 10'000;
  uint64_t sql_timeout_ms = 30'000;
  std::vector<std::string> fleet_nodes;  // query_fleet's default nodes
  std::string fleet_token;
  CostArgs cost;  // --gpus, --gpu-hour-price, --rates: the incidents' GPU-hours and cost
};

std::atomic<bool> g_stop{false};

std::string random_token() {
  unsigned char raw[24] = {};
  std::ifstream in("/dev/urandom", std::ios::binary);
  in.read(reinterpret_cast<char*>(raw), sizeof raw);
  if (!in) return "";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char b : raw) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

int run_mcp(const McpArgs& a) {
  use_one_malloc_arena();
  mcp::ServerOptions opts;
  if (const int rc = incident_options(a.cost, opts.incidents); rc != kExitOk) return rc;
  opts.db_path = a.db.empty() ? embedded_sample_path() : a.db;
  opts.baseline_path = a.baseline;
  if (opts.db_path.empty()) {
    print_error("no --db given and this build has no embedded sample trace");
    return kExitUsage;
  }
  if (::access(opts.db_path.c_str(), R_OK) != 0) {
    print_error(opts.db_path + ": cannot read the trace database");
    return kExitInput;
  }
  // The same analysis as `explain`: the default rule pack (or built-in plans) plus rule files,
  // with the --param overrides, which also set the chain annotator's warm-up.
  AnalysisSpec spec;
  spec.use_default = !a.no_default;
  spec.rule_files = a.rules;
  AnalysisPlan analysis;
  if (std::string error; !parse_param_overrides(a.params, spec.params, error)) {
    print_error(error);
    return kExitUsage;
  } else if (!build_analysis(spec, analysis, error)) {
    std::cerr << error << "\n";
    return kExitFindings;
  }
  opts.plan = std::move(analysis.plan);
  opts.params = spec.params;
  opts.annotate = annotate_options(analysis, LiveChainAnnotator::replay_defaults());
  opts.rule_files = a.rules;
  opts.default_pack = !a.no_default;
  opts.engine_threads = a.threads;
  opts.sql.max_rows = a.max_rows;
  opts.sql.max_ms = a.sql_timeout_ms;
  opts.fleet_nodes = a.fleet_nodes;
  opts.fleet_token = a.fleet_token;
  if (opts.fleet_token.empty())
    if (const char* t = std::getenv("INGERO_MCP_TOKEN")) opts.fleet_token = t;
  ::signal(SIGPIPE, SIG_IGN);

  if (a.http_port >= 0) {
    mcp::HttpOptions http;
    http.port = static_cast<uint16_t>(a.http_port);
    const char* env = std::getenv("INGERO_MCP_TOKEN");
    http.token = !a.token.empty() ? a.token : (env && *env ? env : random_token());
    if (http.token.empty()) {
      print_error("cannot generate a bearer token (/dev/urandom unreadable); pass --token");
      return kExitRuntime;
    }
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_stop.store(true); };
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    mcp::Server server(std::move(opts));
    std::atomic<uint16_t> port{0};
    std::string error;
    std::thread announce([&] {
      for (int i = 0; i < 500 && port.load() == 0 && !g_stop.load(); ++i) ::usleep(10'000);
      if (port.load() != 0) {
        std::cerr << "ingero-pipeline mcp: Streamable HTTP on http://127.0.0.1:" << port.load() << http.path
                  << "  (Authorization: Bearer " << (a.token.empty() && !(env && *env) ? http.token : "<your token>")
                  << ")\n";
      }
    });
    const int rc = mcp::run_http(server, http, g_stop, &port, error);
    announce.join();
    if (rc != 0) {
      print_error(error);
      return kExitRuntime;
    }
    return kExitOk;
  }

  // stdout belongs to the protocol: keep a private copy of it for replies and point fd 1 at
  // stderr, so a stray print anywhere in the process cannot corrupt the stream.
  const int protocol_fd = ::dup(STDOUT_FILENO);
  if (protocol_fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    print_error("cannot set up stdout for the protocol");
    return kExitRuntime;
  }
  std::cerr << "ingero-pipeline mcp: serving " << opts.db_path << " over stdio (MCP " << mcp::kLatestProtocol
            << "); end of input stops the server\n";
  mcp::Server server(std::move(opts));
  const int rc = mcp::run_stdio(server, STDIN_FILENO, protocol_fd);
  ::close(protocol_fd);
  return rc == 0 ? kExitOk : kExitRuntime;
}

Registrar reg{
    "mcp", 50, [](CLI::App& app, int& rc) {
      auto args = std::make_shared<McpArgs>();
      auto* cmd = app.add_subcommand(
          "mcp",
          "Serve a recorded trace to AI agents over the Model Context Protocol (MCP 2025-11-25).\n"
          "Tools: get_check, get_trace_stats, get_causal_chains, explain_chain, get_stacks, run_sql,\n"
          "list_rules, check_rule, why_not, thread_accounting, query_fleet (all read-only); prompt: investigate.\n"
          "See docs/mcp.md.\n"
          "Examples:\n"
          "  ingero-pipeline mcp --db trace.db                  stdio (Claude Code, Cursor, ...)\n"
          "  claude mcp add ingero -- ingero-pipeline mcp --db /abs/trace.db\n"
          "  ingero-pipeline mcp --db trace.db --http 8787      Streamable HTTP on 127.0.0.1");
      cmd->add_option("--db", args->db, "Trace database (Ingero 0.8/0.9 or ours); default: the embedded sample");
      cmd->add_option("--rules", args->rules, "Rule files (.rules) to run besides the default analyses");
      cmd->add_option("--baseline", args->baseline,
                      "A trace of an earlier run: the tool compare_traces diffs --db against it (`diff BASELINE DB`)")
          ->check(CLI::ExistingFile);
      cmd->add_flag("--no-default", args->no_default, "Run only the --rules files");
      add_param_option(cmd, &args->params);
      cmd->add_option("--http", args->http_port, "Serve Streamable HTTP on 127.0.0.1:PORT (0 = any free port)")
          ->check(CLI::Range(0, 65535));
      cmd->add_option("--token", args->token,
                      "Bearer token for --http (default: $INGERO_MCP_TOKEN, else a random one printed on stderr)");
      cmd->add_option("--threads", args->threads, "Engine threads")->check(CLI::Range(1u, 256u));
      add_cost_options(cmd, &args->cost);
      cmd->add_option("--fleet-nodes", args->fleet_nodes,
                      "query_fleet: other nodes' MCP URLs (http://HOST:PORT/mcp, comma-separated)")
          ->delimiter(',');
      cmd->add_option("--fleet-token", args->fleet_token,
                      "query_fleet: bearer token of those nodes (default: $INGERO_MCP_TOKEN)");
      cmd->add_option("--max-rows", args->max_rows, "run_sql row cap (default 10000)")
          ->check(CLI::Range(size_t{1}, size_t{10'000}));
      cmd->add_option("--sql-timeout-ms", args->sql_timeout_ms, "run_sql time budget per statement (default 30000)")
          ->check(CLI::Range(uint64_t{10}, uint64_t{600'000}));
      cmd->callback([args, &rc] { rc = run_mcp(*args); });
    }};

}  // namespace
}  // namespace ingero::cli
