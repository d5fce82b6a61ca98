// `explain --html`: one self-contained HTML file with the chains and charts of a trace.
//
// Contract:
// - The page needs no network: Chart.js (Debian's libjs-chart.js, /usr/share/javascript/chart.js/
//   chart.min.js, or `chartjs_path`) is read at report time and inlined; the data is inlined as
//   JSON. A missing Chart.js file is an error naming the package to install.
// - Content: every chain (severity, summary, root cause, evidence, predicates with both sides,
//   fixes, threads, stacks, time split where present); per-op latency histograms (log-spaced
//   bins on a logarithmic axis; p50/p99 of the op's statistics drawn as two marker series); the
//   call rate per op over time with each chain's window shaded (one series per op, one per
//   chain); per-thread off-CPU share over time for the threads named by chains (one series each);
//   where the main GPU-feeding threads' time went (AnalysisResult::accounting, docs/accounting.md):
//   one stacked bar per thread (in calls by kind, on CPU, preempted, blocked by reason, unknown;
//   % of its wall time) with the same numbers as a table, and for the top threads
//   (max_accounting_over_time) stacked bars second by second (AnalysisResult::accounting_series:
//   in calls, on CPU, preempted, blocked, unknown; % of each bar's time; at most
//   max_accounting_bars bars, wider bars on longer traces). Each chain with an accounting says
//   where its thread's time went over its window.
// - The page exposes what it drew: <pre id="chart-summary"> holds JSON [{id, type, series,
//   labels}] once the charts are built, and <pre id="script-errors"> collects window.onerror
//   messages (empty = none). Tests read both through headless Chromium's --dump-dom.
// - Collection is one pass over the trace (HtmlCollector::add per batch) with memory bounded by
//   ops x histogram bins and (ops + threads) x trace seconds (the time axis is capped at
//   kMaxSeconds buckets; longer traces use wider buckets). Never throws; the file is written to
//   a temporary name and renamed when complete.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "model/result.h"
#include "model/trace.h"

namespace ingero {

struct HtmlReportOptions {
  std::string chartjs_path = "/usr/share/javascript/chart.js/chart.min.js";
  std::string title;                    // default: "ingero-pipeline report: <trace path>"
  size_t max_histograms = 8;            // ops with most calls (GPU API ops first)
  size_t max_threads = 8;               // threads in the off-CPU chart
  size_t max_shaded = 20;               // chain windows shaded on the rate chart
  size_t max_accounting_over_time = 2;  // feeding threads charted second by second
  size_t max_accounting_bars = 600;     // bars per such chart (seconds merged beyond)
};

// Accumulates what the charts need from the trace's events.
class HtmlCollector {
 public:
  static constexpr size_t kMaxSeconds = 4096;  // time buckets kept; beyond, buckets widen
  static constexpr int kBinsPerDecade = 5;     // histogram bins: 10^(1/5) apart, from 100 ns
  static constexpr int kBins = 5 * 10;         // 100 ns .. 10^12 ns (1000 s)

  explicit HtmlCollector(const AnalysisResult& r, const HtmlReportOptions& o = {});
  void add(const Batch& b);

  struct OpSeries {
    std::vector<uint64_t> hist = std::vector<uint64_t>(kBins, 0);
    std::map<uint64_t, uint64_t> per_bucket;  // time bucket -> calls
    uint64_t count = 0;
  };
  std::map<std::pair<int, int>, OpSeries> ops;              // (source, op)
  std::map<uint32_t, std::map<uint64_t, uint64_t>> offcpu;  // tid -> bucket -> off-CPU ns
  std::set<uint32_t> threads;                               // threads of interest (from chains)
  uint64_t first_ts = 0, last_ts = 0;
  bool started = false;
  uint64_t bucket_ns = 1'000'000'000;  // width of a time bucket

 private:
  void widen();
};

// Builds the page. False with `error` (Chart.js missing, file not writable).
bool write_html_report(const std::string& path, const AnalysisResult& r, const HtmlCollector& data, std::string& error,
                       const HtmlReportOptions& o = {});
// Convenience: one pass over `trace` (the same trace `r` came from), then write_html_report.
bool write_html_report(const std::string& path, const AnalysisResult& r, EventSource& trace, std::string& error,
                       const HtmlReportOptions& o = {});

}  // namespace ingero
