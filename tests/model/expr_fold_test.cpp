// fold_source_op / simplify_truth (model/expr.h) against eval on random expressions and events:
// the folded expression gives the same value bit for bit, the simplified one the same truth.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "model/expr.h"

namespace ingero {
namespace {

ExprPtr random_expr(std::mt19937_64& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  if (depth == 0 || pick(4) == 0) {
    switch (pick(6)) {
      case 0: return ex::field(Field::kSource);
      case 1: return ex::field(Field::kOp);
      case 2: return ex::field(pick(2) ? Field::kArg1 : Field::kDuration);
      case 3: return ex::stack_match(pick(2) ? ExprOp::kSiteMatch : ExprOp::kStackMatch, {"*step"});
      case 4: return ex::num(pick(8) == 0 ? std::nan("") : static_cast<double>(pick(6)));
      default: return ex::ref("x");
    }
  }
  static const ExprOp kBin[] = {ExprOp::kAdd, ExprOp::kSub, ExprOp::kMul, ExprOp::kDiv, ExprOp::kLt,
                                ExprOp::kLe,  ExprOp::kGt,  ExprOp::kGe,  ExprOp::kEq,  ExprOp::kNe,
                                ExprOp::kAnd, ExprOp::kOr,  ExprOp::kAnd, ExprOp::kOr,  ExprOp::kMin};
  switch (pick(5)) {
    case 0: return ex::un(pick(2) ? ExprOp::kNot : ExprOp::kNeg, random_expr(rng, depth - 1));
    case 1: return ex::in(random_expr(rng, depth - 1), {1, 2, 4});
    default:
      return ex::bin(kBin[pick(static_cast<int>(std::size(kBin)))], random_expr(rng, depth - 1),
                     random_expr(rng, depth - 1));
  }
}

bool same_bits(double a, double b) {
  if (a != a && b != b) return true;  // NaN payloads are not part of eval's contract
  uint64_t x, y;
  std::memcpy(&x, &a, sizeof x);
  std::memcpy(&y, &b, sizeof y);
  return x == y;
}

TEST(ExprFold, FoldedEqualsEvalOnRandomTrees) {
  std::mt19937_64 rng(12345);
  const double row[] = {3.0};
  int folded_to_const = 0;
  for (int t = 0; t < 3000; ++t) {
    ExprPtr e = random_expr(rng, 5);
    // Resolve the one ref to slot 0 (the engine does this before folding).
    std::function<ExprPtr(const ExprPtr&)> resolve = [&](const ExprPtr& x) -> ExprPtr {
      auto c = std::make_shared<Expr>(*x);
      if (c->op == ExprOp::kRef) c->slot = 0;
      for (auto& a : c->args) a = resolve(a);
      return c;
    };
    e = resolve(e);
    const auto source = static_cast<Source>(rng() % 6);
    const auto op = static_cast<uint8_t>(rng() % 6);
    const ExprPtr f = fold_source_op(e, source, op);
    const ExprPtr s = simplify_truth(f);
    if (f->op == ExprOp::kConst) ++folded_to_const;
    for (int k = 0; k < 8; ++k) {
      Event ev;
      ev.source = source;
      ev.op = op;
      ev.arg1 = rng() % 4;
      ev.dur_ns = rng() % 4;
      const double want = eval(*e, &ev, row);
      ASSERT_TRUE(same_bits(eval(*f, &ev, row), want)) << e->to_string() << " folded " << f->to_string();
      ASSERT_EQ(truthy(eval(*s, &ev, row)), truthy(want)) << e->to_string() << " simplified " << s->to_string();
    }
  }
  EXPECT_GT(folded_to_const, 100);  // the generator exercises folding, not only pass-through
}

TEST(ExprFold, RulePackResidualFolds) {
  // sync_copy_in_loop's residual: `not (cudaMemcpy) or arg1 == 2`.
  const auto is_memcpy = ex::land(ex::eq(ex::field(Field::kSource), ex::num(1)),
                                  ex::eq(ex::field(Field::kOp), ex::num(4)));
  const auto rest = ex::lor(ex::un(ExprOp::kNot, is_memcpy), ex::eq(ex::field(Field::kArg1), ex::num(2)));
  const auto for_memcpy = simplify_truth(fold_source_op(rest, Source::kCuda, 4));
  EXPECT_EQ(for_memcpy->to_string(), "(event.arg1 == 2)");
  const auto for_driver = simplify_truth(fold_source_op(rest, Source::kDriver, 10));
  ASSERT_EQ(for_driver->op, ExprOp::kConst);
  EXPECT_EQ(for_driver->value, 1.0);
  // Nothing to fold: the same tree comes back.
  const auto plain = ex::eq(ex::field(Field::kArg1), ex::num(2));
  EXPECT_EQ(fold_source_op(plain, Source::kCuda, 4), plain);
  EXPECT_EQ(simplify_truth(plain), plain);
}

}  // namespace
}  // namespace ingero
