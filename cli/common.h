// Helpers shared by the subcommands: opening a trace (a file or the embedded sample), choosing
// the analysis plan, and printing errors the same way everywhere.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/plan.h"
#include "engine/trace.h"

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
bool stdout_is_terminal();

// For commands that capture live (trace, run with an ebpf source): event batches of up to 1.3 MB
// are allocated and freed several times a second. glibc raises its mmap threshold after the first
// such free, so later batches land in the heap and fragment it; a fixed threshold keeps them
// mmap-backed and returned on free (measured at 200k events/s without --db: peak 56 -> 46 MiB,
// anonymous 33 -> 13 MiB; docs/performance.md). Call before starting threads.
void keep_large_buffers_out_of_the_heap();

}  // namespace ingero::cli
