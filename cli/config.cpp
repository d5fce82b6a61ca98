#include "cli/config.h"

#include <sys/stat.h>
#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "model/synth.h"

namespace ingero::cli {

const char* const kDefaultConfigText = R"(# The embedded default config of `ingero-pipeline run`:
# replay the sample trace built into the binary through the default analyses, print the report.
version: 1
engine:
  threads: 1
  batch_size: 4096
  window: 10s
sources:
  - name: sample
    type: sqlite
    path: <embedded-sample>
analysis:
  from: [sample]
  rules: [default]
sinks:
  - name: report
    type: report
    path: "-"
    from: [analysis]
)";

namespace {

// --- a YAML tree with positions ----------------------------------------------------------------

struct YEntry;  // a mapping's key and value, defined below (std::pair would need YNode complete here)

struct YNode {
  enum Kind { kScalar, kSeq, kMap } kind = kScalar;
  std::string value;
  bool plain = true;  // an unquoted scalar (only those can be null, numbers or booleans)
  int line = 0, col = 0;
  std::vector<YNode> items;
  std::vector<YEntry> pairs;

  bool is_null() const { return kind == kScalar && plain && (value.empty() || value == "~" || value == "null"); }
  const char* kind_name() const {
    if (is_null()) return "nothing";
    return kind == kScalar ? "a scalar" : kind == kSeq ? "a list" : "a mapping";
  }
};

struct YEntry {
  YNode first, second;  // key, value
};

bool convert(yaml_document_t* doc, yaml_node_t* n, YNode& out, int depth) {
  if (!n || depth > 64) return false;
  out.line = static_cast<int>(n->start_mark.line) + 1;
  out.col = static_cast<int>(n->start_mark.column) + 1;
  switch (n->type) {
    case YAML_SCALAR_NODE:
      out.kind = YNode::kScalar;
      out.value.assign(reinterpret_cast<const char*>(n->data.scalar.value), n->data.scalar.length);
      out.plain = n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
      return true;
    case YAML_SEQUENCE_NODE:
      out.kind = YNode::kSeq;
      for (auto* it = n->data.sequence.items.start; it < n->data.sequence.items.top; ++it) {
        out.items.emplace_back();
        if (!convert(doc, yaml_document_get_node(doc, *it), out.items.back(), depth + 1)) return false;
      }
      return true;
    case YAML_MAPPING_NODE:
      out.kind = YNode::kMap;
      for (auto* p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; ++p) {
        out.pairs.emplace_back();
        if (!convert(doc, yaml_document_get_node(doc, p->key), out.pairs.back().first, depth + 1) ||
            !convert(doc, yaml_document_get_node(doc, p->value), out.pairs.back().second, depth + 1))
          return false;
      }
      return true;
    default: return false;
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min(
          {prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string backtick_list(const std::vector<std::string>& v) {
  std::vector<std::string> q;
  q.reserve(v.size());
  for (const auto& x : v) q.push_back("`" + x + "`");
  return join(q);
}

// "did you mean `x`?" when one candidate is close, else the list of valid ones.
std::string suggest(const std::string& got, const std::vector<std::string>& valid) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& v : valid) {
    const size_t d = edit_distance(got, v);
    if (d < best_d) best_d = d, best = v;
  }
  if (!best.empty() && best_d <= std::max<size_t>(2, best.size() / 3)) return "did you mean `" + best + "`?";
  return "expected one of " + backtick_list(valid);
}

bool parse_number(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(v);
}

bool parse_uint(const std::string& s, uint64_t& v) {
  if (s.empty() ||
      !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '_'; }))
    return false;
  v = 0;
  for (char c : s) {
    if (c == '_') continue;
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return true;
}

// Splits "250ms" into 250 and "ms".
bool split_unit(const std::string& text, double& num, std::string& unit) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' || text[i] == '_'))
    ++i;
  std::string digits;
  for (size_t k = 0; k < i; ++k)
    if (text[k] != '_') digits += text[k];
  unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  return parse_number(digits, num) && num >= 0;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

bool path_exists(const std::string& p, bool* is_dir = nullptr) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return false;
  if (is_dir) *is_dir = S_ISDIR(st.st_mode);
  return true;
}

const std::vector<std::string> kProbeFamilies = {"cuda",    "driver", "graph", "nccl", "sched", "wakeup",
                                                 "process", "memory", "block", "tcp",  "net"};
const std::vector<std::string> kDefaultParams = {"window", "min_calls", "min_tail_ratio", "min_share", "warmup"};

// --- the validator -----------------------------------------------------------------------------

class Checker {
 public:
  Checker(std::string file, const std::string& text, std::vector<ConfigDiagnostic>& diags)
      : file_(std::move(file)), diags_(diags) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines_.push_back(line);
  }

