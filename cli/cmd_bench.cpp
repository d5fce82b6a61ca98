// `ingero-pipeline bench`: how fast the pipeline explains a captured trace, and what it costs in
// CPU and memory. Reports three phases for the whole analysis (the rule pack, or --rules) and the
// run phase of each rule alone, as a table or as JSON (--json; every field in docs/cli.md).
//
// Phases (default: "preloaded" mode):
// - end_to_end: open the trace and stream it through the analysis, as `explain` does (reading and
//   decoding interleaved with the rules). Measured first, so its peak RSS is the streaming cost.
// - load: read and decode the whole trace ONCE into memory (the batches exactly as the reader
//   hands them out, watermarks included) plus its metadata. rss_after_load_bytes says what that
//   costs (80 bytes per event plus vector slack).
// - run: the analysis replayed from those in-memory batches: the rules' cost without the reader.
// - per_rule: each rule alone, replayed from the same in-memory batches (the trace is not read
//   again per rule). --per-rule-end-to-end also streams each rule from the file.
// Every phase reports wall seconds, process CPU seconds (all threads; steadier than wall time on a
// shared machine), events/s for both, and the peak RSS during the phase (VmHWM, reset before the
// phase through /proc/self/clear_refs; when the kernel refuses, peaks are cumulative and
// `peak_rss_reset` is false).
// Memory guard: when the decoded events would exceed --max-preload-mb (default: half of
// MemAvailable at start), loading stops, the memory is released and bench falls back to
// "streamed" mode: per-rule runs then stream the file again, and load/run are not split.
// --no-preload chooses that mode up front. --replay-only reads the trace without rules.
// LMDB: the file is first read once through the OS page cache (not into this process:
// `warm_seconds`), so the phases measure the pipeline rather than the disk; --no-warm skips that.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/bench_scaling.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/config.h"
#include "cli/pipeline_common.h"
#include "cli/preloaded_source.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "operators/time_accounting.h"

#ifdef INGERO_HAVE_IP_RULES
#include "dsl/compiler.h"
#include "rules/pack.h"
#endif

namespace ingero::cli {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// CPU time of the whole process (every thread): user + system, system alone, and the minor page faults
// so far. A phase that takes fresh memory from the kernel pays in system time (page faults), which on a
// VM whose memory the host backs lazily can move run times by tens of percent.
struct CpuUsage {
  double cpu = 0, sys = 0;
  uint64_t minor_faults = 0;
};
CpuUsage cpu_usage() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6; };
  return {s(ru.ru_utime) + s(ru.ru_stime), s(ru.ru_stime), static_cast<uint64_t>(ru.ru_minflt)};
}

// A field of /proc/self/status in bytes ("VmRSS:", "VmHWM:"); 0 if unknown.
uint64_t proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::char_traits<char>::length(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0) return std::strtoull(line.c_str() + n, nullptr, 10) * 1024;
  return 0;
}

// MemAvailable of /proc/meminfo in bytes; 0 if unknown.
uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("MemAvailable:", 0) == 0) return std::strtoull(line.c_str() + 13, nullptr, 10) * 1024;
  return 0;
}

// Resets VmHWM to the current RSS (Linux >= 4.0). False when the kernel refuses.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

