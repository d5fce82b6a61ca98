// `ingero-pipeline trace`: live capture. eBPF uprobes on the CUDA runtime/driver/NCCL and kernel
// tracepoints -> the live source -> the engine (default plan and/or --rules) -> a live terminal
// view, chains as they fire, and (with --db) an Ingero-compatible SQLite database.
//
// Stops cleanly at --duration or on Ctrl-C/SIGTERM: the rings are drained, every open window is
// closed by the final watermark, the database is committed; exit status 0.
#include <csignal>
#include <unistd.h>

#include <cstdlib>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "bpf/annotate_socket.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/live_trace.h"
#include "cli/metrics_cli.h"
#include "cli/pipeline_common.h"
#include "engine/engine.h"
#include "model/format.h"
#include "model/ops.h"
#include "operators/chain_annotate.h"
#include "operators/step_inference.h"
#include "operators/time_accounting.h"
#include "sinks/fleet/clock_anchors.h"
#include "sinks/fleet/process_identity.h"
#include "sinks/report/text_report.h"
#include "sinks/store/spooling_writer.h"
#include "sinks/store/sqlite_store.h"
#ifdef INGERO_HAVE_BPF
#include "bpf/live_source.h"
#include "bpf/tap_source.h"
#endif

namespace ingero::cli {
namespace {

#ifdef INGERO_HAVE_BPF
// "30s", "1.5m", "250ms", "2h", "45" (seconds) -> ns; false when malformed.
bool parse_duration(const std::string& s, uint64_t& ns) {
  if (s.empty()) return false;
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    return false;
  }
  const std::string unit = s.substr(pos);
  double mul = 1e9;
  if (unit == "ns") mul = 1;
  else if (unit == "us") mul = 1e3;
  else if (unit == "ms") mul = 1e6;
  else if (unit == "s" || unit.empty()) mul = 1e9;
  else if (unit == "m" || unit == "min") mul = 60e9;
  else if (unit == "h") mul = 3600e9;
  else return false;
  if (v < 0 || !std::isfinite(v)) return false;
  ns = static_cast<uint64_t>(v * mul);
  return true;
}

std::atomic<bool> g_interrupted{false};
extern "C" void on_signal(int) { g_interrupted.store(true); }

// Per-op latency histogram for the live view: log buckets 2% wide (quantiles within ~1%).
class LiveHistogram {
 public:
  void add(uint64_t ns) {
    ++count_;
    max_ = std::max(max_, ns);
    const size_t b = ns <= 1 ? 0 : static_cast<size_t>(std::log(static_cast<double>(ns)) / kLogBase);
    if (b >= buckets_.size()) buckets_.resize(b + 1, 0);
    ++buckets_[b];
  }
  uint64_t quantile(double q) const {
    if (count_ == 0) return 0;
    const uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
    uint64_t seen = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      seen += buckets_[b];
      if (seen >= std::max<uint64_t>(rank, 1))
        return std::min<uint64_t>(max_, static_cast<uint64_t>(std::exp((static_cast<double>(b) + 0.5) * kLogBase)));
    }
    return max_;
  }
  uint64_t count() const { return count_; }
  uint64_t max() const { return max_; }

 private:
  static constexpr double kLogBase = 0.0198;  // ln(1.02)
  std::vector<uint64_t> buckets_;
  uint64_t count_ = 0, max_ = 0;
};

