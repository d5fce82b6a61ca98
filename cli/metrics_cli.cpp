#include "cli/metrics_cli.h"

#include <unistd.h>

#include <mutex>
#include <thread>

#ifdef INGERO_HAVE_IP_METRICS
#include "sinks/metrics/prometheus_exporter.h"
#endif
#include "sinks/store/sqlite_store.h"

namespace ingero::cli {

void add_metrics_options(CLI::App* cmd, MetricsCliArgs& a) {
  cmd->add_option("--metrics-addr", a.addr, "Serve Prometheus /metrics here: PORT (binds 127.0.0.1) or HOST:PORT");
  cmd->add_option("--node", a.node,
                  "Node name: names the trace's node (trace: default the id persisted in $INGERO_STATE_DIR/node-id, "
                  "created on first run) and target_info's node label (default: the hostname)");
  cmd->add_option("--cluster", a.cluster, "Cluster name in target_info");
  cmd->add_option("--replay-speed", a.replay_speed,
                  "Pace a replay at this multiple of its recorded speed (1 = real time; 0 = full speed)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--replay-start-at", a.replay_start_at,
                  "With --replay-speed: the Unix time (seconds) the replay's first event maps to, so several "
                  "replays run in step (default: when the first batch arrives)")
      ->check(CLI::Range(0.0, 1e11));
  cmd->add_option("--metrics-linger", a.linger_s, "Keep /metrics up this many seconds after the run")
      ->check(CLI::Range(0.0, 86400.0));
}

struct MetricsHook::Impl {
#ifdef INGERO_HAVE_IP_METRICS
  std::unique_ptr<metrics::MetricsExporter> exporter;
#endif
  MetricsCliArgs args;
  std::mutex pace_mu;
  bool paced_started = false;
  uint64_t first_ts = 0;
  std::chrono::steady_clock::time_point wall0;
  const std::atomic<bool>* stop = nullptr;
};

MetricsHook::MetricsHook() : impl_(std::make_unique<Impl>()) {}
MetricsHook::~MetricsHook() = default;

bool MetricsHook::start(const MetricsCliArgs& args, std::string& error, const std::atomic<bool>* stop) {
  impl_->args = args;
  impl_->stop = stop;
  if (args.addr.empty()) return true;
#ifdef INGERO_HAVE_IP_METRICS
  std::string addr = args.addr;
  if (addr.find(':') == std::string::npos) addr = "127.0.0.1:" + addr;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  metrics::MetricsIdentity id{args.node.empty() ? host : args.node, args.cluster, host, kSqliteToolVersion};
  impl_->exporter = metrics::MetricsExporter::start(addr, std::move(id), error);
  return impl_->exporter != nullptr;
#else
  error = "--metrics-addr: this build has no Prometheus exporter (install prometheus-cpp-dev and rebuild)";
  return false;
#endif
}

bool MetricsHook::active() const {
#ifdef INGERO_HAVE_IP_METRICS
  return impl_->exporter != nullptr;
#else
  return false;
#endif
}

int MetricsHook::port() const {
#ifdef INGERO_HAVE_IP_METRICS
  return impl_->exporter ? impl_->exporter->port() : 0;
#else
  return 0;
#endif
}

void MetricsHook::observe(const Batch& b, const TraceMeta& meta, bool live) {
  if (!active() || b.events.empty()) return;
  if (!live && impl_->args.replay_speed > 0 && !(impl_->stop && impl_->stop->load())) {
    std::unique_lock lock(impl_->pace_mu);
    if (!impl_->paced_started) {
      impl_->paced_started = true;
      impl_->first_ts = b.events.front().ts_ns;
      impl_->wall0 = std::chrono::steady_clock::now();
      if (impl_->args.replay_start_at > 0) {
        const double now_unix = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                                    .count();
        impl_->wall0 += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(impl_->args.replay_start_at - now_unix));
      }
    }
    const uint64_t ts = b.events.front().ts_ns;
    if (ts >= impl_->first_ts) {
      const auto due = impl_->wall0 + std::chrono::nanoseconds(static_cast<int64_t>(
                                          static_cast<double>(ts - impl_->first_ts) / impl_->args.replay_speed));
      lock.unlock();
      while (std::chrono::steady_clock::now() < due && !(impl_->stop && impl_->stop->load()))
        std::this_thread::sleep_for(
            std::min<std::chrono::steady_clock::duration>(due - std::chrono::steady_clock::now(),
                                                          std::chrono::milliseconds(100)));
    }
  }
#ifdef INGERO_HAVE_IP_METRICS
  auto& st = impl_->exporter->state();
  st.observe(b.events, meta);
  if (meta.health.dropped_events) st.set_drops("lost", meta.health.dropped_events);
#else
  (void)meta;
#endif
}

std::function<void(const Chain&)> MetricsHook::wrap(std::function<void(const Chain&)> inner) {
  if (!active()) return inner;
  return [this, inner = std::move(inner)](const Chain& c) {
    if (inner) inner(c);
#ifdef INGERO_HAVE_IP_METRICS
    impl_->exporter->state().add_chains(std::span<const Chain>(&c, 1));
#endif
  };
}

void MetricsHook::finish(const AnalysisResult& result, const std::atomic<bool>& interrupted) {
  if (!active()) return;
#ifdef INGERO_HAVE_IP_METRICS
  auto& st = impl_->exporter->state();
  st.add_chains(result.chains);  // chains already counted live keep their count (by id)
  if (result.meta.health.dropped_events) st.set_drops("lost", result.meta.health.dropped_events);
#endif
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(impl_->args.linger_s * 1000));
  while (!interrupted.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace ingero::cli
