// `explain --html`: the report is one self-contained file; opened in headless Chromium (Debian's
// `chromium`) it renders without script errors and builds the charts with the expected series,
// and a screenshot is saved. Chromium tests skip with the reason when it is not installed.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "sinks/report/html_report.h"
#include "tests/util/run_command.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using CliRun = ingero::test::CommandRun;

CliRun sh(const std::string& cmd) { return ingero::test::run_command(cmd); }
CliRun run(const std::string& args) { return sh(std::string(INGERO_BINARY_DIR) + "/ingero-pipeline " + args); }

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string chromium() {
  for (const char* c : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (fs::exists(c)) return c;
  return "";
}

// The text of <pre id="ID">...</pre> in a dumped DOM (HTML entities of JSON undone).
std::string pre_text(const std::string& dom, const std::string& id) {
  const std::string open = "<pre id=\"" + id + "\">";
  const auto a = dom.find(open);
  if (a == std::string::npos) return "<missing>";
  const auto b = dom.find("</pre>", a);
  std::string t = dom.substr(a + open.size(), b - a - open.size());
  for (const auto& [ent, ch] : {std::pair<std::string, std::string>{"&quot;", "\""},
                                {"&lt;", "<"},
                                {"&gt;", ">"},
                                {"&#39;", "'"},
                                {"&amp;", "&"}})
    for (size_t p = 0; (p = t.find(ent, p)) != std::string::npos; p += ch.size()) t.replace(p, ent.size(), ch);
  return t;
}

class HtmlReport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ip-html-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    const CliRun d = run("demo cpu_contention --save " + p("cpu.db"));
    ASSERT_EQ(d.status, 0) << d.err;
    const CliRun r = run("explain --db " + p("cpu.db") + " --html " + p("report.html"));
    status_ = r.status;
    err_ = r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string p(const std::string& n) { return (dir_ / n).string(); }
  static fs::path dir_;
  static int status_;
  static std::string err_;
};
fs::path HtmlReport::dir_;
int HtmlReport::status_ = -1;
std::string HtmlReport::err_;

TEST_F(HtmlReport, IsOneSelfContainedFile) {
  if (!fs::exists("/usr/share/javascript/chart.js/chart.min.js")) {
    EXPECT_EQ(status_, 3);
    EXPECT_NE(err_.find("libjs-chart.js"), std::string::npos) << err_;
    GTEST_SKIP() << "libjs-chart.js is not installed: the report cannot be built (the error says so)";
  }
  ASSERT_EQ(status_, 0) << err_;
  const std::string page = slurp(p("report.html"));
  EXPECT_NE(page.find("Chart.js v"), std::string::npos);  // inlined, not linked
  EXPECT_EQ(page.find("<script src"), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  EXPECT_NE(page.find("cpu_contention"), std::string::npos);
  EXPECT_NE(page.find("Pin the training process"), std::string::npos);  // the fix
  // Predicates, escaped: the contention finding over time (the tail chain is folded into it).
  EXPECT_NE(page.find("share &gt;= min_preempted_share"), std::string::npos);
  // Where the feeding threads' time went: the chart, its table, each chain's thread over its window.
  EXPECT_NE(page.find("<canvas id=\"acct\">"), std::string::npos);
  EXPECT_NE(page.find("<table id=\"acct-table\">"), std::string::npos);
  EXPECT_NE(page.find("<canvas id=\"acct-time-0\">"), std::string::npos);
  EXPECT_NE(page.find("python3 train.py [tid 4242]"), std::string::npos);
  EXPECT_NE(page.find("<b>Time of python3 train.py [tid 4242] over"), std::string::npos);
  EXPECT_NE(page.find("mostly by stress-ng --cpu 8"), std::string::npos);
  // The verdict first, the incidents before the chains.
  const size_t verdict = page.find("<p id=\"verdict\"");
  ASSERT_NE(verdict, std::string::npos);
  EXPECT_LT(verdict, page.find("<div class=\"meta\">"));
  EXPECT_LT(page.find("<table id=\"incidents\">"), page.find("<h2>Causal chains</h2>"));
}

TEST_F(HtmlReport, UnwritablePathIsAnError) {
  const CliRun r = run("explain --db " + p("cpu.db") + " --html /nonexistent-dir/r.html");
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("cannot create the report"), std::string::npos) << r.err;
}

