// The rule compiler's public interface: `.rules` sources -> plan IR + diagnostics + inline tests.
//
// Contract:
// - compile_rules() never throws for anything a user writes and is bounded in time and memory
//   (see ParseLimits and the limits in docs/rules.md); problems are diagnostics.
// - The plan holds one path per rule (Scan shared), every node carrying the rule's line/col;
//   Emit nodes carry the rule name and a content hash, Require nodes the predicate's source text.
// - The plan is produced only when there are no errors (warnings allowed).
// - Files are compiled in order; `import "x.rules"` brings another file's params, lists and defs
//   (not its rules) into scope, resolved relative to the importing file by `read_file`.
// This header includes no X3 (or TBB) header.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dsl/diagnostics.h"
#include "dsl/parser.h"
#include "model/event.h"
#include "model/plan.h"
#include "model/trace.h"

namespace ingero::dsl {

struct RuleSource {
  std::string path;  // shown in diagnostics; imports resolve relative to it
  std::string text;
};

struct CompileOptions {
  // Param overrides: name -> literal text ("20ms", "0.75", "[cudaMalloc, cuMemAlloc]").
  std::map<std::string, std::string> params;
  // Reads an imported file; empty = the filesystem. Returns false when it does not exist.
  std::function<bool(const std::string& path, std::string& text)> read_file;
  ParseLimits limits;
};

// Inline test of a rule: fixture events (timestamps from kFixtureBaseNs) and the expectation.
inline constexpr uint64_t kFixtureBaseNs = 1'000'000'000'000'000'000ull;
struct RuleTest {
  std::string file;
  int line = 0, col = 0;
  std::string rule, name;
  std::vector<Event> events;
  bool expect_match = true;
  std::optional<Severity> severity;       // `expect match severity high`
  int expect_chains = -1;                 // `expect match chains 2`; -1 = at least one
  std::map<uint64_t, StackTrace> stacks;  // `stack "..."` attributes, by the events' stack_id
};

struct CompiledRule {
  std::string name, title, hash, file;
  int line = 0;
  Plan plan;  // this rule alone (inline tests run it)
};

struct CompileResult {
  Plan plan;  // every rule of every (non-imported) file
  std::vector<CompiledRule> rules;
  std::vector<RuleTest> tests;
  std::vector<Diagnostic> diagnostics;
  bool ok() const { return count_errors(diagnostics) == 0; }
};

CompileResult compile_rules(const std::vector<RuleSource>& files, const CompileOptions& opts = {});

// The parse tree of one source, one node per line with line:col (golden tests, `rules plan --ast`).
std::string dump_ast(const RuleSource& file, std::vector<Diagnostic>* diags = nullptr);

// FNV-1a 64 of `text` as 16 hex digits (rule content hash).
std::string content_hash(std::string_view text);

}  // namespace ingero::dsl
