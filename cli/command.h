// How a subcommand plugs into `ingero-pipeline`: each cli/cmd_*.cpp defines one registrar.
//
//   static ingero::cli::Registrar reg{"stats", 10, [](CLI::App& app, int& rc) { ... }};
//
// `setup` adds the subcommand to `app`; its callback stores the exit status in `rc`.
// `order` sets the position in --help (lower first). Files are picked up by cli/CMakeLists.txt.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace ingero::cli {

using CommandSetup = std::function<void(CLI::App& app, int& exit_code)>;

struct CommandEntry {
  std::string name;
  int order;
  CommandSetup setup;
};

std::vector<CommandEntry>& command_registry();

struct Registrar {
  Registrar(std::string name, int order, CommandSetup setup) {
    command_registry().push_back({std::move(name), order, std::move(setup)});
  }
};

// Exit statuses shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFindings = 1;  // e.g. `rules check` found errors
inline constexpr int kExitUsage = 2;     // bad arguments
inline constexpr int kExitInput = 3;     // unreadable or invalid input file
inline constexpr int kExitRuntime = 4;   // the system refused (privileges, BPF)
inline constexpr int kExitDamaged = 5;   // an input file is damaged: the results printed are partial

}  // namespace ingero::cli