  void error(int line, int col, int width, std::string code, std::string message, std::string hint = {}) {
    ConfigDiagnostic d;
    d.file = file_;
    d.line = line;
    d.col = col;
    d.width = std::max(1, width);
    d.code = std::move(code);
    d.message = std::move(message);
    d.hint = std::move(hint);
    if (line >= 1 && static_cast<size_t>(line) <= lines_.size()) d.source_line = lines_[static_cast<size_t>(line) - 1];
    diags_.push_back(std::move(d));
  }
  void error(const YNode& n, std::string code, std::string message, std::string hint = {}) {
    const int width = n.kind == YNode::kScalar ? static_cast<int>(n.value.size()) + (n.plain ? 0 : 2) : 1;
    error(n.line, n.col, width, std::move(code), std::move(message), std::move(hint));
  }
  size_t errors() const { return diags_.size(); }

  // Checks that `n` is a mapping whose keys are all in `allowed`; returns key -> value.
  bool mapping(const YNode& n, const std::string& where, const std::vector<std::string>& allowed,
               std::map<std::string, const YNode*>& out, std::map<std::string, const YNode*>* keys = nullptr) {
    if (n.kind != YNode::kMap) {
      error(n, "C0201", where + " must be a mapping (key: value lines), found " + n.kind_name());
      return false;
    }
    for (const auto& [k, v] : n.pairs) {
      if (k.kind != YNode::kScalar) {
        error(k, "C0201", "keys of " + where + " must be plain names");
        continue;
      }
      if (std::find(allowed.begin(), allowed.end(), k.value) == allowed.end()) {
        error(k, "C0101",
              "unknown key `" + k.value + "` " +
                  (where == "the top level" ? std::string("at the top level") : "in " + where),
              suggest(k.value, allowed));
        continue;
      }
      if (out.count(k.value)) {
        error(k, "C0103", "duplicate key `" + k.value + "` in " + where,
              "the first one is on line " + std::to_string(keys ? (*keys)[k.value]->line : out[k.value]->line));
        continue;
      }
      out[k.value] = &v;
      if (keys) (*keys)[k.value] = &k;
    }
    return true;
  }

  bool scalar(const YNode& n, const std::string& what) {
    if (n.kind == YNode::kScalar && !n.is_null()) return true;
    error(n, "C0201", what + " must be a single value, found " + n.kind_name());
    return false;
  }

