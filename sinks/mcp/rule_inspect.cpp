#include "sinks/mcp/rule_inspect.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

namespace ingero::mcp {
namespace {

std::set<int> ancestors(const Plan& plan, int node) {
  std::set<int> seen;
  std::vector<int> todo{node};
  while (!todo.empty()) {
    const int id = todo.back();
    todo.pop_back();
    if (id < 0 || id >= static_cast<int>(plan.nodes.size()) || !seen.insert(id).second) continue;
    for (int in : plan.nodes[static_cast<size_t>(id)].inputs) todo.push_back(in);
  }
  return seen;
}

// The lines "%<id> = ..." of the plan's canonical text.
std::map<int, std::string> canonical_lines(const Plan& plan) {
  std::map<int, std::string> out;
  std::istringstream in(plan.to_string());
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() < 2 || line[0] != '%') continue;
    try {
      out[std::stoi(line.substr(1))] = line;
    } catch (...) {
    }
  }
  return out;
}

double eval_named(const Expr& e, const std::map<std::string, double>& v, std::string* unknown) {
  auto arg = [&](size_t i) {
    return i < e.args.size() && e.args[i] ? eval_named(*e.args[i], v, unknown) : std::nan("");
  };
  switch (e.op) {
    case ExprOp::kConst: return e.value;
    case ExprOp::kField:
    case ExprOp::kStackMatch:  // event-level, like fields: no value on a row
    case ExprOp::kSiteMatch: return std::nan("");
    case ExprOp::kRef: {
      auto it = v.find(e.name);
      if (it == v.end()) {
        if (unknown && unknown->empty()) *unknown = e.name;
        return std::nan("");
      }
      return it->second;
    }
    case ExprOp::kNeg: return -arg(0);
    case ExprOp::kNot: return truthy(arg(0)) ? 0.0 : 1.0;
    case ExprOp::kAdd: return arg(0) + arg(1);
    case ExprOp::kSub: return arg(0) - arg(1);
    case ExprOp::kMul: return arg(0) * arg(1);
    case ExprOp::kDiv: {
      const double d = arg(1);
      return d == 0 ? std::nan("") : arg(0) / d;
    }
    case ExprOp::kLt: return arg(0) < arg(1);
    case ExprOp::kLe: return arg(0) <= arg(1);
    case ExprOp::kGt: return arg(0) > arg(1);
    case ExprOp::kGe: return arg(0) >= arg(1);
    case ExprOp::kEq: return arg(0) == arg(1);
    case ExprOp::kNe: return arg(0) != arg(1);
    case ExprOp::kAnd: return truthy(arg(0)) && truthy(arg(1));
    case ExprOp::kOr: return truthy(arg(0)) || truthy(arg(1));
    case ExprOp::kIn: {
      const double x = arg(0);
      return std::find(e.set.begin(), e.set.end(), x) != e.set.end();
    }
    case ExprOp::kMin: return std::min(arg(0), arg(1));
    case ExprOp::kMax: return std::max(arg(0), arg(1));
    case ExprOp::kAbs: return std::fabs(arg(0));
  }
  return std::nan("");
}

}  // namespace

std::vector<RuleView> plan_rules(const Plan& plan) {
  std::vector<RuleView> rules;
  const auto lines = canonical_lines(plan);
  for (const auto& n : plan.nodes) {
    const auto* emit = std::get_if<EmitNode>(&n.body);
    if (emit == nullptr) continue;
    RuleView r;
    r.name = emit->rule;
    r.category = emit->category;
    r.summary = emit->summary;
    r.recommendations = emit->recommendations;
    for (const auto& c : emit->severity)
      r.severity.push_back(std::string(severity_name(c.severity)) +
                           (c.when ? " when " + c.when->to_string() : " otherwise"));
    const auto path = ancestors(plan, n.id);
    r.nodes.assign(path.begin(), path.end());
    for (int id : r.nodes) {
      const auto& body = plan.nodes[static_cast<size_t>(id)].body;
      if (const auto* req = std::get_if<RequireNode>(&body))
        r.predicates.push_back(req->label.empty() && req->pred ? req->pred->to_string() : req->label);
      if (std::holds_alternative<TrendNode>(body) || std::holds_alternative<PeerNode>(body)) r.has_history_stage = true;
      auto it = lines.find(id);
      if (it != lines.end()) r.plan_text += it->second + "\n";
    }
    rules.push_back(std::move(r));
  }
  return rules;
}

bool relaxed_rule_plan(const Plan& plan, const std::string& rule, RelaxedRule& out) {
  int emit_id = -1;
  for (const auto& n : plan.nodes)
    if (const auto* e = std::get_if<EmitNode>(&n.body); e && e->rule == rule) emit_id = n.id;
  if (emit_id < 0) return false;
  const auto path = ancestors(plan, emit_id);
  std::map<int, int> remap;
  out = {};
  for (int id : path) {  // ascending: inputs always point backwards
    const auto& n = plan.nodes[static_cast<size_t>(id)];
    NodeBody body = n.body;
    if (auto* req = std::get_if<RequireNode>(&body)) {
      out.requires_.push_back(*req);
      req->pred = ex::num(1);
    }
    std::vector<int> inputs;
    for (int in : n.inputs) inputs.push_back(remap.count(in) ? remap[in] : -1);
    const int nid = out.plan.add(std::move(body), std::move(inputs));
    out.plan.nodes.back().line = n.line;
    out.plan.nodes.back().col = n.col;
    remap[id] = nid;
  }
  return true;
}

PredicateResult evaluate_predicate(const RequireNode& req, const std::map<std::string, double>& values,
                                   std::string* unknown) {
  PredicateResult p;
  p.label = req.label.empty() && req.pred ? req.pred->to_string() : req.label;
  if (!req.pred) return p;
  const Expr& e = *req.pred;
  const bool comparison = e.op == ExprOp::kLt || e.op == ExprOp::kLe || e.op == ExprOp::kGt || e.op == ExprOp::kGe ||
                          e.op == ExprOp::kEq || e.op == ExprOp::kNe;
  if (comparison && e.args.size() == 2 && e.args[0] && e.args[1]) {
    p.lhs = eval_named(*e.args[0], values, unknown);
    p.rhs = eval_named(*e.args[1], values, unknown);
    switch (e.op) {
      case ExprOp::kGt:
      case ExprOp::kGe: p.margin = p.lhs - p.rhs; break;
      case ExprOp::kLt:
      case ExprOp::kLe: p.margin = p.rhs - p.lhs; break;
      case ExprOp::kEq: p.margin = -std::fabs(p.lhs - p.rhs); break;
      default: p.margin = std::fabs(p.lhs - p.rhs); break;
    }
  }
  const double v = eval_named(e, values, unknown);
  p.passed = truthy(v);
  if (!comparison) {
    p.lhs = v;
    p.margin = p.passed ? 1 : -1;
  }
  if (std::isnan(p.margin)) p.margin = 0;
  return p;
}

}  // namespace ingero::mcp
