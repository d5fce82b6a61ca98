// Fuzz regressions and every rule file of the repository, compiled by a parser built WITH
// assertions (this binary compiles dsl/grammar.cpp and dsl/parser.cpp itself with -UNDEBUG).
//
// Why a separate binary: Spirit X3 asserts on input that release builds then mishandle silently
// (a byte >= 0x80 reaching a character class: the assert in a debug build, <cctype> called with a
// negative value in a release build). The suite runs in Release, where that assert is compiled
// out, so only an assert-enabled parser can fail on these inputs in CI. An abort fails the test.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsl/compiler.h"
#include "dsl/diagnostics.h"

namespace fs = std::filesystem;
using namespace ingero::dsl;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CompileResult compile_text(const std::string& name, const std::string& text) {
  CompileOptions o;
  o.read_file = [](const std::string&, std::string&) { return false; };
  return compile_rules({RuleSource{name, text}}, o);
}

std::vector<fs::path> rule_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".rules") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(DslParserAsserts, AssertionsAreCompiledIn) {
#ifdef NDEBUG
  FAIL() << "this binary must be built without NDEBUG, or it tests nothing the release tests do not";
#endif
}

// Inputs a fuzzer found to crash the parser (tests/dsl/fuzz/; the first one is
// shared/data/fuzz/rules-x3-nonascii-assert.rules: a comment that X3 ended at a bare '\r' while
// the prescan read on to '\n', so a non-ASCII byte reached standard::isalnum).
TEST(DslParserAsserts, FuzzRegressionsGiveDiagnosticsNotCrashes) {
  const auto files = rule_files(fs::path(INGERO_SOURCE_DIR) / "tests/dsl/fuzz");
  ASSERT_GE(files.size(), 3u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.filename().string());
    const CompileResult r = compile_text(f.filename().string(), read(f));
    EXPECT_FALSE(r.ok());
    EXPECT_FALSE(render_diagnostics(r.diagnostics).empty());
  }
}

// Every byte >= 0x80 after a '\r' in a comment, in a string, and after recovery from an error.
TEST(DslParserAsserts, NonAsciiAfterCarriageReturnInEveryContext) {
  for (const char* ctx : {"  # note\r%s\n", "  summary \"x\r%s\"\n", "  let n = count((\r%s\n", "  requir\r%s\n"}) {
    for (int b = 0x80; b <= 0xff; b += 0x1f) {
      char line[64];
      const std::string bytes = std::string(1, static_cast<char>(b)) + "ab" + std::string(1, static_cast<char>(b));
      std::snprintf(line, sizeof line, ctx, bytes.c_str());
      const std::string text = std::string("rule r\n  from cuda\n") + line + "end\n";
      SCOPED_TRACE(text);
      (void)compile_text("ctx.rules", text);  // must return (an X3 assert would abort)
    }
  }
}

// The shipped pack and the malformed cases still compile (or fail) without tripping an assert.
TEST(DslParserAsserts, RepositoryRuleFilesDoNotTripAsserts) {
  size_t n = 0;
  for (const char* dir : {"rules", "tests/dsl/cases"})
    for (const auto& f : rule_files(fs::path(INGERO_SOURCE_DIR) / dir)) {
      SCOPED_TRACE(f.string());
      (void)compile_text(f.filename().string(), read(f));
      ++n;
    }
  EXPECT_GE(n, 30u);
}
