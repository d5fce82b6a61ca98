// RouteCheck: one route check of a shard's routing pass (engine/runtime.cpp, Routes::checks) in
// the shape the pass answers it, without eval()'s tree walk where the check allows.
//
// Contract: for every event e, RouteCheck::of(x).holds(e, matcher) ==
// truthy(eval(x, &e, nullptr, &matcher)). Shapes: one stack or site predicate (kStack: false for
// an event with no stack, else the matcher); one comparison of an event field with a constant
// (kCompare: the same double comparison eval() makes; kRange when the field has at most 32 bits,
// where the comparison holds for one range of integers, or outside one for !=); anything else is
// evaluated (kEval). tests/engine/route_check_test.cpp compares holds() with eval() over a grid of
// constants and field values. Never throws.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "model/event.h"
#include "model/expr.h"

namespace ingero {

// A check as the routing pass answers it: its shape and, for a field compared with a constant,
// the field, the comparison and the constant (on the right: `c < x` is held as `x > c`).
// compare() is eval()'s comparison of two doubles, the NaN rules included (a field is NaN only
// for `site`, which no filter compares).
struct RouteCheck {
  enum Kind : uint8_t { kEval, kStack, kCompare, kRange };
  Kind kind = kEval;
  ExprOp cmp = ExprOp::kEq;
  Field field = Field::kTs;
  bool negate = false;  // kRange: holds outside [lo, lo + span]
  double c = 0;
  int64_t lo = 0;
  uint64_t span = 0;
  const Expr* expr = nullptr;
  // A field of at most 32 bits as an integer (every value exact as a double), for kRange.
  static bool is_small(Field f) {
    switch (f) {
      case Field::kPid:
      case Field::kTid:
      case Field::kSource:
      case Field::kOp:
      case Field::kRet:
      case Field::kNode:
      case Field::kRank:
      case Field::kPrevState:
      case Field::kGpuId: return true;
      default: return false;
    }
  }
  [[gnu::always_inline]] static int64_t small_field(const Event& e, Field f) {
    switch (f) {
      case Field::kPid: return e.pid;
      case Field::kTid: return e.tid;
      case Field::kSource: return static_cast<int64_t>(e.source);
      case Field::kOp: return e.op;
      case Field::kRet: return e.ret;
      case Field::kNode: return e.node;
      case Field::kRank: return e.rank;
      case Field::kPrevState: return static_cast<int64_t>(e.prev_state);
      case Field::kGpuId: return e.gpu_id;
      default: return 0;
    }
  }
  // Whether v is in [lo, lo + span] (one unsigned comparison: the values are below 2^34).
  static bool in_range(int64_t v, int64_t lo, uint64_t span) { return static_cast<uint64_t>(v - lo) <= span; }
  // A kCompare of a small field as the integers it holds for: `x OP c` over doubles, with x an
  // integer of magnitude below 2^32, holds for the x in one range [a, b] (for !=: outside
  // one). The bound is read off compare() itself at f = floor(c), so no rounding rule is
  // restated: x < c and x <= c hold up to f when compare(f), else up to f - 1 (x = f - 1 < c
  // always); x > c and x >= c from f when compare(f), else from f + 1; x == c only at f, when
  // compare(f); x != c everywhere but there.
  void to_range() {
    constexpr double kLim = 4294967296.0;  // 2^32: beyond every small field's values
    if (c != c) return;                    // NaN: compare() is false for every x; keep it
    const auto f = static_cast<int64_t>(std::floor(std::clamp(c, -kLim - 2, kLim + 2)));
    const int64_t far = static_cast<int64_t>(kLim) + 4;
    const bool at_f = compare(static_cast<double>(f));
    int64_t a = 0, b = 0;
    switch (cmp) {
      case ExprOp::kLt:
      case ExprOp::kLe:
        a = -far;
        b = at_f ? f : f - 1;
        break;
      case ExprOp::kGt:
      case ExprOp::kGe:
        a = at_f ? f : f + 1;
        b = far;
        break;
      case ExprOp::kEq:
        a = f;
        b = at_f ? f : f - 1;  // empty unless c is the integer f
        break;
      case ExprOp::kNe:
        negate = true;
        a = f;
        b = at_f ? f - 1 : f;  // == held nowhere (c not an integer) or at f
        break;
      default: return;
    }
    kind = kRange;
    if (b < a) {  // an empty range: held nowhere (negated: everywhere)
      lo = 0;
      span = UINT64_MAX;  // every x is in it, so flip negate to mean "nowhere"
      negate = !negate;
      return;
    }
    lo = a;
    span = static_cast<uint64_t>(b - a);
  }
  static RouteCheck of(const Expr& e) {
    RouteCheck rc;
    rc.expr = &e;
    if (e.op == ExprOp::kSiteMatch || e.op == ExprOp::kStackMatch) {
      rc.kind = kStack;
      return rc;
    }
    const bool comparison = e.op == ExprOp::kLt || e.op == ExprOp::kLe || e.op == ExprOp::kGt || e.op == ExprOp::kGe ||
                            e.op == ExprOp::kEq || e.op == ExprOp::kNe;
    if (!comparison || e.args.size() != 2 || !e.args[0] || !e.args[1]) return rc;
    const Expr& a = *e.args[0];
    const Expr& b = *e.args[1];
    if (a.op == ExprOp::kField && b.op == ExprOp::kConst && a.field != Field::kSite) {
      rc.kind = kCompare;
      rc.cmp = e.op;
      rc.field = a.field;
      rc.c = b.value;
    } else if (a.op == ExprOp::kConst && b.op == ExprOp::kField && b.field != Field::kSite) {
      rc.kind = kCompare;
      rc.field = b.field;
      rc.c = a.value;
      // c OP x as x OP' c: the mirrored comparison gives the same answer for every pair of
      // doubles, NaN included (each is false with a NaN operand, and != is handled apart).
      switch (e.op) {
        case ExprOp::kLt: rc.cmp = ExprOp::kGt; break;
        case ExprOp::kLe: rc.cmp = ExprOp::kGe; break;
        case ExprOp::kGt: rc.cmp = ExprOp::kLt; break;
        case ExprOp::kGe: rc.cmp = ExprOp::kLe; break;
        default: rc.cmp = e.op; break;
      }
    }
    if (rc.kind == kCompare && is_small(rc.field)) rc.to_range();
    return rc;
  }
  bool compare(double v) const {
    switch (cmp) {
      case ExprOp::kLt: return v < c;
      case ExprOp::kLe: return v <= c;
      case ExprOp::kGt: return v > c;
      case ExprOp::kGe: return v >= c;
      case ExprOp::kEq: return v == c;
      case ExprOp::kNe: return v == v && c == c && v != c;
      default: return false;
    }
  }
  // Whether the check holds for e (truthy(eval(*expr, &e, nullptr, &stacks))).
  bool holds(const Event& e, const StackMatcher& stacks) const {
    switch (kind) {
      case kRange: return in_range(small_field(e, field), lo, span) != negate;
      case kCompare: return compare(read_field(e, field));
      case kStack: return e.stack_id != 0 && stacks.match(*expr, e.stack_id);
      case kEval: break;
    }
    return truthy(eval(*expr, &e, nullptr, &stacks));
  }
};

}  // namespace ingero