TEST(HtmlReportUnit, EscapesChainTextAndNeedsChartJs) {
  ingero::AnalysisResult r;
  ingero::Chain c;
  c.rule = "x";
  c.summary = "</script><b>bold</b> & \"quoted\"";
  r.chains.push_back(c);
  const std::string path = (fs::temp_directory_path() / ("ip-html-unit-" + std::to_string(getpid()) + ".html"))
                               .string();
  ingero::HtmlCollector d(r);
  std::string error;
  ingero::HtmlReportOptions missing;
  missing.chartjs_path = "/nonexistent/chart.min.js";
  EXPECT_FALSE(ingero::write_html_report(path, r, d, error, missing));
  EXPECT_NE(error.find("apt-get install libjs-chart.js"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(path));
  ingero::HtmlReportOptions fake;  // any file works as the "library" for this check
  fake.chartjs_path = path + ".js";
  std::ofstream(fake.chartjs_path) << "/* stand-in */";
  ASSERT_TRUE(ingero::write_html_report(path, r, d, error, fake)) << error;
  const std::string page = slurp(path);
  EXPECT_NE(page.find("&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;"), std::string::npos);
  fs::remove(path);
  fs::remove(fake.chartjs_path);
}

// The JSON the page's script draws from (<script id="report-data">).
json report_data(const std::string& page) {
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  const auto a = page.find(open);
  if (a == std::string::npos) return json();
  const auto b = page.find("</script>", a);
  return json::parse(page.substr(a + open.size(), b - a - open.size()), nullptr, false);
}

TEST(HtmlReportUnit, AccountingBarsPerThreadAndOverTime) {
  constexpr uint64_t kS = 1'000'000'000;
  ingero::AnalysisResult r;
  r.meta.first_ts = 1'000 * kS + kS / 2;
  ingero::ThreadAccounting a;
  a.pid = a.tid = 7;
  a.comm = "python3";
  a.wall_ns = 10 * kS;
  for (const char* k : ingero::kCallKinds) a.in_calls_ns[k] = 0;
  for (const char* k : ingero::kBlockReasons) a.blocked_ns[k] = 0;
  a.in_calls_ns["sync"] = 4 * kS;
  a.on_cpu_ns = 3 * kS;
  a.preempted_ns = 2 * kS;
  a.blocked_ns["lock"] = kS;
  a.scheduler_data = true;
  ingero::ThreadAccounting b = a;
  b.tid = 8;
  b.comm = "";
  b.scheduler_data = false;
  b.in_calls_ns["sync"] = 0;
  b.on_cpu_ns = b.preempted_ns = 0;
  b.blocked_ns["lock"] = 0;
  b.unknown_ns = b.wall_ns;
  r.accounting = {a, b};
  ingero::AccountingSeries s;
  s.pid = s.tid = 7;
  s.first_sec = 1'000;
  s.bins.resize(25);
  for (auto& bin : s.bins) {
    bin[ingero::acct::kSync] = 400'000'000;
    bin[ingero::acct::kOnCpu] = 300'000'000;
    bin[ingero::acct::kPreempted] = 200'000'000;
    bin[ingero::acct::kLock] = 100'000'000;
  }
  s.bins[3][ingero::acct::kPreempted] = 0;  // one second less preempted: shows in the third bar
  r.accounting_series = {s};
  const std::string path = (fs::temp_directory_path() / ("ip-html-acct-" + std::to_string(getpid()) + ".html"))
                               .string();
  ingero::HtmlReportOptions o;
  o.chartjs_path = path + ".js";
  o.max_accounting_bars = 10;  // 25 seconds -> bars of 3 s
  std::ofstream(o.chartjs_path) << "/* stand-in */";
  ingero::HtmlCollector d(r, o);
  std::string error;
  ASSERT_TRUE(ingero::write_html_report(path, r, d, error, o)) << error;
  const std::string page = slurp(path);
  fs::remove(path);
  fs::remove(o.chartjs_path);
  const json data = report_data(page);
  ASSERT_TRUE(data.is_object()) << page.substr(0, 400);
  const json& acct = data["acct"];
  ASSERT_EQ(acct["parts"].size(), 14u);
  ASSERT_EQ(acct["threads"].size(), 2u);
  EXPECT_EQ(acct["threads"][0]["label"], "python3 [tid 7]");
  EXPECT_EQ(acct["threads"][1]["label"], "thread [tid 8]");
  std::map<std::string, double> parts;
  double total = 0;
  for (size_t i = 0; i < acct["parts"].size(); ++i) {
    parts[acct["parts"][i]["label"]] = acct["threads"][0]["values"][i].get<double>();
    total += acct["threads"][0]["values"][i].get<double>();
  }
  EXPECT_DOUBLE_EQ(total, 100.0);
  EXPECT_DOUBLE_EQ(parts["in calls: sync"], 40.0);
  EXPECT_DOUBLE_EQ(parts["on CPU"], 30.0);
  EXPECT_DOUBLE_EQ(parts["preempted"], 20.0);
  EXPECT_DOUBLE_EQ(parts["blocked: lock"], 10.0);
  EXPECT_DOUBLE_EQ(acct["threads"][1]["values"][13].get<double>(), 100.0);  // all unknown
  ASSERT_EQ(acct["over_time"].size(), 1u);
  const json& t = acct["over_time"][0];
  EXPECT_EQ(t["width_s"], 3);
  ASSERT_EQ(t["x"].size(), 9u);  // 8 bars of 3 s and one of 1 s
  EXPECT_EQ(t["x"][0], 0);       // the trace's first whole second
  EXPECT_EQ(t["x"][1], 3);
  ASSERT_EQ(t["series"].size(), 5u);
  EXPECT_EQ(t["series"][2]["label"], "preempted");
  EXPECT_NEAR(t["series"][2]["y"][0].get<double>(), 20.0, 1e-9);
  EXPECT_NEAR(t["series"][2]["y"][1].get<double>(), 40.0 / 3, 1e-9);
  EXPECT_NEAR(t["series"][0]["y"][8].get<double>(), 40.0, 1e-9);  // the last, 1 s wide
  // The table says it in words, and why the second thread is all unknown.
  EXPECT_NE(page.find("<td>python3 [tid 7]</td>"), std::string::npos);
  EXPECT_NE(page.find("preempted 20%"), std::string::npos);
  EXPECT_NE(page.find("does not record why threads were off CPU"), std::string::npos);
}

ingero::Event call_or_span(uint64_t ts, uint64_t dur, uint32_t tid, bool offcpu) {
  ingero::Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.pid = 1;
  e.tid = tid;
  e.source = offcpu ? ingero::Source::kHost : ingero::Source::kCuda;
  e.op = offcpu ? 1 : 3;  // sched_switch, cudaLaunchKernel
  return e;
}

TEST(HtmlReportUnit, CollectorSplitsOffCpuSpansOverBucketsAndWidensLongTraces) {
  ingero::AnalysisResult r;
  ingero::Chain c;
  c.tid = 7;
  r.chains.push_back(c);
  ingero::HtmlCollector d(r);
  EXPECT_EQ(d.threads, (std::set<uint32_t>{7}));
  const uint64_t t0 = 1'000'000'000'000ull, s = 1'000'000'000ull;
  ingero::Batch b;
  b.events = {call_or_span(t0, 1'000, 7, false), call_or_span(t0 + s / 2, s, 7, true),  // 0.5 s in each of 0, 1
              call_or_span(t0 + s, 50'000, 8, true),                                    // tid 8: not in a chain
              call_or_span(t0 + 2 * s, 2'000'000, 9, false)};
  d.add(b);
  ASSERT_EQ(d.bucket_ns, s);
  EXPECT_EQ(d.offcpu.at(7).at(0), s / 2);
  EXPECT_EQ(d.offcpu.at(7).at(1), s / 2);
  EXPECT_FALSE(d.offcpu.count(8));
  const auto& launches = d.ops.at({1, 3});
  EXPECT_EQ(launches.count, 2u);
  EXPECT_EQ(launches.per_bucket.at(0), 1u);
  EXPECT_EQ(launches.per_bucket.at(2), 1u);
  // 1 us and 2 ms land 3.3 decades apart: bins 10^(1/5) apart from 100 ns.
  EXPECT_EQ(launches.hist[5], 1u);   // 1000 ns = 100 ns * 10^(5/5)
  EXPECT_EQ(launches.hist[21], 1u);  // 2 ms = 100 ns * 10^(21.5/5)
  // A call 10,000 s later: buckets widen (by doubling) until the trace fits in kMaxSeconds.
  b.events = {call_or_span(t0 + 10'000 * s, 1'000, 7, false)};
  d.add(b);
  EXPECT_EQ(d.bucket_ns, 4 * s);
  EXPECT_EQ(d.offcpu.at(7).at(0), s);  // both halves in the first wide bucket
  EXPECT_EQ(launches.per_bucket.at(0), 2u);
  EXPECT_EQ(launches.per_bucket.at(2500), 1u);
}

// Distinct GPU API ops of the trace (the histograms and rate series), counted with SQL.
int gpu_ops_in(const std::string& db_path) {
  sqlite3* db = nullptr;
  int n = -1;
  const std::string uri = "file:" + db_path + "?immutable=1";
  if (sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) == SQLITE_OK) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db,
                           "SELECT count(*) FROM (SELECT DISTINCT source, op FROM events WHERE source IN (1,4,8,9))",
                           -1, &s, nullptr) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW)
      n = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
  }
  sqlite3_close(db);
  return n;
}

