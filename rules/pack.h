// The default rule pack and rule-file loading.
//
// Contract:
// - The pack's text (rules/*.rules) is embedded at build time: nothing is read at run time.
// - load_rule_files() compiles each user file on its own first and runs its inline tests; a file
//   with compile errors or a failing test is rejected (named, with the failing test), the others
//   load. The accepted files are then compiled together with the default pack (when asked), so
//   rule names are unique across everything that runs.
// - Imports from user files resolve on disk first, then against the embedded pack by file name,
//   so `import "common.rules"` gives user rules the pack's params and defs.
// - Inline tests run each fixture through run_plan (engine/engine.h) with the rule alone.
// - pack_param() reads one param of the embedded pack (after `--param` overrides) as a number, for
//   knobs that code beside the rules applies (the chain annotator's `warmup`): the same text, the
//   same override syntax and the same units as the rules' own params.
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/compiler.h"
#include "model/plan.h"

namespace ingero::rules {

struct EmbeddedRuleFile {
  std::string_view path;  // "rules/host_contention.rules"
  std::string_view text;
};
std::span<const EmbeddedRuleFile> embedded_rule_files();

// The embedded pack as compile inputs, and compiled (cached after the first call).
std::vector<dsl::RuleSource> default_rule_sources();
const dsl::CompileResult& default_rule_pack();
Plan default_rule_pack_plan();

// Options that resolve imports on disk, then against the embedded pack.
dsl::CompileOptions pack_compile_options(dsl::CompileOptions base = {});

// A param declared by the embedded pack (rules/*.rules, common.rules included), after `overrides`
// (name -> literal text, as given to `--param` or the config's analysis.params). `value` is in the
// engine's units: durations in ns, bytes in bytes, `50%` as 0.5, `3x` and bare numbers as written.
// `kind` is "duration", "bytes", "ratio" or "number"; `text` the literal that gave the value.
struct PackParam {
  double value = 0;
  std::string kind, text;
  bool overridden = false;
};
// False with `error` set when the pack declares no such param, or when the declaration or the
// override is not a single (optionally negated) number literal of the declared kind.
bool pack_param(const std::string& name, const std::map<std::string, std::string>& overrides, PackParam& out,
                std::string& error);

struct RuleTestOutcome {
  dsl::RuleTest test;
  bool passed = false;
  int chains = 0;
  std::string detail;  // why it failed, or what matched
};
std::vector<RuleTestOutcome> run_rule_tests(const dsl::CompileResult& compiled);

struct LoadResult {
  Plan plan;
  std::vector<dsl::CompiledRule> rules;
  std::vector<dsl::Diagnostic> diagnostics;
  std::vector<RuleTestOutcome> tests;
  std::vector<std::string> rejected;  // "path: reason"
  bool ok() const { return rejected.empty() && dsl::count_errors(diagnostics) == 0; }
};
LoadResult load_rule_files(const std::vector<std::string>& paths, bool include_default,
                           const dsl::CompileOptions& opts = {});

}  // namespace ingero::rules