std::string fmt_ns(uint64_t ns) {
  char buf[32];
  if (ns < 10'000) std::snprintf(buf, sizeof(buf), "%lluns", static_cast<unsigned long long>(ns));
  else if (ns < 10'000'000) std::snprintf(buf, sizeof(buf), "%.1fus", static_cast<double>(ns) / 1e3);
  else if (ns < 10'000'000'000ull) std::snprintf(buf, sizeof(buf), "%.1fms", static_cast<double>(ns) / 1e6);
  else std::snprintf(buf, sizeof(buf), "%.1fs", static_cast<double>(ns) / 1e9);
  return buf;
}

bool apply_disable(const std::vector<std::string>& names, bpf::ProbeFamilies& f) {
  for (std::string n : names) {
    for (auto& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (n == "cuda") f.cuda = false;
    else if (n == "driver") f.driver = false;
    else if (n == "graph") f.graph = false;
    else if (n == "nccl") f.nccl = false;
    else if (n == "sched") f.sched = false;
    else if (n == "wakeup") f.wakeup = false;
    else if (n == "process") f.process = false;
    else if (n == "memory") f.memory = false;
    else if (n == "block") f.block = false;
    else if (n == "tcp") f.tcp = false;
    else if (n == "net") f.net = false;
    else {
      print_error("--disable: unknown probe family '" + n +
                  "' (expected cuda, driver, graph, nccl, sched, wakeup, process, memory, block, "
                  "tcp, net)");
      return false;
    }
  }
  return true;
}

struct ViewState {
  std::mutex mu;
  std::map<std::pair<uint8_t, uint8_t>, LiveHistogram> ops;
  std::deque<std::string> chains;
  uint64_t chains_total = 0;
};

std::string count_text(uint64_t n) { return format_count(static_cast<double>(n)); }

// "db 1,234,567 written, backlog 2,048 (spilled 0)" for the live view and the summary.
std::string db_text(const SpoolingWriter* w) {
  if (!w) return "";
  const SpoolingWriter::Stats s = w->stats();
  std::string t = "db " + count_text(s.events_written) + " written, backlog " + count_text(s.backlog);
  if (s.events_spilled) t += " (" + count_text(s.events_spilled) + " spilled to disk)";
  if (s.lost) t += ", LOST " + count_text(s.lost);
  return t;
}

// "db 1,234,567 written, backlog 0, files 12 (3 deleted), 180.2 MB on disk" for rolled files.
std::string rolled_text(const RollingWriter::Stats& s) {
  std::string t = "db " + count_text(s.events_written) + " written, backlog " + count_text(s.backlog) + ", files " +
                  std::to_string(s.files_opened) + " (" + std::to_string(s.files_deleted) + " deleted), " +
                  format_count(static_cast<double>(s.bytes_on_disk) / 1e6) + " MB on disk (peak " +
                  format_count(static_cast<double>(s.bytes_on_disk_peak) / 1e6) + " MB)";
  if (s.shed) t += ", shed " + count_text(s.shed);
  if (s.lost) t += ", LOST " + count_text(s.lost);
  if (!s.error.empty()) t += ", error: " + s.error;
  return t;
}

// "annotate 1,200 annotations (1,100 step markers), 3 rejected" for the live view.
std::string annotate_text(const AnnotateServer* server) {
  if (!server) return "";
  const AnnotateStats s = server->stats();
  std::string t = "annotate " + count_text(s.annotations) + " annotations (" + count_text(s.step_markers) +
                  " step markers)";
  if (s.rejected) t += ", " + count_text(s.rejected) + " rejected";
  if (s.refused) t += ", " + count_text(s.refused) + " connections refused";
  return t;
}

void render(ViewState& v, const bpf::LiveSource& src, const SpoolingWriter* writer, const AnnotateServer* ann,
            double elapsed_s, bool tty) {
  const bpf::LiveStats st = src.stats();
  std::string out;
  if (tty) out += "\x1b[H\x1b[2J";
  char line[256];
  std::snprintf(line, sizeof(line),
                "ingero-pipeline trace  %.0fs  events %llu (%.0f/s)  drops gpu=%llu host=%llu "
                "queue=%llu  late=%llu  missed=%llu  libs=%zu uprobes=%zu\n",
                elapsed_s, static_cast<unsigned long long>(st.delivered),
                elapsed_s > 0 ? static_cast<double>(st.delivered) / elapsed_s : 0.0,
                static_cast<unsigned long long>(st.dropped[IP_RING_GPU]),
                static_cast<unsigned long long>(st.dropped[IP_RING_HOST]),
                static_cast<unsigned long long>(st.queue_dropped), static_cast<unsigned long long>(st.late),
                static_cast<unsigned long long>(st.missed), st.libraries, st.uprobes);
  out += line;
  if (writer) out += db_text(writer) + "\n";
  if (ann) out += annotate_text(ann) + "\n";
  if (!tty) {  // a log line per refresh when not on a terminal
    std::fputs(out.c_str(), stderr);
    return;
  }
  std::snprintf(line, sizeof(line), "\n%-26s %10s %10s %10s %10s %10s\n", "op", "count", "p50", "p95", "p99", "max");
  out += line;
  std::lock_guard<std::mutex> lk(v.mu);
  for (const auto& [key, h] : v.ops) {
    std::snprintf(line, sizeof(line), "%-26s %10llu %10s %10s %10s %10s\n",
                  op_name(static_cast<Source>(key.first), key.second).c_str(),
                  static_cast<unsigned long long>(h.count()), fmt_ns(h.quantile(0.5)).c_str(),
                  fmt_ns(h.quantile(0.95)).c_str(), fmt_ns(h.quantile(0.99)).c_str(), fmt_ns(h.max()).c_str());
    out += line;
  }
  out += "\nchains (" + std::to_string(v.chains_total) + ")\n";
  for (const auto& c : v.chains) out += "  " + c + "\n";
  out += "\nCtrl-C stops and writes the results.\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

int run_trace(const TraceArgs& a) {
  keep_large_buffers_out_of_the_heap();
  // First: a SIGTERM while the probes attach (seconds) still ends the run cleanly, with status 0.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  uint64_t duration_ns = 0, lag_ns = 0, hold_ns = 0;
  if (!a.duration.empty() && !parse_duration(a.duration, duration_ns)) {
    print_error("--duration '" + a.duration + "': expected a duration such as 30s, 2m, 500ms");
    return kExitUsage;
  }
  if (!parse_duration(a.lag, lag_ns) || !parse_duration(a.max_hold, hold_ns)) {
    print_error("--lag/--max-hold: expected a duration such as 50ms, 2s");
    return kExitUsage;
  }
  if (a.rolled && !a.db.empty()) {
    print_error("--db and rolled files (--db-dir) are exclusive: choose one");
    return kExitUsage;
  }
  if (!a.pids.empty() && !a.cgroup.empty()) {
    print_error("--pid and --cgroup are exclusive: choose one target");
    return kExitUsage;
  }
  if (!a.annotate && !a.annotate_uids.empty()) {
    print_error("--annotate-uid needs --annotate (the annotation socket it opens to those uids)");
    return kExitUsage;
  }
  AnalysisSpec spec;
  spec.use_default = !a.no_default_rules;
  spec.rule_files = a.rules;
  AnalysisPlan analysis;
  std::vector<std::string> errors;
  if (const int rc = prepare_analysis(a.params, spec, analysis); rc != kExitOk) return rc;
  IncidentOptions incident_opts;
  if (const int rc = incident_options(a.cost, incident_opts); rc != kExitOk) return rc;
  const Plan& plan = analysis.plan;

  bpf::LiveOptions lo;
  if (!apply_disable(a.disable, lo.probes.families)) return kExitUsage;
  if (!a.pids.empty()) {
    lo.probes.filter = bpf::FilterMode::kPids;
    lo.probes.pids = a.pids;
    for (uint32_t p : a.pids)
      if (::kill(static_cast<pid_t>(p), 0) != 0 && errno == ESRCH) {
        print_error("--pid " + std::to_string(p) + ": no such process");
        return kExitUsage;
      }
  } else if (!a.cgroup.empty()) {
    lo.probes.filter = bpf::FilterMode::kCgroup;
    lo.probes.cgroup_path = a.cgroup;
  }
  lo.probes.force_classic = a.classic;
  if (a.ring_mb == 0 || (a.ring_mb & (a.ring_mb - 1)) != 0) {
    print_error("--ring-mb " + std::to_string(a.ring_mb) + ": expected a power of two (1, 2, 4, ... 1024)");
    return kExitUsage;
  }
  lo.probes.ring_bytes = a.ring_mb << 20;
  if (!a.no_stacks) {
    uint64_t smin = 0;
    if (!parse_duration(a.stack_min, smin)) {
      print_error("--stack-min '" + a.stack_min + "': expected a duration such as 1ms, 500us, 0");
      return kExitUsage;
    }
    lo.probes.stacks.call_min_ns = smin;
    // Off-CPU spans: the same threshold (a thread off CPU for >= --stack-min gets the kernel and
    // frame-pointer user stacks it went to sleep with).
    lo.probes.stacks.offcpu_min_ns = lo.probes.families.sched ? smin : UINT64_MAX;
  }
  if (!a.no_samples) lo.probes.stacks.sample_hz = a.sample_hz;
  lo.probes.stacks.ustack_bytes = a.stack_bytes;
  lo.probes.stacks.per_thread_rate = a.stack_rate;
  lo.discovery.explicit_paths = a.cuda_libs;
  lo.lag_ns = lag_ns;
  lo.max_hold_ns = hold_ns;

  std::string error;
  // Node identity (docs/fleet.md "Node identity"): --node, else the id persisted on first run in
  // $INGERO_STATE_DIR (default /var/lib/ingero-pipeline)/node-id, else the hostname.
  MetricsCliArgs margs = a.metrics;
  const std::string hostname = local_hostname();
  std::string node_source = "--node";
  if (!margs.node.empty() && !valid_node_name(margs.node)) {
    print_error("--node '" + margs.node + "': expected 1-64 of A-Z a-z 0-9 . _ - (ids are {node}:{seq})");
    return kExitUsage;
  }
  if (margs.node.empty()) {
    bool created = false;
    const std::string dir = default_state_dir();
    if (load_or_create_node_id(dir, margs.node, created, error)) {
      node_source = dir + "/node-id";
      std::fprintf(stderr, "node: %s (%s %s; --node overrides)\n", margs.node.c_str(), created ? "created in" : "from",
                   node_source.c_str());
    } else if (valid_node_name(hostname)) {
      std::fprintf(stderr, "warning: %s; naming this node by its hostname '%s'\n", error.c_str(), hostname.c_str());
      margs.node = hostname;
      node_source = "hostname";
    } else {
      std::fprintf(stderr, "warning: %s; this capture's node stays unnamed\n", error.c_str());
      node_source = "";
    }
    error.clear();
  }
  // The database is written on its own thread (SpoolingWriter): the engine never waits for
  // SQLite; a backlog beyond 4 MiB of events goes to an unlinked spill file beside the database
  // instead of memory, so nothing is dropped and memory stays bounded.
  std::unique_ptr<SpoolingWriter> writer;
  // Rolled files (agent): a RollingWriter over the directory instead (sinks/store/rollover.h).
  std::unique_ptr<RollingWriter> rolling;
  if (a.rolled) {
    rolling = RollingWriter::start(a.roll, error);
    if (!rolling) {
      print_error(error);
      return kExitInput;
    }
  } else if (!a.db.empty()) {
    auto sink = SqliteSink::create(a.db, error);
    if (sink) {
      SpoolingWriter::Options wo;
      wo.memory_cap_bytes = size_t{4} << 20;
      writer = SpoolingWriter::start(std::move(sink), wo, error);
    }
    if (!writer) {
      print_error(error);
      return kExitInput;
    }
  }
  // Explicit step markers (docs/steps.md "Explicit step markers"): Ingero's annotation socket,
  // opened before the probes (attaching takes seconds; Ingero's Lightning callback dials once, at
  // setup, and stays silent for the run if nobody listens). Who may send: root, this process's
  // uids, the user who ran sudo, the owners of --pid processes and --annotate-uid; checked per
  // connection (SO_PEERCRED).
  std::unique_ptr<AnnotateServer> annotate_server;
  if (a.annotate) {
    AnnotateServer::Options ao;
    ao.path = a.annotate_path;
    ao.policy.uids = {::getuid(), ::geteuid()};
    if (const char* sudo = std::getenv("SUDO_UID"); sudo && *sudo) {
      char* end = nullptr;
      const unsigned long u = std::strtoul(sudo, &end, 10);
      if (end && *end == '\0' && u <= UINT32_MAX) ao.policy.uids.insert(static_cast<uint32_t>(u));
    }
    for (uint32_t p : a.pids)
      if (const auto u = proc_real_uid(p)) ao.policy.uids.insert(*u);
    for (uint32_t u : a.annotate_uids) ao.policy.uids.insert(u);
    std::string uids = "root";
    for (uint32_t u : ao.policy.uids)
      if (u != 0) uids += ", " + std::to_string(u);
    annotate_server = AnnotateServer::start(std::move(ao), error);
    if (!annotate_server) {
      print_error("--annotate: " + error);
      return kExitRuntime;
    }
    for (const auto& w : annotate_server->take_warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
    std::fprintf(stderr,
                 "annotate: listening on %s (Ingero's annotation protocol, one JSON object a line: "
                 "{\"labels\":{\"step\":\"42\"}}; senders of uid %s)\n",
                 annotate_server->path().c_str(), uids.c_str());
  }
  auto src = bpf::LiveSource::start(lo, error);
  if (!src) {
    print_error(error + "\n  hint: run `ingero-pipeline check` for what is missing");
    return kExitRuntime;
  }
  for (const auto& w : src->take_warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  // Node identity: --node names every event's node (ids become "{node}:{seq}", as Ingero 0.9's).
  if (!margs.node.empty()) src->meta().nodes[0] = margs.node;
  MetricsHook metrics;
  if (!metrics.start(margs, error, &g_interrupted)) {
    print_error(error);
    src->stop();
    return kExitUsage;
  }
  // Clock anchors every 10 s (sinks/fleet/clock_anchors.h), written to --db at the end for `merge`.
  std::vector<ClockAnchor> anchors{sample_clock_anchor(src->converter().offset())};
  for (const auto& l : src->libraries())
    std::fprintf(stderr, "tracing %s %s (%s)\n", bpf::lib_kind_name(l.kind), l.path.c_str(), l.found_by.c_str());

  ViewState view;
  bool meta_written = false;
  // Rank / local rank / world size / job id of each traced process, read from its environment at
  // its first event and stamped on every event of it (sinks/fleet/process_identity.h).
  ProcessIdentityCache identities;
  IdentityStampSource stamped(*src, identities);
  bpf::TapSource tap(stamped, [&](const Batch& b) {
    metrics.observe(b, src->meta(), true);
    {
      std::lock_guard<std::mutex> lk(view.mu);
      for (const Event& e : b.events)
        if (is_gpu_api(e.source)) view.ops[{static_cast<uint8_t>(e.source), e.op}].add(e.dur_ns);
    }
    if (writer) {
      if (!meta_written) {
        writer->write_meta(src->meta());
        meta_written = true;
      }
      writer->write_events(b.events);
    }
    if (rolling) rolling->write_events(b.events, src->meta());
  });
  // Threads, stacks, the launching thread's time split and launch_gap chains
  // (operators/chain_annotate.h): each chain annotated as the engine emits it, over the recent
  // horizon the annotator keeps.
  // Warm-up and the tail re-judgement follow the pack's params and --param.
  LiveChainAnnotator annotator(annotate_options(analysis, LiveChainAnnotator::defaults()));
  // Where each main GPU-feeding thread's time went (operators/time_accounting.h): result.accounting,
  // and each chain's own thread over its window (Chain::accounting).
  AccountingOptions acct_opts;
  acct_opts.chain_accounting = true;
  acct_opts.meta = &tap.meta();
  if (a.service) {
    // A service runs for months over a churn of processes: exited and long-silent threads are
    // folded into compact records (the top accounts unchanged), and the per-second bins of chain
    // accounting cover the last 10 minutes (an older chain gets no Chain::accounting).
    acct_opts.evict = true;
    acct_opts.bin_horizon_ns = 600'000'000'000;
  }
  TimeAccounting accounting(acct_opts);
  // The step period of each process, inferred with no markers (operators/step_inference.h).
  StepInference steps;
  if (a.service) steps.evict_exited();  // a process's entry is judged as it exits, its state freed
  GpuUsage gpus;                        // the devices each process's calls named: an incident's GPUs
  ObservingSource observed(tap, {&accounting, &steps, &gpus});
  EventSource& annotated = annotator.tap(observed);
  EngineOptions eo;
  eo.threads = a.threads;
  // A service runs for months: each chain goes to the rolled files as it fires, and only the
  // recent ones stay in memory (for the last file's result); a trace keeps them all.
  if (a.service) eo.max_kept_chains = 2000;
  const bool tty = !a.quiet && stdout_is_terminal();
  eo.on_chain = [&](const Chain& emitted) {
    const Chain c = annotator.annotate(emitted);
    std::lock_guard<std::mutex> lk(view.mu);
    ++view.chains_total;
    std::string s = "[" + std::string(severity_name(c.severity)) + "] " + c.category + ": " + c.summary;
    if (c.dropped_events) s += " (" + std::to_string(c.dropped_events) + " events lost in its window)";
    view.chains.push_back(s);
    if (view.chains.size() > 8) view.chains.pop_front();
    if (!tty && !a.quiet) std::fprintf(stderr, "chain %s\n", s.c_str());
    if (rolling) rolling->add_chain(c);
  };

  eo.on_chain = metrics.wrap(std::move(eo.on_chain));
  AnalysisResult result;
  std::thread engine([&] {
    result = run_plan(plan, annotated, eo, &errors);
    annotator.finish(result);  // first: chains get their threads, then their accounting
    observed.finish(result);
    assemble_incidents(result, incident_opts, &gpus);  // severity, incidents, the verdict
  });
  const auto t0 = std::chrono::steady_clock::now();
  const auto log_every = std::chrono::milliseconds(static_cast<int64_t>(a.log_every_s * 1000));
  auto next_render = t0, next_status = t0, next_log = t0 + log_every;
  // Service mode (agent): the status each second for the health endpoint, a log line now and then.
  const auto status_now = [&](bool stopping) {
    LiveStatus ls;
    const bpf::LiveStats st = src->stats();
    ls.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ls.events = st.delivered;
    ls.dropped_gpu = st.dropped[IP_RING_GPU];
    ls.dropped_host = st.dropped[IP_RING_HOST];
    ls.dropped_queue = st.queue_dropped;
    ls.late = st.late;
    ls.libraries = st.libraries;
    ls.uprobes = st.uprobes;
    {
      std::lock_guard<std::mutex> lk(view.mu);
      ls.chains = view.chains_total;
    }
    ls.storing = writer || rolling;
    if (rolling) {
      ls.rolled = rolling->stats();
      ls.db_written = ls.rolled.events_written;
      ls.db_backlog = ls.rolled.backlog;
      ls.db_lost = ls.rolled.lost;
    } else if (writer) {
      const SpoolingWriter::Stats ws = writer->stats();
      ls.db_written = ws.events_written;
      ls.db_backlog = ws.backlog;
      ls.db_lost = ws.lost;
    }
    ls.stopping = stopping;
    return ls;
  };
  while (!g_interrupted.load()) {
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - t0).count();
    if (duration_ns && elapsed * 1e9 >= static_cast<double>(duration_ns)) break;
    if (a.service && now >= next_status) {
      next_status = now + std::chrono::seconds(1);
      const LiveStatus ls = status_now(false);
      if (a.on_status) a.on_status(ls);
      if (now >= next_log) {
        next_log = now + log_every;
        std::fprintf(stderr,
                     "agent: %.0fs, %llu events (%.0f/s), dropped gpu=%llu host=%llu queue=%llu, late=%llu, "
                     "%llu chains, libs=%zu uprobes=%zu%s\n",
                     ls.elapsed_s, static_cast<unsigned long long>(ls.events),
                     ls.elapsed_s > 0 ? static_cast<double>(ls.events) / ls.elapsed_s : 0.0,
                     static_cast<unsigned long long>(ls.dropped_gpu), static_cast<unsigned long long>(ls.dropped_host),
                     static_cast<unsigned long long>(ls.dropped_queue), static_cast<unsigned long long>(ls.late),
                     static_cast<unsigned long long>(ls.chains), ls.libraries, ls.uprobes,
                     rolling ? ("; " + rolled_text(ls.rolled)).c_str() : "");
        for (const auto& w : src->take_warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
      }
    }
    if (elapsed >= 10.0 * static_cast<double>(anchors.size()))
      anchors.push_back(sample_clock_anchor(src->converter().offset()));
    if (!a.quiet && !a.service && now >= next_render) {
      render(view, *src, writer.get(), annotate_server.get(), elapsed, tty);
      next_render = now + std::chrono::seconds(1);
      for (const auto& w : src->take_warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
      if (annotate_server)
        for (const auto& w : annotate_server->take_warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // The markers reach the step inference before the source ends (finish() runs after its last batch).
  std::vector<Annotation> program_annotations;
  if (annotate_server) {
    annotate_server->stop();
    program_annotations = annotate_server->take_annotations();
    std::vector<StepMarker> markers;
    for (const Annotation& x : program_annotations)
      if (StepMarker m; step_marker_of(x, m)) markers.push_back(m);
    steps.add_markers(markers);
  }
  if (a.on_status) a.on_status(status_now(true));
  src->stop();
  engine.join();
  // A service about to exit hands the probes' detach (seconds of kernel grace periods) to a child
  // that outlives it, so SIGTERM to exit stays within the 10 s a service manager allows
  // (BpfProbes::detach_in_background).
  if (a.service) src->detach_in_background();
  anchors.push_back(sample_clock_anchor(src->converter().offset()));
  metrics.finish(result, g_interrupted);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!errors.empty()) {
    for (const auto& e : errors) print_error("plan: " + e);
    return kExitInput;
  }
  const bpf::LiveStats st = src->stats();
  int rc = kExitOk;
  std::string db_summary;
  // The side tables go to the database, or to the last rolled file (the run's result is there).
  const std::string db_path = rolling ? rolling->current_path() : a.db;
  if (rolling) {
    rolling->write_meta(result.meta);
    const auto progress = [](const std::string& m) { std::fprintf(stderr, "db: %s\n", m.c_str()); };
    if (!rolling->finish(&result, error, progress)) {
      print_error(a.roll.dir + ": " + error);
      rc = kExitRuntime;
    }
    db_summary = "  " + rolled_text(rolling->stats());
  }
  if (writer || rolling) {
    if (writer) {
      writer->write_meta(result.meta);
      const auto progress = [](const std::string& m) { std::fprintf(stderr, "db: %s\n", m.c_str()); };
      if (!writer->finish(&result, error, progress)) {
        print_error(a.db + ": " + error);
        rc = kExitRuntime;
      }
      db_summary = "  " + db_text(writer.get());
    }
    if (rc == kExitOk && !write_clock_anchors(db_path, margs.node, anchors, error))
      std::fprintf(stderr, "warning: %s\n", error.c_str());
    IdentityTables idt;
    if (!hostname.empty()) idt.attributes[margs.node]["hostname"] = hostname;
    if (!node_source.empty()) idt.attributes[margs.node]["node_id_source"] = node_source;
    idt.processes[margs.node] = identities.rows();
    if (rc == kExitOk && !write_identity(db_path, idt, error)) std::fprintf(stderr, "warning: %s\n", error.c_str());
    if (rc == kExitOk && !program_annotations.empty() &&
        !write_annotations(db_path, program_annotations, result.meta.nodes, error))
      std::fprintf(stderr, "warning: %s\n", error.c_str());
  }
  if (!a.quiet && !a.service) {
    if (tty) render(view, *src, writer.get(), annotate_server.get(), elapsed, tty);
    ReportOptions ro;
    ro.color = tty;
    std::cout << "\n" << explain_text(result, ro);
  }
  std::fprintf(stderr,
               "trace: %.1fs, %llu events (%llu records), dropped gpu=%llu host=%llu queue=%llu, "
               "late=%llu (long spans delivered late: %llu, unused by the engine: %llu), "
               "unmatched returns=%llu, missed by the self-check=%llu, reorder peak=%zu events, %zu chains%s%s%s\n"
               "trace: stacks %llu captured (%llu distinct, %llu with Python frames; %llu skipped "
               "by the per-thread rate limit, %llu lost to a full stack ring), %llu CPU samples, "
               "%llu Python processes (%llu registered by BPF at their first stack)\n",
               elapsed, static_cast<unsigned long long>(st.delivered), static_cast<unsigned long long>(st.records),
               static_cast<unsigned long long>(st.dropped[IP_RING_GPU]),
               static_cast<unsigned long long>(st.dropped[IP_RING_HOST]),
               static_cast<unsigned long long>(st.queue_dropped), static_cast<unsigned long long>(st.late),
               static_cast<unsigned long long>(st.late_delivered),
               static_cast<unsigned long long>(result.counters.late_events),
               static_cast<unsigned long long>(st.unmatched), static_cast<unsigned long long>(st.missed),
               st.reorder_peak, result.chains.size(), db_path.empty() ? "" : ", written to ",
               (rolling ? a.roll.dir : a.db).c_str(), db_summary.c_str(),
               static_cast<unsigned long long>(st.stacks_resolved), static_cast<unsigned long long>(st.stacks_unique),
               static_cast<unsigned long long>(st.python_stacks),
               static_cast<unsigned long long>(st.stacks_rate_limited), static_cast<unsigned long long>(st.stacks_lost),
               static_cast<unsigned long long>(st.samples), static_cast<unsigned long long>(st.python_procs),
               static_cast<unsigned long long>(st.python_self));
  if (annotate_server) {
    for (const auto& w : annotate_server->take_warnings())
      if (!a.quiet) std::fprintf(stderr, "warning: %s\n", w.c_str());
    std::fprintf(stderr, "trace: annotate %s: %s\n", annotate_server->path().c_str(),
                 annotate_summary(annotate_server->stats()).c_str());
  }
  const ProcessIdentityCache::Stats& is = identities.stats();
  std::fprintf(stderr,
               "trace: node %s; %llu processes seen, %llu with a rank in their environment, %llu "
               "environments unreadable, %llu events stamped with a rank%s\n",
               margs.node.empty() ? "(unnamed)" : margs.node.c_str(), static_cast<unsigned long long>(is.reads),
               static_cast<unsigned long long>(is.with_rank), static_cast<unsigned long long>(is.unreadable),
               static_cast<unsigned long long>(is.stamped),
               is.bad_values ? (", " + std::to_string(is.bad_values) + " malformed rank variables ignored").c_str()
                             : "");
  return rc;
}
#endif

namespace {

Registrar reg{
    "trace", 5, [](CLI::App& app, int& rc) {
      auto args = std::make_shared<TraceArgs>();
      auto* cmd = app.add_subcommand(
          "trace",
          "Live capture with eBPF (root): CUDA runtime/driver/NCCL calls via uprobes and the\n"
          "host via tracepoints, analysed as they arrive. Shows per-op latency, drops and chains\n"
          "as they fire; stops at --duration or Ctrl-C and writes everything to --db.\n"
          "Examples:\n"
          "  sudo ingero-pipeline trace --duration 30s --db run.db\n"
          "  sudo ingero-pipeline trace --pid 1234 --disable net,tcp\n"
          "  sudo ingero-pipeline trace --stack-min 0 --db run.db   # a stack on every call\n"
          "  sudo ingero-pipeline trace --annotate --db run.db     # + the steps the program reports (Lightning, Ray)\n"
          "  sudo ingero-pipeline trace --cgroup /sys/fs/cgroup/system.slice/docker-<id>.scope");
      cmd->add_option("--duration", args->duration, "Stop after this long (30s, 2m); default: until Ctrl-C");
      cmd->add_option("--pid", args->pids, "Trace these processes (all threads, and their children)");
      cmd->add_option("--cgroup", args->cgroup, "Trace the processes of this cgroup v2 directory (a container)");
      cmd->add_option("--db", args->db, "Write the trace, stats and chains to this SQLite database");
      cmd->add_option("--rules", args->rules, "Rule files to load (in addition to the default pack)");
      cmd->add_flag("--no-default-rules", args->no_default_rules, "Use only the --rules files");
      add_param_option(cmd, &args->params);
      add_cost_options(cmd, &args->cost);
      cmd->add_option("--cuda-lib", args->cuda_libs,
                      "A libcudart/libcuda/libnccl file or directory to probe (besides discovery)");
      cmd->add_option("--disable", args->disable,
                      "Probe families to switch off: cuda, driver, graph, nccl, sched, wakeup, "
                      "process, memory, block, tcp, net")
          ->delimiter(',');
      cmd->add_option("--threads", args->threads, "Engine threads")->check(CLI::Range(1u, 256u));
      cmd->add_option("--ring-mb", args->ring_mb,
                      "Size of each of the two BPF ring buffers in MiB, a power of two "
                      "(default 4: ~0.3 s of slack at 200k records/s; raise it if drops "
                      "gpu=/host= are counted)")
          ->check(CLI::Range(1u, 1024u));
      cmd->add_option("--lag", args->lag, "Reorder lag before events are released (default 50ms)");
      cmd->add_option("--max-hold", args->max_hold, "Longest an open call may hold results back (default 2s)");
      cmd->add_flag("--classic-tracepoints", args->classic, "Use classic tracepoints even where tp_btf works");
      cmd->add_option("--stack-min", args->stack_min,
                      "Capture the caller's native + Python stack of CUDA/driver/NCCL calls "
                      "at least this long, and of off-CPU spans as long (default 1ms; 0 = "
                      "every call)");
      cmd->add_flag("--no-stacks", args->no_stacks, "Capture no call or off-CPU stacks");
      cmd->add_option("--sample-hz", args->sample_hz,
                      "On-CPU stack samples of the traced threads per second (default 49)")
          ->check(CLI::Range(1u, 1000u));
      cmd->add_flag("--no-samples", args->no_samples, "No on-CPU stack samples");
      cmd->add_option("--stack-bytes", args->stack_bytes,
                      "User stack copied per stack for unwinding (default 16384, at most 28672)")
          ->check(CLI::Range(512u, 28672u));
      cmd->add_option("--stack-rate", args->stack_rate,
                      "Slow-call stacks per second per thread at most (default 100, bursts "
                      "of 20); the rest are counted as skipped")
          ->check(CLI::Range(1u, 1000000u));
      cmd->add_flag("-q,--quiet", args->quiet, "No live view or report (summary line only)");
      add_metrics_options(cmd, args->metrics);
      auto* annotate = cmd->add_option("--annotate", args->annotate_path,
                                       "Accept the steps the traced program reports, in Ingero's annotation protocol "
                                       "(NDJSON on a Unix socket; Ingero's Lightning callback and Ray helpers work "
                                       "unchanged): explicit step markers win over inferred steps. Default socket: "
                                       "/run/ingero/annotate.sock, as Ingero's; --annotate=PATH for another")
                           ->expected(0, 1);
      cmd->add_option("--annotate-uid", args->annotate_uids,
                      "Also accept annotations from programs of these uids (accepted anyway: root, the tracer's "
                      "uid, $SUDO_UID, the owners of --pid processes)")
          ->delimiter(',');
      cmd->callback([args, annotate, &rc] {
        args->annotate = annotate->count() > 0;
#ifdef INGERO_HAVE_BPF
        rc = run_trace(*args);
#else
                  print_error("this ingero-pipeline was built without eBPF support (INGERO_BUILD_BPF=OFF, or "
                              "clang/bpftool/libbpf missing at build time); replay a recorded trace with "
                              "`explain --db FILE` instead");
                  rc = kExitRuntime;
#endif
      });
    }};

}  // namespace
}  // namespace ingero::cli
