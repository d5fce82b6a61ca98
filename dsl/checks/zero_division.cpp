// Pass `zero_division`: warns (W0401) where a denominator may be zero. The engine turns x/0 into
// "no value" and the rule silently does not fire for that row; the warning asks the author to
// say so explicitly with a guard (`require p50 > 0ns` before the division) or a non-zero
// constant / max(x, c > 0) as the denominator.
#include "dsl/sema.h"

namespace ingero::dsl {
namespace {

void collect_guards(const TExpr& e, std::set<std::string>& out) {
  if (e.op == ExprOp::kAnd) {
    for (const auto& a : e.args) collect_guards(a, out);
    return;
  }
  if (e.args.size() != 2) return;
  const TExpr& a = e.args[0];
  const TExpr& b = e.args[1];
  auto cst = [](const TExpr& x) { return x.op == ExprOp::kConst; };
  if (a.op == ExprOp::kRef && cst(b) &&
      ((e.op == ExprOp::kGt && b.value >= 0) || (e.op == ExprOp::kGe && b.value > 0) ||
       (e.op == ExprOp::kNe && b.value == 0)))
    out.insert(a.name);
  if (b.op == ExprOp::kRef && cst(a) && ((e.op == ExprOp::kLt && a.value >= 0) || (e.op == ExprOp::kLe && a.value > 0)))
    out.insert(b.name);
}

bool nonzero(const TExpr& d, const std::set<std::string>& guards) {
  if (d.op == ExprOp::kConst) return d.value != 0;
  if (d.op == ExprOp::kRef) return guards.count(d.name) > 0;
  if (d.op == ExprOp::kMax)
    for (const auto& a : d.args)
      if (a.op == ExprOp::kConst && a.value > 0) return true;
  return false;
}

void check(Module& m, const TExpr& e, const std::set<std::string>& guards) {
  for (const auto& a : e.args) check(m, a, guards);
  if (e.op != ExprOp::kDiv || e.args.size() != 2 || !e.file) return;
  const TExpr& d = e.args[1];
  if (d.ty == Ty::kUnknown || nonzero(d, guards)) return;
  const std::string text = text_of(*d.file, d.pos, d.end);
  const char* zero = d.ty == Ty::kDuration ? "0ns" : d.ty == Ty::kBytes ? "0B" : "0";
  m.warning(*d.file, d.pos, d.end, "W0401",
            "`" + text + "` may be zero; the division then has no value and the rule does not fire",
            "guard it first: `require " + text + " > " + zero + "`");
}

}  // namespace

void pass_zero_division(Module& m) {
  for (auto& r : m.rules) {
    if (!r.from || !r.window) continue;
    std::set<std::string> guards;
    if (r.stream.where) check(m, *r.stream.where, guards);
    for (auto& s : r.steps) {
      for (auto& [n, e] : s.lets) check(m, e, guards);
      if (s.kind == Step::Kind::kRequire) {
        check(m, s.pred, guards);
        collect_guards(s.pred, guards);
      }
      if (s.kind == Step::Kind::kJoin) {
        if (s.right.where) check(m, *s.right.where, guards);
        check(m, s.tail, guards);
      }
    }
    for (auto& c : r.sev_cases)
      if (c.when) check(m, *c.when, guards);
  }
}

}  // namespace ingero::dsl
