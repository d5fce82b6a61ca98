// Pass `units`: computes the type (with its unit) of every expression and rejects mixtures:
// `duration > 5` (a bare number against a duration), adding bytes to a duration, `and` over
// non-conditions, string values, lists outside `in`. Slot types are learned in clause order.
#include "dsl/sema.h"

namespace ingero::dsl {
namespace {

bool scalarish(Ty t) { return t == Ty::kNumber || t == Ty::kRatio || t == Ty::kCount || t == Ty::kId; }
bool numeric(Ty t) { return scalarish(t) || t == Ty::kDuration || t == Ty::kBytes || t == Ty::kRate; }

bool compatible(Ty a, Ty b) {
  if (a == b) return a != Ty::kString && a != Ty::kList;
  auto loose = [](Ty t) {
    return t == Ty::kNumber || t == Ty::kRatio || t == Ty::kCount || t == Ty::kRate || t == Ty::kId;
  };
  return (a == Ty::kNumber && loose(b)) || (b == Ty::kNumber && loose(a)) || (a == Ty::kRatio && b == Ty::kCount) ||
         (a == Ty::kCount && b == Ty::kRatio) || (a == Ty::kId && b == Ty::kCount) || (a == Ty::kCount && b == Ty::kId);
}

struct Typer {
  Module& m;
  std::map<std::string, Ty>& slots;

  void error(const TExpr& e, const char* code, std::string msg, std::string hint = {}) {
    m.error(*e.file, e.pos, e.end, code, std::move(msg), std::move(hint));
  }

  // Unit mismatch between a and b, with the literal's hint when one side is a bare number.
  void mismatch(const TExpr& whole, const TExpr& a, const TExpr& b, const char* verb) {
    for (const TExpr* lit : {&a, &b}) {
      const TExpr* other = lit == &a ? &b : &a;
      if (lit->literal && lit->ty == Ty::kNumber && (other->ty == Ty::kDuration || other->ty == Ty::kBytes)) {
        const bool dur = other->ty == Ty::kDuration;
        error(*lit, "E0302",
              "`" + text_of(*lit->file, lit->pos, lit->end) + "` has no unit but is compared with " +
                  ty_name(other->ty),
              dur ? "write it with a unit, e.g. `" + text_of(*lit->file, lit->pos, lit->end) +
                        "ms` (ns, us, ms, s, m, h)"
                  : "write it with a unit, e.g. `" + text_of(*lit->file, lit->pos, lit->end) +
                        "MiB` (B, KB, MB, GB, KiB, MiB, GiB)");
        return;
      }
    }
    std::string hint;
    if (a.ty == Ty::kOp || b.ty == Ty::kOp) hint = "compare `op` with an op name, e.g. `op == cudaMalloc`";
    error(whole, "E0301", std::string("cannot ") + verb + " " + ty_name(a.ty) + " and " + ty_name(b.ty), hint);
  }

