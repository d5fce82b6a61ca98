// Golden test of the default plan's canonical text. Regenerate after an intended change with
//   INGERO_UPDATE_GOLDEN=1 ctest -R PlanGolden
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/default_plans.h"

namespace ingero {
namespace {

const std::string kGolden = std::string(INGERO_SOURCE_DIR) + "/tests/engine/golden/default_plan.txt";

TEST(PlanGolden, DefaultPlanText) {
  const std::string text = default_plan().to_string();
  if (std::getenv("INGERO_UPDATE_GOLDEN")) {
    std::ofstream(kGolden) << text;
    GTEST_SKIP() << "golden file rewritten: " << kGolden;
  }
  std::ifstream in(kGolden);
  ASSERT_TRUE(in) << "missing golden file " << kGolden;
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_EQ(text, want.str());
}

TEST(PlanGolden, DefaultPlanValidates) { EXPECT_TRUE(default_plan().validate().empty()); }

TEST(Plan, TextIsCanonicalAndStable) {
  EXPECT_EQ(default_plan().to_string(), default_plan().to_string());
  Plan p;
  const int s = p.add(ScanNode{});
  p.add(FilterNode{ex::ge(ex::field(Field::kDuration), ex::ns(5e6))}, {s});
  EXPECT_EQ(p.to_string(), "%0 = scan()\n%1 = filter(%0) pred=(event.duration >= 5000000ns)\n");
}

TEST(Plan, ValidateCatchesBadShapes) {
  Plan p;
  p.add(AggregateNode{}, {});
  const auto errs = p.validate();
  ASSERT_FALSE(errs.empty());
  EXPECT_NE(errs[0].find("takes 1 input"), std::string::npos);
  Plan q;
  const int s = q.add(ScanNode{});
  WindowNode w;
  w.kind = WindowKind::kSliding;
  w.size_ns = 10;
  w.slide_ns = 20;
  q.add(w, {s});
  ASSERT_FALSE(q.validate().empty());
  EXPECT_NE(q.validate()[0].find("slide"), std::string::npos);
}

TEST(Plan, StepsWindowsAndStepsStreamsComeTogether) {
  WindowNode steps;
  steps.kind = WindowKind::kSteps;
  steps.steps = 20;
  steps.size_ns = steps.slide_ns = 0;
  WindowNode tumbling;
  {  // steps -> where-filter -> steps window: valid, and printed with its step count
    Plan p;
    const int s = p.add(ScanNode{});
    const int st = p.add(StepNode{}, {s});
    const int f = p.add(FilterNode{ex::ge(ex::field(Field::kDuration), ex::ns(1e6))}, {st});
    p.add(steps, {f});
    EXPECT_TRUE(p.validate().empty()) << p.validate()[0];
    EXPECT_NE(p.to_string().find("%1 = steps(%0)"), std::string::npos) << p.to_string();
    EXPECT_NE(p.to_string().find("kind=steps steps=20"), std::string::npos) << p.to_string();
  }
  {  // a steps window over calls
    Plan p;
    const int s = p.add(ScanNode{});
    p.add(steps, {s});
    ASSERT_FALSE(p.validate().empty());
    EXPECT_NE(p.validate()[0].find("a steps window needs a steps stream"), std::string::npos);
  }
  {  // steps in a time window
    Plan p;
    const int s = p.add(ScanNode{});
    p.add(tumbling, {p.add(StepNode{}, {s})});
    ASSERT_FALSE(p.validate().empty());
    EXPECT_NE(p.validate()[0].find("a steps stream needs a steps window"), std::string::npos);
  }
  {  // no steps in a steps window
    Plan p;
    WindowNode none = steps;
    none.steps = 0;
    p.add(none, {p.add(StepNode{}, {p.add(ScanNode{})})});
    ASSERT_FALSE(p.validate().empty());
    EXPECT_NE(p.validate()[0].find("at least 1 step"), std::string::npos);
  }
}

TEST(Plan, FormatDurationRoundTrips) {
  EXPECT_EQ(format_duration(10'000'000'000ull), "10s");
  EXPECT_EQ(format_duration(250'000'000ull), "250ms");
  EXPECT_EQ(format_duration(1500), "1500ns");
  EXPECT_EQ(format_duration(0), "0s");
}

}  // namespace
}  // namespace ingero
