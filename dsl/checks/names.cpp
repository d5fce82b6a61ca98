// Pass `names`: resolves every expression of every rule against the event schema (fields, sources,
// ops, off-CPU states), the scope (params, lists, defs incl. imports) and the rule's row slots,
// which are defined in clause order (a slot is usable after the clause that defines it).
// Aggregate calls are hoisted into the rule's single Aggregate (sema: RuleSema::aggs).
// Also bounds expression size (E0004) so no later recursive pass can be driven deep.
#include <cmath>
#include <cstdio>

#include "dsl/sema.h"
#include "model/accounting.h"

namespace ingero::dsl {
namespace {

constexpr size_t kMaxOperators = 256;
constexpr size_t kMaxUnaryOps = 8;
constexpr size_t kMaxListItems = 4096;
constexpr size_t kMaxAggs = 64;

int precedence(ast::BinOp op) {
  switch (op) {
    case ast::BinOp::kOr: return 1;
    case ast::BinOp::kAnd: return 2;
    case ast::BinOp::kAdd:
    case ast::BinOp::kSub: return 4;
    case ast::BinOp::kMul:
    case ast::BinOp::kDiv: return 5;
    default: return 3;  // comparisons, in
  }
}

bool is_comparison(ExprOp op) {
  return op == ExprOp::kLt || op == ExprOp::kLe || op == ExprOp::kGt || op == ExprOp::kGe || op == ExprOp::kEq ||
         op == ExprOp::kNe || op == ExprOp::kIn;
}

ExprOp to_expr_op(ast::BinOp op) {
  switch (op) {
    case ast::BinOp::kOr: return ExprOp::kOr;
    case ast::BinOp::kAnd: return ExprOp::kAnd;
    case ast::BinOp::kLt: return ExprOp::kLt;
    case ast::BinOp::kLe: return ExprOp::kLe;
    case ast::BinOp::kGt: return ExprOp::kGt;
    case ast::BinOp::kGe: return ExprOp::kGe;
    case ast::BinOp::kEq: return ExprOp::kEq;
    case ast::BinOp::kNe: return ExprOp::kNe;
    case ast::BinOp::kAdd: return ExprOp::kAdd;
    case ast::BinOp::kSub: return ExprOp::kSub;
    case ast::BinOp::kMul: return ExprOp::kMul;
    case ast::BinOp::kDiv: return ExprOp::kDiv;
    default: return ExprOp::kIn;
  }
}

const char* op_word(ast::BinOp op) {
  switch (op) {
    case ast::BinOp::kOr: return "or";
    case ast::BinOp::kAnd: return "and";
    case ast::BinOp::kIn: return "in";
    case ast::BinOp::kNotIn: return "not in";
    case ast::BinOp::kMatch: return "~";
    default: return "?";
  }
}

const std::vector<std::string>& function_names() {
  static const std::vector<std::string> v = {"count",    "rate", "sum",      "min",          "max", "mean",
                                             "quantile", "abs",  "p50",      "p90",          "p95", "p99",
                                             "p999",     "time", "top_task", "top_task_time"};
  return v;
}

std::string number_key(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

TExpr Resolver::bad(int pos, int end) {
  TExpr t;
  t.ty = Ty::kUnknown;
  t.file = &file;
  t.pos = pos;
  t.end = end;
  return t;
}

TExpr Resolver::resolve(const ast::Expr& e) {
  if (e.rest.size() > kMaxOperators) {
    m.error_at(file, e, "E0004",
               "expression has " + std::to_string(e.rest.size()) + " operators; the limit is " +
                   std::to_string(kMaxOperators),
               "split it with `let` or `def`");
    return bad(e.id_first, e.id_last);
  }
  std::vector<TExpr> vals;
  std::vector<ast::BinOp> ops;
  vals.push_back(unary(e.first));
  auto reduce = [&] {
    const ast::BinOp op = ops.back();
    ops.pop_back();
    TExpr b = std::move(vals.back());
    vals.pop_back();
    TExpr a = std::move(vals.back());
    vals.pop_back();
    TExpr out;
    out.file = a.file == b.file ? a.file : &file;
    out.pos = a.file == &file ? a.pos : e.id_first;
    out.end = b.file == &file ? b.end : e.id_last;
    out.from_not = false;
    if (--budget < 0) {
      vals.push_back(bad(out.pos, out.end));
      return;
    }
    if (a.ty == Ty::kUnknown && a.op == ExprOp::kConst && a.args.empty() && a.name.empty() && !a.literal) {
      // keep going with the unknown operand: its error is already reported
    }
    // Stack patterns: `stack ~ "glob"` / `site ~ ["glob", ...]`, and nothing else with them.
    auto bare = [](const TExpr& x) {
      return (x.op == ExprOp::kStackMatch || x.op == ExprOp::kSiteMatch) && x.patterns.empty();
    };
    if (op == ast::BinOp::kMatch) {
      if (!bare(a)) {
        if (a.ty != Ty::kUnknown)
          m.error(*a.file, a.pos, a.end, "E0217",
                  "`~` matches `stack` or `site` against frame patterns, found " + std::string(ty_name(a.ty)),
                  "write `stack ~ \"*.item*\"` (any frame) or `site ~ \"train.py:*\"` (the call site)");
        vals.push_back(bad(out.pos, out.end));
        return;
      }
      std::vector<std::string> pats;
      bool ok = true;
      if (b.ty == Ty::kString && b.op == ExprOp::kConst) {
        pats.push_back(b.name);
      } else if (b.ty == Ty::kList) {
        for (const auto& item : b.args)
          if (item.ty == Ty::kString) pats.push_back(item.name);
          else ok = false;
        if (pats.empty()) ok = false;
      } else {
        ok = false;
      }
      if (!ok) {
        if (b.ty != Ty::kUnknown)
          m.error(*b.file, b.pos, b.end, "E0217",
                  "`~` needs a pattern string or a list of pattern strings on its right, found " +
                      (b.ty == Ty::kList ? std::string("a list with other values") : std::string(ty_name(b.ty))),
                  "patterns are globs over frame text (`train.py:142 in forward`): `*` any text, `?` one character");
        vals.push_back(bad(out.pos, out.end));
        return;
      }
      out.op = a.op;
      out.ty = Ty::kBool;
      out.patterns = std::move(pats);
      vals.push_back(std::move(out));
      return;
    }
    if (bare(a) || bare(b)) {
      const TExpr& s = bare(a) ? a : b;
      m.error(*s.file, s.pos, s.end, "E0217", "`" + text_of(*s.file, s.pos, s.end) + "` can only be matched with `~`",
              "write `" + text_of(*s.file, s.pos, s.end) + " ~ \"pattern\"`");
      vals.push_back(bad(out.pos, out.end));
      return;
    }
    const ExprOp eop = to_expr_op(op);
    if ((a.from_not || b.from_not) && op != ast::BinOp::kAnd && op != ast::BinOp::kOr) {
      const TExpr& n = a.from_not ? a : b;
      m.error(*n.file, n.pos, n.end, "E0311", "`not` applies only to the operand right after it",
              "write `not (" +
                  text_of(*n.file, n.args.empty() ? n.pos : n.args[0].pos, n.args.empty() ? n.end : n.args[0].end) +
                  " ...)`");
      vals.push_back(bad(out.pos, out.end));
      return;
    }
    if (is_comparison(eop) &&
        (is_comparison(a.op) || (op != ast::BinOp::kIn && op != ast::BinOp::kNotIn && is_comparison(b.op)))) {
      m.error(*out.file, out.pos, out.end, "E0310", "comparisons cannot be chained",
              "combine them with `and`: `a < b and b < c`");
      vals.push_back(bad(out.pos, out.end));
      return;
    }
    if (op == ast::BinOp::kIn || op == ast::BinOp::kNotIn) {
      if (b.ty != Ty::kList) {
        if (b.ty != Ty::kUnknown)
          m.error(*b.file, b.pos, b.end, "E0308",
                  std::string("`") + op_word(op) + "` needs a list on its right, found " + ty_name(b.ty),
                  "write `x in [a, b]` or name a `list`");
        vals.push_back(bad(out.pos, out.end));
        return;
      }
      out.op = ExprOp::kIn;
      out.args.push_back(std::move(a));
      for (auto& item : b.args) out.args.push_back(std::move(item));
      if (op == ast::BinOp::kNotIn) {
        TExpr n;
        n.op = ExprOp::kNot;
        n.file = out.file;
        n.pos = out.pos;
        n.end = out.end;
        n.args.push_back(std::move(out));
        vals.push_back(std::move(n));
      } else {
        vals.push_back(std::move(out));
      }
      return;
    }
    out.op = eop;
    out.args.push_back(std::move(a));
    out.args.push_back(std::move(b));
    vals.push_back(std::move(out));
  };
  for (const auto& o : e.rest) {
    while (!ops.empty() && precedence(ops.back()) >= precedence(o.op)) reduce();
    ops.push_back(o.op);
    vals.push_back(unary(o.operand));
  }
  while (!ops.empty()) reduce();
  TExpr r = std::move(vals.back());
  if (r.file == &file && !e.rest.empty()) {
    r.pos = e.id_first;
    r.end = e.id_last;
  }
  return r;
}

TExpr Resolver::unary(const ast::Unary& u) {
  if (u.ops.size() > kMaxUnaryOps) {
    m.error_at(file, u, "E0004", "more than " + std::to_string(kMaxUnaryOps) + " prefix operators");
    return bad(u.id_first, u.id_last);
  }
  TExpr t = primary(u.operand);
  for (size_t i = u.ops.size(); i-- > 0;) {
    if (--budget < 0) return bad(u.id_first, u.id_last);
    if (u.ops[i] == ast::UnOp::kNeg && t.op == ExprOp::kConst && t.ty != Ty::kUnknown) {
      t.value = -t.value;
      t.pos = u.id_first;
      continue;
    }
    TExpr n;
    n.op = u.ops[i] == ast::UnOp::kNeg ? ExprOp::kNeg : ExprOp::kNot;
    n.from_not = u.ops[i] == ast::UnOp::kNot;
    n.file = &file;
    n.pos = u.id_first;
    n.end = u.id_last;
    n.args.push_back(std::move(t));
    t = std::move(n);
  }
  return t;
}

TExpr Resolver::primary(const ast::Primary& p) {
  if (--budget < 0) {
    if (budget == -1)
      m.error(file, 0, 0, "E0004", "expressions are too large (more than 4096 nodes after inlining defs)");
    TExpr t;
    t.file = &file;
    return t;
  }
  struct V {
    Resolver& r;
    TExpr operator()(const ast::Number& n) const { return r.number(n); }
    TExpr operator()(const ast::String& s) const {
      TExpr t;
      t.ty = Ty::kString;
      t.name = s.value;
      t.file = &r.file;
      t.pos = s.id_first;
      t.end = s.id_last;
      return t;
    }
    TExpr operator()(const ast::List& l) const { return r.list(l); }
    TExpr operator()(const ast::Call& c) const { return r.call(c); }
    TExpr operator()(const ast::Path& p) const { return r.name(p); }
    TExpr operator()(const ast::x3::forward_ast<ast::Expr>& e) const {
      TExpr t = r.resolve(e.get());
      t.from_not = false;  // parenthesised
      return t;
    }
  };
  return boost::apply_visitor(V{*this}, p.get());
}

TExpr Resolver::number(const ast::Number& n) {
  TExpr t;
  t.file = &file;
  t.pos = n.id_first;
  t.end = n.id_last;
  double scale = 1;
  Ty ty = Ty::kNumber;
  Unit unit = Unit::kNone;
  if (!parse_unit_suffix(n.unit, scale, ty, unit)) {
    std::string hint = did_you_mean(n.unit, unit_suffixes());
    if (hint.empty()) hint = "units are ns, us, ms, s, m, h, B, KB, MB, GB, KiB, MiB, GiB, % and x";
    m.error_at(file, n, "E0307", "unknown unit `" + n.unit + "`", hint);
    return t;
  }
  t.value = n.value * scale;
  if (!std::isfinite(t.value) || std::fabs(t.value) > 1e300) {
    m.error_at(file, n, "E0307", "number out of range");
    return t;
  }
  t.ty = ty;
  t.unit = unit;
  t.literal = true;
  return t;
}

TExpr Resolver::list(const ast::List& l) {
  TExpr t;
  t.file = &file;
  t.pos = l.id_first;
  t.end = l.id_last;
  if (l.items.size() > kMaxListItems) {
    m.error_at(file, l, "E0004", "list has more than " + std::to_string(kMaxListItems) + " items");
    return t;
  }
  t.ty = Ty::kList;
  for (const auto& item : l.items) t.args.push_back(resolve_atom(item, Ty::kUnknown));
  return t;
}

TExpr Resolver::resolve_atom(const ast::Atom& a, Ty) {
  struct V {
    Resolver& r;
    TExpr operator()(const ast::Number& n) const { return r.number(n); }
    TExpr operator()(const ast::String& s) const {
      TExpr t;
      t.ty = Ty::kString;
      t.name = s.value;
      t.file = &r.file;
      t.pos = s.id_first;
      t.end = s.id_last;
      return t;
    }
    TExpr operator()(const ast::Ident& id) const {
      ast::Path p;
      p.head = id;
      p.id_first = id.id_first;
      p.id_last = id.id_last;
      return r.name(p);
    }
  };
  return boost::apply_visitor(V{*this}, a.get());
}

TExpr Resolver::name(const ast::Path& p) {
  TExpr t;
  t.file = &file;
  t.pos = p.id_first;
  t.end = p.id_last;
  const std::string& head = p.head.name;
  const bool row = ctx == Ctx::kRow || ctx == Ctx::kTail;
  // `stack` (any frame) and `site` (the call site) of the event's stack: operands of `~` only.
  if (!p.member && (head == "stack" || head == "site") && !(row && slots && slots->count(head)) &&
      !find_param(file, head)) {
    if (ctx != Ctx::kEvent) {
      m.error_at(file, p, "E0206", "`" + head + "` (the event's stack) is only available in `where`",
                 "filter the stream: `from cuda where " + head + " ~ \"pattern\"`");
      return t;
    }
    t.op = head == "stack" ? ExprOp::kStackMatch : ExprOp::kSiteMatch;
    t.ty = Ty::kString;
    return t;
  }
  if (p.member) {
    const std::string full = head + "." + p.member->name;
    if (row && slots && slots->count(full)) {
      t.op = ExprOp::kRef;
      t.name = full;
      return t;
    }
    std::vector<std::string> cands;
    if (slots) cands.assign(slots->begin(), slots->end());
    std::string hint = did_you_mean(full, cands);
    if (!row) hint = "row values such as `" + full + "` are not available in `where` or params";
    m.error_at(file, p, "E0201", "unknown name `" + full + "`", hint);
    return t;
  }
  Field f;
  Ty fty;
  const bool is_field = find_event_field(head, f, fty);
  if (ctx == Ctx::kTail && is_field) {
    t.op = ExprOp::kField;
    t.field = f;
    t.ty = fty;
    return t;
  }
  if (row && slots && slots->count(head)) {
    t.op = ExprOp::kRef;
    t.name = head;
    return t;
  }
  if (is_field) {
    if (ctx == Ctx::kEvent) {
      t.op = ExprOp::kField;
      t.field = f;
      t.ty = fty;
      return t;
    }
    if (ctx == Ctx::kRow) {
      m.error_at(file, p, "E0206", "event field `" + head + "` is not available after `window`",
                 "aggregate it, e.g. `max(" + head + ")` or `p99(" + head + ")`, or add it to `by`");
      return t;
    }
  }
  if (const TExpr* v = find_param(file, head)) {
    TExpr c = *v;
    c.file = &file;
    c.pos = p.id_first;
    c.end = p.id_last;
    return c;
  }
  const FileUnit* where = nullptr;
  if (const ast::Def* d = find_def(file, head, &where)) {
    if (active_defs.count(head)) {
      m.error_at(file, p, "E0113", "def `" + head + "` refers to itself");
      return t;
    }
    Resolver sub{m, const_cast<FileUnit&>(*where), rule, ctx, slots, active_defs, budget};
    sub.active_defs.insert(head);
    TExpr r = sub.resolve(d->value);
    budget = sub.budget;
    return r;
  }
  if (const ast::ListDecl* l = find_list(file, head, &where)) {
    Resolver sub{m, const_cast<FileUnit&>(*where), rule, ctx, slots, active_defs, budget};
    TExpr r = sub.list(l->value);
    budget = sub.budget;
    r.file = &file;
    r.pos = p.id_first;
    r.end = p.id_last;
    return r;
  }
  if (const OpInfo* info = find_op(head)) {
    t.ty = Ty::kOp;
    t.ops.emplace_back(info->source, info->op);
    t.value = info->op;
    return t;
  }
  if (head != "offcpu") {
    if (auto s = find_source(head)) {
      t.ty = Ty::kSource;
      t.value = static_cast<double>(*s);
      return t;
    }
  }
  OffCpuState st;
  if (find_state(head, st)) {
    t.ty = Ty::kState;
    t.value = static_cast<double>(st);
    return t;
  }
  std::vector<std::string> cands = scope_names(file);
  if (slots) cands.insert(cands.end(), slots->begin(), slots->end());
  if (ctx != Ctx::kRow) {
    auto fields = event_field_names();
    cands.insert(cands.end(), fields.begin(), fields.end());
  }
  for (const auto& op : all_ops()) cands.emplace_back(op.name);
  for (const auto& s : state_names()) cands.push_back(s);
  std::string hint = did_you_mean(head, cands);
  // After a syntax error in the rule, a missing name is most likely defined by the broken clause.
  if (!(rule && rule->rule->syntax_error)) m.error_at(file, p, "E0201", "unknown name `" + head + "`", hint);
  return t;
}

// Slice buckets by name (operators/time_accounting.h acct::), and the groups a rule may name.
uint32_t bucket_mask(const std::string& name) {
  for (uint8_t b = 0; b < acct::kBuckets; ++b)
    if (name == acct::bucket_name(b)) return 1u << b;
  auto bits = [](std::initializer_list<uint8_t> bs) {
    uint32_t m = 0;
    for (uint8_t b : bs) m |= 1u << b;
    return m;
  };
  if (name == "calls")
    return bits({acct::kLaunch, acct::kCopy, acct::kSync, acct::kAlloc, acct::kCollective, acct::kOtherCall});
  if (name == "blocked") return bits({acct::kLock, acct::kIo, acct::kNetwork, acct::kSleep, acct::kBlockedOther});
  if (name == "all") return (1u << acct::kBuckets) - 1;
  return 0;
}

std::vector<std::string> bucket_names() {
  std::vector<std::string> v;
  for (uint8_t b = 0; b < acct::kBuckets; ++b) v.emplace_back(acct::bucket_name(b));
  v.insert(v.end(), {"calls", "blocked", "all"});
  return v;
}

// time(b, ...), top_task(b, ...), top_task_time(b, ...): aggregates of an accounting stream.
TExpr Resolver::bucket_call(const ast::Call& c) {
  TExpr t;
  t.file = &file;
  t.pos = c.id_first;
  t.end = c.id_last;
  const std::string& fn = c.fn.name;
  if (!per_window(c)) return t;
  if (!rule->stream.account) {
    m.error_at(file, c.fn, "E0207", "`" + fn + "(...)` reads the time of feeding threads: it needs `from accounting`",
               "write the rule `from accounting` (docs/rules.md, \"Rules over time\")");
    return t;
  }
  if (c.args.empty()) {
    m.error_at(file, c, "E0205", "`" + fn + "` takes one or more time buckets, e.g. `" + fn + "(preempted)`");
    return t;
  }
  AggSpec spec;
  spec.kind = fn == "time" ? AggKind::kTime : fn == "top_task" ? AggKind::kTopTask : AggKind::kTopTaskTime;
  spec.field = Field::kDuration;
  std::string names;
  for (const auto& a : c.args) {
    const ast::Path* path = nullptr;
    if (a.rest.empty() && a.first.ops.empty()) path = boost::get<ast::Path>(&a.first.operand.get());
    const uint32_t bits = path && !path->member ? bucket_mask(path->head.name) : 0;
    if (!bits) {
      m.error_at(file, a, "E0208",
                 "expected a time bucket (" + std::string("preempted, on_cpu, calls, launch, sync, ") +
                     "blocked, lock, io, network, sleep, unknown, ...)",
                 path ? did_you_mean(path->head.name, bucket_names()) : "");
      return t;
    }
    spec.buckets |= bits;
    names += "_" + path->head.name;
  }
  t.ty = spec.kind == AggKind::kTopTask ? Ty::kId : Ty::kDuration;
  return aggregate_ref(c, std::move(t), spec, "_" + fn + names, true);
}

TExpr Resolver::call(const ast::Call& c) {
  TExpr t;
  t.file = &file;
  t.pos = c.id_first;
  t.end = c.id_last;
  const std::string& fn = c.fn.name;
  auto arity = [&](size_t lo, size_t hi) {
    if (c.args.size() < lo || c.args.size() > hi) {
      std::string want = lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
      m.error_at(file, c, "E0205",
                 "`" + fn + "` takes " + want + " argument" + (hi == 1 ? "" : "s") + ", found " +
                     std::to_string(c.args.size()));
      return false;
    }
    return true;
  };
  // Scalar functions.
  if (fn == "abs" || ((fn == "min" || fn == "max") && c.args.size() >= 2)) {
    if (fn == "abs" && !arity(1, 1)) return t;
    if (c.args.size() > 16) {
      arity(2, 16);
      return t;
    }
    t.op = fn == "abs" ? ExprOp::kAbs : fn == "min" ? ExprOp::kMin : ExprOp::kMax;
    for (const auto& a : c.args) t.args.push_back(resolve(a));
    return t;
  }
  // Aggregates.
  AggSpec spec;
  bool needs_field = true;
  if (fn == "time" || fn == "top_task" || fn == "top_task_time") return bucket_call(c);
  if (fn == "count") spec.kind = AggKind::kCount, needs_field = false;
  else if (fn == "rate") spec.kind = AggKind::kRate, needs_field = false;
  else if (fn == "sum") spec.kind = AggKind::kSum;
  else if (fn == "min") spec.kind = AggKind::kMin;
  else if (fn == "max") spec.kind = AggKind::kMax;
  else if (fn == "mean") spec.kind = AggKind::kMean;
  else if (fn == "quantile") spec.kind = AggKind::kQuantile;
  else if (fn.size() >= 3 && fn[0] == 'p' && fn.find_first_not_of("0123456789", 1) == std::string::npos &&
           fn.size() <= 4) {
    spec.kind = AggKind::kQuantile;
    const double digits = std::stod(fn.substr(1));
    spec.q = fn.size() == 4 ? digits / 1000.0 : digits / 100.0;
    if (!(spec.q > 0 && spec.q <= 1)) {
      m.error_at(file, c.fn, "E0306", "`" + fn + "` is not a quantile between p1 and p100");
      return t;
    }
  } else {
    m.error_at(file, c.fn, "E0204", "unknown function `" + fn + "`", did_you_mean(fn, function_names()));
    return t;
  }
  if (!per_window(c)) return t;
  const size_t want = !needs_field ? 0 : (fn == "quantile" ? 2 : 1);
  if (!arity(want, want)) return t;
  Ty fty = Ty::kNumber;
  if (needs_field) {
    const ast::Expr& a = c.args[0];
    const ast::Path* path = nullptr;
    if (a.rest.empty() && a.first.ops.empty()) path = boost::get<ast::Path>(&a.first.operand.get());
    Field f;
    if (!path || path->member || !find_event_field(path->head.name, f, fty)) {
      m.error_at(file, a, "E0208", "`" + fn + "` aggregates an event field, e.g. `" + fn + "(duration)`",
                 path ? did_you_mean(path->head.name, event_field_names()) : "");
      return t;
    }
    if (fty != Ty::kDuration && fty != Ty::kBytes && fty != Ty::kNumber) {
      m.error_at(file, a, "E0208", "cannot aggregate `" + path->head.name + "`: it is " + ty_name(fty),
                 "aggregate duration, bytes, arg0, arg1 or ret");
      return t;
    }
    spec.field = f;
    if (fn == "quantile") {
      Resolver sub{m, file, rule, Ctx::kConst, nullptr, active_defs, budget};
      TExpr q = sub.resolve(c.args[1]);
      if (q.ty == Ty::kUnknown) return t;
      if (q.op != ExprOp::kConst || (q.ty != Ty::kNumber && q.ty != Ty::kRatio) || !(q.value > 0 && q.value <= 1)) {
        m.error_at(file, c.args[1], "E0306", "the quantile must be a number in (0, 1], e.g. 0.99 or 99%");
        return t;
      }
      spec.q = q.value;
    }
  }
  // Name: the let's own name when the call is the whole value, else a hidden `_...` name.
  std::string key = std::string(agg_name(spec.kind)) + "/" + field_name(spec.field) + "/" + number_key(spec.q);
  std::string hidden = "_" + std::string(spec.kind == AggKind::kQuantile ? "p" + number_key(spec.q * 100)
                                                                         : agg_name(spec.kind));
  if (needs_field) hidden += "_" + std::string(field_name(spec.field));
  t.ty = spec.kind == AggKind::kCount ? Ty::kCount : spec.kind == AggKind::kRate ? Ty::kRate : fty;
  return aggregate_ref(c, std::move(t), spec, hidden, needs_field);
}

// An aggregate is computed per window: only in a rule's row or tail expressions (E0207 otherwise).
bool Resolver::per_window(const ast::Call& c) {
  if (rule && (ctx == Ctx::kRow || ctx == Ctx::kTail)) return true;
  m.error_at(file, c, "E0207", "aggregate `" + c.fn.name + "(...)` is computed per window and is not available here",
             "use it in `let`, `require` or `severity`");
  return false;
}

// `t` (typed) as a reference to the rule's aggregate `spec`: the one already there when an equal
// spec exists (same kind, q, buckets and, when `by_field`, field), else a new one named after the
// let it is the whole value of, or `hidden`.
TExpr Resolver::aggregate_ref(const ast::Call& c, TExpr t, AggSpec spec, const std::string& hidden, bool by_field) {
  t.op = ExprOp::kRef;
  for (const auto& a : rule->aggs)
    if (a.kind == spec.kind && (!by_field || a.field == spec.field) && a.q == spec.q && a.buckets == spec.buckets) {
      t.name = a.name;
      return t;
    }
  if (rule->aggs.size() >= kMaxAggs) {
    m.error_at(file, c, "E0004", "more than " + std::to_string(kMaxAggs) + " aggregates in one rule");
    return t;
  }
  spec.name = !agg_alias.empty() ? agg_alias : hidden;
  agg_alias.clear();
  rule->aggs.push_back(spec);
  t.name = spec.name;
  return t;
}

// ---------------------------------------------------------------------------------------------

namespace {

void resolve_stream(Module& m, RuleSema& r, const ast::Stream& s, StreamSpec& out) {
  FileUnit& f = *r.file;
  out.node = &s;
  for (const auto& src : s.sources) {
    if (src.name == "offcpu") {
      out.offcpu = true;
      continue;
    }
    if (src.name == "accounting") {
      out.account = true;
      continue;
    }
    if (src.name == "steps") {
      out.steps = true;
      continue;
    }
    if (auto id = find_source(src.name)) {
      out.sources.push_back(*id);
      continue;
    }
    std::vector<std::string> cands = {"offcpu", "accounting", "steps"};
    for (const auto& si : all_sources()) {
      std::string n(si.name);
      for (char& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      cands.push_back(n);
    }
    m.error_at(f, src, "E0202", "unknown event source `" + src.name + "`", did_you_mean(src.name, cands));
    r.broken = true;
  }
  if ((out.offcpu || out.account || out.steps) && s.sources.size() > 1) {
    m.error_at(f, s.sources[1], "E0202",
               std::string("`") +
                   (out.offcpu    ? "offcpu"
                    : out.account ? "accounting"
                                  : "steps") +
                   "` is a stream of its own and cannot be combined with other sources");
    r.broken = true;
  }
  if (s.states) {
    if (!out.offcpu) {
      m.error_at(f, *s.states, "E0209", "`states` applies only to `offcpu` streams");
    }
    for (const auto& item : s.states->items) {
      const auto* id = boost::get<ast::Ident>(&item.get());
      OffCpuState st;
      if (!id || !find_state(id->name, st)) {
        const int pos = id ? id->id_first : s.states->id_first;
        const int end = id ? id->id_last : s.states->id_last;
        m.error(f, pos, end, "E0208",
                "expected an off-CPU state (" + std::string("unknown, preempted, sleeping, disk_wait, other)"),
                id ? did_you_mean(id->name, state_names()) : "");
        continue;
      }
      out.offcpu_node.states.push_back(st);
    }
  }
  if (s.min) {
    if (!out.offcpu) m.error_at(f, *s.min, "E0209", "`min` applies only to `offcpu` streams");
    Resolver res{m, f, &r, Ctx::kConst};
    TExpr v = res.resolve_atom(ast::Atom(*s.min), Ty::kDuration);
    if (v.ty == Ty::kDuration && v.value >= 0) out.offcpu_node.min_ns = static_cast<uint64_t>(v.value);
    else if (v.ty != Ty::kUnknown) m.error_at(f, *s.min, "E0302", "`min` needs a duration", "write e.g. `min 100us`");
  }
  if (s.where) {
    Resolver res{m, f, &r, Ctx::kEvent};
    out.where = res.resolve(*s.where);
  }
}

bool duration_of(Module& m, RuleSema& r, const ast::Number& n, const char* what, uint64_t& out) {
  Resolver res{m, *r.file, &r, Ctx::kConst};
  TExpr v = res.resolve_atom(ast::Atom(n), Ty::kDuration);
  if (v.ty == Ty::kUnknown) return false;
  if (v.ty != Ty::kDuration) {
    m.error_at(*r.file, n, "E0302", std::string(what) + " needs a duration, found " + ty_name(v.ty),
               "add a unit: ns, us, ms, s, m or h");
    return false;
  }
  if (v.value < 1 || v.value > 1e15) {
    m.error_at(*r.file, n, "E0305", std::string(what) + " must be between 1ns and 11 days");
    return false;
  }
  out = static_cast<uint64_t>(v.value);
  return true;
}

bool number_of(Module& m, RuleSema& r, const ast::Number& n, double& out, Ty& ty) {
  Resolver res{m, *r.file, &r, Ctx::kConst};
  TExpr v = res.resolve_atom(ast::Atom(n), Ty::kNumber);
  if (v.ty == Ty::kUnknown) return false;
  out = v.value;
  ty = v.ty;
  return true;
}

bool pick(Module& m, FileUnit& f, const ast::Ident& id, const std::vector<std::string>& allowed, const char* what) {
  if (std::find(allowed.begin(), allowed.end(), id.name) != allowed.end()) return true;
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i) list += (i ? ", " : "") + allowed[i];
  std::string hint = did_you_mean(id.name, allowed);
  if (hint.empty()) hint = std::string("expected one of: ") + list;
  m.error_at(f, id, "E0210", std::string("unknown ") + what + " `" + id.name + "`", hint);
  return false;
}

void define(Module& m, RuleSema& r, std::set<std::string>& slots, const ast::Ident& id, const std::string& name) {
  if (slots.count(name)) {
    m.error_at(*r.file, id, "E0212", "`" + name + "` is already defined in this rule", "pick another name");
    return;
  }
  slots.insert(name);
}

}  // namespace

void pass_names(Module& m) {
  for (auto& r : m.rules) {
    if (!r.from || !r.window) continue;
    FileUnit& f = *r.file;
    resolve_stream(m, r, r.from->stream, r.stream);

    // Window.
    const auto& w = *r.window;
    std::set<std::string> slots;
    if (pick(m, f, w.kind, {"tumbling", "sliding", "whole", "steps"}, "window kind")) {
      auto& wn = r.window_node;
      wn.kind = w.kind.name == "tumbling"  ? WindowKind::kTumbling
                : w.kind.name == "sliding" ? WindowKind::kSliding
                : w.kind.name == "steps"   ? WindowKind::kSteps
                                           : WindowKind::kWhole;
      if (wn.kind == WindowKind::kSteps) {
        // `window steps N`: N steps of each key's process, over `from steps` only.
        double n = 0;
        Ty ty = Ty::kUnknown;
        if (!r.stream.steps) {
          m.error_at(f, w.kind, "E0305", "a `steps` window reads the `steps` stream",
                     "write `from steps` (docs/rules.md, \"Rules over steps\"), or a `tumbling` window");
          r.broken = true;
        } else if (!w.size) {
          m.error_at(f, w.kind, "E0305", "a `steps` window needs a number of steps", "e.g. `window steps 20`");
          r.broken = true;
        } else if (number_of(m, r, *w.size, n, ty) &&
                   (ty != Ty::kNumber || n < 1 || n > 100000 || n != std::floor(n))) {
          m.error_at(f, *w.size, "E0305", "a `steps` window holds a whole number of steps, 1 to 100000",
                     "e.g. `window steps 20` (no unit)");
          r.broken = true;
        } else {
          wn.steps = static_cast<uint32_t>(n);
          wn.size_ns = wn.slide_ns = 0;
        }
        if (w.slide) m.error_at(f, *w.slide, "E0305", "`every` applies only to `sliding` windows");
      } else if (r.stream.steps) {
        m.error_at(f, w.kind, "E0305", "the `steps` stream is windowed by steps",
                   "write `window steps N` (steps come out once settled, late for time windows)");
        r.broken = true;
      } else if (wn.kind == WindowKind::kWhole) {
        if (w.size) m.error_at(f, *w.size, "E0305", "a `whole` window takes no size");
      } else if (!w.size) {
        m.error_at(f, w.kind, "E0305", "a `" + w.kind.name + "` window needs a size", "e.g. `window tumbling 10s`");
        r.broken = true;
      } else if (duration_of(m, r, *w.size, "the window size", wn.size_ns)) {
        wn.slide_ns = wn.size_ns;
      } else {
        r.broken = true;
      }
      if (wn.kind == WindowKind::kSliding) {
        if (!w.slide) {
          m.error_at(f, w.kind, "E0305", "a `sliding` window needs `every DURATION`",
                     "e.g. `window sliding 10s every 2s`");
          r.broken = true;
        } else if (!duration_of(m, r, *w.slide, "`every`", wn.slide_ns)) {
          r.broken = true;
        }
      } else if (w.slide) {
        m.error_at(f, *w.slide, "E0305", "`every` applies only to `sliding` windows");
      }
    } else {
      r.broken = true;
    }
    for (const auto& key : w.keys) {
      if (!pick(m, f, key, {"pid", "tid", "op", "source", "node", "rank", "site"}, "window key")) continue;
      Field fk = Field::kSite;  // `site`: the call site of the event's stack (docs/rules.md)
      if (key.name != "site") parse_field(key.name, fk);
      if (std::find(r.window_node.keys.begin(), r.window_node.keys.end(), fk) != r.window_node.keys.end()) {
        m.error_at(f, key, "E0212", "`" + key.name + "` is listed twice in `by`");
        continue;
      }
      r.window_node.keys.push_back(fk);
      slots.insert(key.name);
    }
    for (const char* s : {"window.start", "window.end", "window.events"}) slots.insert(s);

    // Pipeline steps, in order.
    for (auto& s : r.steps) {
      switch (s.kind) {
        case Step::Kind::kLet:
          for (const auto& b : s.let->bindings) {
            Resolver res{m, f, &r, Ctx::kRow, &slots};
            const bool bare_call = b.value.rest.empty() && b.value.first.ops.empty() &&
                                   boost::get<ast::Call>(&b.value.first.operand.get()) != nullptr;
            if (bare_call && !slots.count(b.name.name)) res.agg_alias = b.name.name;
            TExpr v = res.resolve(b.value);
            const bool became_slot = v.op == ExprOp::kRef && v.name == b.name.name;
            define(m, r, slots, b.name, b.name.name);
            if (!became_slot) s.lets.emplace_back(b.name.name, std::move(v));
          }
          break;
        case Step::Kind::kRequire: {
          Resolver res{m, f, &r, Ctx::kRow, &slots};
          s.pred = res.resolve(s.require->pred);
          s.label = text_of(f, s.require->pred.id_first, s.require->pred.id_last);
          break;
        }
        case Step::Kind::kJoin: {
          const auto& j = *s.join;
          resolve_stream(m, r, j.stream, s.right);
          auto& jn = s.join_node;
          jn.name = j.name.name;
          if (pick(m, f, j.key, {"tid", "pid", "host"}, "join key"))
            jn.key = j.key.name == "tid" ? JoinKey::kTid : j.key.name == "pid" ? JoinKey::kPid : JoinKey::kNone;
          if (pick(m, f, j.mode, {"overlapping", "within"}, "join mode")) {
            jn.kind = j.mode.name == "within" ? JoinKind::kWithin : JoinKind::kOverlap;
            if (jn.kind == JoinKind::kWithin && !j.within)
              m.error_at(f, j.mode, "E0214", "`within` needs a duration", "e.g. `within 200ms`");
            if (jn.kind == JoinKind::kOverlap && j.within)
              m.error_at(f, *j.within, "E0214", "`overlapping` takes no duration", "use `within DURATION` instead");
            if (jn.kind == JoinKind::kWithin && j.within) {
              Resolver res{m, f, &r, Ctx::kConst};
              TExpr v = res.resolve_atom(ast::Atom(*j.within), Ty::kDuration);
              if (v.ty == Ty::kDuration && v.value >= 0) jn.within_ns = static_cast<uint64_t>(v.value);
              else if (v.ty != Ty::kUnknown)
                m.error_at(f, *j.within, "E0302", "`within` needs a duration, found " + std::string(ty_name(v.ty)),
                           "add a unit: ns, us, ms, s");
            }
          }
          {
            Resolver res{m, f, &r, Ctx::kTail, &slots};
            s.tail = res.resolve(j.tail);
          }
          jn.horizon_ns = 0;  // the bounds pass requires one (or derives it from `within`)
          for (const auto& o : j.options) {
            if (o.key.name == "horizon") {
              uint64_t h = 0;
              if (duration_of(m, r, o.value, "`horizon`", h)) jn.horizon_ns = h;
            } else if (o.key.name == "exemplars") {
              double v = 0;
              Ty ty;
              if (number_of(m, r, o.value, v, ty)) {
                if (ty != Ty::kNumber || v < 0 || v > 100 || v != std::floor(v))
                  m.error_at(f, o.value, "E0215", "`exemplars` must be a whole number from 0 to 100");
                else jn.max_exemplars = static_cast<uint32_t>(v);
              }
            } else {
              m.error_at(f, o.key, "E0215", "`" + o.key.name + "` is not an option of `join`",
                         "join options are `horizon` and `exemplars`");
            }
          }
          define(m, r, slots, j.name, j.name.name);
          slots.erase(j.name.name);
          for (const char* out :
               {"overlap_ns", "tail_ns", "share", "calls", "hit_calls", "events", "right_ns", "sum_arg0"})
            slots.insert(j.name.name + "." + out);
          break;
        }
        case Step::Kind::kTrend: {
          const auto& t = *s.trend;
          auto& tn = s.trend_node;
          if (!slots.count(t.value.name)) {
            std::vector<std::string> cands(slots.begin(), slots.end());
            m.error_at(f, t.value, "E0201", "unknown name `" + t.value.name + "`", did_you_mean(t.value.name, cands));
          }
          tn.value = t.value.name;
          if (pick(m, f, t.mode, {"rising", "below", "baseline"}, "trend mode")) {
            tn.mode = t.mode.name == "rising"  ? TrendMode::kRising
                      : t.mode.name == "below" ? TrendMode::kBelowPeak
                                               : TrendMode::kBaseline;
            if (tn.mode != TrendMode::kBelowPeak && t.factor)
              m.error_at(f, *t.factor, "E0216", "`" + t.mode.name + "` takes no factor");
            if (tn.mode == TrendMode::kBelowPeak) {
              double v = 0;
              Ty ty;
              if (!t.factor) {
                m.error_at(f, t.mode, "E0216", "`below` needs a factor of the peak", "e.g. `below 60% of peak`");
              } else if (number_of(m, r, *t.factor, v, ty)) {
                if ((ty != Ty::kRatio && ty != Ty::kNumber) || !(v > 0 && v < 1))
                  m.error_at(f, *t.factor, "E0216", "the factor must be a ratio between 0 and 1, e.g. 60%");
                else tn.factor = v;
              }
            }
          }
          double n = 0;
          Ty ty;
          if (number_of(m, r, t.windows, n, ty)) {
            if (ty != Ty::kNumber || n != std::floor(n) || n < 2 || n > 1000)
              m.error_at(f, t.windows, "E0504", "a trend spans 2 to 1000 windows");
            else tn.windows = static_cast<uint32_t>(n);
          }
          for (const char* out : {"trend.first", "trend.last", "trend.peak", "trend.change", "trend.median",
                                  "trend.mad", "trend.history"})
            slots.insert(out);
          break;
        }
        case Step::Kind::kPeer: {
          const auto& p = *s.peer;
          auto& pn = s.peer_node;
          if (!slots.count(p.value.name)) {
            std::vector<std::string> cands(slots.begin(), slots.end());
            m.error_at(f, p.value, "E0201", "unknown name `" + p.value.name + "`", did_you_mean(p.value.name, cands));
          }
          pn.value = p.value.name;
          if (pick(m, f, p.group, {"rank", "node", "pid", "tid"}, "peer group")) parse_field(p.group.name, pn.group);
          for (const auto& o : p.options) {
            double v = 0;
            Ty ty;
            if (o.key.name == "z") {
              if (number_of(m, r, o.value, v, ty)) {
                if (ty != Ty::kNumber || !(v > 0 && v <= 100))
                  m.error_at(f, o.value, "E0215", "`z` must be a number in (0, 100]");
                else pn.z = v;
              }
            } else if (o.key.name == "floor") {
              Resolver res{m, f, &r, Ctx::kConst};
              TExpr c = res.resolve_atom(ast::Atom(o.value), Ty::kUnknown);
              if (c.ty != Ty::kUnknown) pn.floor = c.value;
            } else if (o.key.name == "min_peers") {
              if (number_of(m, r, o.value, v, ty)) {
                if (ty != Ty::kNumber || v != std::floor(v) || v < 2 || v > 100000)
                  m.error_at(f, o.value, "E0215", "`min_peers` must be a whole number from 2 to 100000");
                else pn.min_peers = static_cast<uint32_t>(v);
              }
            } else {
              m.error_at(f, o.key, "E0215", "`" + o.key.name + "` is not an option of `peer`",
                         "peer options are `z`, `floor` and `min_peers`");
            }
          }
          for (const char* out : {"peer.median", "peer.mad", "peer.z", "peer.peers"}) slots.insert(out);
          break;
        }
      }
    }
    // Severity cases see every slot.
    if (r.severity) {
      const auto& cases = r.severity->cases;
      for (size_t i = 0; i < cases.size(); ++i) {
        SevCase sc;
        if (!parse_severity(cases[i].level.name, sc.level))
          m.error_at(f, cases[i].level, "E0211", "unknown severity `" + cases[i].level.name + "`",
                     did_you_mean(cases[i].level.name, {"low", "medium", "high"}).empty()
                         ? "severities are low, medium and high"
                         : did_you_mean(cases[i].level.name, {"low", "medium", "high"}));
        if (cases[i].when) {
          Resolver res{m, f, &r, Ctx::kRow, &slots};
          sc.when = res.resolve(*cases[i].when);
        } else if (i + 1 < cases.size()) {
          m.error_at(f, cases[i].level, "E0702", "a severity without `when` must be the last case",
                     "later cases could never be chosen");
        }
        r.sev_cases.push_back(std::move(sc));
      }
    }
    r.slot_order.assign(slots.begin(), slots.end());
  }
}

}  // namespace ingero::dsl