struct BenchArgs {
  std::string trace;
  uint64_t synthetic = 0;
  std::vector<std::string> rules, params;
  bool no_default = false, builtin = false, json = false, replay_only = false, no_per_rule = false, no_warm = false,
       no_preload = false, per_rule_e2e = false;
  bool accounting = false;  // --accounting: the time accounting observer in end_to_end and run, as explain runs it
  std::vector<std::string> ab_without;  // --ab-without: rule files whose cost the interleaved rounds measure
  unsigned ab_rounds = 7;
  unsigned threads = 1;
  unsigned scaling = 0;  // rounds of --scaling (0: none)
  size_t batch = 4096;
  uint64_t max_preload_mb = 0;  // 0 = half of MemAvailable
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

struct Phase {
  bool measured = false;
  double wall = 0, cpu = 0, sys = 0;
  uint64_t events = 0, peak_rss = 0, minor_faults = 0;
  size_t chains = 0;
  double eps() const { return wall > 0 ? static_cast<double>(events) / wall : 0; }
  double epcs() const { return cpu > 0 ? static_cast<double>(events) / cpu : 0; }
};

// Times `body` (which returns the number of events it handled) as one phase.
template <typename F>
Phase measure(F&& body) {
  Phase p;
  reset_peak_rss();
  const auto t = Clock::now();
  const CpuUsage c0 = cpu_usage();
  p.events = body(p);
  p.wall = since(t);
  const CpuUsage c1 = cpu_usage();
  p.cpu = c1.cpu - c0.cpu;
  p.sys = c1.sys - c0.sys;
  p.minor_faults = c1.minor_faults - c0.minor_faults;
  p.peak_rss = peak_rss_bytes();
  p.measured = true;
  return p;
}

nlohmann::json phase_json(const Phase& p) {
  return {{"seconds", p.wall},
          {"cpu_seconds", p.cpu},
          {"system_cpu_seconds", p.sys},
          {"minor_page_faults", p.minor_faults},
          {"events", p.events},
          {"events_per_s", p.eps()},
          {"events_per_cpu_s", p.epcs()},
          {"peak_rss_bytes", p.peak_rss}};
}

std::string human_rate(double v) {
  char buf[32];
  if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1f k", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f ", v);
  return buf;
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

void print_phase_row(const char* name, const Phase& p) {
  std::printf("  %-26s %9.3f %9.3f %12s %14s %11s\n", name, p.wall, p.cpu, (human_rate(p.eps()) + "/s").c_str(),
              (human_rate(p.epcs()) + "/CPU-s").c_str(), mib(p.peak_rss).c_str());
}

struct PerRule {
  std::string name;
  Phase run, e2e;
};

// --ab-without: the same analysis without the rule files named (a pack file such as `time.rules`,
// or a --rules file, by path or file name), compiled the way build_analysis compiles the whole.
bool build_plan_without(const BenchArgs& a, const AnalysisSpec& spec, Plan& out, std::string& error) {
#ifdef INGERO_HAVE_IP_RULES
  auto base = [](const std::string& p) { return p.substr(p.find_last_of('/') + 1); };
  auto excluded = [&](const std::string& path) {
    return std::any_of(a.ab_without.begin(), a.ab_without.end(),
                       [&](const std::string& x) { return x == path || base(x) == base(path); });
  };
  std::vector<dsl::RuleSource> sources;
  size_t left_out = 0;
  if (spec.use_default)
    for (auto& src : rules::default_rule_sources()) {
      if (excluded(src.path)) ++left_out;
      else sources.push_back(std::move(src));
    }
  for (const auto& path : a.rules) {
    if (excluded(path)) {
      ++left_out;
      continue;
    }
    std::ifstream f(path);
    if (!f) {
      error = path + ": cannot read the file";
      return false;
    }
    sources.push_back({path, std::string(std::istreambuf_iterator<char>(f), {})});
  }
  if (left_out == 0) {
    error =
        "--ab-without: no rule file of the analysis is named that (a pack file such as time.rules, or a --rules file)";
    return false;
  }
  if (sources.empty()) {
    error = "--ab-without: nothing would be left to run";
    return false;
  }
  dsl::CompileOptions co;
  for (const auto& [k, v] : spec.params)
    if (k != "window") co.params[k] = v;
  dsl::CompileResult r = dsl::compile_rules(sources, rules::pack_compile_options(co));
  if (!r.ok()) {
    error = "--ab-without: the analysis without those files does not compile: " +
            dsl::render_diagnostics(r.diagnostics);
    return false;
  }
  out = std::move(r.plan);
  return true;
#else
  (void)a, (void)spec, (void)out;
  error = "--ab-without needs the rule compiler, which this build does not have";
  return false;
#endif
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int run_bench(const BenchArgs& a) {
  if (a.trace.empty() == (a.synthetic == 0)) {
    print_error("give --trace FILE (SQLite or LMDB) or --synthetic N");
    return kExitUsage;
  }
  if (a.scaling && (a.threads < 2 || a.replay_only || a.no_preload)) {  // 0 (automatic) too
    print_error(
        "--scaling sets --threads N (2 or more) against one thread on the trace replayed from memory: give "
        "--threads 2 (or more), without --replay-only or --no-preload");
    return kExitUsage;
  }
  AnalysisSpec spec;
  spec.use_default = !a.no_default;
  spec.builtin = a.builtin;
  spec.rule_files = a.rules;
  if (std::string error; !parse_param_overrides(a.params, spec.params, error)) {
    print_error(error);
    return kExitUsage;
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
  Plan without_plan;
  if (!a.ab_without.empty()) {
    std::string err;
    if (a.replay_only || a.no_preload || a.ab_rounds == 0)
      err = "--ab-without needs the run phase (no --replay-only, --no-preload) and --ab-rounds >= 1";
    else if (a.threads != 1) err = "--ab-without measures one engine thread: leave --threads at 1";
    else build_plan_without(a, spec, without_plan, err);
    if (!err.empty()) {
      print_error(err);
      return kExitUsage;
    }
  }

  std::string error;
  const std::string format = a.synthetic ? "synthetic" : trace_format_of(a.trace);
  double warm_s = 0;
  if (format == "lmdb" && !a.no_warm) {
    const auto tw = Clock::now();
    warm_page_cache(a.trace);
    warm_s = since(tw);
  }
  const bool peak_reset_works = reset_peak_rss();

  EngineOptions eo;
  eo.threads = a.threads;
  std::vector<std::string> plan_errors;

  // 1. End to end: open + stream + analyse (or only read, with --replay-only).
  AnalysisResult result;
  double open_s = 0;
  bool open_failed = false;
  const Phase e2e = measure([&](Phase& ph) -> uint64_t {
    const auto to = Clock::now();
    auto src = open_bench_source(a, error);
    open_s = since(to);
    if (!src) {
      open_failed = true;
      return 0;
    }
    if (a.replay_only) {
      uint64_t n = 0;
      Batch b;
      while (src->next(b)) n += b.events.size();
      return n;
    }
    TimeAccounting acc;
    ObservingSource observed(*src, {&acc});
    result = run_plan(ap.plan, a.accounting ? static_cast<EventSource&>(observed) : *src, eo, &plan_errors);
    if (a.accounting) observed.finish(result);
    ph.chains = result.chains.size();
    return result.counters.events_in;
  });
  if (open_failed) {
    print_error(error);
    return kExitInput;
  }
  if (!plan_errors.empty()) {
    for (const auto& e : plan_errors) print_error("plan: " + e);
    return kExitInput;
  }
  const uint64_t events = e2e.events;

  // 2. Load into memory, within the memory guard.
  uint64_t preload_cap = a.max_preload_mb << 20;
  if (preload_cap == 0) preload_cap = mem_available_bytes() / 2;
  std::vector<Batch> batches;
  std::optional<TraceMeta> meta;
  std::string mode = (a.replay_only || a.no_preload) ? "streamed" : "preloaded";
  std::string fallback_reason;
  uint64_t loaded_bytes = 0, rss_after_load = 0;
  Phase load;
  if (mode == "preloaded") {
    load = measure([&](Phase&) -> uint64_t {
      auto src = open_bench_source(a, error);
      if (!src) return 0;
      uint64_t n = 0;
      Batch b;
      while (src->next(b)) {
        n += b.events.size();
        loaded_bytes += b.events.capacity() * sizeof(Event);
        if (preload_cap > 0 && loaded_bytes > preload_cap) {
          fallback_reason = "the decoded events passed --max-preload-mb (" + std::to_string(preload_cap >> 20) +
                            " MiB) after " + std::to_string(n) + " events";
          return n;
        }
        batches.push_back(std::move(b));
        b = Batch{};
      }
      meta = src->meta();
      return n;
    });
    rss_after_load = proc_status_bytes("VmRSS:");
    if (!fallback_reason.empty() || !meta) {
      if (fallback_reason.empty()) fallback_reason = "the trace could not be opened again: " + error;
      std::vector<Batch>().swap(batches);
      meta.reset();
      mode = "streamed";
      load.measured = false;  // an abandoned load is not a phase: see fallback_reason
    } else if (load.events != events) {
      print_error("the trace gave " + std::to_string(load.events) + " events when loaded and " +
                  std::to_string(events) + " when streamed");
      return kExitInput;
    }
  }

  // 3. The analysis replayed from memory.
  Phase run;
  AnalysisResult mem_result;
  if (mode == "preloaded" && !a.replay_only) {
    run = measure([&](Phase& ph) -> uint64_t {
      PreloadedSource s(batches, *meta);
      TimeAccounting acc;
      ObservingSource observed(s, {&acc});
      mem_result = run_plan(ap.plan, a.accounting ? static_cast<EventSource&>(observed) : s, eo);
      if (a.accounting) observed.finish(mem_result);
      ph.chains = mem_result.chains.size();
      return mem_result.counters.events_in;
    });
  }

  // 3b. --ab-without: the run phase with and without the named files, in interleaved rounds (the
  // order alternating), so both see the same machine: what those rules cost, as a ratio.
  std::vector<double> ab_with, ab_without, ab_ratio;
  if (!a.ab_without.empty() && mode == "preloaded") {
    auto once = [&](const Plan& plan) {
      return measure([&](Phase&) -> uint64_t {
               PreloadedSource s(batches, *meta);
               TimeAccounting acc;
               ObservingSource observed(s, {&acc});
               AnalysisResult r = run_plan(plan, a.accounting ? static_cast<EventSource&>(observed) : s, eo);
               if (a.accounting) observed.finish(r);
               return r.counters.events_in;
             })
          .cpu;
    };
    for (unsigned k = 0; k < a.ab_rounds; ++k) {
      double w = 0, wo = 0;
      if (k % 2) {
        wo = once(without_plan);
        w = once(ap.plan);
      } else {
        w = once(ap.plan);
        wo = once(without_plan);
      }
      ab_with.push_back(w);
      ab_without.push_back(wo);
      ab_ratio.push_back(wo > 0 ? w / wo : 0);
    }
  }

  // 4. Each rule alone: its own cost, including sharding; statistics off (the pack computes them).
  std::vector<PerRule> per_rule;
  if (!a.replay_only && !a.no_per_rule) {
    EngineOptions ro = eo;
    ro.compute_stats = false;
    for (const auto& rule : ap.rule_plans) {
      const std::string& name = rule.first;
      const auto& plan = rule.second;  // a reference, not a structured binding: lambdas capture it
      PerRule pr{name, {}, {}};
      if (mode == "preloaded")
        pr.run = measure([&](Phase& ph) -> uint64_t {
          PreloadedSource s(batches, *meta);
          const AnalysisResult r = run_plan(plan, s, ro);
          ph.chains = r.chains.size();
          return r.counters.events_in;
        });
      if (mode == "streamed" || a.per_rule_e2e)
        pr.e2e = measure([&](Phase& ph) -> uint64_t {
          auto s = open_bench_source(a, error);
          if (!s) return 0;
          const AnalysisResult r = run_plan(plan, *s, ro);
          ph.chains = r.chains.size();
          return r.counters.events_in;
        });
      per_rule.push_back(std::move(pr));
    }
  }
  const uint64_t process_peak = proc_status_bytes("VmHWM:");

  // 5. --scaling: the engine at --threads N against what this machine gives the same work (last,
  // and in text mode after the report, each round printed as it ends: it takes a while).
  std::vector<ScalingRound> scaling;
  std::string scaling_note;
  auto measure_scaling_rounds = [&](bool print) {
    if (!a.scaling) return true;
    if (mode != "preloaded") {
      scaling_note = "not measured: the trace was not preloaded (" + fallback_reason + ")";
      if (print) std::printf("scaling      %s\n", scaling_note.c_str());
      return true;
    }
    if (print) print_scaling_header(a.threads, a.scaling);
    // With --json nothing is printed until the end: a line on a terminal's stderr says how far it is.
    const bool progress = !print && ::isatty(STDERR_FILENO) == 1 && !quiet_requested();
    scaling = measure_scaling(ap.plan, batches, *meta, a.threads, a.scaling, [&](unsigned k, const ScalingRound& r) {
      if (print) {
        print_scaling_round(k, r);
        std::fflush(stdout);
      }
      if (progress) std::fprintf(stderr, "\rbench --scaling: round %u of %u done", k + 1, a.scaling);
    });
    if (progress) std::fprintf(stderr, "\r\033[K");
    if (print) print_scaling_summary(a.threads, scaling);
    // Every run must have seen the whole trace (copies) or all of it between them (slices).
    for (const auto& r : scaling) {
      uint64_t sliced = 0;
      for (const auto& x : r.slices) sliced += x.events;
      bool ok = r.one.events == events && r.engine.events == events && sliced == events;
      for (const auto& x : r.copies) ok = ok && x.events == events;
      if (!ok) {
        print_error("bench --scaling: a run did not see every event of the trace (" + std::to_string(events) +
                    "): its times mean nothing");
        return false;
      }
    }
    return true;
  };

  std::map<std::string, uint64_t> by_category;
  for (const auto& c : result.chains) ++by_category[c.category];
  // Compatibility fields: in streamed mode load = opening, run = the streamed run.
  const Phase& main_run = run.measured ? run : e2e;
  const double load_s = load.measured ? load.wall : open_s;
  const bool chains_match = !run.measured || mem_result.chains.size() == result.chains.size();

  if (a.json) {
    nlohmann::json j{{"trace", a.synthetic ? "<synthetic>" : a.trace},
                     {"format", format},
                     {"events", events},
                     {"mode", mode},
                     {"threads", a.threads},
                     {"engine_threads", (run.measured ? mem_result : result).counters.threads},
                     {"replay_only", a.replay_only},
                     {"analysis", a.replay_only ? "none" : ap.description},
                     {"plan_seconds", plan_s},
                     {"warm_seconds", warm_s},
                     {"open_seconds", open_s},
                     {"load_seconds", load_s},
                     {"run_seconds", main_run.wall},
                     {"run_cpu_seconds", main_run.cpu},
                     {"events_per_s", main_run.eps()},
                     {"events_per_cpu_s", main_run.epcs()},
                     {"end_to_end_seconds", e2e.wall},
                     {"end_to_end_cpu_seconds", e2e.cpu},
                     {"peak_rss_bytes", process_peak},
                     {"peak_rss_reset", peak_reset_works},
                     {"preload_cap_bytes", preload_cap},
                     {"loaded_bytes", loaded_bytes},
                     {"rss_after_load_bytes", rss_after_load},
                     {"chains", result.chains.size()},
                     {"chains_match", chains_match},
                     {"chains_by_category", by_category}};
    if (!fallback_reason.empty()) j["fallback_reason"] = fallback_reason;
    nlohmann::json phases = nlohmann::json::object();
    phases["end_to_end"] = phase_json(e2e);
    if (load.measured) phases["load"] = phase_json(load);
    if (run.measured) phases["run"] = phase_json(run);
    j["phases"] = phases;
    nlohmann::json prs = nlohmann::json::array();
    for (const auto& pr : per_rule) {
      const Phase& main = pr.run.measured ? pr.run : pr.e2e;
      nlohmann::json o{{"rule", pr.name},
                       {"chains", main.chains},
                       {"run_seconds", main.wall},
                       {"run_cpu_seconds", main.cpu},
                       {"events_per_s", main.eps()},
                       {"events_per_cpu_s", main.epcs()},
                       {"peak_rss_bytes", main.peak_rss},
                       {"source", pr.run.measured ? "memory" : "file"}};
      if (pr.run.measured && pr.e2e.measured) o["end_to_end"] = phase_json(pr.e2e);
      prs.push_back(std::move(o));
    }
    j["per_rule"] = prs;
    if (!ab_with.empty())
      j["ab_without"] = {{"files", a.ab_without},
                         {"rounds", ab_with.size()},
                         {"with_cpu_seconds", ab_with},
                         {"without_cpu_seconds", ab_without},
                         {"with_median_cpu_seconds", median_of(ab_with)},
                         {"without_median_cpu_seconds", median_of(ab_without)},
                         {"ratio_median", median_of(ab_ratio)}};
    const bool scaling_ok = measure_scaling_rounds(false);
    if (a.scaling) {
      j["scaling"] = scaling.empty() ? nlohmann::json{{"threads", a.threads}, {"note", scaling_note}}
                                     : scaling_json(a.threads, scaling);
    }
    std::cout << j.dump(2) << "\n";
    return chains_match && scaling_ok ? kExitOk : kExitInput;
  }

  std::printf("trace        %s (%s, %llu events)\n", a.synthetic ? "<synthetic>" : a.trace.c_str(), format.c_str(),
              static_cast<unsigned long long>(events));
  std::printf("analysis     %s, %u thread%s\n", a.replay_only ? "none (replay only)" : ap.description.c_str(),
              a.threads, a.threads == 1 ? "" : "s");
  if (mode == "preloaded")
    std::printf("mode         preloaded: read once into memory (%s of events, RSS %s after loading), then replayed\n",
                mib(loaded_bytes).c_str(), mib(rss_after_load).c_str());
  else std::printf("mode         streamed%s%s\n", fallback_reason.empty() ? "" : ": ", fallback_reason.c_str());
  if (!a.replay_only) std::printf("plan         %.3f s\n", plan_s);
  if (warm_s > 0) std::printf("warm         %.3f s (file read once through the page cache)\n", warm_s);
  std::printf("  %-26s %9s %9s %12s %14s %11s\n", "phase", "wall s", "CPU s", "events/s", "events/CPU-s",
              peak_reset_works ? "peak RSS" : "peak RSS*");
  print_phase_row(a.replay_only ? "read (stream)" : "end-to-end (stream)", e2e);
  if (load.measured) print_phase_row("load (into memory)", load);
  if (run.measured) print_phase_row("run (from memory)", run);
  if (!a.replay_only) {
    std::printf("chains       %zu", result.chains.size());
    const char* sep = " (";
    for (const auto& [cat, n] : by_category) {
      std::printf("%s%s %llu", sep, cat.c_str(), static_cast<unsigned long long>(n));
      sep = ", ";
    }
    std::printf("%s\n", by_category.empty() ? "" : ")");
    if (!chains_match)
      std::printf("WARNING      the in-memory replay found %zu chains, the streamed run %zu\n",
                  mem_result.chains.size(), result.chains.size());
  }
  if (!per_rule.empty()) {
    std::printf("per rule, each alone (%s):\n",
                mode == "preloaded" ? "replayed from memory" : "streamed from the file");
    for (const auto& pr : per_rule) {
      const Phase& main = pr.run.measured ? pr.run : pr.e2e;
      std::printf("  %-26s %9.3f %9.3f %12s %14s %11s  %zu chains\n", pr.name.c_str(), main.wall, main.cpu,
                  (human_rate(main.eps()) + "/s").c_str(), (human_rate(main.epcs()) + "/CPU-s").c_str(),
                  mib(main.peak_rss).c_str(), main.chains);
      if (pr.run.measured && pr.e2e.measured) print_phase_row("  end-to-end (stream)", pr.e2e);
    }
  }
  if (!ab_with.empty()) {
    std::string files;
    for (const auto& f : a.ab_without) files += (files.empty() ? "" : ", ") + f;
    const double r = median_of(ab_ratio);
    std::printf(
        "ab-without   %s: run phase CPU median %.3f s with, %.3f s without (%zu interleaved rounds); "
        "with / without %.3f (median of the rounds' ratios): those files cost %+.1f %%\n",
        files.c_str(), median_of(ab_with), median_of(ab_without), ab_with.size(), r, (r - 1) * 100);
  }
  std::printf("peak RSS     %s (whole process%s)\n", mib(process_peak).c_str(),
              mode == "preloaded" ? ", including the preloaded trace" : "");
  if (!peak_reset_works) std::printf("* peak RSS could not be reset per phase: values are cumulative\n");
  std::fflush(stdout);
  const bool scaling_ok = measure_scaling_rounds(true);
  return chains_match && scaling_ok ? kExitOk : kExitInput;
}

Registrar reg{
    "bench", 70, [](CLI::App& app, int& rc) {
      auto args = std::make_shared<BenchArgs>();
      auto* cmd = app.add_subcommand(
          "bench",
          "Replay a captured trace through the analysis as fast as possible. Reports, with wall\n"
          "and CPU seconds, events/s and peak RSS: end-to-end (streamed from the file, as explain\n"
          "does), load (the trace read once into memory) and run (replayed from memory), then each\n"
          "rule alone replayed from the same memory. Field by field: docs/cli.md.\n"
          "Examples:\n"
          "  ingero-pipeline bench --trace big.db                      # table\n"
          "  ingero-pipeline bench --trace big.lmdb --json             # machines\n"
          "  ingero-pipeline bench --trace big.lmdb --replay-only      # the reader alone\n"
          "  ingero-pipeline bench --trace trace.db --rules my.rules --threads 2\n"
          "  ingero-pipeline bench --synthetic 5000000                 # no file: generated events\n"
          "  ingero-pipeline bench --trace big.db --threads 2 --scaling 8 --no-per-rule\n"
          "                    # does 2 threads fall short, or does this machine? (docs/performance.md)");
      cmd->add_option("--trace", args->trace, "Captured trace (SQLite or LMDB, detected from the file)");
      cmd->add_option("--synthetic", args->synthetic, "Generate N events in memory instead of a file");
      cmd->add_option("--rules", args->rules, "Rule files, added to the default rules");
      cmd->add_flag("--no-default-rules", args->no_default, "Only the --rules files");
      cmd->add_flag("--builtin", args->builtin, "Default analyses from the built-in plans instead of the rule pack");
      add_param_option(cmd, &args->params);
      cmd->add_option("--threads", args->threads, "Engine threads (0: chosen as explain chooses them)")
          ->check(CLI::Range(0u, 256u));
      cmd->add_option("--batch", args->batch, "Events per batch")->check(CLI::Range(size_t{64}, size_t{1} << 20));
      cmd->add_flag("--json", args->json,
                    "JSON: events, mode, phases{end_to_end,load,run}, per_rule, peak_rss_bytes, chains, ...");
      cmd->add_flag("--replay-only", args->replay_only, "Only read the trace (no rules): reader throughput");
      cmd->add_flag("--no-per-rule", args->no_per_rule, "Skip the per-rule runs");
      cmd->add_option("--ab-without", args->ab_without,
                      "Rule files (a pack file such as time.rules, or a --rules file) whose cost to measure: "
                      "the run phase with and without them in --ab-rounds interleaved rounds, one thread");
      cmd->add_option("--ab-rounds", args->ab_rounds, "Rounds of --ab-without (default 7)")
          ->check(CLI::Range(1u, 1000u));
      cmd->add_flag("--accounting", args->accounting,
                    "Also run the time accounting observer (where each GPU-feeding thread's time went) in the "
                    "end-to-end and run phases, as explain does");
      cmd->add_flag("--no-preload", args->no_preload,
                    "Do not load the trace into memory: no load/run split, per-rule runs stream the file");
      cmd->add_flag("--per-rule-end-to-end", args->per_rule_e2e,
                    "Also stream each rule alone from the file (reads the trace once more per rule)");
      cmd->add_option("--max-preload-mb", args->max_preload_mb,
                      "Memory for the preloaded trace; above it bench streams instead (default: half of "
                      "MemAvailable)");
      add_quiet_flag(cmd);
      cmd->add_flag("--no-warm", args->no_warm, "LMDB: do not pre-read the file into the page cache");
      cmd->add_option("--scaling", args->scaling,
                      "N rounds setting --threads T against one thread and against what this machine gives T\n"
                      "copies of the one-thread run at once (its capacity) and T runs over alternate batches\n"
                      "(a split of time); needs --threads 2 or more")
          ->check(CLI::Range(1u, 1000u));
      cmd->callback([args, &rc] { rc = run_bench(*args); });
    }};

}  // namespace
}  // namespace ingero::cli
