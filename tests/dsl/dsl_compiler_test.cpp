// Rule compiler tests: golden diagnostics for malformed rules (exact rendered text with carets),
// golden parse tree and plan of a sample rule, API behaviour (JSON form, limits, param overrides).
// Regenerate goldens after an intended change: INGERO_UPDATE_GOLDEN=1 ./dsl_compiler_test
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsl/compiler.h"

namespace fs = std::filesystem;
using namespace ingero::dsl;

namespace {

const fs::path kDir = fs::path(INGERO_SOURCE_DIR) / "tests" / "dsl";

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void check_golden(const fs::path& golden, const std::string& actual) {
  if (std::getenv("INGERO_UPDATE_GOLDEN")) {
    std::ofstream(golden, std::ios::binary) << actual;
    return;
  }
  ASSERT_TRUE(fs::exists(golden)) << golden << " missing; run with INGERO_UPDATE_GOLDEN=1";
  EXPECT_EQ(read(golden), actual) << "golden " << golden;
}

// Paths in diagnostics are relative to the repository so goldens do not depend on the checkout.
CompileResult compile_case(const fs::path& file) {
  RuleSource src{fs::relative(file, INGERO_SOURCE_DIR).string(), read(file)};
  CompileOptions o;
  o.read_file = [](const std::string& path, std::string& text) {
    const fs::path p = fs::path(INGERO_SOURCE_DIR) / path;
    if (!fs::exists(p)) return false;
    text = read(p);
    return true;
  };
  return compile_rules({src}, o);
}

}  // namespace

TEST(DslDiagnostics, MalformedCasesMatchGoldens) {
  size_t cases = 0;
  for (const auto& entry : fs::directory_iterator(kDir / "cases")) {
    if (entry.path().extension() != ".rules") continue;
    ++cases;
    const std::string name = entry.path().stem().string();
    SCOPED_TRACE(name);
    const CompileResult r = compile_case(entry.path());
    ASSERT_FALSE(r.diagnostics.empty()) << "a malformed case must produce a diagnostic";
    // The case's name starts with the code of its first diagnostic (e.g. e0201_...).
    const std::string code = name.substr(0, name.find('_'));
    if (code != "multiple") {
      std::string want = code;
      for (char& c : want) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      bool found = false;
      for (const auto& d : r.diagnostics) found = found || d.code == want;
      EXPECT_TRUE(found) << "expected a " << want << " diagnostic:\n" << render_diagnostics(r.diagnostics);
    } else {
      EXPECT_GE(count_errors(r.diagnostics), 3u) << render_diagnostics(r.diagnostics);
    }
    check_golden(kDir / "golden" / (name + ".diag"), render_diagnostics(r.diagnostics));
  }
  EXPECT_GE(cases, 25u);
}

TEST(DslDiagnostics, JsonForm) {
  const CompileResult r = compile_case(kDir / "cases" / "e0201_unknown_name.rules");
  const std::string json = render_diagnostics_json(r.diagnostics);
  EXPECT_NE(json.find("\"code\": \"E0201\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"line\": 6"), std::string::npos) << json;
  EXPECT_NE(json.find("\"hint\": \"did you mean `p50`?\""), std::string::npos) << json;
}

TEST(DslGolden, SampleRuleParseTreeAndPlan) {
  const fs::path sample = kDir / "sample.rules";
  RuleSource src{"tests/dsl/sample.rules", read(sample)};
  check_golden(kDir / "golden" / "sample.ast", dump_ast(src));
  const CompileResult r = compile_rules({src});
  ASSERT_TRUE(r.ok()) << render_diagnostics(r.diagnostics);
  EXPECT_TRUE(r.plan.validate().empty());
  check_golden(kDir / "golden" / "sample.plan", r.plan.to_string());
  ASSERT_EQ(r.tests.size(), 2u);
  EXPECT_TRUE(r.tests[0].expect_match);
  EXPECT_FALSE(r.tests[1].expect_match);
}

TEST(DslCompiler, ParamOverrideChangesThePlan) {
  RuleSource src{"tests/dsl/sample.rules", read(kDir / "sample.rules")};
  CompileOptions o;
  o.params["min_calls"] = "50";
  const CompileResult r = compile_rules({src}, o);
  ASSERT_TRUE(r.ok()) << render_diagnostics(r.diagnostics);
  EXPECT_NE(r.plan.to_string().find("(n >= 50)"), std::string::npos) << r.plan.to_string();
  o.params = {{"min_calls", "5ms"}};
  const CompileResult bad = compile_rules({src}, o);
  EXPECT_FALSE(bad.ok());
}

TEST(DslCompiler, HostileInputIsBounded) {
  // Deep nesting, huge operator chains, deep `not`s and binary noise: diagnostics, never a crash.
  std::string deep = "rule r\n from cuda where " + std::string(100000, '(') + "\nend\n";
  EXPECT_FALSE(compile_rules({{"deep.rules", deep}}).ok());
  std::string chain = "rule r\n from cuda where ts";
  for (int i = 0; i < 20000; ++i) chain += " + ts";
  chain += " > 0ns\n window whole\n category c\n summary \"x\"\nend\n";
  const auto r = compile_rules({{"chain.rules", chain}});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.diagnostics[0].code, "E0004");
  std::string nots = "rule r\n from cuda where " + std::string(5000, '-') + "ts > 0ns\nend\n";
  EXPECT_FALSE(compile_rules({{"nots.rules", nots}}).ok());
  std::string noise;
  for (int i = 0; i < 4096; ++i) noise += static_cast<char>((i * 7919) % 256);
  EXPECT_FALSE(compile_rules({{"noise.rules", noise}}).ok());
  std::string many_errors;
  for (int i = 0; i < 1000; ++i) many_errors += "bogus\n";
  EXPECT_LE(compile_rules({{"many.rules", many_errors}}).diagnostics.size(), 50u);
}

