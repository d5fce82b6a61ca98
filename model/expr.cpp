#include "model/expr.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>

namespace ingero {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct FieldName {
  Field field;
  const char* name;
  Unit unit;
};
constexpr FieldName kFields[] = {
    {Field::kTs, "ts", Unit::kNs},
    {Field::kDuration, "duration", Unit::kNs},
    {Field::kEnd, "end", Unit::kNs},
    {Field::kPid, "pid", Unit::kNone},
    {Field::kTid, "tid", Unit::kNone},
    {Field::kSource, "source", Unit::kNone},
    {Field::kOp, "op", Unit::kNone},
    {Field::kRet, "ret", Unit::kNone},
    {Field::kArg0, "arg0", Unit::kNone},
    {Field::kArg1, "arg1", Unit::kNone},
    {Field::kStackId, "stack_id", Unit::kNone},
    {Field::kCgroupId, "cgroup_id", Unit::kNone},
    {Field::kNode, "node", Unit::kNone},
    {Field::kRank, "rank", Unit::kNone},
    {Field::kPrevState, "prev_state", Unit::kNone},
    {Field::kGpuId, "gpu_id", Unit::kNone},
};

const char* op_text(ExprOp op) {
  switch (op) {
    case ExprOp::kAdd: return "+";
    case ExprOp::kSub: return "-";
    case ExprOp::kMul: return "*";
    case ExprOp::kDiv: return "/";
    case ExprOp::kLt: return "<";
    case ExprOp::kLe: return "<=";
    case ExprOp::kGt: return ">";
    case ExprOp::kGe: return ">=";
    case ExprOp::kEq: return "==";
    case ExprOp::kNe: return "!=";
    case ExprOp::kAnd: return "and";
    case ExprOp::kOr: return "or";
    case ExprOp::kMin: return "min";
    case ExprOp::kMax: return "max";
    case ExprOp::kAbs: return "abs";
    case ExprOp::kNeg: return "-";
    case ExprOp::kNot: return "not";
    default: return "?";
  }
}

std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e18) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

const char* unit_suffix(Unit u) {
  switch (u) {
    case Unit::kNs: return "ns";
    case Unit::kBytes: return "B";
    case Unit::kPercent: return "%";
    default: return "";
  }
}

}  // namespace

const char* field_name(Field f) {
  if (f == Field::kSite) return "site";  // a window key, not an event field (not parsed here)
  for (const auto& fn : kFields)
    if (fn.field == f) return fn.name;
  return "?";
}

bool parse_field(const std::string& name, Field& out) {
  for (const auto& fn : kFields)
    if (name == fn.name) {
      out = fn.field;
      return true;
    }
  return false;
}

Unit field_unit(Field f) {
  for (const auto& fn : kFields)
    if (fn.field == f) return fn.unit;
  return Unit::kNone;
}

std::string Expr::to_string() const {
  switch (op) {
    case ExprOp::kConst:
      if (unit == Unit::kPercent) return number_text(value * 100) + "%";
      return number_text(value) + unit_suffix(unit);
    case ExprOp::kField: return std::string("event.") + field_name(field);
    case ExprOp::kRef: return name;
    case ExprOp::kNeg:
    case ExprOp::kNot:
    case ExprOp::kAbs: return std::string(op_text(op)) + "(" + (args.empty() ? "" : args[0]->to_string()) + ")";
    case ExprOp::kMin:
    case ExprOp::kMax: {
      std::string s = std::string(op_text(op)) + "(";
      for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i]->to_string();
      return s + ")";
    }
    case ExprOp::kStackMatch:
    case ExprOp::kSiteMatch: {
      std::string s = op == ExprOp::kStackMatch ? "(stack ~ [" : "(site ~ [";
      for (size_t i = 0; i < patterns.size(); ++i) {
        s += i ? ", \"" : "\"";
        for (char c : patterns[i]) s += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
        s += '"';
      }
      return s + "])";
    }
    case ExprOp::kIn: {
      std::string s = "(" + (args.empty() ? std::string("?") : args[0]->to_string()) + " in [";
      for (size_t i = 0; i < set.size(); ++i) s += (i ? "," : "") + number_text(set[i]);
      return s + "])";
    }
    default:
      if (args.size() != 2) return "?";
      return "(" + args[0]->to_string() + " " + op_text(op) + " " + args[1]->to_string() + ")";
  }
}

bool Expr::uses_stacks() const {
  if (op == ExprOp::kStackMatch || op == ExprOp::kSiteMatch) return true;
  for (const auto& a : args)
    if (a && a->uses_stacks()) return true;
  return false;
}

