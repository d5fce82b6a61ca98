// The MCP server core: JSON-RPC 2.0 framing, the MCP lifecycle and the method table, separate
// from any I/O so tests and the fuzzer drive it directly (transport.h carries it over stdio/HTTP).
//
// Contract:
// - handle_line() takes one message (a line of newline-delimited JSON) and returns the reply
//   line, or nothing for notifications and client responses. It never throws and never
//   crashes on any input: oversized messages, nesting deeper than `max_depth`, invalid UTF-8 and
//   malformed JSON get -32700; a well-formed value that is not a request gets -32600; unknown
//   methods -32601; bad params and unknown tools/prompts/resources -32602. A tool's own failure
//   is a normal result with isError = true.
// - Protocol revisions: 2025-11-25 (current), 2025-06-18, 2025-03-26. An unknown requested
//   revision is answered with the current one (the client decides). JSON-RPC batches (arrays)
//   are accepted only once 2025-03-26 has been negotiated, as that revision requires.
// - Before `initialize`, only `initialize` and `ping` are served.
// - Cancellation: a request runs with a RequestContext; the transport sets `cancelled` when a
//   notifications/cancelled for its id arrives, long tools (run_sql, analysis) poll it, and the
//   transport drops the reply of a cancelled request, as the spec asks.
// - Thread safety: handle_* may be called from one worker thread at a time; cancel flags are
//   atomics set from the reader thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/plan.h"
#include "operators/chain_annotate.h"
#include "operators/incidents.h"
#include "sinks/store/sql_query.h"

namespace ingero::mcp {

using Json = nlohmann::json;

inline constexpr const char* kLatestProtocol = "2025-11-25";
const std::vector<std::string>& supported_protocols();  // newest first

// JSON-RPC / MCP error codes.
inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;
inline constexpr int kResourceNotFound = -32002;

struct ServerOptions {
  std::string db_path;        // the trace every tool reads
  std::string baseline_path;  // compare_traces: the BEFORE trace when no before_range is given ("" = none)
  // The analysis the tools report: the default analyses and/or compiled rule files. An empty plan
  // means default_plan(). `rule_files` are the .rules files it came from (rules/pack resource).
  Plan plan;
  std::vector<std::string> rule_files;
  bool default_pack = true;  // the plan includes the default analyses
  // The --param overrides the plan was compiled with (shown in the rules/pack resource), and the
  // chain annotator's options that follow from them (warm-up, the tail re-judgement:
  // cli/pipeline_common.h annotate_options()).
  std::map<std::string, std::string> params;
  AnnotateOptions annotate = LiveChainAnnotator::replay_defaults();
  // Incidents' GPUs and price (`mcp --gpus N --gpu-hour-price P --rates FILE`, as `explain`): the
  // analysis and compare_traces assemble incidents with them, so they carry GPU-hours and cost.
  IncidentOptions incidents;
  size_t page_size = 50;                // items per page of tools/prompts/resources lists
  size_t max_message_bytes = 4u << 20;  // larger messages are refused unread
  int max_depth = 64;                   // JSON nesting limit (the parser recurses)
  SqlLimits sql;                        // caps of run_sql
  unsigned engine_threads = 1;
  // query_fleet (sinks/mcp/fleet_query.h): the nodes asked when a call names none, and their token.
  std::vector<std::string> fleet_nodes;
  std::string fleet_token;
  // Drop the trace caches (analysis, SQL connection) at each initialize: for a trace that grows
  // while the server runs (`agent`: a directory of rolled files), a new session reads it afresh.
  bool refresh_on_initialize = false;
};

struct RequestContext {
  std::atomic<bool> cancelled{false};
};

class TraceTools;  // trace_tools.h

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // One line in, at most one line out (no trailing newline).
  std::optional<std::string> handle_line(std::string_view line, RequestContext* ctx = nullptr);
  // One parsed message (object or batch array).
  std::optional<Json> handle_message(const Json& msg, RequestContext* ctx = nullptr);

  // Parses a line with the same limits as handle_line; false (and `error` set to a JSON-RPC
  // error reply) when it cannot be parsed. Used by transports to peek at ids and methods.
  bool parse(std::string_view line, Json& out, Json* error_reply) const;

  bool initialized() const { return initialized_; }
  // Forgets the negotiated session (HTTP DELETE / a new initialize); the trace caches stay.
  void reset_session() {
    initialized_ = false;
    protocol_ = kLatestProtocol;
  }
  const std::string& protocol_version() const { return protocol_; }
  const ServerOptions& options() const { return options_; }
  TraceTools& tools() { return *tools_; }

  // A stable key for a JSON-RPC id (string ids and integer ids never collide).
  static std::string id_key(const Json& id);

 private:
  Json handle_request(const Json& msg, RequestContext* ctx);
  Json dispatch(const std::string& method, const Json& params, RequestContext* ctx);

  ServerOptions options_;
  std::unique_ptr<TraceTools> tools_;
  bool initialized_ = false;
  std::string protocol_ = kLatestProtocol;
  std::string client_name_;
};

// Thrown inside the server only (never escapes handle_*): becomes a JSON-RPC error.
struct RpcError {
  int code;
  std::string message;
  Json data = nullptr;
};

Json make_error(const Json& id, int code, const std::string& message, const Json& data = nullptr);
Json make_result(const Json& id, Json result);
// dump() that never throws on invalid UTF-8 (replaces it).
std::string to_line(const Json& j);
// Deepest nesting of arrays/objects in a JSON text, counted without parsing (strings skipped);
// stops counting once past `stop_at`.
int json_nesting_depth(std::string_view s, int stop_at);

}  // namespace ingero::mcp
