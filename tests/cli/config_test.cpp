// The run config: a valid graph resolves with every default filled in, and malformed configs get
// precise `file:line:col: error[code]: message` diagnostics with hints (golden first lines).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli/config.h"

namespace fs = std::filesystem;
using namespace ingero::cli;

namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ip-config-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "trace.db") << "x";
    std::ofstream(dir_ / "extra.rules") << "";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` as a config and parses it; returns the diagnostics.
  std::vector<ConfigDiagnostic> check(const std::string& text, PipelineConfig* out = nullptr) {
    file_ = (dir_ / "run.yaml").string();
    std::ofstream(file_) << text;
    PipelineConfig cfg;
    std::vector<ConfigDiagnostic> diags;
    const bool ok = load_config(file_, cfg, diags);
    EXPECT_EQ(ok, diags.empty());
    if (out) *out = cfg;
    return diags;
  }
  // The first line of the only diagnostic, with the file name replaced by "run.yaml".
  std::string only(const std::string& text, std::string* hint = nullptr) {
    const auto d = check(text);
    EXPECT_EQ(d.size(), 1u) << render_diagnostics(d);
    if (d.empty()) return "";
    if (hint) *hint = d[0].hint;
    std::string first = d[0].render();
    first = first.substr(0, first.find('\n'));
    const std::string dir = dir_.string() + "/";
    for (size_t at; (at = first.find(dir)) != std::string::npos;) first.erase(at, dir.size());
    return first;
  }

  fs::path dir_;
  std::string file_;
};

const char* kSource = "sources:\n  - name: rec\n    type: sqlite\n    path: trace.db\n";

TEST_F(ConfigTest, ValidGraphResolvesWithDefaults) {
  PipelineConfig cfg;
  const auto d = check(std::string(kSource) +
                           "  - name: demo\n    type: synthetic\n    scenario: straggler\n    fault: false\n"
                           "engine:\n  threads: 2\n  window: 5s\n"
                           "analysis:\n  from: [rec, demo]\n  rules: [default, extra.rules]\n"
                           "  params:\n    min_share: 60%\n    min_calls: 20\n    min_tail_ratio: 4x\n"
                           "sinks:\n  - name: store\n    type: lmdb\n    path: out.lmdb\n    from: [rec, analysis]\n"
                           "    max_size: 1GiB\n    durable: false\n  - type: jsonl\n",
                       &cfg);
  ASSERT_TRUE(d.empty()) << render_diagnostics(d);
  ASSERT_EQ(cfg.sources.size(), 2u);
  EXPECT_EQ(cfg.sources[0].path, dir_.string() + "/trace.db");
  EXPECT_EQ(cfg.sources[1].kind, SourceKind::kSynthetic);
  EXPECT_FALSE(cfg.sources[1].fault);
  EXPECT_EQ(cfg.engine.threads, 2u);
  EXPECT_EQ(cfg.analysis.window_ns, 5'000'000'000ull);
  EXPECT_DOUBLE_EQ(cfg.analysis.min_share, 0.6);
  EXPECT_EQ(cfg.analysis.min_calls, 20u);
  EXPECT_DOUBLE_EQ(cfg.analysis.min_tail_ratio, 4.0);
  ASSERT_EQ(cfg.analysis.rules.size(), 2u);
  EXPECT_TRUE(cfg.analysis.rules[0].builtin);
  EXPECT_EQ(cfg.analysis.rules[1].name, dir_.string() + "/extra.rules");
  ASSERT_EQ(cfg.sinks.size(), 2u);
  EXPECT_EQ(cfg.sinks[0].max_bytes, 1ull << 30);
  EXPECT_FALSE(cfg.sinks[0].durable);
  EXPECT_EQ(cfg.sinks[1].path, "-");
  ASSERT_EQ(cfg.sinks[1].from.size(), 1u);
  EXPECT_EQ(cfg.sinks[1].from[0].node, "analysis");
  const std::string text = describe_config(cfg);
  EXPECT_NE(text.find("analysis from=[rec,demo] rules=[default," + dir_.string() +
                      "/extra.rules] window=5s min_calls=20 min_tail_ratio=4 min_share=60%"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sink store type=lmdb path=" + dir_.string() +
                      "/out.lmdb from=[rec(events),analysis(chains)] max_size=1073741824 durable=false"),
            std::string::npos)
      << text;
}

TEST_F(ConfigTest, EmbeddedDefaultConfigIsValid) {
  PipelineConfig cfg;
  std::vector<ConfigDiagnostic> d;
  ASSERT_TRUE(parse_config(kDefaultConfigText, "<embedded>", cfg, d)) << render_diagnostics(d);
  ASSERT_EQ(cfg.sources.size(), 1u);
  EXPECT_EQ(cfg.sources[0].path, "<embedded-sample>");
  ASSERT_EQ(cfg.sinks.size(), 1u);
  EXPECT_EQ(cfg.sinks[0].kind, SinkKind::kReport);
}

TEST_F(ConfigTest, UnknownTopLevelKey) {
  std::string hint;
  EXPECT_EQ(only(std::string(kSource) + "sinkz:\n  - type: jsonl\n", &hint),
            "run.yaml:5:1: error[C0101]: unknown key `sinkz` at the top level");
  EXPECT_EQ(hint, "did you mean `sinks`?");
}

TEST_F(ConfigTest, UnknownEngineKey) {
  std::string hint;
  EXPECT_EQ(only(std::string(kSource) + "engine:\n  thread: 2\n", &hint),
            "run.yaml:6:3: error[C0101]: unknown key `thread` in engine");
  EXPECT_EQ(hint, "did you mean `threads`?");
}

TEST_F(ConfigTest, WrongTypeForInteger) {
  EXPECT_EQ(only(std::string(kSource) + "engine:\n  threads: many\n"),
            "run.yaml:6:12: error[C0202]: engine.threads must be an integer in 1..256, found `many`");
}

TEST_F(ConfigTest, IntegerOutOfRange) {
  EXPECT_EQ(only(std::string(kSource) + "engine:\n  batch_size: 12\n"),
            "run.yaml:6:15: error[C0202]: engine.batch_size must be in 64..1048576, found 12");
}

TEST_F(ConfigTest, DurationWithoutUnit) {
  std::string hint;
  EXPECT_EQ(only(std::string(kSource) + "engine:\n  window: 10\n", &hint),
            "run.yaml:6:11: error[C0203]: engine.window needs a time unit: `10` is a bare number");
  EXPECT_EQ(hint, "write it with a unit, e.g. `10s` or `10ms` (units: ns, us, ms, s, m, h)");
}

TEST_F(ConfigTest, UnknownSourceType) {
  std::string hint;
  EXPECT_EQ(only("sources:\n  - name: rec\n    type: sqlit\n    path: trace.db\n", &hint),
            "run.yaml:3:11: error[C0206]: unknown source type `sqlit`");
  EXPECT_EQ(hint, "did you mean `sqlite`?");
}

TEST_F(ConfigTest, MissingTraceFile) {
  std::string hint;
  EXPECT_EQ(only("sources:\n  - type: lmdb\n    path: missing.lmdb\n", &hint),
            "run.yaml:3:11: error[C0301]: trace file not found: missing.lmdb");
  EXPECT_EQ(hint, "paths are relative to the config file's directory");
}

TEST_F(ConfigTest, MissingRequiredKey) {
  EXPECT_EQ(only("sources:\n  - type: lmdb\n"), "run.yaml:2:5: error[C0102]: sources[0] (lmdb) has no `path`");
}

TEST_F(ConfigTest, DanglingEdgeFromSink) {
  std::string hint;
  EXPECT_EQ(only(std::string(kSource) + "sinks:\n  - type: jsonl\n    from: [analysys]\n", &hint),
            "run.yaml:7:12: error[C0401]: sink `jsonl` reads from `analysys`, which is not a node of this graph");
  EXPECT_EQ(hint, "did you mean `analysis`?");
}

TEST_F(ConfigTest, DanglingEdgeFromAnalysis) {
  std::string hint;
  EXPECT_EQ(only(std::string(kSource) + "analysis:\n  from: [recc]\n", &hint),
            "run.yaml:6:10: error[C0401]: analysis.from names `recc`, which is not a source");
  EXPECT_EQ(hint, "did you mean `rec`?");
}

TEST_F(ConfigTest, UnknownProbeFamily) {
  std::string hint;
  EXPECT_EQ(only("sources:\n  - type: ebpf\n    probes: [cuda, schedd]\n", &hint),
            "run.yaml:3:20: error[C0206]: unknown probe family `schedd`");
  EXPECT_EQ(hint, "did you mean `sched`?");
}

TEST_F(ConfigTest, KeyOfAnotherSourceType) {
  std::string hint;
  EXPECT_EQ(only(std::string(kSource) + "    probes: [cuda]\n", &hint),
            "run.yaml:5:5: error[C0101]: key `probes` does not apply to a source of type `sqlite`");
  EXPECT_EQ(hint, "it is for ebpf sources");
}

TEST_F(ConfigTest, BadSizeAndPercent) {
  const auto d = check(std::string(kSource) +
                       "analysis:\n  params:\n    min_share: 150%\n"
                       "sinks:\n  - type: lmdb\n    path: out.lmdb\n    max_size: 10XB\n");
  ASSERT_EQ(d.size(), 2u) << render_diagnostics(d);
  EXPECT_EQ(d[0].render().substr(0, d[0].render().find('\n')),
            file_ + ":7:16: error[C0205]: analysis.params.min_share must be a share in (0%, 100%], found `150%`");
  EXPECT_EQ(d[1].render().substr(0, d[1].render().find('\n')),
            file_ + ":11:15: error[C0204]: sinks[0].max_size must be a size such as 512MiB or 10GB, found `10XB`");
}

TEST_F(ConfigTest, UnknownParameterOfTheDefaultAnalyses) {
  std::string hint;
  EXPECT_EQ(only(std::string(kSource) + "analysis:\n  params:\n    min_shar: 0.5\n", &hint),
            "run.yaml:7:5: error[C0501]: unknown parameter `min_shar` of the built-in analyses");
  EXPECT_EQ(hint, "did you mean `min_share`?");
}

TEST_F(ConfigTest, DuplicateSourceNames) {
  EXPECT_EQ(only(std::string(kSource) + "  - name: rec\n    type: synthetic\n    scenario: allocator\n"),
            "run.yaml:5:5: error[C0402]: two sources are named `rec` (the other is on line 2)");
}

TEST_F(ConfigTest, TwoSinksOnStdout) {
  EXPECT_EQ(only(std::string(kSource) + "sinks:\n  - type: report\n  - type: jsonl\n"),
            "run.yaml:7:5: error[C0403]: sinks `report` and `jsonl` both write stdout");
}

TEST_F(ConfigTest, McpNeedsStdoutAlone) {
  EXPECT_EQ(only(std::string(kSource) + "sinks:\n  - type: jsonl\n  - type: mcp\n    path: served.db\n"),
            "run.yaml:7:5: error[C0403]: sink `mcp` (mcp) needs stdout, which sink `jsonl` already writes");
}

TEST_F(ConfigTest, SinkOverwritingItsSource) {
  std::string hint;
  EXPECT_EQ(only(std::string(kSource) + "sinks:\n  - type: sqlite\n    path: trace.db\n", &hint),
            "run.yaml:6:5: error[C0403]: sink `sqlite` would overwrite the file that source `rec` reads");
  EXPECT_EQ(hint, "write to another path");
}

TEST_F(ConfigTest, MissingOutputDirectory) {
  EXPECT_EQ(only(std::string(kSource) + "sinks:\n  - type: sqlite\n    path: no/such/dir/out.db\n"),
            "run.yaml:7:11: error[C0302]: output directory not found: no/such/dir");
}

TEST_F(ConfigTest, YamlSyntaxError) {
  EXPECT_EQ(only("sources:\n  - name: a\n    type: sqlite\n   path: x\n"),
            "run.yaml:4:4: error[C0001]: YAML syntax: did not find expected '-' indicator (while parsing a "
            "block collection)");
}

TEST_F(ConfigTest, ListWhereMappingExpected) {
  EXPECT_EQ(only("sources: {a: 1}\n"),
            "run.yaml:1:10: error[C0201]: sources must be a list (lines starting with `- `), found a mapping");
}

TEST_F(ConfigTest, EmptyAndMissingFiles) {
  EXPECT_EQ(only(""), "run.yaml:1:1: error[C0404]: the config is empty: nothing to run");
  PipelineConfig cfg;
  std::vector<ConfigDiagnostic> d;
  EXPECT_FALSE(load_config((dir_ / "none.yaml").string(), cfg, d));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].render().substr(0, d[0].render().find('\n')),
            (dir_ / "none.yaml").string() + ": error[C0002]: config file not found");
}

TEST_F(ConfigTest, EveryProblemIsReportedWithItsSourceLine) {
  const auto d = check("engine:\n  thread: 2\n  window: 10\nsources:\n  - name: rec\n    type: sqlit\n");
  ASSERT_EQ(d.size(), 3u) << render_diagnostics(d);
  EXPECT_EQ(d[0].line, 2);
  EXPECT_EQ(d[1].line, 3);
  EXPECT_EQ(d[2].line, 6);
  const std::string text = d[0].render();
  EXPECT_EQ(text, file_ +
                      ":2:3: error[C0101]: unknown key `thread` in engine\n"
                      " 2 |   thread: 2\n"
                      "   |   ^^^^^^\n"
                      "   = hint: did you mean `threads`?\n");
}

TEST(ConfigUnits, DurationsSizesFractions) {
  uint64_t v = 0;
  EXPECT_TRUE(parse_duration("250ms", v));
  EXPECT_EQ(v, 250'000'000u);
  EXPECT_TRUE(parse_duration("1.5us", v));
  EXPECT_EQ(v, 1500u);
  EXPECT_FALSE(parse_duration("10", v));
  EXPECT_FALSE(parse_duration("10 parsecs", v));
  EXPECT_TRUE(parse_size("64MiB", v));
  EXPECT_EQ(v, 64u << 20);
  EXPECT_TRUE(parse_size("10GB", v));
  EXPECT_EQ(v, 10'000'000'000u);
  EXPECT_FALSE(parse_size("10XB", v));
  double f = 0;
  EXPECT_TRUE(parse_fraction("60%", f));
  EXPECT_DOUBLE_EQ(f, 0.6);
  EXPECT_TRUE(parse_fraction("0.25", f));
  EXPECT_DOUBLE_EQ(f, 0.25);
}

}  // namespace
