// Lowering: a checked RuleSema -> plan IR nodes (model/plan.h), one path per rule:
//   Scan -> Filter(source) [-> Filter(where)]   or   Scan -> OffCpu [-> Filter(where)]
//   -> Window -> Aggregate -> (Let | Require | Join(.., right stream))* -> [Trend | Peer]
//   -> (Let | Require)* -> [Let(template placeholders)] -> Emit
// Identical stream nodes are shared between rules of one plan (the engine computes a stream
// once per batch), which keeps the rule pack as cheap as the hand-built plans.
#include <numeric>

#include "dsl/sema.h"

namespace ingero::dsl {
namespace {

std::shared_ptr<Expr> node(ExprOp op, Unit unit) {
  auto e = std::make_shared<Expr>();
  e->op = op;
  e->unit = unit;
  return e;
}

bool has_key(const RuleSema& r, Field f) {
  const auto& k = r.window_node.keys;
  return std::find(k.begin(), k.end(), f) != k.end();
}

// `x == opname` / `x in [ops]`: ops are (source, id) pairs, ids repeat across sources.
ExprPtr op_match(const ExprPtr& lhs, const std::vector<std::pair<Source, uint8_t>>& ops, const RuleSema& r,
                 bool event_ctx) {
  std::map<Source, std::vector<double>> by_source;
  for (const auto& [s, o] : ops) by_source[s].push_back(o);
  ExprPtr out;
  for (const auto& [s, ids] : by_source) {
    ExprPtr id_match = ids.size() == 1 ? ex::eq(lhs, ex::num(ids[0])) : ex::in(lhs, ids);
    ExprPtr src;
    if (event_ctx) src = ex::eq(ex::field(Field::kSource), ex::num(static_cast<double>(s)));
    else if (has_key(r, Field::kSource)) src = ex::eq(ex::ref("source"), ex::num(static_cast<double>(s)));
    ExprPtr term = src ? ex::land(src, id_match) : id_match;
    out = out ? ex::lor(out, term) : term;
  }
  return out ? out : ex::num(0, Unit::kBool);
}

}  // namespace

ExprPtr lower_expr(const TExpr& e, const RuleSema& r, bool event_ctx) {
  const Unit unit = ty_unit(e.ty);
  switch (e.op) {
    case ExprOp::kConst: return ex::num(e.value, e.literal ? e.unit : unit);
    case ExprOp::kField: return ex::field(e.field);
    case ExprOp::kStackMatch:
    case ExprOp::kSiteMatch: return ex::stack_match(e.op, e.patterns);
    case ExprOp::kRef: {
      auto x = node(ExprOp::kRef, unit);
      x->name = e.name;
      return x;
    }
    case ExprOp::kEq:
    case ExprOp::kNe:
      for (int side = 0; side < 2; ++side) {
        const TExpr& c = e.args[static_cast<size_t>(side)];
        if (c.ty == Ty::kOp && c.op == ExprOp::kConst) {
          ExprPtr m = op_match(lower_expr(e.args[static_cast<size_t>(1 - side)], r, event_ctx), c.ops, r, event_ctx);
          return e.op == ExprOp::kEq ? m : ex::un(ExprOp::kNot, m);
        }
      }
      break;
    case ExprOp::kIn: {
      ExprPtr lhs = lower_expr(e.args[0], r, event_ctx);
      if (e.args[0].ty == Ty::kOp) {
        std::vector<std::pair<Source, uint8_t>> ops;
        for (size_t i = 1; i < e.args.size(); ++i) ops.insert(ops.end(), e.args[i].ops.begin(), e.args[i].ops.end());
        return op_match(lhs, ops, r, event_ctx);
      }
      std::vector<double> set;
      for (size_t i = 1; i < e.args.size(); ++i) set.push_back(e.args[i].value);
      return ex::in(lhs, set);
    }
    default: break;
  }
  // A ratio scaled by a percent literal (`a / b * 100%`) is shown as a percentage: same value,
  // printed "42%" instead of "0.42x".
  Unit shown = unit;
  if (e.op == ExprOp::kMul && e.ty == Ty::kRatio)
    for (const auto& a : e.args)
      if (a.op == ExprOp::kConst && a.literal && a.unit == Unit::kPercent) shown = Unit::kPercent;
  auto x = node(e.op, shown);
  for (const auto& a : e.args) x->args.push_back(lower_expr(a, r, event_ctx));
  return x;
}

namespace {

struct Lowerer {
  Plan& plan;
  std::map<std::string, int>& streams;  // canonical text -> node id (shared streams)
  const RuleSema& r;

