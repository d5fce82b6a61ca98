// filter_source_op_mask (engine/runtime.h) answers from a few evaluations per rectangle between
// the constants a filter compares source and op with; it must equal evaluating the filter for
// every one of the 65,536 (source, op) pairs, on random filters that read only source and op.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/runtime.h"
#include "model/ops.h"

namespace ingero {
namespace {

double random_constant(std::mt19937_64& rng) {
  switch (rng() % 8) {
    case 0: return std::nan("");
    case 1: return -1.5;
    case 2: return 255;
    case 3: return 256.5;
    case 4: return static_cast<double>(rng() % 256) + 0.5;
    default: return static_cast<double>(rng() % 12);  // near the real sources and ops
  }
}

ExprPtr random_filter(std::mt19937_64& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  auto field = [&] { return ex::field(pick(2) ? Field::kSource : Field::kOp); };
  if (depth == 0 || pick(3) == 0) {
    static const ExprOp kCmp[] = {ExprOp::kLt, ExprOp::kLe, ExprOp::kGt, ExprOp::kGe, ExprOp::kEq, ExprOp::kNe};
    switch (pick(6)) {
      case 0: return ex::in(field(), {random_constant(rng), random_constant(rng), random_constant(rng)});
      case 1:  // constant on the left, or a constant subtree
        return ex::bin(kCmp[pick(6)], ex::bin(ExprOp::kAdd, ex::num(random_constant(rng)), ex::num(1)), field());
      case 2: return field();  // a bare read: the mask must fall back to every pair
      case 3:                  // arithmetic on a read: fall back too
        return ex::bin(kCmp[pick(6)], ex::bin(ExprOp::kMul, field(), ex::num(2)), ex::num(random_constant(rng)));
      default: return ex::bin(kCmp[pick(6)], field(), ex::num(random_constant(rng)));
    }
  }
  switch (pick(4)) {
    case 0: return ex::un(ExprOp::kNot, random_filter(rng, depth - 1));
    case 1: return ex::lor(random_filter(rng, depth - 1), random_filter(rng, depth - 1));
    default: return ex::land(random_filter(rng, depth - 1), random_filter(rng, depth - 1));
  }
}

std::vector<uint8_t> every_pair(const Expr& e) {
  std::vector<uint8_t> mask(1u << 16);
  Event ev;
  for (unsigned s = 0; s < 256; ++s)
    for (unsigned o = 0; o < 256; ++o) {
      ev.source = static_cast<Source>(s);
      ev.op = static_cast<uint8_t>(o);
      mask[s << 8 | o] = truthy(eval(e, ev)) ? 1 : 0;
    }
  return mask;
}

TEST(SourceOpMask, EqualsEvaluatingEveryPair) {
  std::mt19937_64 rng(20261123);
  for (int i = 0; i < 400; ++i) {
    const ExprPtr f = random_filter(rng, 1 + i % 4);
    const auto want = every_pair(*f);
    const auto got = filter_source_op_mask(*f);
    ASSERT_EQ(got.size(), want.size());
    size_t first_diff = want.size();
    for (size_t c = 0; c < want.size() && first_diff == want.size(); ++c)
      if (got[c] != want[c]) first_diff = c;
    ASSERT_EQ(first_diff, want.size()) << f->to_string() << ": differs at source " << (first_diff >> 8) << " op "
                                       << (first_diff & 0xff);
  }
}

TEST(SourceOpMask, BoundariesOfOneComparison) {
  // op < 3.5 keeps ops 0..3 of every source; source == 1 and op in [255] keeps one pair.
  auto m = filter_source_op_mask(*ex::lt(ex::field(Field::kOp), ex::num(3.5)));
  for (unsigned s : {0u, 1u, 200u, 255u}) {
    EXPECT_EQ(m[s << 8 | 3], 1);
    EXPECT_EQ(m[s << 8 | 4], 0);
  }
  m = filter_source_op_mask(
      *ex::land(ex::eq(ex::field(Field::kSource), ex::num(1)), ex::in(ex::field(Field::kOp), {255})));
  EXPECT_EQ(std::count(m.begin(), m.end(), uint8_t{1}), 1);
  EXPECT_EQ(m[1u << 8 | 255], 1);
}

// find_op(source, op) answers from a table (every replayed row asks): it must name the same op
// as a scan of all_ops() for each of the 65,536 pairs, the first of any duplicates, and null for
// the pairs no op has.
TEST(FindOp, TableAnswersAsAScanOfEveryOp) {
  size_t known = 0;
  for (unsigned s = 0; s < 256; ++s) {
    for (unsigned o = 0; o < 256; ++o) {
      const OpInfo* scan = nullptr;
      for (const OpInfo& info : all_ops())
        if (static_cast<unsigned>(info.source) == s && info.op == o) {
          scan = &info;
          break;
        }
      const OpInfo* got = find_op(static_cast<Source>(s), static_cast<uint8_t>(o));
      ASSERT_EQ(got, scan) << "source " << s << " op " << o;
      known += got ? 1 : 0;
    }
  }
  EXPECT_EQ(known, all_ops().size());  // no two ops share a (source, op)
}

}  // namespace
}  // namespace ingero
