#include "rules/pack.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/engine.h"
#include "engine/trace.h"

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

}  // namespace

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
      o.detail = o.passed ? "no chain, as expected"
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
