// `ingero-pipeline merge A B ... -o OUT`: per-node traces into one multi-node trace, each node's
// clock corrected onto the reference node's (sinks/fleet/merge.h has the contract, docs/fleet.md the
// method). Exit 0 on success, 3 on an unreadable input or a node conflict, 2 on bad arguments.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "model/plan.h"
#include "sinks/fleet/merge.h"

namespace ingero::cli {
namespace {

struct MergeArgs {
  std::vector<std::string> inputs;
  std::string out, format;
  bool no_align = false, json = false, quiet = false;
  double min_block_us = 100;
};

// "NAME=PATH" names an unnamed node; a plain path (or one whose '=' part has a '/') is a path.
MergeInput parse_input(const std::string& arg) {
  const auto eq = arg.find('=');
  if (eq != std::string::npos && eq > 0 && arg.substr(0, eq).find('/') == std::string::npos)
    return {arg.substr(eq + 1), arg.substr(0, eq)};
  return {arg, ""};
}

int run_merge(const MergeArgs& a) {
  std::vector<MergeInput> inputs;
  for (const auto& s : a.inputs) inputs.push_back(parse_input(s));
  MergeOptions o;
  o.out = a.out;
  o.format = a.format;
  o.align = !a.no_align;
  o.min_block_ns = static_cast<uint64_t>(a.min_block_us * 1000);
  MergeReport r;
  std::string error;
  if (!merge_traces(inputs, o, r, error)) {
    print_error(error);
    return kExitInput;
  }
  if (a.json) {
    nlohmann::json j;
    j["nodes"] = nlohmann::json::array();
    for (const auto& n : r.nodes) j["nodes"].push_back(merge_node_json(n));
    j["events"] = r.events_out;
    j["output"] = a.out;
    j["warnings"] = r.warnings;
    j["seconds"] = r.seconds;
    j["stragglers"] = stragglers_json(r.stragglers);
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  if (a.quiet) return kExitOk;
  std::printf("merged %zu input(s) -> %s: %llu events in %.2f s\n", a.inputs.size(), a.out.c_str(),
              static_cast<unsigned long long>(r.events_out), r.seconds);
  for (const auto& n : r.nodes) {
    std::printf("  %-20s %10llu events  offset %+.3f ms", n.node.c_str(), static_cast<unsigned long long>(n.events),
                static_cast<double>(n.offset_ns) / 1e6);
    if (n.uncertainty_ns >= 0) std::printf(" +- %.3f ms", static_cast<double>(n.uncertainty_ns) / 1e6);
    else std::printf(" +- unknown");
    std::printf("  [%s%s]\n", n.method.c_str(),
                n.pairs ? (", " + std::to_string(n.pairs) + " collectives").c_str() : "");
    if (!n.note.empty()) std::printf("      %s\n", n.note.c_str());
    if (n.method == "ambiguous")
      std::printf(
          "      clock known only to whole steps: no arrival order is claimed at collectives this node "
          "takes part in\n");
    // Arrival order is claimed only beyond both nodes' clock uncertainties (docs/fleet.md).
    if (n.last_arrivals)
      std::printf(
          "      entered last at %llu of %llu matched collectives, by more than the clock "
          "uncertainty (lead up to %.3f ms)\n",
          static_cast<unsigned long long>(n.last_arrivals), static_cast<unsigned long long>(n.arrivals_compared),
          static_cast<double>(n.max_lead_ns) / 1e6);
    if (n.last_arrivals_unresolved)
      std::printf("      latest at %llu collectives only within the clock uncertainty: no order claimed\n",
                  static_cast<unsigned long long>(n.last_arrivals_unresolved));
  }
  // Stragglers per step (sinks/fleet/stragglers.h): one chain per straggling rank.
  for (const auto& c : straggler_chains(r.stragglers))
    std::printf("[%s] %s  %s\n  %s\n", severity_name(c.severity), c.category.c_str(), c.rule.c_str(),
                c.summary.c_str());
  if (r.stragglers.stragglers.empty() && !r.stragglers.note.empty())
    std::printf("stragglers: none (%s)\n", r.stragglers.note.c_str());
  for (const auto& w : r.warnings) std::printf("warning: %s\n", w.c_str());
  return kExitOk;
}

Registrar reg{
    "merge", 62, [](CLI::App& app, int& rc) {
      auto args = std::make_shared<MergeArgs>();
      auto* cmd = app.add_subcommand(
          "merge",
          "Merge per-node traces (SQLite or LMDB, Ingero 0.8/0.9 or ours) into one trace on one\n"
          "corrected clock. Each node keeps its identity; clock skew is estimated from matched\n"
          "NCCL collectives (the return of the first blocking wait after each), else from the\n"
          "capture's clock anchors, and subtracted. Merging a node twice writes it once.\n"
          "Examples:\n"
          "  ingero-pipeline merge node-a.db node-b.db -o fleet.db\n"
          "  ingero-pipeline merge a=old-0.8.db b=old-0.8-b.db -o fleet.lmdb --json\n"
          "  ingero-pipeline merge a.db b.db -o raw.db --no-align");
      cmd->add_option("inputs", args->inputs, "Traces to merge ([NAME=]PATH; NAME names an unnamed node)")->required();
      cmd->add_option("-o,--output", args->out, "Merged trace to write (.lmdb/.mdb = LMDB, else SQLite)")->required();
      cmd->add_option("--to-format", args->format, "Output format")->check(CLI::IsMember({"sqlite", "lmdb"}));
      cmd->add_flag("--no-align", args->no_align, "Keep every node's raw clock");
      cmd->add_option("--min-block-us", args->min_block_us, "A wait shorter than this did not block (no sync point)")
          ->check(CLI::Range(0.0, 1e6));
      cmd->add_flag("--json", args->json, "Print {\"nodes\":[{node,events,offset_ns,uncertainty_ns,method,...}]}");
      add_quiet_flag(cmd, &args->quiet, "No summary and no progress on stderr");
      cmd->callback([args, &rc] { rc = run_merge(*args); });
    }};

}  // namespace
}  // namespace ingero::cli
