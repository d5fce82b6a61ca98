// RouteCheck (engine/route_check.h) answers a route check as eval() does: every comparison of
// every field with constants around each field's values (integers, halves, the field's limits,
// beyond them, infinities, NaN), for events at each field's extremes, both operand orders.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/route_check.h"

using namespace ingero;

namespace {

class NoStacks final : public StackMatcher {
 public:
  bool match(const Expr&, uint64_t) const override { return true; }
};

void set_field(Event& e, Field f, int64_t v) {
  switch (f) {
    case Field::kPid: e.pid = static_cast<uint32_t>(v); break;
    case Field::kTid: e.tid = static_cast<uint32_t>(v); break;
    case Field::kSource: e.source = static_cast<Source>(v); break;
    case Field::kOp: e.op = static_cast<uint8_t>(v); break;
    case Field::kRet: e.ret = static_cast<int32_t>(v); break;
    case Field::kNode: e.node = static_cast<uint16_t>(v); break;
    case Field::kRank: e.rank = static_cast<int16_t>(v); break;
    case Field::kPrevState: e.prev_state = static_cast<OffCpuState>(v); break;
    case Field::kGpuId: e.gpu_id = static_cast<uint8_t>(v); break;
    case Field::kDuration: e.dur_ns = static_cast<uint64_t>(v); break;
    case Field::kArg1: e.arg1 = static_cast<uint64_t>(v); break;
    default: break;
  }
}

}  // namespace

TEST(RouteCheck, AnswersEveryFieldComparisonAsEvalDoes) {
  struct FieldRange {
    Field field;
    int64_t min, max;
  };
  const FieldRange fields[] = {{Field::kPid, 0, 4294967295},
                               {Field::kTid, 0, 4294967295},
                               {Field::kSource, 0, 255},
                               {Field::kOp, 0, 255},
                               {Field::kRet, -2147483648, 2147483647},
                               {Field::kNode, 0, 65535},
                               {Field::kRank, -32768, 32767},
                               {Field::kPrevState, 0, 255},
                               {Field::kGpuId, 0, 255},
                               {Field::kDuration, 0, 1'000'000'000},
                               {Field::kArg1, 0, 4'000'000'000}};
  const ExprOp ops[] = {ExprOp::kLt, ExprOp::kLe, ExprOp::kGt, ExprOp::kGe, ExprOp::kEq, ExprOp::kNe};
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  NoStacks stacks;
  size_t ranges = 0, checked = 0;
  for (const auto& fr : fields) {
    std::vector<int64_t> values;
    for (const int64_t base : {fr.min, fr.max, int64_t{-1}, int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}})
      for (int64_t d = -2; d <= 2; ++d)
        if (base + d >= fr.min && base + d <= fr.max) values.push_back(base + d);
    std::vector<double> constants = {inf,    -inf,         nan,           -0.0,         1e300,
                                     -1e300, 4294967296.0, -4294967296.0, 4294967297.5, -4294967298.5};
    for (const int64_t v : values)
      for (const double d : {-1.0, -0.5, 0.0, 0.5, 1.0}) constants.push_back(static_cast<double>(v) + d);
    for (const ExprOp op : ops)
      for (const double c : constants)
        for (const bool field_left : {true, false}) {
          const ExprPtr x = field_left ? ex::bin(op, ex::field(fr.field), ex::num(c))
                                       : ex::bin(op, ex::num(c), ex::field(fr.field));
          const RouteCheck rc = RouteCheck::of(*x);
          ASSERT_NE(rc.kind, RouteCheck::kEval) << x->to_string();
          ranges += rc.kind == RouteCheck::kRange;
          for (const int64_t v : values) {
            Event e;
            set_field(e, fr.field, v);
            const bool want = truthy(eval(*x, &e, nullptr, &stacks));
            ASSERT_EQ(rc.holds(e, stacks), want) << x->to_string() << " at " << v;
            ++checked;
          }
        }
  }
  EXPECT_GT(ranges, 1000u);  // the small fields took the integer path
  EXPECT_GT(checked, 100000u);
}

TEST(RouteCheck, OtherShapesAreStackPredicatesOrEvaluated) {
  const ExprPtr site = ex::stack_match(ExprOp::kSiteMatch, {"* in step"});
  EXPECT_EQ(RouteCheck::of(*site).kind, RouteCheck::kStack);
  const ExprPtr both = ex::bin(ExprOp::kAnd, ex::bin(ExprOp::kEq, ex::field(Field::kArg1), ex::num(2)), site);
  EXPECT_EQ(RouteCheck::of(*both).kind, RouteCheck::kEval);
  const ExprPtr two_fields = ex::bin(ExprOp::kLt, ex::field(Field::kPid), ex::field(Field::kTid));
  EXPECT_EQ(RouteCheck::of(*two_fields).kind, RouteCheck::kEval);
  NoStacks stacks;
  Event e;
  e.pid = 5;
  e.tid = 6;
  EXPECT_TRUE(RouteCheck::of(*two_fields).holds(e, stacks));
  EXPECT_FALSE(RouteCheck::of(*site).holds(e, stacks));  // no stack: false before the matcher
  e.stack_id = 9;
  EXPECT_TRUE(RouteCheck::of(*site).holds(e, stacks));
}
