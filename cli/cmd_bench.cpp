// `ingero-pipeline bench`: how fast the pipeline explains a captured trace. Loads the trace, then
// replays it through the analysis as fast as it can and reports load and run time separately,
// events/s, peak memory, the chains found and (with the rule pack) each rule's time when it runs
// alone.
//
// What the phases measure:
// - load: opening the trace. SQLite: schema checks, side tables and the reorder slack; the rows
//   are streamed during `run` (INGERO_SQLITE_STREAM=0: loaded and sorted here, 80 bytes each).
//   LMDB: opening the environment and reading the file once through the OS page cache (not into
//   this process), so `run` measures the pipeline rather than the disk; --no-warm skips that.
// - run: the engine over every batch (decode + rules for LMDB), until the final watermark.
// - peak_rss_bytes: VmHWM of the process after the run (LMDB replay releases decoded pages, so
//   it does not grow with the trace).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/config.h"
#include "cli/pipeline_common.h"
#include "engine/engine.h"
#include "engine/synth.h"

namespace ingero::cli {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// CPU time of the whole process (every thread), seconds: on a shared machine events per
// CPU-second is steadier than events per wall-second.
double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

struct BenchArgs {
  std::string trace;
  uint64_t synthetic = 0;
  std::vector<std::string> rules, params;
  bool no_default = false, builtin = false, json = false, replay_only = false, no_per_rule = false,
       no_warm = false;
  unsigned threads = 1;
  size_t batch = 4096;
};

// Reads the file once so its pages sit in the OS page cache (not in this process).
uint64_t warm_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(4 << 20);
  uint64_t total = 0;
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) total += static_cast<uint64_t>(n);
  ::close(fd);
  return total;
}

std::unique_ptr<EventSource> open_bench_source(const BenchArgs& a, std::string& error) {
  if (a.synthetic) return std::make_unique<synth::LargeTraceSource>(a.synthetic, 1, a.batch);
  return open_any_trace(a.trace, error, a.batch);
}

std::string human_rate(double v) {
  char buf[32];
  if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1f k", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f ", v);
  return buf;
}

int run_bench(const BenchArgs& a) {
  if (a.trace.empty() == (a.synthetic == 0)) {
    print_error("give --trace FILE (SQLite or LMDB) or --synthetic N");
    return kExitUsage;
  }
  AnalysisSpec spec;
  spec.use_default = !a.no_default;
  spec.builtin = a.builtin;
  spec.rule_files = a.rules;
  for (const auto& p : a.params) {
    const auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      print_error("--param expects name=value, got '" + p + "'");
      return kExitUsage;
    }
    spec.params[p.substr(0, eq)] = p.substr(eq + 1);
  }
  AnalysisPlan ap;
  const auto tp = Clock::now();
  if (!a.replay_only) {
    std::string errors;
    if (!build_analysis(spec, ap, errors)) {
      std::fputs(errors.c_str(), stderr);
      return kExitInput;
    }
  }
  const double plan_s = since(tp);

  const auto tl = Clock::now();
  std::string error;
  auto src = open_bench_source(a, error);
  if (!src) {
    print_error(error);
    return kExitInput;
  }
  const std::string format = a.synthetic ? "synthetic" : trace_format_of(a.trace);
  if (format == "lmdb" && !a.no_warm) warm_page_cache(a.trace);
  const double load_s = since(tl);

  const auto tr = Clock::now();
  const double cpu0 = cpu_seconds();
  uint64_t events = 0;
  AnalysisResult result;
  if (a.replay_only) {
    Batch b;
    while (src->next(b)) events += b.events.size();
  } else {
    EngineOptions eo;
    eo.threads = a.threads;
    std::vector<std::string> errs;
    result = run_plan(ap.plan, *src, eo, &errs);
    if (!errs.empty()) {
      for (const auto& e : errs) print_error("plan: " + e);
      return kExitInput;
    }
    events = result.counters.events_in;
  }
  const double run_s = since(tr);
  const double run_cpu = cpu_seconds() - cpu0;
  const uint64_t rss = peak_rss_bytes();
  src.reset();

  // Each rule alone over the same trace: its own cost, including the shared replay and sharding.
  std::vector<std::tuple<std::string, double, size_t, double>> per_rule;  // name, wall, chains, CPU
  if (!a.replay_only && !a.no_per_rule) {
    for (const auto& [name, plan] : ap.rule_plans) {
      auto s = open_bench_source(a, error);
      if (!s) break;
      EngineOptions eo;
      eo.threads = a.threads;
      eo.compute_stats = false;
      const auto t = Clock::now();
      const double c0 = cpu_seconds();
      const AnalysisResult r = run_plan(plan, *s, eo);
      per_rule.emplace_back(name, since(t), r.chains.size(), cpu_seconds() - c0);
    }
  }

  std::map<std::string, uint64_t> by_category;
  for (const auto& c : result.chains) ++by_category[c.category];
  const double eps = run_s > 0 ? static_cast<double>(events) / run_s : 0;
  if (a.json) {
    nlohmann::json j{{"trace", a.synthetic ? "<synthetic>" : a.trace},
                     {"format", format},
                     {"events", events},
                     {"load_seconds", load_s},
                     {"plan_seconds", plan_s},
                     {"run_seconds", run_s},
                     {"events_per_s", eps},
                     {"run_cpu_seconds", run_cpu},
                     {"events_per_cpu_s", run_cpu > 0 ? static_cast<double>(events) / run_cpu : 0},
                     {"peak_rss_bytes", rss},
                     {"threads", a.threads},
                     {"replay_only", a.replay_only},
                     {"analysis", a.replay_only ? "none" : ap.description},
                     {"chains", result.chains.size()},
                     {"chains_by_category", by_category}};
    nlohmann::json pr = nlohmann::json::array();
    for (const auto& [name, secs, chains, cpu] : per_rule)
      pr.push_back({{"rule", name}, {"run_seconds", secs}, {"run_cpu_seconds", cpu}, {"chains", chains},
                    {"events_per_s", secs > 0 ? static_cast<double>(events) / secs : 0},
                    {"events_per_cpu_s", cpu > 0 ? static_cast<double>(events) / cpu : 0}});
    j["per_rule"] = pr;
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf("trace        %s (%s)\n", a.synthetic ? "<synthetic>" : a.trace.c_str(), format.c_str());
  std::printf("analysis     %s\n", a.replay_only ? "none (replay only)" : ap.description.c_str());
  std::printf("events       %llu\n", static_cast<unsigned long long>(events));
  std::printf("load         %.3f s\n", load_s);
  if (!a.replay_only) std::printf("plan         %.3f s\n", plan_s);
  std::printf("run          %.3f s  (%sevents/s, %u thread%s; %.3f CPU-s, %sevents/CPU-s)\n", run_s,
              human_rate(eps).c_str(), a.threads, a.threads == 1 ? "" : "s", run_cpu,
              human_rate(run_cpu > 0 ? static_cast<double>(events) / run_cpu : 0).c_str());
  std::printf("peak RSS     %.1f MiB\n", static_cast<double>(rss) / (1 << 20));
  if (!a.replay_only) {
    std::printf("chains       %zu", result.chains.size());
    const char* sep = " (";
    for (const auto& [cat, n] : by_category) {
      std::printf("%s%s %llu", sep, cat.c_str(), static_cast<unsigned long long>(n));
      sep = ", ";
    }
    std::printf("%s\n", by_category.empty() ? "" : ")");
  }
  if (!per_rule.empty()) {
    std::printf("per rule (each alone over the whole trace):\n");
    for (const auto& [name, secs, chains, cpu] : per_rule)
      std::printf("  %-28s %8.3f s  %8.3f CPU-s  %10sevents/CPU-s  %zu chains\n", name.c_str(), secs, cpu,
                  human_rate(cpu > 0 ? static_cast<double>(events) / cpu : 0).c_str(), chains);
  }
  return kExitOk;
}

