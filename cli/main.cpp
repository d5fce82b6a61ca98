// ingero-pipeline: explains why GPU workloads stall. Subcommands live in cli/cmd_*.cpp.
#include <algorithm>
#include <cstdio>
#include <exception>

#include "cli/command.h"

namespace ingero::cli {
std::vector<CommandEntry>& command_registry() {
  static std::vector<CommandEntry> registry;
  return registry;
}
}  // namespace ingero::cli

namespace {
// The whole command line: set up the subcommands, parse, run. Errors from parsing and from the
// commands are handled here; main() only catches what escapes set-up itself.
int run_cli(int argc, char** argv) {
  using namespace ingero::cli;
  CLI::App app{
      "ingero-pipeline - explains why GPU workloads stall.\n\n"
      "It joins slow CUDA/driver/NCCL calls with what the host was doing at the same moment on\n"
      "the same thread (off-CPU time, block I/O, TCP retransmits, memory pressure) and reports\n"
      "causal chains with evidence. Start with:\n"
      "  ingero-pipeline explain               analyse the bundled sample trace\n"
      "  ingero-pipeline stats --db trace.db   per-op latency table of a recorded trace\n"
      "  ingero-pipeline explain --db trace.db causal chains of a recorded trace\n",
      "ingero-pipeline"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ingero-pipeline 0.1.0");
  int exit_code = kExitOk;
  auto& registry = command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandEntry& a, const CommandEntry& b) { return a.order < b.order; });
  for (auto& entry : registry) entry.setup(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ingero-pipeline: error: %s\n", e.what());
    return kExitRuntime;
  }
  return exit_code;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    return run_cli(argc, argv);
  } catch (const std::exception& e) {  // set-up failed (a CLI11 construction error, bad_alloc)
    std::fprintf(stderr, "ingero-pipeline: error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "ingero-pipeline: error: unknown exception\n");
  }
  return ingero::cli::kExitRuntime;
}
