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
