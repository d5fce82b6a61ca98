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
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/compiler.h"
#include "engine/plan.h"

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