  Ty type(TExpr& e) {
    switch (e.op) {
      case ExprOp::kConst:
        if (e.ty == Ty::kString) {
          error(e, "E0308", "a string is not a value here", "strings are for summary, fix and test names");
          return e.ty = Ty::kUnknown;
        }
        if (e.ty == Ty::kList) {
          for (auto& a : e.args) type(a);
          error(e, "E0308", "a list is only a value on the right of `in`");
          return e.ty = Ty::kUnknown;
        }
        return e.ty;
      case ExprOp::kField: return e.ty;
      case ExprOp::kStackMatch:
      case ExprOp::kSiteMatch:
        if (e.patterns.empty()) {
          error(e, "E0217",
                std::string("`") + (e.op == ExprOp::kStackMatch ? "stack" : "site") + "` is not a condition by itself",
                "match it: `site ~ \"train.py:*\"`");
          return e.ty = Ty::kUnknown;
        }
        return e.ty = Ty::kBool;
      case ExprOp::kRef: {
        auto it = slots.find(e.name);
        return e.ty = it == slots.end() ? Ty::kUnknown : it->second;
      }
      case ExprOp::kNeg:
      case ExprOp::kAbs: {
        const Ty a = type(e.args[0]);
        if (a != Ty::kUnknown && !numeric(a)) {
          error(e, "E0303", std::string("cannot negate ") + ty_name(a));
          return e.ty = Ty::kUnknown;
        }
        return e.ty = a;
      }
      case ExprOp::kNot: {
        const Ty a = type(e.args[0]);
        if (a != Ty::kUnknown && a != Ty::kBool) {
          error(e.args[0], "E0304", std::string("`not` needs a condition, found ") + ty_name(a));
          return e.ty = Ty::kUnknown;
        }
        return e.ty = Ty::kBool;
      }
      case ExprOp::kAnd:
      case ExprOp::kOr: {
        const Ty a = type(e.args[0]), b = type(e.args[1]);
        for (size_t i = 0; i < 2; ++i) {
          const Ty t = i ? b : a;
          if (t != Ty::kUnknown && t != Ty::kBool)
            error(e.args[i], "E0304",
                  std::string("`") + (e.op == ExprOp::kAnd ? "and" : "or") + "` needs conditions, found " + ty_name(t),
                  "compare it, e.g. `x > 0`");
        }
        return e.ty = Ty::kBool;
      }
      case ExprOp::kLt:
      case ExprOp::kLe:
      case ExprOp::kGt:
      case ExprOp::kGe:
      case ExprOp::kEq:
      case ExprOp::kNe: {
        const Ty a = type(e.args[0]), b = type(e.args[1]);
        if (a == Ty::kUnknown || b == Ty::kUnknown) return e.ty = Ty::kBool;
        const bool ordered = e.op != ExprOp::kEq && e.op != ExprOp::kNe;
        if (!compatible(a, b)) {
          mismatch(e, e.args[0], e.args[1], "compare");
        } else if (ordered && (a == Ty::kOp || a == Ty::kSource || a == Ty::kState || a == Ty::kBool)) {
          error(e, "E0301", std::string("cannot order ") + ty_name(a) + "; use `==`, `!=` or `in`");
        }
        return e.ty = Ty::kBool;
      }
      case ExprOp::kIn: {
        const Ty a = type(e.args[0]);
        for (size_t i = 1; i < e.args.size(); ++i) {
          TExpr& item = e.args[i];
          const Ty t = item.ty;  // constants
          if (item.op != ExprOp::kConst) {
            error(item, "E0308", "list items must be constants");
            continue;
          }
          if (a != Ty::kUnknown && t != Ty::kUnknown && !compatible(a, t)) mismatch(item, e.args[0], item, "compare");
        }
        if (a == Ty::kDuration || a == Ty::kBytes || a == Ty::kBool)
          error(e.args[0], "E0301", std::string("`in` compares ids, ops, sources or states, not ") + ty_name(a));
        return e.ty = Ty::kBool;
      }
      case ExprOp::kAdd:
      case ExprOp::kSub: {
        const Ty a = type(e.args[0]), b = type(e.args[1]);
        if (a == Ty::kUnknown || b == Ty::kUnknown) return e.ty = Ty::kUnknown;
        if (!numeric(a) || !numeric(b) || !compatible(a, b)) {
          mismatch(e, e.args[0], e.args[1], e.op == ExprOp::kAdd ? "add" : "subtract");
          return e.ty = Ty::kUnknown;
        }
        return e.ty = a == Ty::kNumber ? b : a;
      }
      case ExprOp::kMul: {
        const Ty a = type(e.args[0]), b = type(e.args[1]);
        if (a == Ty::kUnknown || b == Ty::kUnknown) return e.ty = Ty::kUnknown;
        if (!numeric(a) || !numeric(b)) {
          mismatch(e, e.args[0], e.args[1], "multiply");
          return e.ty = Ty::kUnknown;
        }
        if (scalarish(a) && scalarish(b))
          return e.ty = (a == Ty::kRatio && b == Ty::kRatio) ? Ty::kRatio : (a == Ty::kNumber ? b : a);
        if (scalarish(a)) return e.ty = b;
        if (scalarish(b)) return e.ty = a;
        error(e, "E0303", std::string("cannot multiply ") + ty_name(a) + " by " + ty_name(b));
        return e.ty = Ty::kUnknown;
      }
      case ExprOp::kDiv: {
        const Ty a = type(e.args[0]), b = type(e.args[1]);
        if (a == Ty::kUnknown || b == Ty::kUnknown) return e.ty = Ty::kUnknown;
        if (!numeric(a) || !numeric(b)) {
          mismatch(e, e.args[0], e.args[1], "divide");
          return e.ty = Ty::kUnknown;
        }
        if (a == b) return e.ty = (a == Ty::kNumber ? Ty::kNumber : Ty::kRatio);
        if (scalarish(b)) return e.ty = a;
        if (a == Ty::kCount && b == Ty::kDuration) return e.ty = Ty::kRate;
        error(e, "E0303", std::string("cannot divide ") + ty_name(a) + " by " + ty_name(b),
              "divide like by like for a ratio (p99 / p50), or use rate()");
        return e.ty = Ty::kUnknown;
      }
      case ExprOp::kMin:
      case ExprOp::kMax: {
        Ty out = Ty::kUnknown;
        for (auto& a : e.args) {
          const Ty t = type(a);
          if (t == Ty::kUnknown) continue;
          if (!numeric(t)) {
            error(a, "E0303", std::string("min/max need numbers, found ") + ty_name(t));
            continue;
          }
          if (out == Ty::kUnknown || out == Ty::kNumber) {
            if (out != Ty::kUnknown && !compatible(out, t)) mismatch(e, e.args[0], a, "compare");
            out = t;
          } else if (!compatible(out, t)) {
            mismatch(e, e.args[0], a, "compare");
          }
        }
        return e.ty = out;
      }
    }
    return e.ty = Ty::kUnknown;
  }

