// Helpers shared by the subcommands: opening a trace (a file or the embedded sample), choosing
// the analysis plan, and printing errors the same way everywhere.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

#include "model/plan.h"
#include "model/trace.h"

namespace ingero::cli {

// The embedded sample trace (samples/pytorch-dataloader-starvation.db, compiled into the binary),
// written to a private temporary file on first use. Empty if the build has none.
std::string embedded_sample_path();

// Opens an SQLite trace at `path`; an empty path opens the embedded sample and notes that on
// stderr. Null + message on failure. (cli/pipeline_common.h: open_any_trace() also reads LMDB.)
std::unique_ptr<EventSource> open_trace(const std::string& path, std::string& error, size_t batch_size = 4096);

// The plan for explain/trace/mcp: the default analyses (the embedded rule pack) plus, or instead
// of, rule files. A thin wrapper over build_analysis() (cli/pipeline_common.h). Returns false with
// messages formatted for a terminal on failure.
bool build_plan(const std::vector<std::string>& rule_files, bool no_default, Plan& plan,
                std::vector<std::string>& errors);

void print_error(const std::string& message);

// After a command has read a trace (`meta`, its health final): notes on stderr the damage the
// reader worked around without changing a result, and returns kExitOk; for damage that may
// have changed the results (meta.health.damage), prints an error per damaged part naming the
// file, then that the results are partial, and returns kExitDamaged (docs/cli.md).
int input_damage_status(const TraceMeta& meta);
bool stdout_is_terminal();

// --param NAME=VALUE (repeatable), the same option on every command that runs the analyses
// (explain, trace, export, mcp, bench): rule-pack and rule-file params, `warmup` included.
CLI::Option* add_param_option(CLI::App* cmd, std::vector<std::string>* params);
// The --param strings as name -> value text. False, with the message in `error`, for one that is
// not NAME=VALUE (the value is checked later, by the rule compiler or rules::pack_param()).
bool parse_param_overrides(const std::vector<std::string>& params, std::map<std::string, std::string>& out,
                           std::string& error);

// For commands that capture live (trace, run with an ebpf source): event batches of up to 1.3 MB
// are allocated and freed several times a second. glibc raises its mmap threshold after the first
// such free, so later batches land in the heap and fragment it; a fixed threshold keeps them
// mmap-backed and returned on free (measured at 200k events/s without --db: peak 56 -> 46 MiB,
// anonymous 33 -> 13 MiB; docs/performance.md). Call before starting threads.
void keep_large_buffers_out_of_the_heap();

// Replay commands call this first, before any thread starts: one glibc malloc arena for the
// process. A replay's batches are filled on its reader thread and freed on the engine's, and with
// an arena per thread each keeps what the others freed: `explain --threads 2` of a 50 M-event
// trace peaked at 83.7-94.9 MB RSS with 62.1 MB of live heap (heaptrack), 71.4 MB with one arena
// (docs/history/issue-12.md, part 10). Nothing on the replay paths allocates per event, so the one
// arena's lock costs no measurable time. Live capture keeps glibc's default. Call before starting threads.
void use_one_malloc_arena();

// --quiet for long commands (explain, convert, stats, merge, bench): no progress line on stderr.
// Progress is only ever drawn when stderr is a terminal; the SQLite reader decides when a trace
// is opened, from the INGERO_QUIET environment variable (sinks/store/sqlite_reader.cpp). So the flag
// sets INGERO_QUIET=1 in this process's environment while the command line is parsed, before
// any trace is opened (children inherit it). `quiet`, when given, also receives the flag's value
// for the command's own output (e.g. a summary line). Returns the option (`-q,--quiet`).
CLI::Option* add_quiet_flag(CLI::App* cmd, bool* quiet = nullptr,
                            const std::string& help = "No progress on stderr (only drawn on a terminal)");
// What add_quiet_flag does on the flag: true sets INGERO_QUIET=1, false leaves the environment.
void set_quiet(bool quiet);
bool quiet_requested();  // INGERO_QUIET is set (by the flag or by the caller's environment)

}  // namespace ingero::cli