TEST(DslCompiler, DefsAndListsInline) {
  const std::string text = R"(
list slow_ops = [cudaMalloc, cuMemAlloc]
def ratio = p99 / p50
rule r
  from cuda, driver where op in slow_ops
  window tumbling 5s by pid, source, op
  let p50 = p50(duration), p99 = p99(duration)
  require p50 > 0ns
  require ratio >= 2x
  category allocator
  summary "{op}: {p99 / p50}"
end
)";
  const CompileResult r = compile_rules({{"x.rules", text}});
  ASSERT_TRUE(r.ok()) << render_diagnostics(r.diagnostics);
  const std::string plan = r.plan.to_string();
  // op names become (source, id) pairs: cudaMalloc is 1:1, cuMemAlloc 4:5.
  EXPECT_NE(plan.find("((event.source == 1) and (event.op == 1)) or ((event.source == 4) and (event.op == 5))"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("_t1=(p99 / p50)"), std::string::npos) << plan;
  EXPECT_NE(plan.find("summary=\"{op}: {_t1}\""), std::string::npos) << plan;
}

// Rules over time (`from accounting`, time()/top_task(), {task:slot}, `trend ... baseline`): each
// defect is an error with its code, span and hint, and the same rule without it compiles (so the
// error is the defect's, not another's).
TEST(DslDiagnostics, RulesOverTime) {
  const std::string good = R"rules(rule r1 "x"
  from accounting
  window tumbling 1s by pid, tid
  let wall = time(all)
  require wall >= 200ms
  let preempted = time(preempted), share = preempted / wall * 100%, by = top_task(preempted)
  trend share baseline over 30 windows
  require share >= 10% and share >= trend.median + 3 * trend.mad
  category c
  summary "thread {tid}: {task:by} ran instead ({share})"
end
)rules";
  const CompileResult ok = compile_rules({{"t.rules", good}});
  ASSERT_TRUE(ok.ok()) << render_diagnostics(ok.diagnostics);
  EXPECT_TRUE(ok.diagnostics.empty()) << render_diagnostics(ok.diagnostics);
  const std::string plan = ok.plan.to_string();
  EXPECT_NE(plan.find("account(%0) grid=1s"), std::string::npos) << plan;
  EXPECT_NE(plan.find("by=top_task(buckets=1)"), std::string::npos) << plan;  // bucket 0: preempted
  EXPECT_NE(plan.find("mode=baseline"), std::string::npos) << plan;

  struct Case {
    std::string what, from, to;  // replace `from` in the good rule by `to`
    std::string code, text, hint;
    std::string at;  // what the caret is on
  };
  const std::vector<Case> cases = {
      {"time() over calls", "from accounting", "from cuda", "E0207", "time(...)` reads the time of feeding threads",
       "write the rule `from accounting`", "time(all)"},
      {"top_task() over calls", "from accounting", "from driver where op == cuLaunchKernel", "E0207",
       "it needs `from accounting`", "from accounting", "time(all)"},
      {"a misspelt bucket", "time(preempted), share", "time(premepted), share", "E0208", "expected a time bucket",
       "did you mean `preempted`?", "premepted"},
      {"a bucket group misspelt", "time(all)", "time(alll)", "E0208", "expected a time bucket", "did you mean `all`?",
       "alll"},
      {"a slot for a bucket", "top_task(preempted)", "top_task(wall)", "E0208", "expected a time bucket", "", "wall)"},
      {"time() with no bucket", "time(all)", "time()", "E0205", "takes one or more time buckets", "", "time()"},
      {"{task:} of a duration", "{task:by}", "{task:wall}", "E0701", "names the process of a pid slot",
       "top_task(preempted)", "task:wall"},
      {"{task:} of no slot", "{task:by}", "{task:nobody}", "E0701", "names the process of a pid slot", "",
       "task:nobody"},
      {"a factor for baseline", "baseline over", "baseline 50% over", "E0216", "`baseline` takes no factor", "", "50%"},
      {"accounting and a source", "from accounting", "from accounting, cuda", "E0202",
       "`accounting` is a stream of its own", "", "cuda"},
      {"a source and accounting", "from accounting", "from cuda, accounting", "E0202",
       "`accounting` is a stream of its own", "", "accounting"},
      {"accounting misspelt", "from accounting", "from acounting", "E0202", "unknown event source",
       "did you mean `accounting`?", "acounting"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::string text = good;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, c.from.size(), c.to);
    const CompileResult r = compile_rules({{"t.rules", text}});
    EXPECT_FALSE(r.ok());
    const Diagnostic* d = nullptr;
    for (const auto& x : r.diagnostics)
      if (!d && x.code == c.code && x.level == DiagLevel::kError) d = &x;
    ASSERT_TRUE(d) << render_diagnostics(r.diagnostics);
    EXPECT_NE(d->message.find(c.text), std::string::npos) << render_diagnostics(r.diagnostics);
    if (!c.hint.empty()) {
      EXPECT_NE(d->hint.find(c.hint), std::string::npos) << render_diagnostics(r.diagnostics);
    }
    ASSERT_GE(d->col, 1);
    EXPECT_EQ(d->source_line.substr(static_cast<size_t>(d->col - 1), c.at.size()), c.at)
        << render_diagnostics(r.diagnostics);
  }
}
