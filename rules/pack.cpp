#include "rules/pack.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsl/parser.h"
#include "engine/engine.h"
#include "model/trace.h"

namespace ingero::rules {
namespace {

bool read_disk(const std::string& path, std::string& text) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  // One byte past the compiler's size limit is enough for it to report the file as too large.
  text.assign(dsl::ParseLimits{}.max_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return true;
}

bool read_embedded(const std::string& path, std::string& text) {
  const std::string base = std::filesystem::path(path).filename().string();
  for (const auto& f : embedded_rule_files())
    if (f.path == path || std::filesystem::path(std::string(f.path)).filename().string() == base) {
      text = std::string(f.text);
      return true;
    }
  return false;
}

// The number literal an expression is made of (`10s`, `-5%`), scaled to the engine's units with
// the rule language's unit suffixes (docs/rules.md, "Units"). False for anything else.
bool literal_value(const dsl::ast::Expr& e, double& value, std::string& kind) {
  namespace ast = dsl::ast;
  if (!e.rest.empty()) return false;
  const auto* n = boost::get<ast::Number>(&e.first.operand.get());
  if (!n) return false;
  bool neg = false;
  for (const auto op : e.first.ops) {
    if (op != ast::UnOp::kNeg) return false;
    neg = !neg;
  }
  struct U {
    const char* suffix;
    double scale;
    const char* kind;
  };
  static constexpr U kUnits[] = {
      {"", 1, "number"},           {"ns", 1, "duration"},          {"us", 1e3, "duration"},   {"ms", 1e6, "duration"},
      {"s", 1e9, "duration"},      {"m", 60e9, "duration"},        {"h", 3600e9, "duration"}, {"B", 1, "bytes"},
      {"KB", 1e3, "bytes"},        {"MB", 1e6, "bytes"},           {"GB", 1e9, "bytes"},      {"KiB", 1024.0, "bytes"},
      {"MiB", 1048576.0, "bytes"}, {"GiB", 1073741824.0, "bytes"}, {"%", 0.01, "ratio"},      {"x", 1, "ratio"},
  };
  for (const auto& u : kUnits)
    if (n->unit == u.suffix) {
      value = (neg ? -1 : 1) * n->value * u.scale;
      kind = u.kind;
      return true;
    }
  return false;
}

}  // namespace

bool pack_param(const std::string& name, const std::map<std::string, std::string>& overrides, PackParam& out,
                std::string& error) {
  out = PackParam{};
  bool found = false;
  for (const auto& f : embedded_rule_files()) {
    const dsl::SourceText src{std::string(f.path), std::string(f.text)};
    std::vector<dsl::Diagnostic> diags;
    const dsl::ast::File file = dsl::parse_rules_text(src, diags);
    for (const auto& item : file.items) {
      const auto* p = std::get_if<dsl::ast::Param>(&item);
      if (!p || p->name.name != name) continue;
      const size_t a = static_cast<size_t>(std::max(p->value.id_first, 0));
      const size_t b = static_cast<size_t>(std::max(p->value.id_last, p->value.id_first));
      out.text = src.text().substr(a, b - a);
      if (!literal_value(p->value, out.value, out.kind)) {
        error = std::string(f.path) + ": param `" + name + "` is not a number literal";
        return false;
      }
      found = true;
      break;
    }
    if (found) break;
  }
  if (!found) {
    error = "the rule pack declares no param `" + name + "`";
    return false;
  }
  const auto it = overrides.find(name);
  if (it == overrides.end()) return true;
  const dsl::SourceText src{"<param " + name + ">", it->second};
  dsl::ast::Expr e;
  std::vector<dsl::Diagnostic> diags;
  double v = 0;
  std::string kind;
  if (!dsl::parse_expression_at(src, 0, src.text().size(), e, diags) || !literal_value(e, v, kind) ||
      kind != out.kind) {
    error = "param `" + name + "` overridden with `" + it->second + "`: expected a " + out.kind +
            " literal like the pack's `" + out.text + "`";
    return false;
  }
  out.value = v;
  out.kind = kind;
  out.text = it->second;
  out.overridden = true;
  return true;
}

std::vector<dsl::RuleSource> default_rule_sources() {
  std::vector<dsl::RuleSource> out;
  for (const auto& f : embedded_rule_files()) {
    // common.rules holds only shared params and defs: it is imported, not loaded on its own.
    if (f.path == "rules/common.rules") continue;
    out.push_back({std::string(f.path), std::string(f.text)});
  }
  return out;
}

dsl::CompileOptions pack_compile_options(dsl::CompileOptions base) {
  if (!base.read_file)
    base.read_file = [](const std::string& path, std::string& text) {
      return read_disk(path, text) || read_embedded(path, text);
    };
  return base;
}

const dsl::CompileResult& default_rule_pack() {
  static const dsl::CompileResult compiled = [] {
    dsl::CompileOptions o;
    o.read_file = read_embedded;  // the embedded pack never reads the disk
    return dsl::compile_rules(default_rule_sources(), o);
  }();
  return compiled;
}

Plan default_rule_pack_plan() { return default_rule_pack().plan; }

std::vector<RuleTestOutcome> run_rule_tests(const dsl::CompileResult& compiled) {
  std::vector<RuleTestOutcome> out;
  for (const auto& t : compiled.tests) {
    RuleTestOutcome o;
    o.test = t;
    const dsl::CompiledRule* rule = nullptr;
    for (const auto& r : compiled.rules)
      if (r.name == t.rule) rule = &r;
    if (!rule) {
      o.detail = "rule `" + t.rule + "` did not compile";
      out.push_back(std::move(o));
      continue;
    }
    TraceMeta meta;
    meta.stacks = t.stacks;  // `stack "..."` fixture attributes
    VectorSource source(t.events, 4096, std::move(meta));
    EngineOptions eo;
    eo.threads = 1;
    eo.compute_stats = false;
    std::vector<std::string> errors;
    AnalysisResult res = run_plan(rule->plan, source, eo, &errors);
    if (!errors.empty()) {
      o.detail = "the engine rejected the plan: " + errors.front();
      out.push_back(std::move(o));
      continue;
    }
    std::vector<const Chain*> chains;
    for (const auto& c : res.chains)
      if (c.rule == t.rule) chains.push_back(&c);
    o.chains = static_cast<int>(chains.size());
    if (!t.expect_match) {
      o.passed = chains.empty();
      o.detail = o.passed
                     ? "no chain, as expected"
                     : "expected no match, got " + std::to_string(chains.size()) + " chain(s): " + chains[0]->summary;
    } else if (chains.empty()) {
      o.detail = "expected a match, got no chain";
    } else if (t.expect_chains >= 0 && o.chains != t.expect_chains) {
      o.detail = "expected " + std::to_string(t.expect_chains) + " chain(s), got " + std::to_string(o.chains);
    } else if (t.severity && chains[0]->severity != *t.severity) {
      o.detail = std::string("expected severity ") + severity_name(*t.severity) + ", got " +
                 severity_name(chains[0]->severity) + ": " + chains[0]->summary;
    } else {
      o.passed = true;
      o.detail = std::string(severity_name(chains[0]->severity)) + ": " + chains[0]->summary;
    }
    out.push_back(std::move(o));
  }
  return out;
}

LoadResult load_rule_files(const std::vector<std::string>& paths, bool include_default,
                           const dsl::CompileOptions& base) {
  LoadResult out;
  const dsl::CompileOptions opts = pack_compile_options(base);
  std::vector<dsl::RuleSource> accepted;
  for (const auto& path : paths) {
    dsl::RuleSource src{path, {}};
    if (!read_disk(path, src.text)) {
      out.rejected.push_back(path + ": cannot read the file");
      continue;
    }
    dsl::CompileResult one = dsl::compile_rules({src}, opts);
    out.diagnostics.insert(out.diagnostics.end(), one.diagnostics.begin(), one.diagnostics.end());
    if (!one.ok()) {
      out.rejected.push_back(path + ": " + std::to_string(dsl::count_errors(one.diagnostics)) + " error(s)");
      continue;
    }
    auto results = run_rule_tests(one);
    bool passed = true;
    for (const auto& r : results)
      if (!r.passed) {
        passed = false;
        out.rejected.push_back(path + ": test \"" + r.test.name + "\" of rule `" + r.test.rule + "` failed (" +
                               r.detail + ")");
      }
    out.tests.insert(out.tests.end(), results.begin(), results.end());
    if (passed) accepted.push_back(std::move(src));
  }
  std::vector<dsl::RuleSource> all;
  if (include_default) all = default_rule_sources();
  all.insert(all.end(), accepted.begin(), accepted.end());
  if (all.empty()) return out;
  dsl::CompileResult combined = dsl::compile_rules(all, opts);
  for (const auto& d : combined.diagnostics)
    if (d.level == dsl::DiagLevel::kError) out.diagnostics.push_back(d);
  out.plan = std::move(combined.plan);
  out.rules = std::move(combined.rules);
  return out;
}

}  // namespace ingero::rules
