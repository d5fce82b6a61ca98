// `explain --nodes URL,...`: ask several nodes' MCP HTTP endpoints (`mcp --http`) for their
// chains at once and print them together, each with its node, worst first; a node that is down
// or slower than --node-timeout becomes a warning, not a failure (sinks/mcp/fleet_query.h).
// Exit 0 when at least one node answered, 3 when none did.
#pragma once

#include <string>
#include <vector>

namespace ingero::cli {

struct FleetExplainArgs {
  std::vector<std::string> nodes;
  std::string token;  // --token, else $INGERO_MCP_TOKEN
  double timeout_s = 5;
  std::string severity;  // minimum severity ("" = all)
  size_t limit = 20;     // chains per node
  bool json = false;
};

int run_fleet_explain(const FleetExplainArgs& a);

}  // namespace ingero::cli
