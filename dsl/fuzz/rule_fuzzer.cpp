// libFuzzer target for the rule compiler: parse + every check + lowering + diagnostics rendering.
// Imports resolve to nothing (no filesystem access while fuzzing). See docs/rules.md for the
// command line (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <string>

#include "dsl/compiler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ingero::dsl::RuleSource src{"fuzz.rules", std::string(reinterpret_cast<const char*>(data), size)};
  ingero::dsl::CompileOptions opts;
  opts.read_file = [](const std::string&, std::string&) { return false; };
  const auto result = ingero::dsl::compile_rules({src}, opts);
  const std::string text = ingero::dsl::render_diagnostics(result.diagnostics);
  const std::string json = ingero::dsl::render_diagnostics_json(result.diagnostics);
  if (result.ok()) (void)result.plan.to_string();
  return text.empty() && json.empty() ? 1 : 0;
}