TEST_F(HtmlReport, RendersInHeadlessChromiumWithTheExpectedCharts) {
  const std::string chrome = chromium();
  if (chrome.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium): cannot render the report";
  ASSERT_EQ(status_, 0) << err_;
  const std::string flags = " --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=5000 ";
  const std::string url = "file://" + p("report.html");
  const CliRun dom = sh("timeout 120 " + chrome + flags + "--dump-dom " + url);
  ASSERT_EQ(dom.status, 0) << dom.err.substr(0, 2000);
  EXPECT_EQ(pre_text(dom.out, "script-errors"), "");
  // The rendered page opens with the verdict: the first element after the title is it.
  const size_t h1_end = dom.out.find("</h1>");
  ASSERT_NE(h1_end, std::string::npos);
  const size_t next_tag = dom.out.find('<', h1_end + 5);
  const std::string verdict_tag = "<p id=\"verdict\"";
  EXPECT_EQ(dom.out.compare(next_tag, verdict_tag.size(), verdict_tag), 0) << dom.out.substr(h1_end, 300);
  const size_t chains_at = dom.out.find("<h2>Causal chains</h2>");
  EXPECT_LT(next_tag, chains_at);
  EXPECT_NE(dom.out.find("Verdict:</b> The main GPU-feeding thread"), std::string::npos);
  const std::string summary_text = pre_text(dom.out, "chart-summary");
  const json summary = json::parse(summary_text, nullptr, false);
  ASSERT_TRUE(summary.is_array()) << summary_text;

  const int ops = gpu_ops_in(p("cpu.db"));
  const CliRun ex = run("explain --db " + p("cpu.db") + " --json");
  const json explained = json::parse(ex.out, nullptr, false);
  ASSERT_FALSE(explained.is_discarded());
  const size_t chains = explained["chains"].size();
  ASSERT_GE(ops, 1);
  ASSERT_GE(chains, 1u);
  size_t hists = 0;
  bool rate = false, offcpu = false, acct = false, acct_time = false;
  for (const auto& c : summary) {
    const std::string id = c["id"];
    if (id.rfind("hist-", 0) == 0) {
      ++hists;
      EXPECT_EQ(c["series"], 3) << c.dump();  // the histogram, p50, p99
      EXPECT_EQ(c["labels"][1].get<std::string>().rfind("p50 ", 0), 0u) << c.dump();
      EXPECT_EQ(c["labels"][2].get<std::string>().rfind("p99 ", 0), 0u) << c.dump();
    } else if (id == "rate") {
      rate = true;
      EXPECT_EQ(c["series"].get<size_t>(), static_cast<size_t>(ops) + chains) << c.dump();  // ops + shaded windows
    } else if (id == "offcpu") {
      offcpu = true;
      EXPECT_EQ(c["labels"][0], "python3 train.py [tid 4242]") << c.dump();
    } else if (id == "acct") {
      acct = true;
      std::set<std::string> labels(c["labels"].begin(), c["labels"].end());
      EXPECT_TRUE(labels.count("preempted")) << c.dump();  // the demo's CPU hog
      EXPECT_TRUE(labels.count("in calls: launch")) << c.dump();
    } else if (id == "acct-time-0") {
      acct_time = true;
      EXPECT_EQ(c["labels"], json({"in calls", "on CPU", "preempted", "blocked", "unknown"})) << c.dump();
    }
  }
  EXPECT_EQ(hists, static_cast<size_t>(ops));
  EXPECT_TRUE(rate);
  EXPECT_TRUE(offcpu);
  EXPECT_TRUE(acct);
  EXPECT_TRUE(acct_time);

  const std::string png = std::string(INGERO_BINARY_DIR) + "/html_report_test.png";
  fs::remove(png);
  const CliRun shot = sh("timeout 120 " + chrome + flags + "--window-size=1280,2000 --screenshot=" + png + " " + url);
  ASSERT_EQ(shot.status, 0) << shot.err.substr(0, 2000);
  ASSERT_TRUE(fs::exists(png));
  EXPECT_GT(fs::file_size(png), 20'000u);  // a blank page is a few KB
  EXPECT_EQ(slurp(png).substr(1, 3), "PNG");
}

}  // namespace
