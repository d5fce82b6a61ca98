// Fan-out of one MCP tool call to several nodes' MCP HTTP endpoints (`explain --nodes`;
// docs/fleet.md). The user's CLI is the merge point.
//
// Contract:
// - Each node is "http://HOST:PORT/PATH" (plain HTTP; the MCP HTTP transport listens on loopback
//   only, so remote nodes are reached through a tunnel or proxy). Every request carries
//   `Authorization: Bearer <token>`. Per node: initialize (session id), then tools/call.
// - All nodes are asked in parallel (one thread each); each node has its own deadline covering
//   connect, both requests and the replies. A node that is down, slow past its deadline, answers
//   garbage, refuses the token or returns a tool error gets ok = false and a one-line `error`;
//   the others are unaffected (partial results + warnings). Replies are capped at
//   max_reply_bytes.
// - Never throws.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ingero {

struct FleetQueryOptions {
  std::string token;
  int deadline_ms = 5000;
  size_t max_reply_bytes = size_t{32} << 20;
};

// The implicit noexcept move goes through nlohmann::json's, which clang-tidy 14 cannot prove
// non-throwing; no member here throws on move.
// NOLINTNEXTLINE(bugprone-exception-escape): see above
struct FleetNodeReply {
  std::string url;
  bool ok = false;
  std::string error;
  double ms = 0;
  nlohmann::json data;  // the tool's structuredContent
};

std::vector<FleetNodeReply> fleet_call(const std::vector<std::string>& urls, const std::string& tool,
                                       const nlohmann::json& arguments, const FleetQueryOptions& options);

}  // namespace ingero

namespace ingero {

// The MCP tool `query_fleet` (sinks/mcp/trace_tools.cpp calls it): `action` chains | ops | sql,
// `nodes` (comma-separated URLs; default `default_nodes`), `sql`/`query`, `limit`, `timeout_ms`.
// chains: every node's chains worst first, each with "from"; ops: each node's per-op statistics
// side by side (NOT merged quantiles: the nodes' sketches are not exported yet); sql: rows with
// the node's URL prepended. Always lists every node with ok/ms/error, plus warnings. Returns
// false with `error` for bad arguments or when no node answered.
bool query_fleet(const nlohmann::json& args, const std::vector<std::string>& default_nodes, const std::string& token,
                 nlohmann::json& out, std::string& error);

}  // namespace ingero