  void condition(TExpr& e, const char* where) {
    const Ty t = type(e);
    if (t != Ty::kUnknown && t != Ty::kBool)
      error(e, "E0304", std::string(where) + " needs a condition, found " + ty_name(t), "compare it, e.g. `x > 0`");
  }
};

Ty key_type(Field f) {
  switch (f) {
    case Field::kOp: return Ty::kOp;
    case Field::kSource: return Ty::kSource;
    default: return Ty::kId;
  }
}

}  // namespace

Ty type_row_expr(Module& m, RuleSema& r, TExpr& e) {
  Typer t{m, r.slot_types};
  return t.type(e);
}

void pass_units(Module& m) {
  for (auto& r : m.rules) {
    if (!r.from || !r.window) continue;
    auto& slots = r.slot_types;
    Typer t{m, slots};
    if (r.stream.where) t.condition(*r.stream.where, "`where`");
    for (Field k : r.window_node.keys) slots[field_name(k)] = key_type(k);
    slots["window.start"] = Ty::kDuration;
    slots["window.end"] = Ty::kDuration;
    slots["window.events"] = Ty::kCount;
    for (const auto& a : r.aggs) {
      Field f = a.field;
      Ty fty = Ty::kNumber;
      find_event_field(field_name(f), f, fty);
      if (a.field == Field::kArg0 && a.kind != AggKind::kCount) fty = Ty::kBytes;  // `bytes` is arg0
      slots[a.name] = a.kind == AggKind::kCount ? Ty::kCount : a.kind == AggKind::kRate ? Ty::kRate : fty;
      if (a.kind == AggKind::kTime || a.kind == AggKind::kTopTaskTime) slots[a.name] = Ty::kDuration;
      if (a.kind == AggKind::kTopTask) slots[a.name] = Ty::kId;
    }
    for (auto& s : r.steps) {
      switch (s.kind) {
        case Step::Kind::kLet:
          for (auto& [name, e] : s.lets) slots[name] = t.type(e);
          break;
        case Step::Kind::kRequire: t.condition(s.pred, "`require`"); break;
        case Step::Kind::kJoin: {
          if (s.right.where) t.condition(*s.right.where, "`where`");
          t.condition(s.tail, "`tail`");
          const std::string& n = s.join_node.name;
          slots[n + ".overlap_ns"] = slots[n + ".tail_ns"] = slots[n + ".right_ns"] = Ty::kDuration;
          slots[n + ".share"] = Ty::kRatio;
          slots[n + ".calls"] = slots[n + ".hit_calls"] = slots[n + ".events"] = Ty::kCount;
          slots[n + ".sum_arg0"] = Ty::kBytes;
          break;
        }
        case Step::Kind::kTrend: {
          const Ty v = slots.count(s.trend_node.value) ? slots[s.trend_node.value] : Ty::kUnknown;
          if (v != Ty::kUnknown && !numeric(v))
            m.error_at(*r.file, s.trend->value, "E0303",
                       "a trend needs a numeric value, found " + std::string(ty_name(v)));
          slots["trend.first"] = slots["trend.last"] = slots["trend.peak"] = v;
          slots["trend.median"] = slots["trend.mad"] = v;
          slots["trend.change"] = Ty::kRatio;
          slots["trend.history"] = Ty::kCount;
          break;
        }
        case Step::Kind::kPeer: {
          const Ty v = slots.count(s.peer_node.value) ? slots[s.peer_node.value] : Ty::kUnknown;
          if (v != Ty::kUnknown && !numeric(v))
            m.error_at(*r.file, s.peer->value, "E0303",
                       "a peer group compares a numeric value, found " + std::string(ty_name(v)));
          for (const auto& o : s.peer->options) {
            if (o.key.name != "floor" || v == Ty::kUnknown) continue;
            double scale;
            Ty fty;
            Unit u;
            if (parse_unit_suffix(o.value.unit, scale, fty, u) && !compatible(fty, v))
              m.error_at(*r.file, o.value, fty == Ty::kNumber ? "E0302" : "E0301",
                         "the floor is " + std::string(ty_name(fty)) + " but `" + s.peer_node.value + "` is " +
                             ty_name(v),
                         v == Ty::kDuration ? "write it with a unit, e.g. `floor 20ms`" : "");
          }
          slots["peer.median"] = slots["peer.mad"] = v;
          slots["peer.z"] = Ty::kNumber;
          slots["peer.peers"] = Ty::kCount;
          break;
        }
      }
    }
    for (auto& c : r.sev_cases)
      if (c.when) t.condition(*c.when, "`when`");
  }
}

}  // namespace ingero::dsl
