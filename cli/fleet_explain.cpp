#include "cli/fleet_explain.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "sinks/mcp/fleet_query.h"

namespace ingero::cli {
namespace {

int severity_rank(const std::string& s) {
  std::string l = s;
  for (auto& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return l == "high" ? 3 : l == "medium" ? 2 : l == "low" ? 1 : 0;
}

}  // namespace

int run_fleet_explain(const FleetExplainArgs& a) {
  FleetQueryOptions o;
  o.token = a.token;
  if (o.token.empty())
    if (const char* t = std::getenv("INGERO_MCP_TOKEN")) o.token = t;
  o.deadline_ms = static_cast<int>(a.timeout_s * 1000);
  nlohmann::json args = {{"limit", a.limit}};
  if (!a.severity.empty()) args["severity"] = a.severity;
  const auto replies = fleet_call(a.nodes, "get_causal_chains", args, o);
  nlohmann::json chains = nlohmann::json::array(), warnings = nlohmann::json::array(), nodes = nlohmann::json::array();
  size_t answered = 0;
  for (const auto& r : replies) {
    nodes.push_back({{"url", r.url}, {"ok", r.ok}, {"ms", r.ms}, {"error", r.error}});
    if (!r.ok) {
      warnings.push_back(r.url + ": " + r.error);
      continue;
    }
    ++answered;
    for (auto c : r.data.value("chains", nlohmann::json::array())) {
      c["from"] = r.url;
      chains.push_back(std::move(c));
    }
  }
  std::stable_sort(chains.begin(), chains.end(), [](const nlohmann::json& x, const nlohmann::json& y) {
    return severity_rank(x.value("severity", "")) > severity_rank(y.value("severity", ""));
  });
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"nodes", nodes}, {"chains", chains}, {"warnings", warnings}}.dump(2).c_str());
  } else {
    for (const auto& c : chains) {
      std::string where = c.value("from", "");
      if (c.contains("node") && c["node"].is_string() && !c["node"].get<std::string>().empty())
        where = c["node"].get<std::string>().append(" (").append(where).append(")");
      std::printf("[%s] %s  %s\n  %s\n", c.value("severity", "?").c_str(), c.value("category", "?").c_str(),
                  where.c_str(), c.value("summary", "").c_str());
    }
    std::printf("%zu chain(s) from %zu of %zu node(s)\n", chains.size(), answered, replies.size());
    for (const auto& w : warnings) std::fprintf(stderr, "warning: %s\n", w.get<std::string>().c_str());
  }
  return answered ? kExitOk : kExitInput;
}

}  // namespace ingero::cli
