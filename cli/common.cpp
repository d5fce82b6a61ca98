#include "cli/common.h"

#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "cli/command.h"
#include "cli/pipeline_common.h"
#include "sinks/store/sqlite_store.h"

#ifdef INGERO_SAMPLE_DB
// The sample database, linked into the binary so the default run needs no files.
asm(".section .rodata\n"
    ".balign 16\n"
    ".global ingero_sample_db_start\n"
    "ingero_sample_db_start:\n"
    ".incbin \"" INGERO_SAMPLE_DB
    "\"\n"
    ".global ingero_sample_db_end\n"
    "ingero_sample_db_end:\n"
    ".previous\n");
extern "C" const char ingero_sample_db_start[];
extern "C" const char ingero_sample_db_end[];
#endif

namespace ingero::cli {

std::string embedded_sample_path() {
#ifdef INGERO_SAMPLE_DB
  static std::once_flag once;
  static std::string path;
  std::call_once(once, [] {
    char tmpl[] = "/tmp/ingero-sample-XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) return;
    const size_t size = static_cast<size_t>(ingero_sample_db_end - ingero_sample_db_start);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(fd, ingero_sample_db_start + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    close(fd);
    if (done == size) {
      path = tmpl;
      std::atexit([] { unlink(path.c_str()); });
    }
  });
  return path;
#else
  return {};
#endif
}

std::unique_ptr<EventSource> open_trace(const std::string& path, std::string& error, size_t batch_size) {
  std::string p = path;
  if (p.empty()) {
    p = embedded_sample_path();
    if (p.empty()) {
      error = "no --db given and this build has no embedded sample trace";
      return nullptr;
    }
    std::fprintf(stderr,
                 "note: no --db given: analysing the embedded sample trace (PyTorch DataLoader starvation, "
                 "recorded by Ingero on an RTX 4090)\n");
  }
  auto src = open_sqlite_trace(p, error, batch_size);
  // Where a live capture lost events: chains over those stretches are judged with it.
  if (src) read_loss_spans(p, src->meta().health);
  if (src && path.empty()) src->meta().path = "<embedded sample: pytorch-dataloader-starvation.db>";
  return src;
}

bool build_plan(const std::vector<std::string>& rule_files, bool no_default, Plan& plan,
                std::vector<std::string>& errors) {
  AnalysisSpec spec;
  spec.use_default = !no_default;
  spec.rule_files = rule_files;
  AnalysisPlan analysis;
  std::string error;
  if (!build_analysis(spec, analysis, error)) {
    errors.push_back(error);
    return false;
  }
  plan = std::move(analysis.plan);
  return true;
}

CLI::Option* add_param_option(CLI::App* cmd, std::vector<std::string>* params) {
  return cmd->add_option("--param", *params,
                         "Override a rule-pack or rule-file param: NAME=VALUE, repeatable (e.g. min_share=60%, "
                         "warmup=0s); the pack's params are at the top of rules/common.rules");
}

bool parse_param_overrides(const std::vector<std::string>& params, std::map<std::string, std::string>& out,
                           std::string& error) {
  for (const auto& p : params) {
    const auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      error = "--param expects NAME=VALUE, got '" + p + "'";
      return false;
    }
    out[p.substr(0, eq)] = p.substr(eq + 1);
  }
  return true;
}

void keep_large_buffers_out_of_the_heap() { mallopt(M_MMAP_THRESHOLD, 128 * 1024); }

void use_one_malloc_arena() { mallopt(M_ARENA_MAX, 1); }

void print_error(const std::string& message) { std::fprintf(stderr, "ingero-pipeline: error: %s\n", message.c_str()); }

int input_damage_status(const TraceMeta& meta) {
  const InputHealth& h = meta.health;
  for (const auto& r : h.recovered)
    std::fprintf(stderr, "ingero-pipeline: note: %s: damaged file: %s\n", meta.path.c_str(), r.c_str());
  if (h.damage.empty()) return kExitOk;
  for (const auto& d : h.damage) print_error(meta.path + ": damaged file: " + d);
  print_error(meta.path + ": the results are partial: they may differ from the undamaged file's" +
              (h.rows_unreadable ? " (" + std::to_string(h.rows_unreadable) + " rows unreadable)" : std::string()) +
              " (exit status 5)");
  return kExitDamaged;
}

void set_quiet(bool quiet) {
  if (quiet) ::setenv("INGERO_QUIET", "1", 1);
}

bool quiet_requested() { return std::getenv("INGERO_QUIET") != nullptr; }

CLI::Option* add_quiet_flag(CLI::App* cmd, bool* quiet, const std::string& help) {
  return cmd->add_flag_function(
      "-q,--quiet",
      [quiet](int64_t count) {
        if (quiet != nullptr) *quiet = count > 0;
        set_quiet(count > 0);
      },
      help);
}

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

}  // namespace ingero::cli
