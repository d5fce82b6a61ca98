// Prometheus exposition of a running analysis: `trace` and `run` serve /metrics with
// --metrics-addr (docs/fleet.md lists every series and the per-node series budget).
//
// Contract:
// - MetricsState is fed events (observe()), chains (add_chains()) and drop totals (set_drops())
//   from any thread (one mutex) and renders the Prometheus text format at scrape time.
// - Latency: per (op, rank) a log sketch with gamma = 2^(1/32) (relative error ~1.1 %) over the
//   duration in seconds; bucket i holds (2^((i-1)/32), 2^(i/32)]. Every 32nd boundary is a power
//   of two, so the classic histogram `gpustall_op_latency_seconds` with le = 2^k s, k = -20..4
//   (about 1 us .. 16 s, 25 buckets + +Inf) is an EXACT collapse of the sketch: fleet quantiles
//   computed by Prometheus from summed buckets (histogram_quantile over sum by (le)) are the
//   quantiles of the merged sketches at bucket resolution, never averaged percentiles. The same
//   buckets are native-histogram schema 5 / OTLP exponential scale 5. (The engine's own
//   operators/quantile.h sketch uses alpha = 1 %, whose boundaries are not powers of two, so the
//   exporter keeps this sketch beside it rather than collapsing that one.)
// - Series and labels are bounded: `op` (the op table, ~45 names), `rank` (the first
//   kMaxRanks distinct ranks; later ones share rank="other"), `source`, `reason`,
//   `category`/`severity` of chains; pid and comm appear only in gpustall_rank_info (at most
//   kMaxRankInfo series). `node` and `cluster` are target labels set by Prometheus's scrape
//   config, and also carried by target_info.
// - The per-step straggler signal (sinks/metrics/step_waits.h), per rank: counters
//   gpustall_step_syncs_total (steps: a collective and the wait after it),
//   gpustall_step_wait_seconds_total (the waits at the collective) and gpustall_step_seconds_total
//   (the steps' lengths), and the gauges gpustall_step_wait_median_seconds and
//   gpustall_step_median_seconds: medians over the last kWindowSteps steps of the rank's busiest
//   communicator, present only once that many steps were seen (a rank labelled "other" gets no
//   gauges: several ranks' waits are not one rank's).
// - gpustall_trace_seconds_total counts the trace time the events cover (last end - first start),
//   so rules can divide a time counter by it: the share stays right for a paced replay and for a
//   5 m rate() window that is only partly filled (rate() divides by the whole range).
// - MetricsExporter serves /metrics over HTTP (prometheus-cpp's civetweb Exposer) on `addr`
//   ("127.0.0.1:9464" by default; port 0 picks a free port, port() says which). start() returns
//   null with `error` when the address cannot be bound. Never throws.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "model/event.h"
#include "model/result.h"
#include "model/trace.h"
#include "sinks/metrics/step_waits.h"

namespace ingero::metrics {

inline constexpr int kSketchPerOctave = 32;         // gamma = 2^(1/32)
inline constexpr int kMinPow2 = -20, kMaxPow2 = 4;  // classic buckets le = 2^k s
inline constexpr size_t kMaxRanks = 16;
inline constexpr size_t kMaxRankInfo = 64;

// Sketch bucket of a duration in ns: the smallest i with v <= 2^(i/32) seconds (0 ns -> INT32_MIN).
int sketch_index(uint64_t ns);

struct MetricsIdentity {
  std::string node, cluster, hostname, version;
};

class MetricsState {
 public:
  explicit MetricsState(MetricsIdentity id);
  void observe(std::span<const Event> events, const TraceMeta& meta);
  void add_chains(std::span<const Chain> chains);  // counted once per chain id
  void set_drops(const std::string& reason, uint64_t total);
  std::string render() const;  // the Prometheus text format (0.0.4)
  // For tests: the classic cumulative counts of one (op, rank) histogram, le = 2^k for
  // k = kMinPow2..kMaxPow2, then +Inf.
  std::vector<uint64_t> classic_buckets(const std::string& op, const std::string& rank) const;
  size_t series() const;  // sample lines render() would print

 private:
  struct Sketch {
    std::map<int, uint64_t> buckets;
    uint64_t count = 0;
    double sum_s = 0;
  };
  friend class FamiliesBuilder;  // renders the families under mu_ (prometheus_exporter.cpp)
  std::string rank_label(int16_t rank);
  mutable std::mutex mu_;
  MetricsIdentity id_;
  std::map<std::pair<std::string, std::string>, Sketch> latency_;  // (op, rank)
  std::map<std::string, uint64_t> events_by_source_;
  std::map<std::string, uint64_t> drops_;
  std::map<std::pair<std::string, std::string>, uint64_t> chains_;           // (category, severity)
  std::map<std::string, double> sync_wait_s_;                                // by rank
  std::map<std::pair<std::string, std::string>, uint64_t> collectives_;      // (op, rank)
  std::map<int16_t, std::string> ranks_;                                     // rank -> label
  std::map<std::tuple<std::string, uint32_t, std::string>, int> rank_info_;  // (rank, pid, comm)
  std::map<std::string, bool> chain_ids_;
  uint64_t first_ts_ = UINT64_MAX, last_end_ = 0;  // trace time covered: gpustall_trace_seconds_total
  uint64_t rank_info_dropped_ = 0;
  StepWaitTracker steps_;  // the per-step straggler signal (step_waits.h)
};

class MetricsExporter {
 public:
  static std::unique_ptr<MetricsExporter> start(const std::string& addr, MetricsIdentity id, std::string& error);
  ~MetricsExporter();
  MetricsState& state() { return *state_; }
  int port() const { return port_; }

 private:
  MetricsExporter() = default;
  struct Impl;
  std::shared_ptr<MetricsState> state_;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace ingero::metrics