Registrar reg{"bench", 70, [](CLI::App& app, int& rc) {
                auto args = std::make_shared<BenchArgs>();
                auto* cmd = app.add_subcommand(
                    "bench",
                    "Replay a captured trace through the analysis as fast as possible and report load and\n"
                    "run time separately, events/s, peak memory, the chains found and each rule's time alone.\n"
                    "Examples:\n"
                    "  ingero-pipeline bench --trace big.lmdb --json\n"
                    "  ingero-pipeline bench --trace big.lmdb --replay-only      # the LMDB reader alone\n"
                    "  ingero-pipeline bench --trace trace.db --rules my.rules --threads 2\n"
                    "  ingero-pipeline bench --synthetic 5000000                 # no file: generated events");
                cmd->add_option("--trace", args->trace, "Captured trace (SQLite or LMDB, detected from the file)");
                cmd->add_option("--synthetic", args->synthetic, "Generate N events in memory instead of a file");
                cmd->add_option("--rules", args->rules, "Rule files, added to the default rules");
                cmd->add_flag("--no-default-rules", args->no_default, "Only the --rules files");
                cmd->add_flag("--builtin", args->builtin,
                              "Default analyses from the built-in plans instead of the rule pack");
                cmd->add_option("--param", args->params, "Override a rule parameter: name=value (e.g. min_share=60%)");
                cmd->add_option("--threads", args->threads, "Engine threads")->check(CLI::Range(1u, 256u));
                cmd->add_option("--batch", args->batch, "Events per batch")->check(CLI::Range(size_t{64}, size_t{1} << 20));
                cmd->add_flag("--json", args->json,
                              "JSON: events, load_seconds, run_seconds, events_per_s, peak_rss_bytes, chains, ...");
                cmd->add_flag("--replay-only", args->replay_only, "Only read the trace (no rules): reader throughput");
                cmd->add_flag("--no-per-rule", args->no_per_rule, "Skip the per-rule runs");
                cmd->add_flag("--no-warm", args->no_warm, "LMDB: do not pre-read the file into the page cache");
                cmd->callback([args, &rc] { rc = run_bench(*args); });
              }};

}  // namespace
}  // namespace ingero::cli
