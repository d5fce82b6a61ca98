// The self-contained HTML report (contract in html_report.h).
#include "sinks/report/html_report.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/format.h"
#include "model/ops.h"
#include "model/plan.h"
#include "model/result_json.h"
#include "model/stack.h"
#include "sinks/report/html_escape.h"
#include "sinks/report/text_report.h"

namespace ingero {

namespace {

std::string html(const std::string& s) { return html_escape(s); }

// JSON safe to inline in a <script> element.
std::string script_json(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string o;
  o.reserve(s.size());
  for (const char c : s) {
    if (c == '<') o += "\\u003c";  // no "</script>" or "<!--" can appear
    else o += c;
  }
  return o;
}

std::string pct(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", v * 100);
  return b;
}

std::string dur_text(uint64_t ns) {
  char b[32];
  if (ns >= 1'000'000'000ull) std::snprintf(b, sizeof b, "%.2fs", static_cast<double>(ns) / 1e9);
  else if (ns >= 1'000'000ull) std::snprintf(b, sizeof b, "%.2fms", static_cast<double>(ns) / 1e6);
  else if (ns >= 1'000ull) std::snprintf(b, sizeof b, "%.1fus", static_cast<double>(ns) / 1e3);
  else std::snprintf(b, sizeof b, "%lluns", static_cast<unsigned long long>(ns));
  return b;
}

int hist_bin(uint64_t ns) {
  if (ns <= 100) return 0;
  const double k = std::floor(std::log10(static_cast<double>(ns) / 100.0) * HtmlCollector::kBinsPerDecade);
  return static_cast<int>(std::clamp(k, 0.0, static_cast<double>(HtmlCollector::kBins - 1)));
}

// The accounting's buckets in the order the report stacks them (model/accounting.h acct::
// indexes): in calls by kind, on CPU, preempted, blocked by reason, unknown.
struct AcctPart {
  uint8_t bucket;
  const char* label;
  const char* color;
};
constexpr AcctPart kAcctParts[] = {{acct::kLaunch, "in calls: launch", "#1f4e79"},
                                   {acct::kCopy, "in calls: copy", "#2e75b6"},
                                   {acct::kSync, "in calls: sync", "#5b9bd5"},
                                   {acct::kAlloc, "in calls: alloc", "#9dc3e6"},
                                   {acct::kCollective, "in calls: collective", "#17a2b8"},
                                   {acct::kOtherCall, "in calls: other", "#bdd7ee"},
                                   {acct::kOnCpu, "on CPU", "#1a7f37"},
                                   {acct::kPreempted, "preempted", "#d0342c"},
                                   {acct::kLock, "blocked: lock", "#e69500"},
                                   {acct::kIo, "blocked: io", "#f0b849"},
                                   {acct::kNetwork, "blocked: network", "#9b59b6"},
                                   {acct::kSleep, "blocked: sleep", "#c39bd3"},
                                   {acct::kBlockedOther, "blocked: other", "#8e6c3a"},
                                   {acct::kUnknown, "unknown", "#b0b7c3"}};
// The coarse groups of the charts over time: [first, last] bucket ranges of kAcctParts.
struct AcctGroup {
  const char* label;
  const char* color;
  size_t first, last;  // indexes into kAcctParts
};
constexpr AcctGroup kAcctGroups[] = {{"in calls", "#2e75b6", 0, 5},
                                     {"on CPU", "#1a7f37", 6, 6},
                                     {"preempted", "#d0342c", 7, 7},
                                     {"blocked", "#e69500", 8, 12},
                                     {"unknown", "#b0b7c3", 13, 13}};

// A whole-trace accounting's ns by acct:: bucket.
std::array<uint64_t, acct::kBuckets> bucket_ns(const ThreadAccounting& a) {
  std::array<uint64_t, acct::kBuckets> b{};
  auto at = [](const std::map<std::string, uint64_t>& m, const char* k) {
    auto it = m.find(k);
    return it == m.end() ? uint64_t{0} : it->second;
  };
  for (size_t i = 0; i < std::size(kCallKinds); ++i) b[acct::kLaunch + i] = at(a.in_calls_ns, kCallKinds[i]);
  for (size_t i = 0; i < std::size(kBlockReasons); ++i) b[acct::kLock + i] = at(a.blocked_ns, kBlockReasons[i]);
  b[acct::kOnCpu] = a.on_cpu_ns;
  b[acct::kPreempted] = a.preempted_ns;
  b[acct::kUnknown] = a.unknown_ns;
  return b;
}

// "python3 [tid 4243]": the accounting's name for a thread.
std::string acct_label(const std::string& comm, uint32_t tid) {
  return (comm.empty() ? std::string("thread") : comm) + " [tid " + std::to_string(tid) + "]";
}

const char* kCss = R"(
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d8dde6;padding-bottom:4px}
.meta{color:#5a6475;font-size:13px}.chain{background:#fff;border:1px solid #d8dde6;border-left:6px solid #888;border-radius:6px;padding:10px 14px;margin:10px 0}
.chain.HIGH{border-left-color:#d0342c}.chain.MEDIUM{border-left-color:#e69500}.chain.LOW{border-left-color:#3b82c4}
.sev{font-weight:700;font-size:12px;padding:1px 6px;border-radius:3px;background:#eef1f5;margin-right:6px}
.verdict{border-left:6px solid #1f5fbf;background:#eef3fb;padding:10px 14px;margin:8px 0 14px;font-size:16px}
.summary{font-weight:600}.root{margin:4px 0}.small{font-size:13px;color:#3c4656}
table{border-collapse:collapse;font-size:13px;margin:4px 0}td,th{border:1px solid #e1e5ec;padding:2px 6px;text-align:left}
.pass{color:#1a7f37}.fail{color:#cf222e}code,pre.stack{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
pre.stack{background:#f3f5f8;padding:6px;margin:4px 0;white-space:pre-wrap}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:12px}
.card{background:#fff;border:1px solid #d8dde6;border-radius:6px;padding:8px}.wide{height:320px}.cell{height:240px}
#chart-summary,#script-errors{display:none}
)";

// Builds the charts, then records what it built in #chart-summary (tests read it).
const char* kScript = R"(
(function () {
  const D = JSON.parse(document.getElementById('report-data').textContent);
  const charts = [];
  const palette = ['#3b82c4', '#e69500', '#1a7f37', '#9b59b6', '#d0342c', '#17a2b8', '#6c757d', '#8e6c3a'];
  const fmtUs = (us) => us >= 1e6 ? (us / 1e6).toFixed(2) + 's' : us >= 1e3 ? (us / 1e3).toFixed(2) + 'ms' : us.toFixed(1) + 'us';
  function add(id, cfg) {
    const el = document.getElementById(id);
    if (!el) return;
    cfg.options = Object.assign({animation: false, responsive: true, maintainAspectRatio: false}, cfg.options || {});
    charts.push(new Chart(el, cfg));
  }
  D.hist.forEach((h, i) => {
    const ymax = Math.max(1, ...h.bins.map(b => b.y));
    const marker = (label, x, color) => ({label: label, data: [{x: x, y: 0}, {x: x, y: ymax}], borderColor: color,
      borderDash: [6, 4], borderWidth: 2, pointRadius: 0, fill: false});
    add('hist-' + i, {type: 'line', data: {datasets: [
        {label: h.op + ' calls', data: h.bins, stepped: 'middle', borderColor: palette[0], backgroundColor: 'rgba(59,130,196,0.25)', fill: true, pointRadius: 0},
        marker('p50 ' + fmtUs(h.p50_us), h.p50_us, '#1a7f37'),
        marker('p99 ' + fmtUs(h.p99_us), h.p99_us, '#d0342c')]},
      options: {plugins: {title: {display: true, text: h.op + ' latency (' + h.count + ' calls)'}},
        scales: {x: {type: 'logarithmic', title: {display: true, text: 'latency (us, log scale)'}},
                 y: {beginAtZero: true, title: {display: true, text: 'calls'}}}}});
  });
  if (D.rate.series.length) {
    const ymax = Math.max(1, ...D.rate.series.map(s => Math.max(...s.y)));
    const ds = D.rate.series.map((s, k) => ({label: s.op + ' calls/s', data: s.y.map((y, j) => ({x: D.rate.x[j], y: y})),
      borderColor: palette[k % palette.length], pointRadius: 0, borderWidth: 1.5, fill: false}));
    D.rate.chains.forEach(c => ds.push({label: 'chain: ' + c.label, data: [{x: c.start, y: ymax}, {x: c.end, y: ymax}],
      fill: 'origin', backgroundColor: 'rgba(208,52,44,0.12)', borderWidth: 0, pointRadius: 0}));
    add('rate', {type: 'line', data: {datasets: ds}, options: {
      plugins: {title: {display: true, text: 'Calls per second by op; shaded: chain windows'}},
      scales: {x: {type: 'linear', title: {display: true, text: 'seconds from trace start'}},
               y: {beginAtZero: true, title: {display: true, text: 'calls/s'}}}}});
  }
  if (D.offcpu.series.length) {
    add('offcpu', {type: 'line', data: {datasets: D.offcpu.series.map((s, k) => ({label: s.label,
        data: s.y.map((y, j) => ({x: D.offcpu.x[j], y: y * 100})), borderColor: palette[k % palette.length],
        pointRadius: 0, borderWidth: 1.5, fill: false}))},
      options: {plugins: {title: {display: true, text: 'Off-CPU share per thread (threads named by chains)'}},
        scales: {x: {type: 'linear', title: {display: true, text: 'seconds from trace start'}},
                 y: {min: 0, max: 100, title: {display: true, text: '% of the bucket off CPU'}}}}});
  }
  if (D.acct.threads.length) {
    const ds = D.acct.parts.map((p, k) => ({label: p.label, backgroundColor: p.color,
      data: D.acct.threads.map(t => t.values[k])})).filter(d => d.data.some(v => v > 0));
    add('acct', {type: 'bar', data: {labels: D.acct.threads.map(t => t.label), datasets: ds},
      options: {indexAxis: 'y', plugins: {title: {display: true, text: 'Where each GPU-feeding thread\'s time went (% of its wall time)'}},
        scales: {x: {stacked: true, min: 0, max: 100, title: {display: true, text: '% of the thread\'s wall time'}},
                 y: {stacked: true}}}});
  }
  D.acct.over_time.forEach((t, i) => add('acct-time-' + i, {type: 'bar', data: {labels: t.x,
      datasets: t.series.map(s => ({label: s.label, backgroundColor: s.color, data: s.y, barPercentage: 1, categoryPercentage: 1}))},
    options: {plugins: {title: {display: true, text: t.title}},
      scales: {x: {stacked: true, title: {display: true, text: 'seconds from the trace start'}},
               y: {stacked: true, min: 0, max: 100, title: {display: true, text: '% of each ' + t.width_s + ' s bar'}}}}}));
  document.getElementById('chart-summary').textContent = JSON.stringify(charts.map(c => ({
    id: c.canvas.id, type: c.config.type, series: c.data.datasets.length,
    labels: c.data.datasets.map(d => d.label)})));
})();
)";

}  // namespace

// ---------------------------------------------------------------------------------------------

HtmlCollector::HtmlCollector(const AnalysisResult& r, const HtmlReportOptions& o) {
  for (const auto& c : r.chains) {
    if (c.tid) threads.insert(c.tid);
    for (const auto& t : c.threads) threads.insert(t.tid);
    if (c.time_split.present && c.time_split.tid) threads.insert(c.time_split.tid);
    if (threads.size() >= o.max_threads) break;
  }
  while (threads.size() > o.max_threads) threads.erase(std::prev(threads.end()));
}

void HtmlCollector::widen() {
  bucket_ns *= 2;
  auto halve = [](std::map<uint64_t, uint64_t>& m) {
    std::map<uint64_t, uint64_t> n;
    for (const auto& [k, v] : m) n[k / 2] += v;
    m.swap(n);
  };
  for (auto& [k, s] : ops) halve(s.per_bucket);
  for (auto& [k, m] : offcpu) halve(m);
}

void HtmlCollector::add(const Batch& b) {
  for (const Event& e : b.events) {
    if (!started) {
      started = true;
      first_ts = e.ts_ns;
    }
    if (e.ts_ns < first_ts) continue;  // late context events before the start: not charted
    last_ts = std::max(last_ts, e.end_ns());
    while ((last_ts - first_ts) / bucket_ns >= kMaxSeconds) widen();
    if (is_gpu_api(e.source)) {
      auto& s = ops[{static_cast<int>(e.source), e.op}];
      ++s.count;
      ++s.hist[static_cast<size_t>(hist_bin(e.dur_ns))];
      ++s.per_bucket[(e.ts_ns - first_ts) / bucket_ns];
    } else if (e.source == Source::kHost && e.op == op::kSchedSwitch && e.dur_ns > 0 && threads.count(e.tid) &&
               !(e.flags & (event_flags::kSwitchIn | event_flags::kSwitchOut))) {
      auto& m = offcpu[e.tid];
      uint64_t t = e.ts_ns;
      const uint64_t end = e.end_ns();
      while (t < end) {
        const uint64_t bucket = (t - first_ts) / bucket_ns;
        const uint64_t bucket_end = first_ts + (bucket + 1) * bucket_ns;
        const uint64_t upto = std::min(end, bucket_end);
        m[bucket] += upto - t;
        t = upto;
      }
    }
  }
}

bool write_html_report(const std::string& path, const AnalysisResult& r, const HtmlCollector& d, std::string& error,
                       const HtmlReportOptions& o) {
  std::ifstream cj(o.chartjs_path, std::ios::binary);
  if (!cj) {
    error = "Chart.js not found at " + o.chartjs_path + " (the HTML report inlines it: apt-get install libjs-chart.js)";
    return false;
  }
  const std::string chartjs{std::istreambuf_iterator<char>(cj), {}};
  const TraceMeta& meta = r.meta;

  // --- data for the charts
  nlohmann::json data;
  std::vector<std::pair<uint64_t, std::pair<int, int>>> by_count;
  for (const auto& [key, s] : d.ops) by_count.emplace_back(s.count, key);
  std::sort(by_count.rbegin(), by_count.rend());
  if (by_count.size() > o.max_histograms) by_count.resize(o.max_histograms);
  data["hist"] = nlohmann::json::array();
  for (const auto& [n, key] : by_count) {
    const auto& s = d.ops.at(key);
    const auto src = static_cast<Source>(key.first);
    const auto op = static_cast<uint8_t>(key.second);
    int lo = HtmlCollector::kBins, hi = -1;
    for (int k = 0; k < HtmlCollector::kBins; ++k)
      if (s.hist[static_cast<size_t>(k)]) lo = std::min(lo, k), hi = std::max(hi, k);
    nlohmann::json bins = nlohmann::json::array();
    for (int k = std::max(0, lo - 1); k <= std::min(HtmlCollector::kBins - 1, hi + 1); ++k) {
      const double center_ns = 100.0 * std::pow(10.0, (k + 0.5) / HtmlCollector::kBinsPerDecade);
      bins.push_back({{"x", center_ns / 1e3}, {"y", s.hist[static_cast<size_t>(k)]}});
    }
    uint64_t p50 = 0, p99 = 0;
    for (const auto& st : r.ops)
      if (st.source == src && st.op == op) p50 = st.p50_ns, p99 = st.p99_ns;
    data["hist"].push_back({{"op", op_name(src, op)},
                            {"count", s.count},
                            {"bins", bins},
                            {"p50_us", std::max(1e-3, static_cast<double>(p50) / 1e3)},
                            {"p99_us", std::max(1e-3, static_cast<double>(p99) / 1e3)}});
  }
  const uint64_t buckets = d.started ? (d.last_ts - d.first_ts) / d.bucket_ns + 1 : 0;
  const double bucket_s = static_cast<double>(d.bucket_ns) / 1e9;
  nlohmann::json xs = nlohmann::json::array();
  for (uint64_t k = 0; k < buckets; ++k) xs.push_back(static_cast<double>(k) * bucket_s);
  data["rate"]["x"] = xs;
  data["rate"]["series"] = nlohmann::json::array();
  for (const auto& [n, key] : by_count) {
    const auto& s = d.ops.at(key);
    nlohmann::json ys = nlohmann::json::array();
    for (uint64_t k = 0; k < buckets; ++k) {
      auto it = s.per_bucket.find(k);
      ys.push_back(it == s.per_bucket.end() ? 0.0 : static_cast<double>(it->second) / bucket_s);
    }
    data["rate"]["series"].push_back(
        {{"op", op_name(static_cast<Source>(key.first), static_cast<uint8_t>(key.second))}, {"y", ys}});
  }
  data["rate"]["chains"] = nlohmann::json::array();
  for (size_t i = 0; i < r.chains.size() && i < o.max_shaded && d.started; ++i) {
    const Chain& c = r.chains[i];
    const auto off = [&](uint64_t t) { return t <= d.first_ts ? 0.0 : static_cast<double>(t - d.first_ts) / 1e9; };
    data["rate"]["chains"].push_back({{"label", c.rule + (c.op ? " " + op_name(c.source, c.op) : std::string())},
                                      {"start", off(c.window_start)},
                                      {"end", off(c.window_end)}});
  }
  data["offcpu"]["x"] = xs;
  data["offcpu"]["series"] = nlohmann::json::array();
  for (uint32_t tid : d.threads) {
    auto it = d.offcpu.find(tid);
    nlohmann::json ys = nlohmann::json::array();
    for (uint64_t k = 0; k < buckets; ++k) {
      double v = 0;
      if (it != d.offcpu.end())
        if (auto b = it->second.find(k); b != it->second.end())
          v = std::min(1.0, static_cast<double>(b->second) / static_cast<double>(d.bucket_ns));
      ys.push_back(v);
    }
    std::string name;
    if (auto t = meta.thread_names.find(tid); t != meta.thread_names.end()) name = t->second;
    for (const auto& c : r.chains)
      for (const auto& t : c.threads)
        if (name.empty() && t.tid == tid) name = t.name;
    data["offcpu"]["series"].push_back(
        {{"label", (name.empty() ? "thread" : name) + " [tid " + std::to_string(tid) + "]"}, {"y", ys}});
  }

  // Where the main feeding threads' time went: one stacked bar each, then second by second.
  data["acct"]["parts"] = nlohmann::json::array();
  for (const auto& p : kAcctParts) data["acct"]["parts"].push_back({{"label", p.label}, {"color", p.color}});
  data["acct"]["threads"] = nlohmann::json::array();
  for (const auto& a : r.accounting) {
    const auto b = bucket_ns(a);
    nlohmann::json values = nlohmann::json::array();
    for (const auto& p : kAcctParts)
      values.push_back(a.wall_ns ? 100.0 * static_cast<double>(b[p.bucket]) / static_cast<double>(a.wall_ns) : 0.0);
    data["acct"]["threads"].push_back({{"label", acct_label(a.comm, a.tid)}, {"values", values}});
  }
  data["acct"]["over_time"] = nlohmann::json::array();
  // Seconds on the x axis count from the trace's first whole second.
  const uint64_t sec0 = (d.started ? d.first_ts : meta.first_ts) / 1'000'000'000ull;
  for (const auto& s : r.accounting_series) {
    if (data["acct"]["over_time"].size() >= o.max_accounting_over_time) break;
    if (s.bins.empty()) continue;
    const size_t per_bar = std::max<size_t>(1, (s.bins.size() + o.max_accounting_bars - 1) /
                                                   std::max<size_t>(1, o.max_accounting_bars));
    nlohmann::json x = nlohmann::json::array();
    std::vector<nlohmann::json> ys(std::size(kAcctGroups), nlohmann::json::array());
    for (size_t i = 0; i < s.bins.size(); i += per_bar) {
      const size_t n = std::min(per_bar, s.bins.size() - i);
      const uint64_t sec = s.first_sec + i;
      x.push_back(sec >= sec0 ? static_cast<int64_t>(sec - sec0) : -static_cast<int64_t>(sec0 - sec));
      for (size_t g = 0; g < std::size(kAcctGroups); ++g) {
        uint64_t ns = 0;
        for (size_t k = i; k < i + n; ++k)
          for (size_t p = kAcctGroups[g].first; p <= kAcctGroups[g].last; ++p) ns += s.bins[k][kAcctParts[p].bucket];
        ys[g].push_back(100.0 * static_cast<double>(ns) / (1e9 * static_cast<double>(n)));
      }
    }
    std::string comm;
    for (const auto& a : r.accounting)
      if (a.node == s.node && a.tid == s.tid) comm = a.comm;
    nlohmann::json series = nlohmann::json::array();
    for (size_t g = 0; g < std::size(kAcctGroups); ++g)
      series.push_back({{"label", kAcctGroups[g].label}, {"color", kAcctGroups[g].color}, {"y", ys[g]}});
    data["acct"]["over_time"].push_back(
        {{"title", "Time of " + acct_label(comm, s.tid) +
                       (per_bar > 1 ? ", " + std::to_string(per_bar) + " s a bar" : ", second by second")},
         {"width_s", per_bar},
         {"x", x},
         {"series", series}});
  }

  // --- the page
  std::ostringstream h;
  const std::string title = o.title.empty() ? "ingero-pipeline report: " + meta.path : o.title;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << html(title) << "</title>\n"
    << "<style>" << kCss << "</style>\n"
    << "<script>window.onerror=function(m,s,l,c){var e=document.getElementById('script-errors');"
       "if(e)e.textContent+=m+' at '+l+':'+c+'\\n';else document.title='SCRIPT ERROR: '+m;};</script>\n"
    << "<script>" << chartjs << "</script>\n</head><body>\n"
    << "<h1>" << html(title) << "</h1>\n";
  // The verdict first (operators/incidents.h make_verdict): detail follows for whoever wants it.
  if (!r.verdict.empty()) h << "<p id=\"verdict\" class=\"verdict\"><b>Verdict:</b> " << html(r.verdict) << "</p>\n";
  h << "<div class=\"meta\">" << html(meta.format) << " &middot; " << r.counters.events_in << " events &middot; "
    << r.chains.size() << " chain(s)"
    << (d.started ? " &middot; " + dur_text(d.last_ts - d.first_ts) + " of trace" : std::string()) << "</div>\n";

  if (!r.incidents.empty()) {
    h << "<h2>Incidents</h2>\n<table id=\"incidents\"><tr><th>severity</th><th>cause</th><th>where</th><th>when</th>"
         "<th>time lost</th><th>GPU-hours</th><th>cost</th><th>step without it</th></tr>\n";
    for (const Incident& in : r.incidents) {
      char gh[48], cost[48];
      std::snprintf(gh, sizeof gh, "%.3g", in.gpu_hours);
      if (in.cost) std::snprintf(cost, sizeof cost, "%.2f %s", *in.cost, in.currency.c_str());
      h << "<tr><td>" << severity_name(in.severity) << "</td><td>" << html(in.category) << " (<code>" << html(in.rule)
        << "</code>)</td><td>" << html(process_label(meta, in.pid)) << (in.tid ? " tid " + std::to_string(in.tid) : "")
        << "</td><td>" << html(trace_offset(meta, in.start_ns)) << " .. " << html(trace_offset(meta, in.end_ns))
        << "</td><td>" << html(dur_text(in.lost_ns)) << " (" << html(format_value(in.lost_share, Unit::kPercent))
        << ")</td><td>" << gh << "</td><td>" << (in.cost ? html(cost) : "-") << "</td><td>"
        << (in.what_if_step_ns ? html(dur_text(in.step_ns)) + " &rarr; " + html(dur_text(*in.what_if_step_ns)) : "-")
        << "</td></tr>\n";
    }
    h << "</table>\n";
  }
  h << "<h2>Causal chains</h2>\n";
  if (r.chains.empty()) h << "<p>No chain: no rule found a slow call that host activity explains.</p>\n";
  for (const Chain& c : r.chains) {
    const std::string sev = severity_name(c.severity);
    h << "<div class=\"chain " << sev << "\"><div><span class=\"sev\">" << sev << "</span><code>" << html(c.rule)
      << "</code> &middot; " << html(process_label(meta, c.pid)) << " &middot; window "
      << html(trace_offset(meta, c.window_start)) << " .. " << html(trace_offset(meta, c.window_end)) << "</div>\n"
      << "<div class=\"summary\">" << html(c.summary)
      << "</div>\n<div class=\"root\">Root cause: " << html(c.root_cause) << "</div>\n";
    if (!c.explanation.empty()) h << "<div class=\"small\">" << html(c.explanation) << "</div>\n";
    if (!c.evidence.empty()) {
      h << "<div><b>Evidence</b><ul>";
      for (const auto& e : c.evidence) {
        h << "<li><code>" << html(e.kind) << "</code> " << html(e.detail);
        if (!e.event_ids.empty()) {
          h << " <span class=\"small\">[events";
          for (size_t i = 0; i < e.event_ids.size() && i < 8; ++i) h << ' ' << e.event_ids[i];
          h << (e.event_ids.size() > 8 ? " ..." : "") << "]</span>";
        }
        h << "</li>";
      }
      h << "</ul></div>\n";
    }
    if (!c.predicates.empty()) {
      h << "<table><tr><th>check</th><th>value</th><th>threshold</th><th></th></tr>";
      for (const auto& p : c.predicates)
        h << "<tr><td>" << html(p.label) << "</td><td>" << html(p.lhs_text) << "</td><td>" << html(p.rhs_text)
          << "</td><td class=\"" << (p.passed ? "pass\">passed" : "fail\">failed") << "</td></tr>";
      h << "</table>\n";
    }
    if (!c.recommendations.empty()) {
      h << "<div><b>Fix</b><ol>";
      for (const auto& f : c.recommendations) h << "<li>" << html(f) << "</li>";
      h << "</ol></div>\n";
    }
    if (!c.threads.empty()) {
      h << "<div class=\"small\"><b>Threads:</b>";
      for (const auto& t : c.threads) h << ' ' << html(t.name) << " [tid " << t.tid << "] " << pct(t.share) << ';';
      h << "</div>\n";
    }
    if (c.time_split.present) {
      const auto& t = c.time_split;
      h << "<div class=\"small\"><b>Time of tid " << t.tid << ":</b> in calls " << pct(t.in_calls)
        << ", off CPU preempted " << pct(t.off_cpu_preempted) << ", blocked " << pct(t.off_cpu_blocked) << ", unknown "
        << pct(t.off_cpu_unknown) << ", on CPU " << pct(t.on_cpu) << " (dominant: " << html(t.dominant) << ")</div>\n";
    }
    if (c.accounting) {
      const ThreadAccounting& a = *c.accounting;
      h << "<div class=\"small\"><b>Time of " << html(acct_label(a.comm, a.tid)) << " over "
        << html(trace_offset(meta, a.start_ns)) << " .. " << html(trace_offset(meta, a.end_ns)) << ":</b> "
        << html(accounting_parts(a)) << "</div>\n";
    }
    for (const auto& s : c.stacks) {
      h << "<div class=\"small\"><b>Stack (" << html(s.role) << ", " << pct(s.share) << ", " << s.calls
        << " events)</b><pre class=\"stack\">";
      for (const auto& f : s.frames) h << html(frame_text(f)) << "\n";
      if (s.truncated) h << "(truncated)\n";
      h << "</pre></div>\n";
    }
    h << "</div>\n";
  }

  h << "<h2>Where the GPU-feeding threads' time went</h2>\n";
  if (r.accounting.empty()) {
    h << "<p class=\"small\">No thread issued a GPU API call in this trace.</p>\n";
  } else {
    h << "<div class=\"card\" style=\"height:" << 90 + 34 * r.accounting.size()
      << "px\"><canvas id=\"acct\"></canvas></div>\n<table id=\"acct-table\"><tr><th>thread</th><th>pid</th>"
         "<th>wall</th><th>where the time went</th></tr>";
    bool unstated = false;
    for (const auto& a : r.accounting) {
      unstated = unstated || !a.scheduler_data;
      h << "<tr><td>" << html(acct_label(a.comm, a.tid)) << "</td><td>" << a.pid << "</td><td>"
        << html(dur_text(a.wall_ns)) << "</td><td>" << html(accounting_parts(a)) << "</td></tr>";
    }
    h << "</table>\n";
    if (unstated)
      h << "<p class=\"small\">Unknown: this trace does not record why threads were off CPU, nor every switch (no "
           "switch-out state), so time outside calls cannot be split into on CPU, preempted and blocked "
           "(docs/accounting.md).</p>\n";
    for (size_t i = 0; i < data["acct"]["over_time"].size(); ++i)
      h << "<div class=\"card wide\"><canvas id=\"acct-time-" << i << "\"></canvas></div>\n";
  }
  h << "<h2>Call rate over time</h2>\n<div class=\"card wide\"><canvas id=\"rate\"></canvas></div>\n";
  h << "<h2>Off-CPU share of the threads in chains</h2>\n";
  if (d.threads.empty()) h << "<p class=\"small\">No chain names a thread.</p>\n";
  else h << "<div class=\"card wide\"><canvas id=\"offcpu\"></canvas></div>\n";
  h << "<h2>Latency histograms</h2>\n<div class=\"grid\">\n";
  for (size_t i = 0; i < data["hist"].size(); ++i)
    h << "<div class=\"card cell\"><canvas id=\"hist-" << i << "\"></canvas></div>\n";
  h << "</div>\n<pre id=\"chart-summary\"></pre><pre id=\"script-errors\"></pre>\n"
    << "<script type=\"application/json\" id=\"report-data\">" << script_json(data) << "</script>\n"
    << "<script>" << kScript << "</script>\n</body></html>\n";

  const std::string tmp = path + ".partial-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      error = path + ": cannot create the report file (does its directory exist and is it writable?)";
      return false;
    }
    const std::string page = h.str();
    out.write(page.data(), static_cast<std::streamsize>(page.size()));
    out.close();
    if (!out) {
      ::unlink(tmp.c_str());
      error = path + ": write failed (disk full?)";
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    error = path + ": cannot rename the finished report into place";
    return false;
  }
  return true;
}

bool write_html_report(const std::string& path, const AnalysisResult& r, EventSource& trace, std::string& error,
                       const HtmlReportOptions& o) {
  HtmlCollector d(r, o);
  Batch b;
  while (trace.next(b)) d.add(b);
  return write_html_report(path, r, d, error, o);
}

}  // namespace ingero
