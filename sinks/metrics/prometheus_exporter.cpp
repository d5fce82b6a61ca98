#include "sinks/metrics/prometheus_exporter.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <cctype>
#include <climits>
#include <cmath>
#include <limits>
#include <sstream>

#include "model/ops.h"
#include "model/plan.h"

namespace ingero::metrics {
namespace {

bool is_wait(const Event& e) {
  if (e.source == Source::kCuda)
    return e.op == op::kCudaStreamSync || e.op == op::kCudaDeviceSync || e.op == op::kCudaEventSync;
  if (e.source == Source::kDriver) return e.op == op::kCuStreamSynchronize || e.op == op::kCuCtxSynchronize;
  return false;
}

bool is_collective(const Event& e) {
  return e.source == Source::kNccl && e.op >= op::kNcclAllReduce && e.op <= op::kNcclRecv;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

prometheus::ClientMetric labelled(std::vector<prometheus::ClientMetric::Label> l) {
  prometheus::ClientMetric m;
  m.label = std::move(l);
  return m;
}

}  // namespace

int sketch_index(uint64_t ns) {
  if (ns == 0) return INT_MIN;
  const double s = static_cast<double>(ns) * 1e-9;
  int i = static_cast<int>(std::ceil(std::log2(s) * kSketchPerOctave));
  // log2 rounding at exact powers of two: keep upper-inclusive (v <= 2^(i/32)).
  if (std::exp2(static_cast<double>(i - 1) / kSketchPerOctave) >= s) --i;
  if (std::exp2(static_cast<double>(i) / kSketchPerOctave) < s) ++i;
  return i;
}

MetricsState::MetricsState(MetricsIdentity id) : id_(std::move(id)) {}

std::string MetricsState::rank_label(int16_t rank) {
  if (rank < 0) return "";
  auto it = ranks_.find(rank);
  if (it != ranks_.end()) return it->second;
  std::string l = ranks_.size() < kMaxRanks ? std::to_string(rank) : "other";
  ranks_.emplace(rank, l);
  return l;
}

void MetricsState::observe(std::span<const Event> events, const TraceMeta& meta) {
  std::lock_guard lock(mu_);
  for (const Event& e : events) {
    ++events_by_source_[lower(source_name(e.source))];
    first_ts_ = std::min(first_ts_, e.ts_ns);
    last_end_ = std::max(last_end_, e.end_ns());
    if (!is_gpu_api(e.source)) continue;
    steps_.add(e);
    const std::string rank = rank_label(e.rank);
    const std::string name = op_name(e.source, e.op);
    auto& sk = latency_[{name, rank}];
    ++sk.count;
    sk.sum_s += static_cast<double>(e.dur_ns) * 1e-9;
    ++sk.buckets[sketch_index(e.dur_ns)];
    if (is_wait(e)) sync_wait_s_[rank] += static_cast<double>(e.dur_ns) * 1e-9;
    if (is_collective(e)) ++collectives_[{name, rank}];
    if (e.rank >= 0) {
      auto pn = meta.process_names.find(e.pid);
      std::tuple<std::string, uint32_t, std::string> key{rank, e.pid, pn != meta.process_names.end() ? pn->second : ""};
      if (!rank_info_.count(key)) {
        if (rank_info_.size() < kMaxRankInfo) rank_info_.emplace(key, 1);
        else ++rank_info_dropped_;
      }
    }
  }
}

void MetricsState::add_chains(std::span<const Chain> chains) {
  std::lock_guard lock(mu_);
  for (const auto& c : chains) {
    if (!c.id.empty() && !chain_ids_.emplace(c.id, true).second) continue;
    ++chains_[{c.category, lower(severity_name(c.severity))}];
  }
}

void MetricsState::set_drops(const std::string& reason, uint64_t total) {
  std::lock_guard lock(mu_);
  drops_[reason] = total;
}

std::vector<uint64_t> MetricsState::classic_buckets(const std::string& op, const std::string& rank) const {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> out(kMaxPow2 - kMinPow2 + 2, 0);
  auto it = latency_.find({op, rank});
  if (it == latency_.end()) return out;
  for (const auto& [idx, n] : it->second.buckets)
    for (int k = kMinPow2; k <= kMaxPow2; ++k)
      if (idx <= k * kSketchPerOctave) out[static_cast<size_t>(k - kMinPow2)] += n;
  out.back() = it->second.count;
  return out;
}

class FamiliesBuilder {
 public:
  static std::vector<prometheus::MetricFamily> build(const MetricsState& s) {
    using prometheus::MetricType;
    std::lock_guard lock(s.mu_);
    std::vector<prometheus::MetricFamily> out;
    auto family = [&](const char* name, const char* help, MetricType t) -> prometheus::MetricFamily& {
      out.push_back({name, help, t, {}});
      return out.back();
    };
    {
      auto& f = family("gpustall_op_latency_seconds",
                       "Host-side CUDA/driver/NCCL call latency; buckets are an exact collapse of a "
                       "gamma=2^(1/32) log sketch",
                       MetricType::Histogram);
      for (const auto& [key, sk] : s.latency_) {
        auto m = labelled({{"op", key.first}, {"rank", key.second}});
        m.histogram.sample_count = sk.count;
        m.histogram.sample_sum = sk.sum_s;
        uint64_t cum = 0;
        auto it = sk.buckets.begin();
        for (int k = kMinPow2; k <= kMaxPow2; ++k) {
          for (; it != sk.buckets.end() && it->first <= k * kSketchPerOctave; ++it) cum += it->second;
          m.histogram.bucket.push_back({cum, std::ldexp(1.0, k)});
        }
        m.histogram.bucket.push_back({sk.count, std::numeric_limits<double>::infinity()});
        f.metric.push_back(std::move(m));
      }
    }
    {
      auto& f = family("gpustall_events_total", "Events analysed, by source", MetricType::Counter);
      for (const auto& [src, n] : s.events_by_source_) {
        auto m = labelled({{"source", src}});
        m.counter.value = static_cast<double>(n);
        f.metric.push_back(std::move(m));
      }
    }
    {
      auto& f = family("gpustall_events_dropped_total", "Events lost before analysis, by reason", MetricType::Counter);
      for (const auto& [reason, n] : s.drops_) {
        auto m = labelled({{"reason", reason}});
        m.counter.value = static_cast<double>(n);
        f.metric.push_back(std::move(m));
      }
    }
    {
      auto& f = family("gpustall_chains_total", "Causal chains emitted, by category and severity", MetricType::Counter);
      for (const auto& [key, n] : s.chains_) {
        auto m = labelled({{"category", key.first}, {"severity", key.second}});
        m.counter.value = static_cast<double>(n);
        f.metric.push_back(std::move(m));
      }
    }
    {
      auto& f = family("gpustall_sync_wait_seconds_total", "Time the host blocked in synchronising calls, by rank",
                       MetricType::Counter);
      for (const auto& [rank, v] : s.sync_wait_s_) {
        auto m = labelled({{"rank", rank}});
        m.counter.value = v;
        f.metric.push_back(std::move(m));
      }
    }
    {
      auto& f = family("gpustall_trace_seconds_total",
                       "Trace time covered by the events analysed (the denominator of time shares)",
                       MetricType::Counter);
      auto m = labelled({});
      m.counter.value = s.last_end_ > s.first_ts_ ? static_cast<double>(s.last_end_ - s.first_ts_) * 1e-9 : 0.0;
      f.metric.push_back(std::move(m));
    }
    {
      auto& f = family("gpustall_collectives_total", "NCCL calls, by op and rank", MetricType::Counter);
      for (const auto& [key, n] : s.collectives_) {
        auto m = labelled({{"op", key.first}, {"rank", key.second}});
        m.counter.value = static_cast<double>(n);
        f.metric.push_back(std::move(m));
      }
    }
    {
      const auto ranks = s.steps_.ranks();
      std::map<std::string, RankStepWaits> by_label;  // counters: ranks sharing "other" are summed
      std::vector<std::pair<std::string, RankStepWaits>> gauges;
      for (const auto& r : ranks) {
        auto it = s.ranks_.find(r.rank);
        const std::string label = r.rank < 0 ? "" : it != s.ranks_.end() ? it->second : "other";
        auto& t = by_label[label];
        t.steps += r.steps;
        t.wait_s += r.wait_s;
        t.step_s += r.step_s;
        if (r.ready && label != "other") gauges.emplace_back(label, r);
      }
      auto& syncs = family("gpustall_step_syncs_total",
                           "Steps seen: a collective and the first synchronising call after it, by rank",
                           MetricType::Counter);
      for (const auto& [label, t] : by_label) {
        auto m = labelled({{"rank", label}});
        m.counter.value = static_cast<double>(t.steps);
        syncs.metric.push_back(std::move(m));
      }
      auto& waits = family("gpustall_step_wait_seconds_total",
                           "Time waited at the collective (its entry to the end of the wait after it), by rank",
                           MetricType::Counter);
      for (const auto& [label, t] : by_label) {
        auto m = labelled({{"rank", label}});
        m.counter.value = t.wait_s;
        waits.metric.push_back(std::move(m));
      }
      auto& lens = family("gpustall_step_seconds_total",
                          "Sum of step lengths (collective entry to the next one's), by rank", MetricType::Counter);
      for (const auto& [label, t] : by_label) {
        auto m = labelled({{"rank", label}});
        m.counter.value = t.step_s;
        lens.metric.push_back(std::move(m));
      }
      auto& mw = family("gpustall_step_wait_median_seconds",
                        "Median wait at the collective over the rank's last 20 steps (the rank that arrives last "
                        "waits least)",
                        MetricType::Gauge);
      for (const auto& [label, r] : gauges) {
        auto m = labelled({{"rank", label}});
        m.gauge.value = static_cast<double>(r.median_wait_ns) * 1e-9;
        mw.metric.push_back(std::move(m));
      }
      auto& ms = family("gpustall_step_median_seconds", "Median step length over the rank's last 20 steps",
                        MetricType::Gauge);
      for (const auto& [label, r] : gauges) {
        auto m = labelled({{"rank", label}});
        m.gauge.value = static_cast<double>(r.median_step_ns) * 1e-9;
        ms.metric.push_back(std::move(m));
      }
    }
    {
      auto& f = family("gpustall_rank_info", "Processes behind each rank (pid and comm live only here)",
                       MetricType::Gauge);
      for (const auto& [key, one] : s.rank_info_) {
        auto m = labelled(
            {{"rank", std::get<0>(key)}, {"pid", std::to_string(std::get<1>(key))}, {"comm", std::get<2>(key)}});
        m.gauge.value = 1;
        f.metric.push_back(std::move(m));
      }
    }
    {
      auto& f = family("gpustall_build_info", "Build of the exporting ingero-pipeline", MetricType::Gauge);
      auto m = labelled({{"version", s.id_.version}});
      m.gauge.value = 1;
      f.metric.push_back(std::move(m));
    }
    {
      auto& f = family("target_info", "The node this process observes", MetricType::Gauge);
      auto m = labelled({{"cluster", s.id_.cluster}, {"node", s.id_.node}, {"hostname", s.id_.hostname}});
      m.gauge.value = 1;
      f.metric.push_back(std::move(m));
    }
    return out;
  }
};

size_t MetricsState::series() const {
  size_t n = 0;
  for (const auto& f : FamiliesBuilder::build(*this))
    n += f.type == prometheus::MetricType::Histogram
             ? f.metric.size() * (kMaxPow2 - kMinPow2 + 2 + 2)  // buckets + +Inf, _sum, _count
             : f.metric.size();
  return n;
}

std::string MetricsState::render() const {
  std::ostringstream os;
  prometheus::TextSerializer().Serialize(os, FamiliesBuilder::build(*this));
  return os.str();
}

namespace {

class StateCollectable final : public prometheus::Collectable {
 public:
  explicit StateCollectable(std::shared_ptr<MetricsState> s) : s_(std::move(s)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return FamiliesBuilder::build(*s_); }

 private:
  std::shared_ptr<MetricsState> s_;
};

}  // namespace

struct MetricsExporter::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<StateCollectable> collectable;
};

std::unique_ptr<MetricsExporter> MetricsExporter::start(const std::string& addr, MetricsIdentity id,
                                                        std::string& error) {
  std::unique_ptr<MetricsExporter> ex(new MetricsExporter());
  ex->state_ = std::make_shared<MetricsState>(std::move(id));
  ex->impl_ = std::make_unique<Impl>();
  try {
    ex->impl_->exposer = std::make_unique<prometheus::Exposer>(addr, 1);
    ex->impl_->collectable = std::make_shared<StateCollectable>(ex->state_);
    ex->impl_->exposer->RegisterCollectable(ex->impl_->collectable);
    const auto ports = ex->impl_->exposer->GetListeningPorts();
    ex->port_ = ports.empty() ? 0 : ports.front();
  } catch (const std::exception& e) {
    error = "--metrics-addr " + addr + ": cannot serve /metrics: " + e.what();
    return nullptr;
  }
  return ex;
}

MetricsExporter::~MetricsExporter() = default;

}  // namespace ingero::metrics