  void at(int id, int pos) {
    auto [line, col] = r.file->src.line_col(static_cast<size_t>(std::max(pos, 0)));
    auto& n = plan.nodes[static_cast<size_t>(id)];
    if (n.line == 0) {
      n.line = line;
      n.col = col;
    }
  }
  int shared(const std::string& key, NodeBody body, std::vector<int> inputs, int pos) {
    if (auto it = streams.find(key); it != streams.end()) return it->second;
    const int id = plan.add(std::move(body), std::move(inputs));
    at(id, pos);
    streams[key] = id;
    return id;
  }
  int scan() { return shared("scan", ScanNode{}, {}, 0); }

  int stream(const StreamSpec& s) {
    int id;
    const int pos = s.node ? s.node->id_first : 0;
    if (s.offcpu) {
      std::string key = "offcpu min=" + std::to_string(s.offcpu_node.min_ns) + " states=";
      for (auto st : s.offcpu_node.states) key += std::to_string(static_cast<int>(st)) + ",";
      id = shared(key, s.offcpu_node, {scan()}, pos);
    } else if (s.account) {
      // Slices cut at the window's grid, so each window gets exactly its time: the step of a
      // tumbling or sliding window (both multiples of it); 1 s for a whole-trace window.
      const WindowNode& w = r.window_node;
      uint64_t grid = w.kind == WindowKind::kWhole ? 1'000'000'000ull : std::gcd(w.size_ns, w.slide_ns);
      if (grid == 0) grid = 1'000'000'000ull;
      id = shared("account grid=" + std::to_string(grid), AccountNode{grid}, {scan()}, pos);
    } else if (s.steps) {
      id = shared("steps", StepNode{}, {scan()}, pos);
    } else {
      std::vector<double> ids;
      for (Source src : s.sources) ids.push_back(static_cast<double>(src));
      ExprPtr pred = ids.size() == 1 ? ex::eq(ex::field(Field::kSource), ex::num(ids[0]))
                                     : ex::in(ex::field(Field::kSource), ids);
      const int base = scan();
      id = shared("filter " + std::to_string(base) + " " + pred->to_string(), FilterNode{pred}, {base}, pos);
    }
    if (s.where) {
      ExprPtr pred = lower_expr(*s.where, r, true);
      id = shared("filter " + std::to_string(id) + " " + pred->to_string(), FilterNode{pred}, {id}, s.where->pos);
    }
    return id;
  }

  int add(NodeBody body, int input, int pos) {
    const int id = plan.add(std::move(body), {input});
    at(id, pos);
    return id;
  }

  void run() {
    int id = stream(r.stream);
    id = add(r.window_node, id, r.window->id_first);
    AggregateNode agg;
    agg.aggs = r.aggs;
    id = add(agg, id, r.window->id_first);
    for (const auto& s : r.steps) {
      switch (s.kind) {
        case Step::Kind::kLet: {
          if (s.lets.empty()) break;
          LetNode let;
          for (const auto& [n, e] : s.lets) let.lets.emplace_back(n, lower_expr(e, r, false));
          id = add(let, id, s.pos);
          break;
        }
        case Step::Kind::kRequire: id = add(RequireNode{lower_expr(s.pred, r, false), s.label}, id, s.pos); break;
        case Step::Kind::kJoin: {
          const int right = stream(s.right);
          JoinNode j = s.join_node;
          j.tail = lower_expr(s.tail, r, true);
          id = plan.add(j, {id, right});
          at(id, s.pos);
          break;
        }
        case Step::Kind::kTrend: id = add(s.trend_node, id, s.pos); break;
        case Step::Kind::kPeer: id = add(s.peer_node, id, s.pos); break;
      }
    }
    if (!r.template_lets.empty()) {
      LetNode let;
      for (const auto& [n, e] : r.template_lets) let.lets.emplace_back(n, lower_expr(e, r, false));
      id = add(let, id, r.texts.count("summary") ? r.texts.at("summary")->id_first : r.rule->id_first);
    }
    EmitNode em;
    em.rule = r.name;
    em.rule_hash = r.hash;
    em.category = r.category;
    for (const auto& c : r.sev_cases)
      em.severity.push_back({c.when ? lower_expr(*c.when, r, false) : nullptr, c.level});
    if (em.severity.empty()) em.severity.push_back({nullptr, Severity::kMedium});
    em.summary = r.summary;
    em.root_cause = r.root_cause;
    em.explanation = r.explanation;
    em.recommendations = r.fix;
    add(em, id, r.rule->id_first);
  }
};

}  // namespace

void lower_rule_into(const RuleSema& r, Plan& plan, std::map<std::string, int>& streams) {
  Lowerer{plan, streams, r}.run();
}

Plan lower_rule(const RuleSema& r) {
  Plan p;
  std::map<std::string, int> streams;
  lower_rule_into(r, p, streams);
  return p;
}

}  // namespace ingero::dsl