  bool integer(const YNode& n, const std::string& what, uint64_t lo, uint64_t hi, uint64_t& out) {
    if (!scalar(n, what)) return false;
    uint64_t v = 0;
    if (!n.plain || !parse_uint(n.value, v)) {
      error(n, "C0202",
            what + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", found `" + n.value +
                "`");
      return false;
    }
    if (v < lo || v > hi) {
      error(n, "C0202", what + " must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", found " + n.value);
      return false;
    }
    out = v;
    return true;
  }

  bool boolean(const YNode& n, const std::string& what, bool& out) {
    if (!scalar(n, what)) return false;
    if (n.plain && (n.value == "true" || n.value == "yes" || n.value == "on")) return out = true, true;
    if (n.plain && (n.value == "false" || n.value == "no" || n.value == "off")) return out = false, true;
    error(n, "C0202", what + " must be true or false, found `" + n.value + "`");
    return false;
  }

  bool duration(const YNode& n, const std::string& what, uint64_t& out) {
    if (!scalar(n, what)) return false;
    double num = 0;
    std::string unit;
    if (split_unit(n.value, num, unit) && unit.empty()) {
      error(n, "C0203", what + " needs a time unit: `" + n.value + "` is a bare number",
            "write it with a unit, e.g. `" + n.value + "s` or `" + n.value + "ms` (units: ns, us, ms, s, m, h)");
      return false;
    }
    if (!parse_duration(n.value, out)) {
      error(n, "C0203", what + " must be a duration such as 10s or 250ms, found `" + n.value + "`",
            "units: ns, us, ms, s, m, h");
      return false;
    }
    return true;
  }

  bool size(const YNode& n, const std::string& what, uint64_t& out) {
    if (!scalar(n, what)) return false;
    if (!parse_size(n.value, out)) {
      error(n, "C0204", what + " must be a size such as 512MiB or 10GB, found `" + n.value + "`",
            "units: B, KB, KiB, MB, MiB, GB, GiB, TB, TiB");
      return false;
    }
    return true;
  }

  bool fraction(const YNode& n, const std::string& what, double& out) {
    if (!scalar(n, what)) return false;
    if (!parse_fraction(n.value, out) || out <= 0 || out > 1) {
      error(n, "C0205", what + " must be a share in (0%, 100%], found `" + n.value + "`",
            "write a percentage (60%) or a fraction (0.6)");
      return false;
    }
    return true;
  }

  bool string_list(const YNode& n, const std::string& what, std::vector<const YNode*>& out) {
    if (n.kind == YNode::kScalar && !n.is_null()) {  // a single name is a list of one
      out.push_back(&n);
      return true;
    }
    if (n.kind != YNode::kSeq) {
      error(n, "C0201", what + " must be a list, e.g. [a, b], found " + n.kind_name());
      return false;
    }
    for (const auto& item : n.items) {
      if (item.kind != YNode::kScalar || item.is_null()) {
        error(item, "C0201", "items of " + what + " must be names, found " + item.kind_name());
        continue;
      }
      out.push_back(&item);
    }
    return true;
  }

  std::string resolve(const std::string& dir, const std::string& p) const {
    if (p.empty() || p[0] == '/' || p == "-" || p == "<embedded-sample>" || dir.empty()) return p;
    return dir + "/" + p;
  }

 private:
  std::string file_;
  std::vector<std::string> lines_;
  std::vector<ConfigDiagnostic>& diags_;
};

void check_engine(Checker& c, const YNode& n, EngineSettings& e) {
  std::map<std::string, const YNode*> m;
  if (!c.mapping(n, "engine", {"threads", "batch_size", "window"}, m)) return;
  uint64_t v = 0;
  if (m.count("threads") && c.integer(*m["threads"], "engine.threads", 1, 256, v)) e.threads = static_cast<unsigned>(v);
  if (m.count("batch_size") && c.integer(*m["batch_size"], "engine.batch_size", 64, 1 << 20, v)) e.batch_size = v;
  if (m.count("window")) {
    uint64_t ns = 0;
    if (c.duration(*m["window"], "engine.window", ns)) {
      if (ns < 1'000'000)
        c.error(*m["window"], "C0202", "engine.window must be at least 1ms, found `" + m["window"]->value + "`");
      else e.window_ns = ns;
    }
  }
}

void check_source(Checker& c, const YNode& n, size_t index, const std::string& dir, SourceConfig& s) {
  const std::string where = "sources[" + std::to_string(index) + "]";
  std::map<std::string, const YNode*> m;
  if (!c.mapping(n, where,
                 {"name", "type", "path", "probes", "targets", "duration", "scenario", "fault", "events", "seed"}, m))
    return;
  s.pos = {n.line, n.col};
  if (!m.count("type")) {
    c.error(n, "C0102", where + " has no `type`", "add `type: sqlite`, `lmdb`, `ebpf` or `synthetic`");
    return;
  }
  const YNode& type = *m["type"];
  if (!c.scalar(type, where + ".type")) return;
  static const std::vector<std::string> kTypes = {"ebpf", "sqlite", "lmdb", "synthetic"};
  if (type.value == "ebpf") s.kind = SourceKind::kEbpf;
  else if (type.value == "sqlite") s.kind = SourceKind::kSqlite;
  else if (type.value == "lmdb") s.kind = SourceKind::kLmdb;
  else if (type.value == "synthetic") s.kind = SourceKind::kSynthetic;
  else {
    c.error(type, "C0206", "unknown source type `" + type.value + "`", suggest(type.value, kTypes));
    return;
  }
  s.name = source_kind_name(s.kind);
  if (m.count("name") && c.scalar(*m["name"], where + ".name")) {
    if (!is_identifier(m["name"]->value))
      c.error(*m["name"], "C0202",
              where + ".name must be a name (letters, digits, _ and -), found `" + m["name"]->value + "`");
    else s.name = m["name"]->value;
  }
  // Keys that belong to another source type are mistakes worth naming.
  auto only_for = [&](const char* key, std::initializer_list<SourceKind> kinds) {
    if (!m.count(key)) return;
    if (std::find(kinds.begin(), kinds.end(), s.kind) == kinds.end())
      for (const auto& [k, v] : n.pairs)
        if (k.value == key)
          c.error(k, "C0101", "key `" + std::string(key) + "` does not apply to a source of type `" + type.value + "`",
                  std::string("it is for ") +
                      (std::string(key) == "path" ? "sqlite and lmdb sources"
                       : std::string(key) == "probes" || std::string(key) == "targets" || std::string(key) == "duration"
                           ? "ebpf sources"
                           : "synthetic sources"));
  };
  only_for("path", {SourceKind::kSqlite, SourceKind::kLmdb});
  only_for("probes", {SourceKind::kEbpf});
  only_for("targets", {SourceKind::kEbpf});
  only_for("duration", {SourceKind::kEbpf});
  only_for("scenario", {SourceKind::kSynthetic});
  only_for("fault", {SourceKind::kSynthetic});
  only_for("events", {SourceKind::kSynthetic});
  only_for("seed", {SourceKind::kSynthetic});

  if (s.kind == SourceKind::kSqlite || s.kind == SourceKind::kLmdb) {
    if (!m.count("path")) {
      c.error(n, "C0102", where + " (" + type.value + ") has no `path`",
              "add `path: trace." + std::string(s.kind == SourceKind::kLmdb ? "lmdb" : "db") + "`");
    } else if (c.scalar(*m["path"], where + ".path")) {
      s.path = c.resolve(dir, m["path"]->value);
      bool is_dir = false;
      if (s.path == "<embedded-sample>") {
        if (s.kind != SourceKind::kSqlite)
          c.error(*m["path"], "C0202", "<embedded-sample> is a SQLite trace", "use `type: sqlite`");
      } else if (!path_exists(s.path, &is_dir)) {
        c.error(*m["path"], "C0301", "trace file not found: " + s.path,
                "paths are relative to the config file's directory");
      } else if (is_dir) {
        c.error(*m["path"], "C0301", "trace path is a directory: " + s.path);
      }
    }
  }
  if (s.kind == SourceKind::kEbpf) {
    if (m.count("probes")) {
      std::vector<const YNode*> items;
      if (c.string_list(*m["probes"], where + ".probes", items))
        for (const YNode* p : items) {
          if (std::find(kProbeFamilies.begin(), kProbeFamilies.end(), p->value) == kProbeFamilies.end())
            c.error(*p, "C0206", "unknown probe family `" + p->value + "`", suggest(p->value, kProbeFamilies));
          else s.probes.push_back(p->value);
        }
    }
    if (m.count("targets")) {
      std::map<std::string, const YNode*> t;
      if (c.mapping(*m["targets"], where + ".targets", {"pids", "cgroup"}, t)) {
        if (t.count("pids")) {
          std::vector<const YNode*> items;
          if (c.string_list(*t["pids"], where + ".targets.pids", items))
            for (const YNode* p : items) {
              uint64_t pid = 0;
              if (c.integer(*p, "a pid", 1, 4194304, pid)) s.pids.push_back(static_cast<uint32_t>(pid));
            }
        }
        if (t.count("cgroup") && c.scalar(*t["cgroup"], where + ".targets.cgroup")) {
          s.cgroup = t["cgroup"]->value;
          bool is_dir = false;
          if (!path_exists(s.cgroup, &is_dir) || !is_dir)
            c.error(*t["cgroup"], "C0301", "cgroup directory not found: " + s.cgroup,
                    "give a cgroup v2 directory such as /sys/fs/cgroup/system.slice/train.service");
        }
        if (t.count("pids") && t.count("cgroup"))
          c.error(*t["cgroup"], "C0202", "targets take either `pids` or `cgroup`, not both");
      }
    }
    if (m.count("duration")) c.duration(*m["duration"], where + ".duration", s.duration_ns);
  }
  if (s.kind == SourceKind::kSynthetic) {
    std::vector<std::string> names{"large"};
    for (const auto& info : synth::all_scenarios()) names.emplace_back(info.name);
    if (!m.count("scenario")) {
      c.error(n, "C0102", where + " (synthetic) has no `scenario`", "expected one of " + backtick_list(names));
    } else if (c.scalar(*m["scenario"], where + ".scenario")) {
      if (std::find(names.begin(), names.end(), m["scenario"]->value) == names.end())
        c.error(*m["scenario"], "C0206", "unknown scenario `" + m["scenario"]->value + "`",
                suggest(m["scenario"]->value, names));
      else s.scenario = m["scenario"]->value;
    }
    if (m.count("fault")) c.boolean(*m["fault"], where + ".fault", s.fault);
    if (m.count("events")) c.integer(*m["events"], where + ".events", 1, 10'000'000'000ull, s.events);
    if (m.count("seed")) c.integer(*m["seed"], where + ".seed", 0, UINT64_MAX, s.seed);
  }
}

void check_analysis(Checker& c, const YNode& n, const std::string& dir, AnalysisConfig& a) {
  a.pos = {n.line, n.col};
  if (n.kind == YNode::kScalar && n.plain && (n.value == "off" || n.value == "false")) {
    a.enabled = false;
    return;
  }
  std::map<std::string, const YNode*> m;
  if (!c.mapping(n, "analysis", {"from", "rules", "params"}, m)) return;
  if (m.count("from")) {
    std::vector<const YNode*> items;
    if (c.string_list(*m["from"], "analysis.from", items))
      for (const YNode* i : items) a.from.push_back({i->value, {i->line, i->col}});
  }
  bool has_default = true;
  if (m.count("rules")) {
    has_default = false;
    std::vector<const YNode*> items;
    if (c.string_list(*m["rules"], "analysis.rules", items))
      for (const YNode* r : items) {
        RuleRef ref;
        ref.pos = {r->line, r->col};
        if (r->value == "default" || r->value == "builtin") {
          ref.name = r->value;
          ref.builtin = true;
          has_default = true;
        } else {
          ref.name = c.resolve(dir, r->value);
          bool is_dir = false;
          if (!path_exists(ref.name, &is_dir) || is_dir)
            c.error(*r, "C0301", "rule file not found: " + ref.name,
                    "`default` is the default rule pack, `builtin` the hand-built plans; other entries are .rules "
                    "files relative to the config");
        }
        a.rules.push_back(ref);
      }
  }
  if (m.count("params")) {
    std::map<std::string, const YNode*> p;
    const YNode& pn = *m["params"];
    if (pn.kind != YNode::kMap) {
      c.error(pn, "C0201", "analysis.params must be a mapping (name: value), found " + std::string(pn.kind_name()));
      return;
    }
    const bool only_default = std::all_of(a.rules.begin(), a.rules.end(), [](const RuleRef& r) { return r.builtin; });
    for (const auto& [k, v] : pn.pairs) {
      if (k.kind != YNode::kScalar || !c.scalar(v, "analysis.params." + k.value)) continue;
      if (a.params.count(k.value)) {
        c.error(k, "C0103", "duplicate parameter `" + k.value + "`");
        continue;
      }
      a.params[k.value] = v.value;
      a.param_pos[k.value] = {k.line, k.col};
      const bool known = std::find(kDefaultParams.begin(), kDefaultParams.end(), k.value) != kDefaultParams.end();
      if (!known) {
        // Rule files declare their own params (the rule compiler checks those); with only the
        // built-in analyses, an unknown name is certainly a mistake.
        if (only_default)
          c.error(k, "C0501", "unknown parameter `" + k.value + "` of the built-in analyses",
                  suggest(k.value, kDefaultParams));
        continue;
      }
      if (!has_default) continue;
      uint64_t u = 0;
      if (k.value == "window") {
        if (c.duration(v, "analysis.params.window", u)) a.window_ns = u;
      } else if (k.value == "min_calls") {
        if (c.integer(v, "analysis.params.min_calls", 1, 1'000'000'000, u)) a.min_calls = u;
      } else if (k.value == "min_tail_ratio") {
        double d = 0;
        std::string num = v.value;
        if (!num.empty() && num.back() == 'x') num.pop_back();  // "3x", the rule language's ratio
        if (!parse_number(num, d) || d < 1)
          c.error(v, "C0202", "analysis.params.min_tail_ratio must be a ratio >= 1, found `" + v.value + "`");
        else a.min_tail_ratio = d;
      } else if (k.value == "min_share") {
        c.fraction(v, "analysis.params.min_share", a.min_share);
      }
    }
  }
}

void check_sink(Checker& c, const YNode& n, size_t index, const std::string& dir, SinkConfig& s) {
  const std::string where = "sinks[" + std::to_string(index) + "]";
  std::map<std::string, const YNode*> m;
  if (!c.mapping(n, where, {"name", "type", "path", "from", "max_size", "durable"}, m)) return;
  s.pos = {n.line, n.col};
  if (!m.count("type")) {
    c.error(n, "C0102", where + " has no `type`", "add `type: sqlite`, `lmdb`, `mcp`, `jsonl` or `report`");
    return;
  }
  const YNode& type = *m["type"];
  if (!c.scalar(type, where + ".type")) return;
  static const std::vector<std::string> kTypes = {"sqlite", "lmdb", "mcp", "jsonl", "report", "perfetto"};
  if (type.value == "sqlite") s.kind = SinkKind::kSqlite;
  else if (type.value == "lmdb") s.kind = SinkKind::kLmdb;
  else if (type.value == "mcp") s.kind = SinkKind::kMcp;
  else if (type.value == "jsonl") s.kind = SinkKind::kJsonl;
  else if (type.value == "report") s.kind = SinkKind::kReport;
  else if (type.value == "perfetto") s.kind = SinkKind::kPerfetto;  // trace-event JSON (sinks/report/perfetto.h)
  else {
    c.error(type, "C0206", "unknown sink type `" + type.value + "`", suggest(type.value, kTypes));
    return;
  }
  s.name = sink_kind_name(s.kind);
  if (m.count("name") && c.scalar(*m["name"], where + ".name")) {
    if (!is_identifier(m["name"]->value))
      c.error(*m["name"], "C0202",
              where + ".name must be a name (letters, digits, _ and -), found `" + m["name"]->value + "`");
    else s.name = m["name"]->value;
  }
  const bool to_stdout_ok = s.kind == SinkKind::kJsonl || s.kind == SinkKind::kReport;
  if (m.count("path")) {
    if (c.scalar(*m["path"], where + ".path")) {
      s.path = c.resolve(dir, m["path"]->value);
      if (s.path == "-" && !to_stdout_ok) {
        c.error(*m["path"], "C0202", "a " + type.value + " sink writes a file, not stdout", "give a file name");
      } else if (s.path != "-") {
        const auto slash = s.path.rfind('/');
        const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : s.path.substr(0, slash);
        bool is_dir = false;
        if (!path_exists(parent, &is_dir) || !is_dir)
          c.error(*m["path"], "C0302", "output directory not found: " + parent, "create it first");
      }
    }
  } else if (to_stdout_ok) {
    s.path = "-";
  } else {
    c.error(n, "C0102", where + " (" + type.value + ") has no `path`",
            "add `path: out." +
                std::string(s.kind == SinkKind::kLmdb       ? "lmdb"
                            : s.kind == SinkKind::kPerfetto ? "json"
                                                            : "db") +
                "`");
  }
  if (m.count("from")) {
    std::vector<const YNode*> items;
    if (c.string_list(*m["from"], where + ".from", items))
      for (const YNode* i : items) s.from.push_back({i->value, {i->line, i->col}});
  } else {
    s.from.push_back({"analysis", {n.line, n.col}});
  }
  if (m.count("max_size")) {
    if (s.kind != SinkKind::kLmdb) c.error(*m["max_size"], "C0101", "`max_size` applies to lmdb sinks only");
    else c.size(*m["max_size"], where + ".max_size", s.max_bytes);
  }
  if (m.count("durable")) {
    if (s.kind != SinkKind::kLmdb) c.error(*m["durable"], "C0101", "`durable` applies to lmdb sinks only");
    else c.boolean(*m["durable"], where + ".durable", s.durable);
  }
}

// Names, edges and outputs across the whole graph.
void check_graph(Checker& c, PipelineConfig& cfg, const YNode& root) {
  std::map<std::string, ConfigPos> names;
  std::vector<std::string> source_names;
  for (const auto& s : cfg.sources) {
    if (names.count(s.name)) {
      c.error(s.pos.line, s.pos.col, 1, "C0402",
              "two sources are named `" + s.name + "` (the other is on line " + std::to_string(names[s.name].line) +
                  ")",
              "give each source a distinct `name`");
      continue;
    }
    names[s.name] = s.pos;
    source_names.push_back(s.name);
  }
  if (cfg.sources.empty())
    c.error(root, "C0404", "the config has no sources: nothing to run", "add a `sources:` list, e.g. a sqlite replay");
  std::vector<std::string> all_nodes = source_names;
  if (cfg.analysis.enabled) all_nodes.emplace_back("analysis");
  for (const auto& e : cfg.analysis.from)
    if (std::find(source_names.begin(), source_names.end(), e.node) == source_names.end())
      c.error(e.pos.line, e.pos.col, static_cast<int>(e.node.size()), "C0401",
              "analysis.from names `" + e.node + "`, which is not a source",
              source_names.empty() ? "define it under `sources:`" : suggest(e.node, source_names));
  std::map<std::string, std::string> outputs;  // path -> sink name
  std::set<std::string> sink_names;
  for (const auto& s : cfg.sinks) {
    if (names.count(s.name) || sink_names.count(s.name)) {
      c.error(s.pos.line, s.pos.col, 1, "C0402", "the name `" + s.name + "` is used twice",
              "give each sink a distinct `name`");
    }
    sink_names.insert(s.name);
    for (const auto& e : s.from) {
      if (std::find(all_nodes.begin(), all_nodes.end(), e.node) == all_nodes.end()) {
        std::string hint = all_nodes.empty() ? "" : suggest(e.node, all_nodes);
        if (e.node == "analysis" && !cfg.analysis.enabled) hint = "the analysis is switched off (`analysis: off`)";
        c.error(e.pos.line, e.pos.col, static_cast<int>(e.node.size()), "C0401",
                "sink `" + s.name + "` reads from `" + e.node + "`, which is not a node of this graph", hint);
      }
    }
    if (s.path.empty()) continue;
    for (const auto& src : cfg.sources)
      if (!src.path.empty() && src.path == s.path)
        c.error(s.pos.line, s.pos.col, 1, "C0403",
                "sink `" + s.name + "` would overwrite the file that source `" + src.name + "` reads",
                "write to another path");
    const std::string key = s.path == "-" ? "stdout" : s.path;
    if (s.kind == SinkKind::kMcp) {
      // The MCP server speaks JSON-RPC on stdout: nothing else may write there.
      if (outputs.count("stdout"))
        c.error(s.pos.line, s.pos.col, 1, "C0403",
                "sink `" + s.name + "` (mcp) needs stdout, which sink `" + outputs["stdout"] + "` already writes",
                "send that sink to a file (`path: out.jsonl`)");
      outputs["stdout"] = s.name;
    }
    if (outputs.count(key)) {
      if (s.kind != SinkKind::kMcp || key != "stdout")
        c.error(s.pos.line, s.pos.col, 1, "C0403",
                "sinks `" + outputs[key] + "` and `" + s.name + "` both write " + (key == "stdout" ? "stdout" : s.path),
                "give one of them another path");
    } else {
      outputs[key] = s.name;
    }
  }
}

std::string fmt_duration(uint64_t ns) {
  char buf[48];
  if (ns % 1'000'000'000 == 0)
    std::snprintf(buf, sizeof buf, "%llus", static_cast<unsigned long long>(ns / 1'000'000'000));
  else if (ns % 1'000'000 == 0)
    std::snprintf(buf, sizeof buf, "%llums", static_cast<unsigned long long>(ns / 1'000'000));
  else if (ns % 1'000 == 0) std::snprintf(buf, sizeof buf, "%lluus", static_cast<unsigned long long>(ns / 1'000));
  else std::snprintf(buf, sizeof buf, "%lluns", static_cast<unsigned long long>(ns));
  return buf;
}

}  // namespace

const char* source_kind_name(SourceKind k) {
  switch (k) {
    case SourceKind::kEbpf: return "ebpf";
    case SourceKind::kSqlite: return "sqlite";
    case SourceKind::kLmdb: return "lmdb";
    case SourceKind::kSynthetic: return "synthetic";
  }
  return "?";
}

const char* sink_kind_name(SinkKind k) {
  switch (k) {
    case SinkKind::kSqlite: return "sqlite";
    case SinkKind::kLmdb: return "lmdb";
    case SinkKind::kMcp: return "mcp";
    case SinkKind::kJsonl: return "jsonl";
    case SinkKind::kReport: return "report";
    case SinkKind::kPerfetto: return "perfetto";
  }
  return "?";
}

bool parse_duration(const std::string& text, uint64_t& ns) {
  double num = 0;
  std::string unit;
  if (!split_unit(text, num, unit)) return false;
  double mult = 0;
  if (unit == "ns") mult = 1;
  else if (unit == "us" || unit == "µs") mult = 1e3;
  else if (unit == "ms") mult = 1e6;
  else if (unit == "s") mult = 1e9;
  else if (unit == "m" || unit == "min") mult = 60e9;
  else if (unit == "h") mult = 3600e9;
  else return false;
  const double v = num * mult;
  if (v > 1e19) return false;
  ns = static_cast<uint64_t>(std::llround(v));
  return true;
}

bool parse_size(const std::string& text, uint64_t& bytes) {
  double num = 0;
  std::string unit;
  if (!split_unit(text, num, unit)) return false;
  static const std::map<std::string, double> kUnits = {{"", 1},      {"B", 1},
                                                       {"KB", 1e3},  {"KiB", 1024.0},
                                                       {"MB", 1e6},  {"MiB", 1048576.0},
                                                       {"GB", 1e9},  {"GiB", 1073741824.0},
                                                       {"TB", 1e12}, {"TiB", 1099511627776.0}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) return false;
  const double v = num * it->second;
  if (v > 1.8e19) return false;
  bytes = static_cast<uint64_t>(v);
  return true;
}

bool parse_fraction(const std::string& text, double& fraction) {
  if (!text.empty() && text.back() == '%') {
    double v = 0;
    if (!parse_number(text.substr(0, text.size() - 1), v)) return false;
    fraction = v / 100;
    return true;
  }
  return parse_number(text, fraction);
}

std::string ConfigDiagnostic::render() const {
  std::string out = file + (line > 0 ? ":" + std::to_string(line) + ":" + std::to_string(col) : "") + ": error[" +
                    code + "]: " + message + "\n";
  if (line > 0 && !source_line.empty()) {
    const std::string num = std::to_string(line);
    const std::string pad(num.size(), ' ');
    out += " " + num + " | " + source_line + "\n";
    const int avail = std::max(1, static_cast<int>(source_line.size()) - (col - 1));
    out += " " + pad + " | " + std::string(static_cast<size_t>(std::max(0, col - 1)), ' ') +
           std::string(static_cast<size_t>(std::min(width, avail)), '^') + "\n";
    if (!hint.empty()) out += " " + pad + " = hint: " + hint + "\n";
  } else if (!hint.empty()) {
    out += "   = hint: " + hint + "\n";
  }
  return out;
}

std::string render_diagnostics(const std::vector<ConfigDiagnostic>& diags) {
  std::string out;
  for (const auto& d : diags) out += d.render();
  return out;
}

bool parse_config(const std::string& text, const std::string& file, PipelineConfig& out,
                  std::vector<ConfigDiagnostic>& diags) {
  out = PipelineConfig{};
  out.file = file;
  if (file != "<embedded>") {
    const auto slash = file.rfind('/');
    out.dir = slash == std::string::npos ? "." : file.substr(0, slash);
  }
  Checker c(file, text, diags);
  const size_t before = diags.size();

  yaml_parser_t parser;
  yaml_document_t doc;
  if (!yaml_parser_initialize(&parser)) {
    c.error(0, 0, 1, "C0001", "cannot initialise the YAML parser");
    return false;
  }
  yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  YNode root;
  bool loaded = yaml_parser_load(&parser, &doc) != 0;
  if (!loaded) {
    const int line = static_cast<int>(parser.problem_mark.line) + 1,
              col = static_cast<int>(parser.problem_mark.column) + 1;
    std::string msg = std::string("YAML syntax: ") + (parser.problem ? parser.problem : "malformed document");
    if (parser.context) msg += std::string(" (") + parser.context + ")";
    c.error(line, col, 1, "C0001", msg, "check the indentation and the `key: value` form around here");
    yaml_parser_delete(&parser);
    return false;
  }
  yaml_node_t* rn = yaml_document_get_root_node(&doc);
  const bool converted = rn && convert(&doc, rn, root, 0);
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  if (!rn) {
    c.error(1, 1, 1, "C0404", "the config is empty: nothing to run",
            "start from `ingero-pipeline run --print-default`");
    return false;
  }
  if (!converted) {
    c.error(1, 1, 1, "C0001", "YAML nesting too deep or unsupported node");
    return false;
  }

  std::map<std::string, const YNode*> top;
  if (!c.mapping(root, "the top level", {"version", "engine", "sources", "analysis", "sinks"}, top)) return false;
  if (top.count("version")) {
    uint64_t v = 0;
    c.integer(*top["version"], "version", 1, 1, v);
  }
  if (top.count("engine")) check_engine(c, *top["engine"], out.engine);
  if (top.count("sources")) {
    const YNode& s = *top["sources"];
    if (s.kind != YNode::kSeq) {
      c.error(s, "C0201", "sources must be a list (lines starting with `- `), found " + std::string(s.kind_name()));
    } else {
      for (size_t i = 0; i < s.items.size(); ++i) {
        SourceConfig sc;
        check_source(c, s.items[i], i, out.dir, sc);
        if (!sc.name.empty()) out.sources.push_back(std::move(sc));
      }
    }
  }
  if (top.count("analysis") && !top["analysis"]->is_null()) check_analysis(c, *top["analysis"], out.dir, out.analysis);
  if (out.analysis.rules.empty()) out.analysis.rules.push_back({"default", true, {}});
  if (top.count("sinks")) {
    const YNode& s = *top["sinks"];
    if (s.kind != YNode::kSeq) {
      c.error(s, "C0201", "sinks must be a list (lines starting with `- `), found " + std::string(s.kind_name()));
    } else {
      for (size_t i = 0; i < s.items.size(); ++i) {
        SinkConfig sc;
        check_sink(c, s.items[i], i, out.dir, sc);
        if (!sc.name.empty()) out.sinks.push_back(std::move(sc));
      }
    }
  } else {
    SinkConfig report;
    report.name = "report";
    report.kind = SinkKind::kReport;
    report.path = "-";
    report.from.push_back({"analysis", {}});
    if (out.analysis.enabled) out.sinks.push_back(report);
  }
  if (out.analysis.window_ns == 0) out.analysis.window_ns = out.engine.window_ns;
  if (c.errors() == before) check_graph(c, out, root);
  // Report in file order, whichever pass found the problem.
  std::stable_sort(diags.begin() + static_cast<std::ptrdiff_t>(before), diags.end(),
                   [](const ConfigDiagnostic& a, const ConfigDiagnostic& b) {
                     return a.line != b.line ? a.line < b.line : a.col < b.col;
                   });
  return c.errors() == before;
}

bool load_config(const std::string& path, PipelineConfig& out, std::vector<ConfigDiagnostic>& diags) {
  std::ifstream in(path, std::ios::binary);
  bool is_dir = false;
  if (!in || (path_exists(path, &is_dir) && is_dir)) {
    ConfigDiagnostic d;
    d.file = path;
    d.code = "C0002";
    d.message = path_exists(path) ? "cannot read the config file" : "config file not found";
    d.hint = "give a YAML file; `ingero-pipeline run --print-default` prints a starting point";
    diags.push_back(d);
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, out, diags);
}

std::string describe_config(const PipelineConfig& cfg) {
  std::ostringstream o;
  o << "config " << cfg.file << "\n";
  o << "engine threads=" << cfg.engine.threads << " batch_size=" << cfg.engine.batch_size
    << " window=" << fmt_duration(cfg.engine.window_ns) << "\n";
  for (const auto& s : cfg.sources) {
    o << "source " << s.name << " type=" << source_kind_name(s.kind);
    switch (s.kind) {
      case SourceKind::kSqlite:
      case SourceKind::kLmdb: o << " path=" << s.path; break;
      case SourceKind::kEbpf:
        o << " probes=[" << (s.probes.empty() ? join(kProbeFamilies, ",") : join(s.probes, ",")) << "]";
        if (!s.pids.empty()) {
          std::vector<std::string> p;
          for (auto pid : s.pids) p.push_back(std::to_string(pid));
          o << " pids=[" << join(p, ",") << "]";
        } else if (!s.cgroup.empty()) {
          o << " cgroup=" << s.cgroup;
        } else {
          o << " targets=all-cuda-processes";
        }
        o << " duration=" << (s.duration_ns ? fmt_duration(s.duration_ns) : "until-interrupted");
        break;
      case SourceKind::kSynthetic:
        o << " scenario=" << s.scenario
          << (s.scenario == "large" ? " events=" + std::to_string(s.events)
                                    : std::string(s.fault ? " fault" : " control"))
          << " seed=" << s.seed;
        break;
    }
    o << "\n";
  }
  if (cfg.analysis.enabled) {
    std::vector<std::string> from, rules;
    for (const auto& e : cfg.analysis.from) from.push_back(e.node);
    if (from.empty())
      for (const auto& s : cfg.sources) from.push_back(s.name);
    for (const auto& r : cfg.analysis.rules) rules.push_back(r.name);
    char share[32], ratio[32];
    std::snprintf(share, sizeof share, "%g%%", cfg.analysis.min_share * 100);
    std::snprintf(ratio, sizeof ratio, "%g", cfg.analysis.min_tail_ratio);
    o << "analysis from=[" << join(from, ",") << "] rules=[" << join(rules, ",")
      << "] window=" << fmt_duration(cfg.analysis.window_ns) << " min_calls=" << cfg.analysis.min_calls
      << " min_tail_ratio=" << ratio << " min_share=" << share;
    for (const auto& [k, v] : cfg.analysis.params)
      if (std::find(kDefaultParams.begin(), kDefaultParams.end(), k) == kDefaultParams.end()) o << " " << k << "=" << v;
    o << "\n";
  } else {
    o << "analysis off\n";
  }
  for (const auto& s : cfg.sinks) {
    std::vector<std::string> from;
    for (const auto& e : s.from) from.push_back(e.node == "analysis" ? "analysis(chains)" : e.node + "(events)");
    o << "sink " << s.name << " type=" << sink_kind_name(s.kind) << " path=" << (s.path == "-" ? "stdout" : s.path)
      << " from=[" << join(from, ",") << "]";
    if (s.kind == SinkKind::kLmdb)
      o << " max_size=" << (s.max_bytes ? std::to_string(s.max_bytes) : "unbounded")
        << " durable=" << (s.durable ? "true" : "false");
    o << "\n";
  }
  return o.str();
}

}  // namespace ingero::cli