bool glob_match(std::string_view p, std::string_view t) {
  // Greedy with one backtrack point (the last `*`): O(|p| x |t|), no recursion.
  size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && (p[pi] == '?' || (p[pi] != '*' && p[pi] == t[ti]))) {
      ++pi;
      ++ti;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

bool stack_matches(const Expr& e, const ParsedStack& st) {
  auto any_pattern = [&](const std::string& text) {
    for (const auto& p : e.patterns)
      if (glob_match(p, text)) return true;
    return false;
  };
  if (e.op == ExprOp::kSiteMatch) {
    const StackFrame* f = call_site(st);
    return f && any_pattern(frame_text(*f));
  }
  if (e.op == ExprOp::kStackMatch) {
    for (const auto& f : st.frames)
      if (any_pattern(frame_text(f))) return true;
  }
  return false;
}

void StackTable::sync(const std::map<uint64_t, StackTrace>& stacks) {
  {
    std::shared_lock lock(mu_);
    if (stacks_.size() >= stacks.size()) {
      bool all = true;
      for (const auto& [id, _] : stacks)
        if (!stacks_.count(id)) {
          all = false;
          break;
        }
      if (all) return;
    }
  }
  // Parse outside the lock; insert what is still missing.
  std::vector<std::pair<uint64_t, std::shared_ptr<const ParsedStack>>> fresh;
  {
    std::shared_lock lock(mu_);
    for (const auto& [id, st] : stacks)
      if (!stacks_.count(id)) fresh.emplace_back(id, nullptr);
  }
  for (auto& [id, p] : fresh) p = std::make_shared<const ParsedStack>(parse_stack(stacks.at(id)));
  std::unique_lock lock(mu_);
  for (auto& [id, p] : fresh) stacks_.emplace(id, std::move(p));
}

std::shared_ptr<const ParsedStack> StackTable::find(uint64_t id) const {
  std::shared_lock lock(mu_);
  const auto it = stacks_.find(id);
  return it == stacks_.end() ? nullptr : it->second;
}

size_t StackTable::size() const {
  std::shared_lock lock(mu_);
  return stacks_.size();
}

uint16_t StackTable::site_index(uint64_t stack_id) {
  const auto st = stack_id ? find(stack_id) : nullptr;
  const StackFrame* f = st ? call_site(*st) : nullptr;
  if (!f) return 0;
  std::string text = frame_text(*f);
  {
    std::shared_lock lock(mu_);
    if (const auto it = site_ids_.find(text); it != site_ids_.end()) return it->second;
  }
  std::unique_lock lock(mu_);
  if (const auto it = site_ids_.find(text); it != site_ids_.end()) return it->second;
  if (sites_.size() >= kOtherSites) return kOtherSites;
  const auto id = static_cast<uint16_t>(sites_.size());
  sites_.push_back(text);
  site_ids_.emplace(std::move(text), id);
  return id;
}

std::string StackTable::site_text(uint16_t index) const {
  if (index == kOtherSites) return "(other sites)";
  std::shared_lock lock(mu_);
  return index < sites_.size() ? sites_[index] : std::string("(no stack)");
}

double StackTable::site_value(uint16_t index) const {
  const std::string text = site_text(index);
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return static_cast<double>(h & ((uint64_t{1} << 53) - 1));
}

double eval(const Expr& e, const Event* ev, const double* row, const StackMatcher* stacks) {
  auto arg = [&](size_t i) { return i < e.args.size() ? eval(*e.args[i], ev, row, stacks) : kNaN; };
  switch (e.op) {
    case ExprOp::kStackMatch:
    case ExprOp::kSiteMatch: return (ev && stacks && ev->stack_id != 0 && stacks->match(e, ev->stack_id)) ? 1.0 : 0.0;
    case ExprOp::kConst: return e.value;
    case ExprOp::kField: return ev ? read_field(*ev, e.field) : kNaN;
    case ExprOp::kRef: return (row && e.slot >= 0) ? row[e.slot] : kNaN;
    case ExprOp::kNeg: return -arg(0);
    case ExprOp::kNot: {
      const double a = arg(0);
      return a != a ? kNaN : (a == 0.0 ? 1.0 : 0.0);
    }
    case ExprOp::kAbs: return std::fabs(arg(0));
    case ExprOp::kAdd: return arg(0) + arg(1);
    case ExprOp::kSub: return arg(0) - arg(1);
    case ExprOp::kMul: return arg(0) * arg(1);
    case ExprOp::kDiv: {
      const double d = arg(1);
      return d == 0.0 ? kNaN : arg(0) / d;
    }
    case ExprOp::kLt: return arg(0) < arg(1) ? 1.0 : 0.0;
    case ExprOp::kLe: return arg(0) <= arg(1) ? 1.0 : 0.0;
    case ExprOp::kGt: return arg(0) > arg(1) ? 1.0 : 0.0;
    case ExprOp::kGe: return arg(0) >= arg(1) ? 1.0 : 0.0;
    case ExprOp::kEq: return arg(0) == arg(1) ? 1.0 : 0.0;
    case ExprOp::kNe: {
      const double a = arg(0), b = arg(1);
      return (a == a && b == b && a != b) ? 1.0 : 0.0;
    }
    case ExprOp::kAnd: return truthy(arg(0)) && truthy(arg(1)) ? 1.0 : 0.0;
    case ExprOp::kOr: return truthy(arg(0)) || truthy(arg(1)) ? 1.0 : 0.0;
    case ExprOp::kIn: {
      const double a = arg(0);
      for (double v : e.set)
        if (a == v) return 1.0;
      return 0.0;
    }
    case ExprOp::kMin:
    case ExprOp::kMax: {
      double best = kNaN;
      for (size_t i = 0; i < e.args.size(); ++i) {
        const double v = arg(i);
        if (v != v) return kNaN;
        if (best != best || (e.op == ExprOp::kMin ? v < best : v > best)) best = v;
      }
      return best;
    }
  }
  return kNaN;
}

ExprPtr fold_source_op(const ExprPtr& e, Source source, uint8_t op) {
  if (!e) return e;
  switch (e->op) {
    case ExprOp::kField:
      if (e->field == Field::kSource) return ex::num(static_cast<double>(source));
      if (e->field == Field::kOp) return ex::num(op);
      return e;
    case ExprOp::kConst:
    case ExprOp::kRef:
    case ExprOp::kStackMatch:
    case ExprOp::kSiteMatch: return e;
    default: break;
  }
  std::vector<ExprPtr> args;
  args.reserve(e->args.size());
  bool changed = false, all_const = true;
  for (const auto& a : e->args) {
    args.push_back(fold_source_op(a, source, op));
    changed = changed || args.back() != a;
    all_const = all_const && args.back() && args.back()->op == ExprOp::kConst;
  }
  // `x or TRUE`, `x and FALSE`: decided by the constant side (eval reads both sides' truth only).
  if ((e->op == ExprOp::kOr || e->op == ExprOp::kAnd) && args.size() == 2)
    for (const auto& a : args)
      if (a && a->op == ExprOp::kConst && truthy(a->value) == (e->op == ExprOp::kOr))
        return ex::num(e->op == ExprOp::kOr ? 1.0 : 0.0);
  if (!changed && !all_const) return e;
  auto copy = std::make_shared<Expr>(*e);
  copy->args = std::move(args);
  if (all_const) return ex::num(eval(*copy, nullptr, nullptr), e->unit);
  return copy;
}

ExprPtr simplify_truth(const ExprPtr& e) {
  if (!e || (e->op != ExprOp::kAnd && e->op != ExprOp::kOr) || e->args.size() != 2) return e;
  ExprPtr a = simplify_truth(e->args[0]), b = simplify_truth(e->args[1]);
  // The operand that cannot decide: TRUE in an `and`, FALSE in an `or`.
  const bool neutral = e->op == ExprOp::kAnd;
  if (a && a->op == ExprOp::kConst && truthy(a->value) == neutral) return b;
  if (b && b->op == ExprOp::kConst && truthy(b->value) == neutral) return a;
  if (a == e->args[0] && b == e->args[1]) return e;
  auto copy = std::make_shared<Expr>(*e);
  copy->args = {a, b};
  return copy;
}

namespace ex {
ExprPtr num(double v, Unit u) {
  auto e = std::make_shared<Expr>();
  e->op = ExprOp::kConst;
  e->value = v;
  e->unit = u;
  return e;
}
ExprPtr ns(double v) { return num(v, Unit::kNs); }
ExprPtr field(Field f) {
  auto e = std::make_shared<Expr>();
  e->op = ExprOp::kField;
  e->field = f;
  e->unit = field_unit(f);
  return e;
}
ExprPtr ref(std::string name) {
  auto e = std::make_shared<Expr>();
  e->op = ExprOp::kRef;
  e->name = std::move(name);
  return e;
}
ExprPtr bin(ExprOp op, ExprPtr a, ExprPtr b) {
  auto e = std::make_shared<Expr>();
  e->op = op;
  e->args = {std::move(a), std::move(b)};
  return e;
}
ExprPtr un(ExprOp op, ExprPtr a) {
  auto e = std::make_shared<Expr>();
  e->op = op;
  e->args = {std::move(a)};
  return e;
}
ExprPtr stack_match(ExprOp op, std::vector<std::string> patterns) {
  auto e = std::make_shared<Expr>();
  e->op = op;
  e->patterns = std::move(patterns);
  return e;
}
ExprPtr in(ExprPtr a, std::vector<double> set) {
  auto e = std::make_shared<Expr>();
  e->op = ExprOp::kIn;
  e->args = {std::move(a)};
  e->set = std::move(set);
  return e;
}
}  // namespace ex

}  // namespace ingero
