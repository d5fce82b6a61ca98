// The `run` config: a pipeline graph (sources -> analysis -> sinks) in YAML, validated in full
// before anything starts.
//
// Contract:
// - parse_config() reads YAML (libyaml, which reports a line and column for every node) into a
//   PipelineConfig and checks everything that can be checked without starting: unknown keys,
//   wrong types, values out of range, durations/sizes/percentages without or with wrong units,
//   missing input files and output directories, dangling edges (a `from` naming no node),
//   duplicate names, two sinks writing the same file or both writing stdout.
// - Every problem is a ConfigDiagnostic with the file, 1-based line and column, a stable code
//   (docs/pipeline.md lists them), a message saying what was expected and, where one helps, a
//   hint ("did you mean `sinks`?"). All problems are reported, not only the first.
// - Relative paths resolve against the config file's directory ("<embedded>" is the embedded
//   default config: paths resolve against the working directory).
// - Never throws. No engine, BPF or storage code is touched here: cmd_run builds the graph.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ingero::cli {

struct ConfigPos {
  int line = 0, col = 0;  // 1-based; 0 = not from the file (a default)
};

struct ConfigDiagnostic {
  std::string file;
  int line = 0, col = 0, width = 1;
  std::string code;  // "C0101"
  std::string message, hint;
  std::string source_line;
  // `file:line:col: error[code]: message`, the source line with a caret, and `= hint: ...`.
  std::string render() const;
};

struct EngineSettings {
  unsigned threads = 1;
  size_t batch_size = 4096;
  uint64_t window_ns = 10'000'000'000ull;  // the default window of the analyses
};

enum class SourceKind { kEbpf, kSqlite, kLmdb, kSynthetic };
const char* source_kind_name(SourceKind k);

struct SourceConfig {
  std::string name;
  SourceKind kind = SourceKind::kSqlite;
  ConfigPos pos;
  // sqlite / lmdb
  std::string path;  // resolved; "<embedded-sample>" = the sample trace built into the binary
  // ebpf
  std::vector<std::string> probes;  // families; empty = all
  std::vector<uint32_t> pids;       // targets: these processes (and children)
  std::string cgroup;               // targets: a cgroup v2 directory
  uint64_t duration_ns = 0;         // 0 = until Ctrl-C
  // synthetic
  std::string scenario;  // a demo scenario name, or "large"
  bool fault = true;
  uint64_t events = 1'000'000;  // "large" only
  uint64_t seed = 1;
};

struct RuleRef {
  std::string name;  // "default" (the built-in analyses) or a resolved .rules path
  bool builtin = false;
  ConfigPos pos;
};

struct EdgeRef {
  std::string node;
  ConfigPos pos;
};

struct AnalysisConfig {
  bool enabled = true;
  std::vector<EdgeRef> from;                  // source names; empty = every source
  std::vector<RuleRef> rules;                 // empty = [default]
  std::map<std::string, std::string> params;  // overrides, as written ("60%", "20ms", "5")
  std::map<std::string, ConfigPos> param_pos;
  // Resolved overrides of the built-in analyses (validated here).
  uint64_t min_calls = 10;
  double min_tail_ratio = 3.0, min_share = 0.5;
  uint64_t window_ns = 0;  // 0 = engine.window
  ConfigPos pos;
};

enum class SinkKind { kSqlite, kLmdb, kMcp, kJsonl, kReport, kPerfetto };
const char* sink_kind_name(SinkKind k);

struct SinkConfig {
  std::string name;
  SinkKind kind = SinkKind::kJsonl;
  ConfigPos pos;
  std::string path;           // resolved; "-" = stdout (jsonl, report)
  std::vector<EdgeRef> from;  // source names (events) and/or "analysis" (chains)
  uint64_t max_bytes = 0;     // lmdb: size bound with retention
  bool durable = true;        // lmdb: fsync per commit
};

struct PipelineConfig {
  std::string file;  // as given, or "<embedded>"
  std::string dir;   // base for relative paths
  EngineSettings engine;
  std::vector<SourceConfig> sources;
  AnalysisConfig analysis;
  std::vector<SinkConfig> sinks;
};

// The config used when `run` is given none: replay the embedded sample trace through the default
// analyses and print the report.
extern const char* const kDefaultConfigText;

bool parse_config(const std::string& text, const std::string& file, PipelineConfig& out,
                  std::vector<ConfigDiagnostic>& diags);
// Reads `path` and parses it; a file that cannot be read is a diagnostic too.
bool load_config(const std::string& path, PipelineConfig& out, std::vector<ConfigDiagnostic>& diags);

std::string render_diagnostics(const std::vector<ConfigDiagnostic>& diags);

// The resolved graph, one node per line, every default filled in (`run --dry-run`).
std::string describe_config(const PipelineConfig& cfg);

// Parsers shared with the CLI flags. False when the text is not of that form.
bool parse_duration(const std::string& text, uint64_t& ns);      // "10s", "250ms", "1.5us"
bool parse_size(const std::string& text, uint64_t& bytes);       // "64MiB", "10GB", "4096"
bool parse_fraction(const std::string& text, double& fraction);  // "60%", "0.6"

}  // namespace ingero::cli
