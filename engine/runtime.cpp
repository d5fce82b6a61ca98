#include "engine/runtime.h"

#include "engine/route_check.h"
#include "engine/top_k.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <unordered_map>

#include "model/format.h"
#include "model/ops.h"

namespace ingero {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr uint64_t kFinal = std::numeric_limits<uint64_t>::max();

template <class T>
const T* body_as(const Plan& p, int id) {
  if (id < 0 || id >= static_cast<int>(p.nodes.size())) return nullptr;
  return std::get_if<T>(&p.nodes[static_cast<size_t>(id)].body);
}

bool is_stream_node(const NodeBody& b) {
  return std::holds_alternative<ScanNode>(b) || std::holds_alternative<FilterNode>(b) ||
         std::holds_alternative<OffCpuNode>(b) || std::holds_alternative<AccountNode>(b) ||
         std::holds_alternative<StepNode>(b);
}

// Units of computed values, so templates print "25.80ms", "87%", "352x".
Unit infer_unit(const Expr& e, const std::vector<Slot>& slots) {
  if (e.op != ExprOp::kConst && e.op != ExprOp::kRef && e.op != ExprOp::kField && e.unit != Unit::kNone) return e.unit;
  auto arg = [&](size_t i) { return i < e.args.size() ? infer_unit(*e.args[i], slots) : Unit::kNone; };
  switch (e.op) {
    case ExprOp::kConst: return e.unit;
    case ExprOp::kRef:
      return e.slot >= 0 && e.slot < static_cast<int>(slots.size()) ? slots[static_cast<size_t>(e.slot)].unit
                                                                    : Unit::kNone;
    case ExprOp::kField: return field_unit(e.field);
    case ExprOp::kDiv: {
      const Unit a = arg(0), b = arg(1);
      if (a == b && a != Unit::kNone) return Unit::kRatio;  // ns/ns, %/%: a plain ratio
      if (b == Unit::kNone || b == Unit::kRatio || b == Unit::kPercent) return a;
      return Unit::kNone;
    }
    case ExprOp::kMul: {
      const Unit a = arg(0), b = arg(1);
      if (a == Unit::kNone || a == Unit::kRatio || a == Unit::kPercent) return b == Unit::kNone ? a : b;
      return a;
    }
    case ExprOp::kAdd:
    case ExprOp::kSub:
    case ExprOp::kMin:
    case ExprOp::kMax:
    case ExprOp::kNeg:
    case ExprOp::kAbs:
      for (size_t i = 0; i < e.args.size(); ++i)
        if (arg(i) != Unit::kNone) return arg(i);
      return Unit::kNone;
    default: return Unit::kBool;
  }
}

// Copies an expression with every Ref resolved to its slot; collects unknown names.
ExprPtr resolve(const ExprPtr& e, const std::vector<Slot>& slots, std::vector<std::string>& missing) {
  if (!e) return nullptr;
  auto copy = std::make_shared<Expr>(*e);
  if (copy->op == ExprOp::kRef) {
    copy->slot = -1;
    for (size_t i = slots.size(); i-- > 0;)
      if (slots[i].name == copy->name) {
        copy->slot = static_cast<int>(i);
        break;
      }
    if (copy->slot < 0) missing.push_back(copy->name);
  }
  for (auto& a : copy->args) a = resolve(a, slots, missing);
  return copy;
}

bool reads_only_source_op(const Expr& e) {
  if (e.op == ExprOp::kField) return e.field == Field::kSource || e.field == Field::kOp;
  if (e.op == ExprOp::kStackMatch || e.op == ExprOp::kSiteMatch) return false;
  if (e.op == ExprOp::kRef) return false;
  for (const auto& a : e.args)
    if (!reads_only_source_op(*a)) return false;
  return true;
}

// The operands of a chain of `and`s, left to right (depth bounded by the DSL's expression limits).
void conjuncts(const ExprPtr& e, std::vector<ExprPtr>& out) {
  if (e->op == ExprOp::kAnd && e->args.size() == 2) {
    conjuncts(e->args[0], out);
    conjuncts(e->args[1], out);
  } else {
    out.push_back(e);
  }
}

bool reads_nothing(const Expr& e) {
  if (e.op == ExprOp::kField || e.op == ExprOp::kRef || e.op == ExprOp::kStackMatch || e.op == ExprOp::kSiteMatch)
    return false;
  for (const auto& a : e.args)
    if (!reads_nothing(*a)) return false;
  return true;
}

bool is_field(const Expr& e, Field f) { return e.op == ExprOp::kField && e.field == f; }

// The integer values (0..255) where a comparison of a byte with `c` can change its answer:
// below floor(c), at it, and from floor(c) + 1 on, each comparison holds or fails throughout.
void add_breaks(double c, std::vector<unsigned>& out) {
  if (!(c >= 0) || c >= 256) return;  // NaN, negative or past a byte: the same for every value
  const auto f = static_cast<unsigned>(std::floor(c));
  out.push_back(f);
  if (f < 255) out.push_back(f + 1);
}

// Where the answer of `e` (which reads only source and op) can change along each field, when
// every read of them is a bare operand of a comparison or `in` against a constant; false when
// some read is used otherwise (arithmetic, min/max, a bare truth value).
bool collect_breaks(const Expr& e, std::vector<unsigned>& src, std::vector<unsigned>& op) {
  auto list_of = [&](const Expr& f) -> std::vector<unsigned>* {
    if (is_field(f, Field::kSource)) return &src;
    if (is_field(f, Field::kOp)) return &op;
    return nullptr;
  };
  switch (e.op) {
    case ExprOp::kField: return false;
    case ExprOp::kLt:
    case ExprOp::kLe:
    case ExprOp::kGt:
    case ExprOp::kGe:
    case ExprOp::kEq:
    case ExprOp::kNe: {
      if (e.args.size() != 2) return false;
      for (int side = 0; side < 2; ++side) {
        auto* out = list_of(*e.args[side]);
        const Expr& other = *e.args[1 - side];
        if (out && reads_nothing(other)) {
          add_breaks(eval(other, nullptr, nullptr), *out);
          return true;
        }
      }
      break;
    }
    case ExprOp::kIn:
      if (e.args.size() == 1) {
        if (auto* out = list_of(*e.args[0])) {
          for (double v : e.set) add_breaks(v, *out);
          return true;
        }
      }
      break;
    default: break;
  }
  for (const auto& a : e.args)
    if (!collect_breaks(*a, src, op)) return false;
  return true;
}

// mask[source << 8 | op]: whether the filter `e`, which reads only the event's source and op,
// keeps such events. Where collect_breaks finds the few values each field is compared with, the
// answer is constant on each rectangle between them and is evaluated once per rectangle (a few
// dozen evaluations instead of 65,536; compile time was ~8 % of a 5 M-event run phase).
std::vector<uint8_t> source_op_table(const Expr& e) {
  std::vector<uint8_t> mask(1u << 16);
  std::vector<unsigned> src{0}, op{0};
  if (!collect_breaks(e, src, op)) {
    src.resize(256);
    op.resize(256);
    for (unsigned i = 0; i < 256; ++i) src[i] = op[i] = i;
  }
  for (auto* v : {&src, &op}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
    v->push_back(256);
  }
  Event ev;
  for (size_t i = 0; i + 1 < src.size(); ++i)
    for (size_t j = 0; j + 1 < op.size(); ++j) {
      ev.source = static_cast<Source>(src[i]);
      ev.op = static_cast<uint8_t>(op[j]);
      const uint8_t keep = truthy(eval(e, ev)) ? 1 : 0;
      for (unsigned s = src[i]; s < src[i + 1]; ++s)
        std::fill(mask.begin() + (s << 8 | op[j]), mask.begin() + (s << 8 | (op[j + 1] - 1)) + 1, keep);
    }
  return mask;
}

// dst[c] &= (src[c] != 0), and dst[c] &= (src[c] == 1), over n codes: byte loops the compiler
// vectorises once it knows the two arrays do not alias (run at every plan compilation and shard
// construction over 65,536 codes; the plain loop in compile_plan was a sixth of a plan's set-up).
void and_nonzero(uint8_t* __restrict dst, const uint8_t* __restrict src, size_t n) {
  for (size_t c = 0; c < n; ++c) dst[c] &= src[c] != 0 ? 1 : 0;
}
void and_one(uint8_t* __restrict dst, const uint8_t* __restrict src, size_t n) {
  for (size_t c = 0; c < n; ++c) dst[c] &= src[c] == 1 ? 1 : 0;
}

// Gives every (source, op) the mask keeps its own copy of the filter's residual part `rest`,
// folded for that source and op (fold_source_op): the mask then says 1 (keep: the residual
// holds for every such event), 0 (drop) or 2 + i (keep when residuals[i] holds). Identical
// residuals are stored once. When the mask keeps too many pairs to specialise cheaply, or they
// need too many distinct residuals, every kept pair evaluates `rest` itself.
void specialise_residual(StreamDef& s, const ExprPtr& rest) {
  constexpr size_t kMaxSpecialised = 4096, kMaxResiduals = 250;
  const auto kept = static_cast<size_t>(std::count(s.source_op_mask.begin(), s.source_op_mask.end(), uint8_t{1}));
  s.residuals.clear();
  if (kept <= kMaxSpecialised) {
    std::vector<uint8_t> mask = s.source_op_mask;
    std::map<std::string, uint8_t> index;
    bool ok = true;
    for (size_t code = 0; code < mask.size() && ok; ++code) {
      if (mask[code] != 1) continue;
      const ExprPtr r = simplify_truth(
          fold_source_op(rest, static_cast<Source>(code >> 8), static_cast<uint8_t>(code & 0xff)));
      if (r->op == ExprOp::kConst) {
        mask[code] = truthy(r->value) ? 1 : 0;
        continue;
      }
      auto [it, fresh] = index.try_emplace(r->to_string(), static_cast<uint8_t>(2 + s.residuals.size()));
      if (fresh) {
        if (s.residuals.size() >= kMaxResiduals) {
          ok = false;
          break;
        }
        s.residuals.push_back(r);
      }
      mask[code] = it->second;
    }
    if (ok) {
      s.source_op_mask = std::move(mask);
      return;
    }
    s.residuals.clear();
  }
  s.residuals.push_back(rest);
  for (auto& m : s.source_op_mask)
    if (m == 1) m = 2;
}

int add_slot(std::vector<Slot>& slots, std::string name, Unit unit) {
  slots.push_back({std::move(name), unit});
  return static_cast<int>(slots.size() - 1);
}

Unit agg_unit(const AggSpec& a) {
  switch (a.kind) {
    case AggKind::kCount: return Unit::kCount;
    case AggKind::kRate: return Unit::kPerSecond;
    case AggKind::kTopTask: return Unit::kNone;
    default:
      return a.field == Field::kDuration || a.field == Field::kEnd || a.field == Field::kTs ? Unit::kNs : Unit::kNone;
  }
}

// The call-site index of a key of a pipe keyed by site (StackTable::site_index).
uint16_t site_of(const Key& key) { return static_cast<uint16_t>(key.lo & 0xffff); }

std::string key_text(const PipeDef& pipe, const Key& key, const StackTable* stacks) {
  std::string s;
  for (Field f : pipe.key_fields) {
    if (f == Field::kSource && pipe.keys.has(Field::kOp)) continue;
    if (!s.empty()) s += ' ';
    if (f == Field::kSite) s += "site=" + (stacks ? stacks->site_text(site_of(key)) : std::to_string(site_of(key)));
    else if (f == Field::kOp) s += "op=" + op_name(key.source(), key.op());
    else if (f == Field::kSource) s += "source=" + source_name(key.source());
    else s += std::string(field_name(f)) + "=" + format_value(KeyBy::field_value(key, f), Unit::kNone);
  }
  return s.empty() ? "all" : s;
}

}  // namespace

namespace {
// Calls f on each event of `events` a shard input selects: all of them, or those at `at` when the
// input is indexed (ShardInput::indexed).
template <class F>
void for_each_selected(const std::vector<Event>& events, bool indexed, std::span<const uint32_t> at, F&& f) {
  if (!indexed) {
    for (const auto& e : events) f(e);
    return;
  }
  for (const uint32_t i : at)
    if (i < events.size()) f(events[i]);
}
}  // namespace

// Spreads the prefetch of a memory range (ShardInput::prefetch) over a pass of `items` steps:
// each step requests the next stretch of it, two cache lines at most (about 80 bytes a step when
// the next batch is as long as this one), and rest() the part still left after the pass. The
// lines go to L2 (a batch of 4096 events is 320 KB there), not L1, where this pass works.
class SpreadPrefetch {
 public:
  SpreadPrefetch(PrefetchHint h, size_t items)
      : p_(static_cast<const char*>(h.data)), end_(p_ ? p_ + h.bytes : nullptr) {
    if (p_ && items) step_ = std::min<size_t>(kMaxStep, std::max<size_t>(kLine, (h.bytes + items - 1) / items));
    else end_ = p_;  // a pass of no steps: rest() requests it all
  }
  [[gnu::always_inline]] void step() {
    if (p_ >= end_) return;
    __builtin_prefetch(p_, 0, 2);
    __builtin_prefetch(p_ + kLine, 0, 2);
    p_ += step_;
  }
  void rest() {
    for (; p_ < end_; p_ += kLine) __builtin_prefetch(p_, 0, 2);
  }

 private:
  static constexpr size_t kLine = 64, kMaxStep = 2 * kLine;
  const char* p_;
  const char* end_;
  size_t step_ = kLine;
};

bool is_host_wide(const Event& e) {
  switch (e.source) {
    case Source::kIo:
    case Source::kTcp: return true;
    case Source::kHost: return e.op == op::kPageAlloc || e.op == op::kOomKill;
    default: return false;
  }
}

std::vector<uint8_t> filter_source_op_mask(const Expr& filter) { return source_op_table(filter); }

std::unique_ptr<CompiledPlan> compile_plan(const Plan& plan_in, std::vector<std::string>& errors) {
  errors = plan_in.validate();
  if (!errors.empty()) return nullptr;
  auto cp = std::make_unique<CompiledPlan>();
  cp->plan = plan_in;
  const Plan& plan = cp->plan;
  const size_t n = plan.nodes.size();
  std::vector<std::vector<int>> consumers(n);
  for (const auto& node : plan.nodes)
    for (int in : node.inputs) consumers[static_cast<size_t>(in)].push_back(node.id);

  // Streams.
  cp->stream_of_node.assign(n, -1);
  std::map<std::string, int> stream_sig;
  for (const auto& node : plan.nodes) {
    if (!is_stream_node(node.body)) continue;
    StreamDef s;
    s.node = node.id;
    s.parent = node.inputs.empty() ? -1 : cp->stream_of_node[static_cast<size_t>(node.inputs[0])];
    if (const auto* f = std::get_if<FilterNode>(&node.body)) s.filter = f->pred;
    if (const auto* o = std::get_if<OffCpuNode>(&node.body)) s.offcpu = o;
    if (const auto* a = std::get_if<AccountNode>(&node.body)) s.account = a;
    if (const auto* st = std::get_if<StepNode>(&node.body)) s.steps = st;
    if (!node.inputs.empty() && s.parent < 0) {
      errors.push_back("%" + std::to_string(node.id) + ": stream input is not a stream");
      continue;
    }
    // Identical streams (same parent, same step) are computed once per batch, whichever rule
    // or rule file declared them.
    std::string sig = std::to_string(s.parent) + "|";
    if (s.filter) sig += "filter " + s.filter->to_string();
    if (s.offcpu) {
      sig += "offcpu " + std::to_string(s.offcpu->min_ns) + ":";
      for (auto st : s.offcpu->states) sig += std::to_string(static_cast<int>(st)) + ",";
    }
    if (s.account) sig += "account " + std::to_string(s.account->grid_ns);
    if (s.steps) sig += "steps";
    if (s.parent < 0) sig += "scan";
    auto [it, fresh] = stream_sig.try_emplace(sig, static_cast<int>(cp->streams.size()));
    cp->stream_of_node[static_cast<size_t>(node.id)] = it->second;
    if (fresh) {
      if (s.filter && reads_only_source_op(*s.filter)) {
        s.source_op_mask = source_op_table(*s.filter);
      } else if (s.filter && s.filter->op == ExprOp::kAnd) {
        // `A and B and C`: the conjuncts that read only source and op become the mask, the
        // others are evaluated for the events it keeps (`and` has no side effects: any order).
        std::vector<ExprPtr> all, pure, rest;
        conjuncts(s.filter, all);
        for (auto& c : all) (reads_only_source_op(*c) ? pure : rest).push_back(c);
        if (!pure.empty() && !rest.empty()) {
          ExprPtr m = pure[0], r = rest[0];
          for (size_t i = 1; i < pure.size(); ++i) m = ex::land(m, pure[i]);
          for (size_t i = 1; i < rest.size(); ++i) r = ex::land(r, rest[i]);
          s.source_op_mask = source_op_table(*m);
          specialise_residual(s, r);
        }
      }
      if (s.filter && s.filter->uses_stacks()) cp->uses_stacks = true;
      if (s.account) cp->uses_stacks = true;  // the blocked reason of a slice comes from its stack
      cp->streams.push_back(s);
    }
  }

  // Pipes: one per window, walking forward to its Emit.
  for (const auto& node : plan.nodes) {
    const auto* w = std::get_if<WindowNode>(&node.body);
    if (!w) continue;
    PipeDef pipe;
    pipe.window_node = node.id;
    pipe.window = *w;
    pipe.stream = cp->stream_of_node[static_cast<size_t>(node.inputs[0])];
    for (int st = pipe.stream; st >= 0; st = cp->streams[static_cast<size_t>(st)].parent)
      pipe.over_time = pipe.over_time || cp->streams[static_cast<size_t>(st)].account != nullptr ||
                       cp->streams[static_cast<size_t>(st)].steps != nullptr;
    // Slices of a thread come as the watermark settles them, up to a silent gap (not sliced) of
    // 1 s behind it (operators/time_accounting.h): its windows wait that long, and a margin.
    if (pipe.over_time) pipe.window.lateness_ns = std::max<uint64_t>(pipe.window.lateness_ns, 2'000'000'000ull);
    pipe.keys = KeyBy(w->keys);
    pipe.key_fields = w->keys;
    const std::string where = "%" + std::to_string(node.id) + ": ";
    for (Field f : w->keys) {
      if (f != Field::kPid && f != Field::kTid && f != Field::kOp && f != Field::kSource && f != Field::kNode &&
          f != Field::kRank && f != Field::kSite)
        errors.push_back(where + "cannot window by " + field_name(f) +
                         " (keys: pid, tid, op, source, node, rank, site)");
      if (f == Field::kSite) pipe.site_key = cp->uses_stacks = true;
      add_slot(pipe.slots, field_name(f), Unit::kNone);
    }
    pipe.slot_start = add_slot(pipe.slots, "window.start", Unit::kNone);
    pipe.slot_end = add_slot(pipe.slots, "window.end", Unit::kNone);
    pipe.slot_events = add_slot(pipe.slots, "window.events", Unit::kCount);

    int cur = node.id;
    auto next_of = [&](int id) -> int {
      for (int c : consumers[static_cast<size_t>(id)]) {
        const auto& cn = plan.nodes[static_cast<size_t>(c)];
        if (!cn.inputs.empty() && cn.inputs[0] == id && !is_stream_node(cn.body) &&
            !std::holds_alternative<WindowNode>(cn.body))
          return c;
      }
      return -1;
    };
    const int agg_id = next_of(cur);
    const auto* agg = body_as<AggregateNode>(plan, agg_id);
    if (!agg) {
      errors.push_back(where + "a window must be followed by an aggregate");
      continue;
    }
    pipe.layout = std::make_unique<AggregateLayout>(*agg);
    pipe.slot_aggs = static_cast<int>(pipe.slots.size());
    for (const auto& a : agg->aggs) add_slot(pipe.slots, a.name, agg_unit(a));
    cur = agg_id;

    bool emitted = false;
    std::vector<std::string> missing;
    for (int id = next_of(cur); id >= 0; id = next_of(id)) {
      const auto& body = plan.nodes[static_cast<size_t>(id)].body;
      Stage st;
      st.node = id;
      const std::string at = "%" + std::to_string(id) + ": ";
      if (const auto* l = std::get_if<LetNode>(&body)) {
        st.kind = StageKind::kLet;
        for (const auto& [name, e] : l->lets) {
          auto r = resolve(e, pipe.slots, missing);
          const int slot = add_slot(pipe.slots, name, infer_unit(*r, pipe.slots));
          st.lets.emplace_back(slot, r);
        }
      } else if (const auto* r = std::get_if<RequireNode>(&body)) {
        st.kind = StageKind::kRequire;
        st.pred = resolve(r->pred, pipe.slots, missing);
        st.label = r->label.empty() ? r->pred->to_string() : r->label;
        const Expr* cmp = st.pred.get();
        while (cmp->op == ExprOp::kAnd && cmp->args.size() == 2) cmp = cmp->args[0].get();
        if (cmp->args.size() == 2) {
          st.lhs_unit = infer_unit(*cmp->args[0], pipe.slots);
          st.rhs_unit = infer_unit(*cmp->args[1], pipe.slots);
          if (st.rhs_unit == Unit::kNone) st.rhs_unit = st.lhs_unit;
          if (st.lhs_unit == Unit::kNone) st.lhs_unit = st.rhs_unit;
        }
      } else if (const auto* j = std::get_if<JoinNode>(&body)) {
        st.kind = StageKind::kJoin;
        st.join = j;
        st.right_stream = cp->stream_of_node[static_cast<size_t>(plan.nodes[static_cast<size_t>(id)].inputs[1])];
        st.tail = resolve(j->tail, pipe.slots, missing);
        const std::string p = j->name + ".";
        st.js.overlap_ns = add_slot(pipe.slots, p + "overlap_ns", Unit::kNs);
        st.js.tail_ns = add_slot(pipe.slots, p + "tail_ns", Unit::kNs);
        st.js.share = add_slot(pipe.slots, p + "share", Unit::kPercent);
        st.js.calls = add_slot(pipe.slots, p + "calls", Unit::kCount);
        st.js.hit_calls = add_slot(pipe.slots, p + "hit_calls", Unit::kCount);
        st.js.events = add_slot(pipe.slots, p + "events", Unit::kCount);
        st.js.right_ns = add_slot(pipe.slots, p + "right_ns", Unit::kNs);
        st.js.sum_arg0 = add_slot(pipe.slots, p + "sum_arg0", Unit::kBytes);
        pipe.needs_calls = true;
      } else if (const auto* t = std::get_if<TrendNode>(&body)) {
        st.kind = StageKind::kTrend;
        st.trend = t;
        auto v = resolve(ex::ref(t->value), pipe.slots, missing);
        st.trend_value = v->slot;
        const Unit u = v->slot >= 0 ? pipe.slots[static_cast<size_t>(v->slot)].unit : Unit::kNone;
        st.trend_first = add_slot(pipe.slots, "trend.first", u);
        st.trend_last = add_slot(pipe.slots, "trend.last", u);
        st.trend_peak = add_slot(pipe.slots, "trend.peak", u);
        st.trend_change = add_slot(pipe.slots, "trend.change", Unit::kRatio);
        st.trend_median = add_slot(pipe.slots, "trend.median", u);
        st.trend_mad = add_slot(pipe.slots, "trend.mad", u);
        st.trend_history = add_slot(pipe.slots, "trend.history", Unit::kCount);
      } else if (const auto* pe = std::get_if<PeerNode>(&body)) {
        st.kind = StageKind::kPeer;
        st.peer = pe;
        auto v = resolve(ex::ref(pe->value), pipe.slots, missing);
        st.peer_value = v->slot;
        const Unit u = v->slot >= 0 ? pipe.slots[static_cast<size_t>(v->slot)].unit : Unit::kNone;
        st.peer_median = add_slot(pipe.slots, "peer.median", u);
        st.peer_mad = add_slot(pipe.slots, "peer.mad", u);
        st.peer_z = add_slot(pipe.slots, "peer.z", Unit::kNone);
        st.peer_count = add_slot(pipe.slots, "peer.peers", Unit::kCount);
        if (std::find(w->keys.begin(), w->keys.end(), pe->group) == w->keys.end())
          errors.push_back(at + "peer group field " + field_name(pe->group) + " is not a window key");
        pipe.global = true;
      } else if (const auto* em = std::get_if<EmitNode>(&body)) {
        st.kind = StageKind::kEmit;
        st.emit = em;
        for (const auto& c : em->severity) st.severity.emplace_back(resolve(c.when, pipe.slots, missing), c.severity);
        emitted = true;
      } else {
        errors.push_back(at + "unexpected node after an aggregate");
        break;
      }
      pipe.stages.push_back(std::move(st));
      if (emitted) break;
    }
    for (const auto& m : missing) {
      std::string msg = where;
      msg += "unknown name '";
      msg += m;
      msg += "' in a rule expression";
      errors.push_back(std::move(msg));
    }
    if (!emitted) {
      errors.push_back(where + "window path does not end in an emit");
      continue;
    }
    // Joins need every window to wait for spans that may still overlap its last calls.
    uint64_t horizon = 0;
    for (const auto& st : pipe.stages)
      if (st.kind == StageKind::kJoin) horizon = std::max(horizon, st.join->horizon_ns + st.join->within_ns);
    pipe.window.lateness_ns = std::max(pipe.window.lateness_ns, horizon);
    const uint64_t wsize = pipe.window.kind == WindowKind::kWhole ? 0 : pipe.window.size_ns;
    for (auto& st : pipe.stages)
      if (st.kind == StageKind::kJoin) st.retain_ns = wsize + pipe.window.lateness_ns + st.join->horizon_ns;
    if (!pipe.keys.has(Field::kPid) && !pipe.keys.has(Field::kTid)) pipe.global = true;
    RuleOutcome outcome;
    const auto* em = pipe.stages.back().emit;
    outcome.rule = em->rule;
    outcome.rule_hash = em->rule_hash;
    outcome.category = em->category;
    outcome.over_time = pipe.over_time;
    pipe.rule_index = cp->rules.size();
    cp->rules.push_back(outcome);
    (pipe.global ? cp->has_global : cp->has_sharded) = true;
    cp->pipes.push_back(std::move(pipe));
  }
  // Host-wide right streams: a stream carries broadcast events unless it is off-CPU spans.
  for (auto& s : cp->streams) s.host_wide = s.offcpu == nullptr && s.account == nullptr && s.steps == nullptr;
  if (!errors.empty()) return nullptr;
  // Group pipes that window and aggregate the same stream the same way.
  std::map<std::string, size_t> group_of;
  for (size_t i = 0; i < cp->pipes.size(); ++i) {
    auto& pipe = cp->pipes[i];
    std::string sig = std::to_string(pipe.stream) + "|" + std::to_string(static_cast<int>(pipe.window.kind)) + "|" +
                      std::to_string(pipe.window.size_ns) + "|" + std::to_string(pipe.window.slide_ns) + "|" +
                      (pipe.global ? "g" : "s") + "|";
    for (Field f : pipe.key_fields) sig += std::string(field_name(f)) + ",";
    const auto& agg = pipe.layout->node();
    sig += "|" + std::to_string(agg.exact_limit) + "|" + std::to_string(agg.sketch_alpha);
    for (const auto& a : agg.aggs)
      sig += "|" + a.name + ":" + agg_name(a.kind) + ":" + field_name(a.field) + ":" + std::to_string(a.q) + ":" +
             std::to_string(a.buckets);
    auto [it, fresh] = group_of.try_emplace(sig, cp->groups.size());
    if (fresh) {
      WindowGroup g;
      g.stream = pipe.stream;
      g.window = pipe.window;
      g.global = pipe.global;
      cp->groups.push_back(g);
    }
    auto& g = cp->groups[it->second];
    g.pipes.push_back(i);
    g.needs_calls = g.needs_calls || pipe.needs_calls;
    g.window.lateness_ns = std::max(g.window.lateness_ns, pipe.window.lateness_ns);
  }
  // Routes (see Routes): groups over filter chains of the scan, per tier and (source, op).
  cp->routed.assign(cp->groups.size(), 0);
  for (size_t g = 0; g < cp->groups.size(); ++g) {
    bool ok = cp->groups[g].stream >= 0;
    for (int s = cp->groups[g].stream; s >= 0 && ok; s = cp->streams[static_cast<size_t>(s)].parent)
      ok = cp->streams[static_cast<size_t>(s)].offcpu == nullptr &&
           cp->streams[static_cast<size_t>(s)].account == nullptr &&
           cp->streams[static_cast<size_t>(s)].steps == nullptr;
    cp->routed[g] = ok ? 1 : 0;
  }
  // Built group by group: each group's chain of filters is walked once for a mask of the codes
  // it can take (a byte loop), then only those codes collect its residual checks. Targets stay in
  // group order within a code, as the engine expects; the checks of one target are contiguous
  // (their order across targets does not matter).
  constexpr uint32_t kCodes = 1u << 16;
  std::vector<uint8_t> live(kCodes);
  std::vector<uint32_t> fill(kCodes);
  for (int tier = 0; tier < 2; ++tier) {
    Routes& r = cp->routes[tier];
    std::vector<std::vector<uint8_t>> live_of;
    std::vector<size_t> tier_groups;
    std::vector<uint32_t> count(kCodes + 1, 0);
    for (size_t g = 0; g < cp->groups.size(); ++g) {
      if (!cp->routed[g] || cp->groups[g].global != (tier == 1)) continue;
      std::fill(live.begin(), live.end(), uint8_t{1});
      for (int s = cp->groups[g].stream; s >= 0; s = cp->streams[static_cast<size_t>(s)].parent) {
        const StreamDef& sd = cp->streams[static_cast<size_t>(s)];
        if (!sd.filter || sd.source_op_mask.empty()) continue;
        and_nonzero(live.data(), sd.source_op_mask.data(), kCodes);
      }
      for (uint32_t code = 0; code < kCodes; ++code) count[code + 1] += live[code];
      tier_groups.push_back(g);
      live_of.push_back(live);
    }
    for (uint32_t code = 0; code < kCodes; ++code) count[code + 1] += count[code];
    r.begin = count;
    r.targets.assign(count[kCodes], RouteTarget{});
    std::copy(count.begin(), count.end() - 1, fill.begin());
    for (size_t i = 0; i < tier_groups.size(); ++i) {
      const size_t g = tier_groups[i];
      for (uint32_t code = 0; code < kCodes; ++code) {
        if (!live_of[i][code]) continue;
        const auto checks_begin = static_cast<uint32_t>(r.checks.size());
        for (int s = cp->groups[g].stream; s >= 0; s = cp->streams[static_cast<size_t>(s)].parent) {
          const StreamDef& sd = cp->streams[static_cast<size_t>(s)];
          if (!sd.filter) continue;  // the scan
          if (sd.source_op_mask.empty()) {
            r.checks.push_back(sd.filter.get());
          } else if (const uint8_t m = sd.source_op_mask[code]; m >= 2) {
            r.checks.push_back(sd.residuals[m - 2u].get());
          }
        }
        r.targets[fill[code]++] = {static_cast<uint32_t>(g), checks_begin, static_cast<uint32_t>(r.checks.size())};
      }
    }
  }
  // A pipe's windows now close at its group's lateness: its join buffers must keep spans that long.
  for (const auto& g : cp->groups)
    for (size_t i : g.pipes) {
      auto& pipe = cp->pipes[i];
      pipe.window.lateness_ns = g.window.lateness_ns;
      const uint64_t wsize = pipe.window.kind == WindowKind::kWhole ? 0 : pipe.window.size_ns;
      for (auto& st : pipe.stages)
        if (st.kind == StageKind::kJoin) st.retain_ns = wsize + pipe.window.lateness_ns + st.join->horizon_ns;
    }
  return cp;
}

void merge_window_runs(const CompiledPlan& plan, std::vector<Chain>& chains) {
  std::map<std::string, uint64_t> step_of;  // rule -> its window's step
  for (const auto& pipe : plan.pipes) {
    if (pipe.over_time && pipe.window.kind != WindowKind::kWhole && !pipe.stages.empty() && pipe.stages.back().emit)
      step_of[pipe.stages.back().emit->rule] = pipe.window.kind == WindowKind::kSteps ? 0 : pipe.window.slide_ns;
  }
  if (step_of.empty()) return;
  auto same_key = [](const Chain& a, const Chain& b) {
    return a.rule == b.rule && a.node == b.node && a.pid == b.pid && a.tid == b.tid && a.rank == b.rank &&
           a.source == b.source && a.op == b.op;
  };
  std::vector<Chain> keep, runs;
  for (auto& c : chains) (step_of.count(c.rule) ? runs : keep).push_back(std::move(c));
  std::sort(runs.begin(), runs.end(), [](const Chain& a, const Chain& b) {
    return std::tie(a.rule, a.node, a.pid, a.tid, a.rank, a.source, a.op, a.window_start) <
           std::tie(b.rule, b.node, b.pid, b.tid, b.rank, b.source, b.op, b.window_start);
  });
  for (size_t i = 0; i < runs.size();) {
    // A steps window has no fixed length (step_of 0): the gap allowed is two of the last window's.
    const uint64_t fixed = step_of[runs[i].rule];
    size_t j = i + 1, worst = i;
    uint64_t end = runs[i].window_end, dropped = runs[i].dropped_events;
    auto step = [&] { return fixed ? fixed : runs[j - 1].window_end - runs[j - 1].window_start; };
    while (j < runs.size() && same_key(runs[j], runs[i]) && runs[j].window_start <= end + 2 * step()) {
      if (runs[j].severity > runs[worst].severity) worst = j;
      end = std::max(end, runs[j].window_end);
      dropped += runs[j].dropped_events;
      ++j;
    }
    Chain c = runs[worst];
    const size_t n = j - i;
    if (n > 1) {
      c.id = runs[i].id;
      c.window_start = runs[i].window_start;
      c.window_end = end;
      c.dropped_events = dropped;
      c.summary += " (worst of " + std::to_string(n) + " windows in a row)";
    }
    c.values.emplace_back("windows", static_cast<double>(n));
    // The baseline before the run (its first window's), for the time it lost against it
    // (operators/severity.h chain_lost_ns): later windows' baselines hold the run itself.
    for (const auto& [k, v] : runs[i].values)
      if (k == "trend.median") {
        c.values.emplace_back("trend.median.before", v);
        break;
      }
    keep.push_back(std::move(c));
    i = j;
  }
  chains = std::move(keep);
}

std::string expand_template(const std::string& tmpl, const CompiledPlan& plan, const PipeDef& pipe, const Key& key,
                            const double* row, const std::map<uint32_t, std::string>* names) {
  const auto& process_names = names ? *names : plan.process_names;
  std::string out;
  out.reserve(tmpl.size() + 32);
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '{') {
      out += tmpl[i];
      continue;
    }
    const size_t close = tmpl.find('}', i);
    if (close == std::string::npos) {
      out += tmpl.substr(i);
      break;
    }
    const std::string name = tmpl.substr(i + 1, close - i - 1);
    i = close;
    if (name == "op") {
      out += pipe.keys.has(Field::kOp) ? op_name(key.source(), key.op()) : "calls";
    } else if (name == "source") {
      out += source_name(key.source());
    } else if (name == "node") {
      const auto idx = key.node();
      out += idx < plan.node_names.size() && !plan.node_names[idx].empty() ? plan.node_names[idx] : std::to_string(idx);
    } else if (name == "process") {
      auto it = process_names.find(key.pid());
      out += it != process_names.end() ? it->second : "pid " + std::to_string(key.pid());
    } else if (name == "key") {
      out += key_text(pipe, key, plan.stacks.get());
    } else if (name == "site" && pipe.site_key) {
      out += plan.stacks->site_text(site_of(key));
    } else if (name.rfind("task:", 0) == 0) {
      // {task:slot}: the process whose pid the slot holds, by name: "stress (pid 4242)".
      const std::string slot = name.substr(5);
      bool found = false;
      for (size_t s = pipe.slots.size(); s-- > 0 && !found;) {
        if (pipe.slots[s].name != slot) continue;
        found = true;
        const double v = row[s];
        if (!(v > 0 && v < 4294967296.0)) {
          out += "an unknown task";
          break;
        }
        const auto pid = static_cast<uint32_t>(v);
        auto it = process_names.find(pid);
        out += (it != process_names.end() && !it->second.empty() ? it->second + " " : std::string()) + "(pid " +
               std::to_string(pid) + ")";
      }
      if (!found) out += "{" + name + "}";
    } else {
      bool found = false;
      for (size_t s = pipe.slots.size(); s-- > 0;)
        if (pipe.slots[s].name == name) {
          out += format_value(row[s], pipe.slots[s].unit);
          found = true;
          break;
        }
      if (!found) out += "{" + name + "}";
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

namespace {

struct Call {
  uint64_t ts, dur, id;
  uint32_t pid, tid;
};

// Total order on calls by slowness (duration, then time, id, tid as tie-breaks), so which calls
// a capped buffer keeps never depends on arrival order, batch size or thread count.
bool slower(const Call& a, const Call& b) {
  if (a.dur != b.dur) return a.dur > b.dur;
  if (a.ts != b.ts) return a.ts > b.ts;
  if (a.id != b.id) return a.id > b.id;
  return a.tid > b.tid;
}

// A call as a buffer holds it while every call it was given has one pid and fits a 32-bit
// duration (4.29 s): 24 bytes instead of 32. Ordered by `slower` on the same fields.
struct NarrowCall {
  uint64_t ts, id;
  uint32_t dur, tid;
};
struct Slower {
  // The duration orders slowness first (TopK's primary key: a compaction selects on it).
  static uint64_t primary(const Call& c) { return c.dur; }
  static uint64_t primary(const NarrowCall& c) { return c.dur; }
  bool operator()(const Call& a, const Call& b) const { return slower(a, b); }
  bool operator()(const NarrowCall& a, const NarrowCall& b) const {
    if (a.dur != b.dur) return a.dur > b.dur;
    if (a.ts != b.ts) return a.ts > b.ts;
    if (a.id != b.id) return a.id > b.id;
    return a.tid > b.tid;
  }
};

// The calls of a call buffer before its cap (CallBuffer): appended in chunks of kCalls narrow
// calls, full chunks reported to the shard's SpillFile as resident and, while it is over its
// budget, written to it and dropped from memory (replay only: a SpillFile is given there). The
// calls are the same and come back in the same order; only where they live changes. A growing
// vector would hold up to twice its calls (doubling) for every key of every open window; chunks
// hold at most one partly filled chunk each, and spilled chunks none.
class CallChunks {
 public:
  static constexpr size_t kCalls = 256;  // a power of two: a full chunk's vector has no slack (6 KiB)
  CallChunks() = default;
  explicit CallChunks(SpillFile* spill) : spill_(spill) {}
  CallChunks(CallChunks&& o) noexcept : spill_(o.spill_), chunks_(std::move(o.chunks_)) { o.chunks_.clear(); }
  CallChunks& operator=(CallChunks&& o) noexcept {
    if (this != &o) {
      clear();
      spill_ = o.spill_;
      chunks_ = std::move(o.chunks_);
      o.chunks_.clear();
    }
    return *this;
  }
  CallChunks(const CallChunks&) = delete;
  CallChunks& operator=(const CallChunks&) = delete;
  ~CallChunks() { clear(); }

  [[gnu::always_inline]] void push_back(const NarrowCall& c) {
    if (chunks_.empty() || chunks_.back().calls.size() == kCalls) [[unlikely]]
      open_chunk();
    chunks_.back().calls.push_back(c);
  }
  // fn(call) for every call, in the order they were added.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const Chunk& ch : chunks_) {
      if (ch.slot.cap == 0) {
        for (const auto& c : ch.calls) fn(c);
        continue;
      }
      const std::vector<NarrowCall>& back = read(ch);
      for (const auto& c : back) fn(c);
    }
  }
  // Drops every call (slots released, resident bytes given back).
  void clear() {
    for (Chunk& ch : chunks_) {
      if (ch.slot.cap != 0) spill_->release(ch.slot);
      else if (ch.counted) spill_->add_resident(-static_cast<std::ptrdiff_t>(ch.calls.capacity() * sizeof(NarrowCall)));
    }
    chunks_.clear();
  }

 private:
  struct Chunk {
    std::vector<NarrowCall> calls;  // empty once spilled
    SpillFile::Slot slot;           // cap != 0: the calls are in the spill file
    uint32_t n = 0;                 // calls when spilled
    bool counted = false;           // reported to the spill file as resident
  };
  // The last chunk is full: it is sealed (counted as resident, spilled while over budget) and a
  // new one opened.
  [[gnu::noinline]] void open_chunk() {
    if (!chunks_.empty()) {
      Chunk& last = chunks_.back();
      const size_t bytes = last.calls.size() * sizeof(NarrowCall);
      spill_->add_resident(static_cast<std::ptrdiff_t>(last.calls.capacity() * sizeof(NarrowCall)));
      last.counted = true;
      if (spill_->over_budget() &&
          spill_->put(reinterpret_cast<const uint8_t*>(last.calls.data()), static_cast<uint32_t>(bytes), last.slot)) {
        spill_->add_resident(-static_cast<std::ptrdiff_t>(last.calls.capacity() * sizeof(NarrowCall)));
        last.counted = false;
        last.n = static_cast<uint32_t>(last.calls.size());
        std::vector<NarrowCall>().swap(last.calls);
      }
    }
    chunks_.emplace_back();
  }
  // A spilled chunk's calls, read back into a scratch vector (valid until the next read()). A
  // read error (an I/O error on our own file) gives no calls (SpillFile counts it: the run's
  // join_spill_read_errors).
  const std::vector<NarrowCall>& read(const Chunk& ch) const {
    static thread_local std::vector<NarrowCall> scratch;
    scratch.resize(ch.n);
    if (!spill_->get(ch.slot, reinterpret_cast<uint8_t*>(scratch.data()))) scratch.clear();
    return scratch;
  }
  SpillFile* spill_ = nullptr;
  std::vector<Chunk> chunks_;
};

// The calls a join may look at when the window closes. Joins only look at the window's tail (the
// slow calls, chosen by the rule's `tail` condition once the window's quantiles are known), so
// the buffer keeps every call up to kMaxTailCalls and, beyond that, the kMaxTailCalls slowest
// (TopK: threshold reject + bulk compaction, the same set a heap keeps): exact whenever the tail
// has at most kMaxTailCalls calls, and bounded memory (1.5 x kMaxTailCalls x 24 or 32 bytes per
// window and key) at any rate. A capped window's joins are judged on its slowest calls, and say
// so (evidence text, EngineCounters::tail_windows_capped).
// Calls are kept narrow (NarrowCall, the pid once for the buffer) until one has another pid or a
// duration past 32 bits; the buffer then widens for good: a TopK of full calls is given the kept
// narrow ones, which are the slowest so far, so it keeps the same set a full buffer would have.
// On replay (a SpillFile given: ShardTuning::join_resident_bytes, whose budget and file the call
// chunks share with the join span blocks) narrow calls up to the cap sit
// in CallChunks, whose full chunks go to the spill file past the budget, instead of the TopK; at
// the cap, or at a call that is not narrow, they are given to the TopK in the order they came.
// Only where the calls live changes: explain's peak RSS on the 5 M-event procs64 shape went from
// 272 to 101 MB, its output byte for byte the same (docs/performance.md, "Speed on any shape").
class CallBuffer {
 public:
  // `pid`: the pid narrow calls have (the window's first call's); `narrow` false: full calls only.
  // `spill`: where narrow calls before the cap may go (CallChunks); null: in the TopK from the
  // first call, all in memory.
  explicit CallBuffer(size_t cap = kMaxTailCalls, bool narrow = true, uint32_t pid = 0, SpillFile* spill = nullptr)
      : cap_(cap ? cap : 1), pid_(pid), narrow_(cap_), chunked_(narrow && spill != nullptr), chunks_(spill) {
    if (!narrow) widen();
  }
  [[gnu::always_inline]] void add(const Event& e) {
    ++seen_;
    sorted_ = false;
    if (!wide_ && e.pid == pid_ && e.dur_ns <= std::numeric_limits<uint32_t>::max()) {
      if (chunked_ && seen_ <= cap_) [[likely]] {
        chunks_.push_back({e.ts_ns, e.id, static_cast<uint32_t>(e.dur_ns), e.tid});
        return;
      }
      if (chunked_) leave_chunks();
      narrow_.add({e.ts_ns, e.id, static_cast<uint32_t>(e.dur_ns), e.tid});
      return;
    }
    if (chunked_) leave_chunks();
    if (!wide_) widen();
    wide_->add({e.ts_ns, e.dur_ns, e.id, e.pid, e.tid});
  }
  // Calls visit(items, as_call) once: the kept calls in time order (arrival order while under the
  // cap: events reach a window in time order), full or narrow, and a function that makes a Call
  // of one. The caller's loop over them is compiled once per form, with nothing called per call.
  template <class Visit>
  void visit_calls(Visit&& visit) {
    if (chunked_) {
      // At most cap() calls, in arrival order: what the TopK would hand out (sorted when full).
      std::vector<NarrowCall>& v = gathered();
      if (seen_ >= cap_) sort_by_time(v.begin(), v.end());
      visit(v, [this](const NarrowCall& n) { return wide_of(n); });
      return;
    }
    if (wide_) {
      auto& v = wide_->items();
      sort_if_full(v);
      visit(v, [](const Call& c) { return c; });
      return;
    }
    auto& v = narrow_.items();
    sort_if_full(v);
    visit(v, [this](const NarrowCall& n) { return wide_of(n); });
  }
  // Calls fn(call) for every call the buffer holds, in no particular order (compacting first,
  // which does not change which calls are kept): a superset of what visit_calls gives later.
  template <class Fn>
  void for_each_held(Fn&& fn) {
    if (chunked_) {
      chunks_.for_each([&](const NarrowCall& n) { fn(wide_of(n)); });
      return;
    }
    if (wide_) {
      for (const auto& c : wide_->items()) fn(c);
      return;
    }
    for (const auto& n : narrow_.items()) fn(wide_of(n));
  }
  // The kept calls with a duration at or above `bound` (above it when `strict`; compared as
  // eval() compares `duration >= bound`), appended to `out` in the order visit_calls gives them,
  // without compacting the buffer first - when at most cap() held calls pass the bound. They are
  // then exactly the kept calls that pass it: every call slower than one of them is held too
  // (a call is dropped only below the k-th slowest seen when it came), so each has fewer than
  // cap() slower calls. Returns false, with `out` as it was, when more pass (the caller visits
  // the compacted calls instead).
  bool tail_without_compacting(double bound, bool strict, std::vector<Call>& out) {
    const size_t first = out.size();
    auto take = [&](const auto& held, auto as_call) {
      for (const auto& item : held) {
        const double d = static_cast<double>(item.dur);
        if (!(strict ? d > bound : d >= bound)) continue;
        if (out.size() - first == cap_) return false;
        out.push_back(as_call(item));
      }
      return true;
    };
    const bool fits = chunked_ ? take(gathered(), [this](const NarrowCall& n) { return wide_of(n); })
                      : wide_  ? take(wide_->held(), [](const Call& c) { return c; })
                               : take(narrow_.held(), [this](const NarrowCall& n) { return wide_of(n); });
    if (!fits) {
      out.resize(first);
      return false;
    }
    // visit_calls sorts a full buffer into time order; a filter of it is that order's filter.
    if (seen_ >= cap_) sort_by_time(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    return true;
  }
  uint64_t seen() const { return seen_; }
  bool capped() const { return seen_ > cap_; }
  size_t kept() const { return static_cast<size_t>(std::min<uint64_t>(seen_, cap_)); }  // once compacted
  size_t cap() const { return cap_; }

 private:
  // A full buffer's calls in time order. TopK compactions keep arrival order (Slower has a
  // primary key), and calls arrive in time order, so the sort is usually a check.
  template <class V>
  void sort_if_full(V& v) {
    if (seen_ < cap_ || sorted_) return;
    sort_by_time(v.begin(), v.end());
    sorted_ = true;
  }
  // Calls (full or narrow) into time order: start, then id and tid (a sort usually a check).
  template <class It>
  static void sort_by_time(It begin, It end) {
    const auto earlier = [](const auto& a, const auto& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.id != b.id ? a.id < b.id : a.tid < b.tid;
    };
    if (!std::is_sorted(begin, end, earlier)) std::sort(begin, end, earlier);
  }
  Call wide_of(const NarrowCall& n) const { return {n.ts, n.dur, n.id, pid_, n.tid}; }
  // The chunks' calls in arrival order, in a scratch vector of the thread (valid until the next
  // gathered()): at most cap() calls, one key's at a time.
  std::vector<NarrowCall>& gathered() const {
    static thread_local std::vector<NarrowCall> v;
    v.clear();
    chunks_.for_each([](const NarrowCall& n) { v.push_back(n); });
    return v;
  }
  // The cap is passed, or a call is not narrow: the calls so far go to the TopK in the order they
  // came, which then holds exactly what it would had it taken them one by one.
  [[gnu::noinline]] void leave_chunks() {
    chunked_ = false;
    chunks_.for_each([this](const NarrowCall& n) { narrow_.add(n); });
    chunks_.clear();
  }
  void widen() {
    wide_ = std::make_unique<TopK<Call, Slower>>(cap_);
    for (const auto& n : narrow_.items()) wide_->add(wide_of(n));
    narrow_ = TopK<NarrowCall, Slower>(1);  // frees the narrow items
  }

  size_t cap_;
  uint64_t seen_ = 0;
  uint32_t pid_ = 0;
  bool sorted_ = false;
  TopK<NarrowCall, Slower> narrow_;
  std::unique_ptr<TopK<Call, Slower>> wide_;  // null while narrow
  bool chunked_ = false;                      // the calls are in chunks_ (narrow, not past the cap), not in the TopK
  CallChunks chunks_;
};

struct WinState {
  bool ready = false;  // the aggregate is bound to its layout on the first event
  AggregateState agg;
  CallBuffer calls;
  // Index in the shard's list of its group's open call-buffering windows (Impl::open_calls).
  uint32_t open_index = std::numeric_limits<uint32_t>::max();
  uint16_t code = 0;  // source << 8 | op of its first event (Impl::stats_group: of all of them)
};

struct PipeState {
  bool active = false;               // runs in this shard's tier
  std::vector<IntervalJoin*> joins;  // per stage: its span buffer (Impl::join_buffers), null for non-join stages
  std::vector<uint64_t> join_tags;   // per join stage: the tags it counts in its buffer (IntervalJoin::probe)
  std::vector<std::unique_ptr<TrendOp>> trends;
};

// The spans of one right stream on one join key, buffered once for every join stage of the shard
// that reads the same spans the same way: the same stream, key, kind and `within`; and off-CPU
// streams built by one builder (Impl::builder_of) share one buffer of all the builder's spans,
// tagged with their state, each stage counting only its states' tags (IntervalJoin, "Tags").
// In the default pack: 10 join stages, 5 buffers (the off-CPU time of the preempted, the blocked
// and the combined rules is one buffer instead of three copies). Kept as long as the stage that
// needs it longest (retain_ns), and pruned against the calls of every window group that probes
// it: a span no candidate of any of them touches is dropped, so each stage sees the spans its own
// buffer would have held for its calls, and results do not change (tests/engine/join_share_test).
struct JoinBuffer {
  std::unique_ptr<IntervalJoin> join;
  size_t right_stream = 0;  // the stream whose events are added (the first stage's)
  int builder = -1;         // tagged: the off-CPU builder whose spans (all states) are added
  JoinKey key = JoinKey::kNone;
  uint64_t retain_ns = 0;      // the largest retain_ns of its stages
  std::vector<size_t> groups;  // the window groups whose calls probe it (ascending, no repeats)
  size_t prune_at = 0;         // prune once it holds this many spans (ShardTuning); 0: never
                               // (a group of its may receive calls late)
};

struct Row {
  Key key;
  uint64_t window = 0, start = 0, end = 0;
  std::vector<double> values;
  std::vector<PredicateResult> predicates;
  std::vector<EvidenceItem> evidence;
};

// Whether an expression reads the event (a field or a stack predicate), not only row slots.
bool reads_event(const Expr& e) {
  if (e.op == ExprOp::kField || e.op == ExprOp::kStackMatch || e.op == ExprOp::kSiteMatch) return true;
  for (const auto& a : e.args)
    if (reads_event(*a)) return true;
  return false;
}

// A join's tail condition when it is `duration >= X` or `duration > X` with X read from the row
// only (the rule pack's `tail duration >= slow`): X is evaluated once per window and each call's
// duration compared with it, the same double comparison eval() makes, instead of a tree walk per
// buffered call. Any other condition is evaluated per call.
struct TailCut {
  bool fast = false;
  bool strict = false;          // `>` rather than `>=`
  const Expr* bound = nullptr;  // X
};

TailCut tail_cut_of(const Expr* tail) {
  TailCut t;
  if (!tail || (tail->op != ExprOp::kGe && tail->op != ExprOp::kGt) || tail->args.size() != 2) return t;
  const Expr& lhs = *tail->args[0];
  if (lhs.op != ExprOp::kField || lhs.field != Field::kDuration || reads_event(*tail->args[1])) return t;
  t.fast = true;
  t.strict = tail->op == ExprOp::kGt;
  t.bound = tail->args[1].get();
  return t;
}

PredicateResult judge(const Expr& pred, const std::string& label, const double* row) {
  PredicateResult r;
  r.label = label;
  const Expr* e = &pred;
  // For a conjunction, report the first failing side (or the last one when all pass).
  while (e->op == ExprOp::kAnd && e->args.size() == 2) {
    if (!truthy(eval(*e->args[0], row))) {
      e = e->args[0].get();
    } else {
      e = e->args[1].get();
    }
  }
  r.passed = truthy(eval(pred, row));
  const bool cmp = e->op == ExprOp::kLt || e->op == ExprOp::kLe || e->op == ExprOp::kGt || e->op == ExprOp::kGe;
  if (cmp && e->args.size() == 2) {
    r.lhs = eval(*e->args[0], row);
    r.rhs = eval(*e->args[1], row);
    r.margin = (e->op == ExprOp::kGt || e->op == ExprOp::kGe) ? r.lhs - r.rhs : r.rhs - r.lhs;
  } else {
    r.lhs = eval(*e, row);
    r.rhs = 1;
    r.margin = r.passed ? 0 : -1;
  }
  if (r.margin != r.margin) r.margin = -std::numeric_limits<double>::infinity();
  return r;
}

// better_miss without the key: 1 or -1 when stage, shortfall or window decide, 0 when only the
// key can (a tie on all three).
int better_miss_unkeyed(int stage, const PredicateResult& p, uint64_t window, const RuleOutcome& cur) {
  if (!cur.has_miss) return 1;
  if (stage != cur.miss_stage) return stage > cur.miss_stage ? 1 : -1;
  // Compare shortfalls relative to the threshold, so ratios and nanoseconds compare fairly.
  auto rel = [](const PredicateResult& x) {
    const double scale = std::max(std::fabs(x.rhs), 1e-12);
    return x.margin / scale;
  };
  if (rel(p) != rel(cur.miss)) return rel(p) > rel(cur.miss) ? 1 : -1;
  if (window != cur.miss_window_start) return window < cur.miss_window_start ? 1 : -1;
  return 0;
}
}  // namespace

bool better_miss(int stage, const PredicateResult& p, uint64_t window, const std::string& key, const RuleOutcome& cur) {
  const int by = better_miss_unkeyed(stage, p, window, cur);
  return by != 0 ? by > 0 : key < cur.miss_key;
}

namespace {

// Answers a shard's stack predicates from the plan's shared stack table, remembering each
// (predicate, stack) answer: a stack is parsed and matched once per shard, not once per event.
// The memo holds at most kMaxMemo answers (then starts over). A stack not yet in the table (live:
// its event came before its symbols) does not match, and is not remembered, so later events
// with it match once it is known.
class ShardStackMatcher final : public StackMatcher {
 public:
  explicit ShardStackMatcher(const StackTable* table) : table_(table) {}
  bool match(const Expr& e, uint64_t stack_id) const override {
    const Key k{&e, stack_id};
    if (const auto it = memo_.find(k); it != memo_.end()) return it->second;
    const auto st = table_ ? table_->find(stack_id) : nullptr;
    if (!st) return false;
    if (memo_.size() >= kMaxMemo) memo_.clear();
    const bool m = stack_matches(e, *st);
    memo_.emplace(k, m);
    return m;
  }

 private:
  static constexpr size_t kMaxMemo = 1u << 16;
  struct Key {
    const Expr* e;
    uint64_t id;
    bool operator==(const Key& o) const { return e == o.e && id == o.id; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<uint64_t>()(k.id * 0x9e3779b97f4a7c15ull ^ reinterpret_cast<uintptr_t>(k.e));
    }
  };
  const StackTable* table_;
  mutable std::unordered_map<Key, bool, KeyHash> memo_;
};

}  // namespace

struct Shard::Impl {
  const CompiledPlan& plan;
  ShardTier tier;
  std::vector<char> group_mask;  // empty: every group of the tier; else only groups g with group_mask[g]
  bool compute_stats;
  // Whether this shard runs the pipes (and window groups) of that tier.
  bool runs(bool global_tier) const { return tier == ShardTier::kBoth || (tier == ShardTier::kGlobal) == global_tier; }
  // Whether this shard runs window group g (and the pipes of it).
  bool runs_group(size_t g) const {
    return runs(plan.groups[g].global) && (group_mask.empty() || (g < group_mask.size() && group_mask[g]));
  }
  // The tiers' route tables this shard walks (CompiledPlan::routes: [0] pid, [1] global).
  std::vector<const Routes*> route_tiers() const {
    std::vector<const Routes*> r;
    if (runs(false)) r.push_back(&plan.routes[0]);
    if (runs(true)) r.push_back(&plan.routes[1]);
    return r;
  }
  ShardTuning tuning;
  // Per window group that buffers calls for joins: its open windows' states (pointers into the
  // WindowStore are stable while the window is open), so a join prune can see every call that
  // may still be probed. A state is listed at its first event and unlisted when it closes.
  std::vector<std::vector<WinState*>> open_calls;
  std::vector<size_t> group_of_pipe;
  // Where the join buffers' sealed span blocks go beyond ShardTuning::join_resident_bytes (null:
  // nothing spills). Declared before join_buffers, which use it until they are destroyed.
  // The call buffers' full chunks of calls (CallChunks) go to the same file, within the same
  // budget: it is created with the shard when there is a budget (declared before the window
  // stores, whose call buffers use it until they are destroyed).
  std::unique_ptr<SpillFile> join_spill;
  std::vector<JoinBuffer> join_buffers;  // the span buffers the pipes' join stages point at
  // Off-CPU span building, shared by the off-CPU streams with the same parent and minimum
  // length: their builders would pair the same switches into the same spans in the same order
  // and differ only in which states they keep (OffCpuSpanBuilder::emit), so one builder with no
  // state filter builds the spans once per batch and each stream keeps its states' spans
  // (pointers into the shared list, in its order). builder_of: per stream, its index, or -1.
  struct SharedSpans {
    std::unique_ptr<OffCpuSpanBuilder> builder;
    std::vector<Event> spans;  // this batch's, when this shard builds them
    // This batch's spans: `spans`, or the router's (RoutedBatch::spans, take_routed).
    std::span<const Event> view;
    const std::vector<Event>* routed = nullptr;  // the router's this batch, if it built them
    bool built = false;                          // this batch
    bool prebuild = false;                       // route(): this shard builds them for others
  };
  std::vector<SharedSpans> shared_spans;
  std::vector<int> builder_of;
  // Per stream with an Account step: the shard's accounting of the threads it owns, and this
  // batch's slices (the stream's events point into it).
  // The stream's events are not the slices themselves (one per piece of time: about two per GPU
  // call) but their totals per thread, grid cell and bucket (and, preempted, per task that ran
  // instead): a cell's totals go out once the watermark is more than the slicer's gap_ns past the
  // cell's end (by then every slice of it is out: operators/time_accounting.h), at its start
  // time, so a window gets at most ~14 events per thread and second, the same however the batches
  // were cut.
  // The slicer sums its slices per thread and cell itself (TimeAccounting::flush_cells): no Event
  // per slice.
  struct AccountStep {
    std::unique_ptr<TimeAccounting> acct;
    uint64_t grid_ns = 1;
    std::vector<CellTotals> flushed;                                       // this batch's, from the slicer
    std::map<std::tuple<uint64_t, uint16_t, uint32_t>, CellTotals> cells;  // (cell, node, tid)
    std::vector<Event> out;                                                // this batch's stream events
  };
  std::vector<AccountStep> accounts;
  // Per stream with a Step step: the shard's step tracker of the processes it owns and this
  // batch's step events (the stream's events point into it).
  struct StepStep {
    std::unique_ptr<StepTracker> tracker;
    std::vector<Event> out;
  };
  std::vector<StepStep> step_steps;
  std::vector<PipeState> pipes;                                 // per plan pipe (inactive if not ours)
  std::vector<std::unique_ptr<WindowStore<WinState>>> windows;  // per window group (null if not ours)
  std::unique_ptr<OpStatsAccumulator> stats;
  std::vector<RuleOutcome> outcomes;
  EngineCounters counters;
  uint64_t last_ts = 0;
  uint64_t dropped = 0;
  std::shared_ptr<const std::map<uint32_t, std::string>> names;  // latest from the input, if any
  // Every process exit (HOST process_exit) as (pid, ts), in that order: a window keyed by pid
  // ends at the pid's last exit inside it, for rates. Every exit, not the latest: a window closes
  // some batches after its end, and by then the pid may have exited again (pid reuse, or a trace
  // that records thread exits), so the latest exit would depend on where the batches were cut.
  // Exits older than every time window still open are pruned (exit_horizon; whole-trace windows
  // never read exits), so a capture of many short-lived processes does not grow it without bound.
  std::set<std::pair<uint32_t, uint64_t>> exited;
  std::vector<std::pair<uint32_t, uint64_t>> batch_exits;  // route_batch's: this batch's, in order
  uint64_t exit_horizon = 0;
  // Per-batch stream outputs, as pointers into the input batch (filters copy nothing) or into
  // shared_spans (off-CPU spans built this batch): owned and foreign events separately.
  std::vector<std::vector<const Event*>> owned_out, foreign_out;
  std::vector<char> computed;
  ShardStackMatcher stack_matcher;  // stack predicates of filters
  // Windows keyed by site: stack_id -> site index, remembered per shard (at most 65,536 entries,
  // then started over). Stacks not known yet are not remembered (index 0 this time).
  std::unordered_map<uint64_t, uint16_t> site_memo;
  // Per pipe and stage: the join's tail cut (TailCut), and an id shared by the joins that compute
  // the same outcome from the same window: same right stream, kind, key, reach, exemplars,
  // retention and cut. Within one (window, key) close, a join whose id and threshold match an
  // earlier one's reuses its outcome (the rule pack repeats some joins in several rules).
  std::vector<std::vector<TailCut>> tail_cuts;
  std::vector<std::vector<int>> join_ids;
  struct CachedJoin {
    int id;
    double bound;
    JoinOutcome outcome;
  };
  std::vector<CachedJoin> join_cache;  // cleared at every (window, key) close
  // The tail window_tail extracted last: of which state, for which cut. Forgotten (of = null) at
  // every (window, key) close, with join_cache; the vector keeps its capacity.
  struct TailCalls {
    const WinState* of = nullptr;
    double bound = 0;
    bool strict = false;
    std::vector<Call> calls;
  } tail_;
  // Per window group with tumbling or whole windows: a cache of the states events last went to,
  // by key, in sets of two entries (win_cache_set; the most recently added first). Keys
  // interleave in real traces (threads take turns, a process alternates launches and syncs), so
  // WindowStore's one-entry cache misses and each event would pay two map lookups. An entry is
  // used only for the same key and window index, and only while that window is open: the group's
  // cache is emptied whenever the group closes a window (WinState pointers are stable until then).
  struct WinCacheEntry {
    Key key;  // the key's identity (feed_events: its raw packing, or the Key by site)
    uint64_t k = 0;
    WinState* state = nullptr;
  };
  static constexpr unsigned kWinCacheBits = 12;
  static constexpr size_t kWinCache = size_t{1} << kWinCacheBits;
  // The first entry of a key's set: every bit of the key moves the set (multiplicative hashing,
  // top bits), so keys that differ only in the op (KeyHash's low bits do not see it) or the pid
  // spread over the sets.
  static size_t win_cache_set(const Key& k) {
    const uint64_t h = k.hi * 0x9E3779B97F4A7C15ull ^ k.lo * 0xC2B2AE3D27D4EB4Full;
    return static_cast<size_t>(h >> (64 - kWinCacheBits)) & (kWinCache - 2);
  }
  std::vector<std::vector<WinCacheEntry>> win_cache;
  // Per window group, the sets filled since the cache was last emptied (up to kWinCache / 2
  // entries; past that the whole cache is emptied): a group that closes windows often over few
  // keys empties a few sets, not all of them (win_cache_clear).
  std::vector<std::vector<uint32_t>> win_cache_filled;
  void win_cache_clear(size_t g) {
    auto& filled = win_cache_filled[g];
    WinCacheEntry* cache = win_cache[g].data();
    if (filled.size() >= kWinCache / 2) {
      for (auto& ce : win_cache[g]) ce.state = nullptr;
    } else {
      for (const uint32_t i : filled) cache[i].state = cache[i + 1].state = nullptr;
    }
    filled.clear();
  }
  // Per window group, what feed_events needs, gathered once: the key as masks over
  // KeyBy::full_key, the aggregate layout, whether it buffers calls, its window size.
  struct GroupFeed {
    uint64_t hi_mask = 0, lo_mask = 0;
    uint64_t raw_hi_mask = 0, raw_lo_mask = 0;  // the same fields over KeyBy::raw_key
    bool site_key = false, needs_calls = false, whole = false;
    uint64_t size = 1;
    const AggregateLayout* layout = nullptr;
  };
  std::vector<GroupFeed> feeds;
  // Sinks of the routing pass (routes_): per stream s, sink s when the stream of a routed window
  // group or a prerouted stream (window groups over one stream share its list: they keep the
  // same events, as compile_plan derives a route's codes and checks from the stream alone), and
  // the list of sched_switch events the off-CPU streams over the scan read (sink S, S = the
  // stream count). Per sink, the events of this batch it keeps, in batch order: the first
  // sink_sizes[k] entries of sink_events[k]. The routing pass writes through a cursor per sink
  // into lists sized for the whole batch up front (no capacity check per event).
  std::vector<std::vector<const Event*>> sink_events;
  std::vector<size_t> sink_sizes;
  std::vector<const Event**> sink_cursor;
  // Per sink, where this batch's list starts: sink_events[k], or another shard's routing pass
  // (ShardInput::routed).
  std::vector<const Event* const*> sink_data;
  // This shard's routes, to sinks (RouteTarget::group holds a sink index here): its tier's plan
  // routes (to the sinks of the window groups' streams, once per stream) plus, for the same codes, the
  // streams the routing pass fills itself instead of compute() scanning the batch once per
  // stream: the right streams of this shard's joins that are chains of source/op-only filters
  // over the scan (prerouted, keep = the chain's masks combined), and the sched_switch list when
  // an off-CPU stream over the scan is a join's right side (route_switches).
  Routes routes_;
  // routes_ per code as the routing pass reads it: one record, then the code's sinks that need no
  // check (stored as sink indices: a store per target, nothing to test) followed by its targets
  // that have checks (indices into routes_.targets). Within a code the targets fill different
  // sinks, so their order does not change any sink's list.
  struct CodeRoute {
    uint32_t begin = 0;               // into route_items
    uint32_t plain = 0, checked = 0;  // how many of each
    // The code's events reach stats_group (a plain route): the per-op statistics take their
    // totals here and their durations from that group's window states (stats_group).
    uint32_t carried = 0;
  };
  std::vector<CodeRoute> code_routes;    // 65,536
  std::vector<RouteCheck> route_checks;  // routes_.checks as route_checks_hold() answers them
  // Per target of routes_ (those with checks matter), what the routing loop needs to answer
  // them in place: its sink, and for a target whose one check is a kRange (a small field
  // against a constant: `rank >= 0`) the range itself; a target whose first check is a stack
  // predicate fails at once for an event without a stack. Any other goes to route_checks_hold().
  struct CheckedTarget {
    enum Mode : uint8_t { kCall, kRange, kStackFirst };
    int64_t lo = 0;
    uint64_t span = 0;
    uint32_t sink = 0, target = 0;
    Mode mode = kCall;
    Field field = Field::kTs;
    bool negate = false;
  };
  std::vector<CheckedTarget> checked_targets;
  std::vector<uint32_t> route_items;
  // Range checks answered per batch (a zone map): before the routing pass, the batch's smallest
  // and largest value of each field a kRange target reads (range_fields, usually only rank); a
  // target whose range holds every value in between passes every event of the batch, one whose
  // range holds none of them fails every one, and neither is checked per event (`rank >= 0` on a
  // trace without ranks: about 13 instructions per CUDA event and target otherwise). The codes
  // with such targets (range_codes) keep their lists as build_routes made them (base_*) and have
  // a second list in route_items (at alt) that answer_range_checks() rewrites, and points
  // code_routes at, when the answers change: the passing targets' sinks as plain items, the
  // failing ones left out, the rest checked as before.
  struct RangeCode {
    uint32_t code = 0;
    uint32_t base_begin = 0, base_plain = 0, base_checked = 0;
    uint32_t alt = 0;
  };
  std::vector<RangeCode> range_codes;
  std::vector<Field> range_fields;
  std::vector<uint32_t> range_targets;  // the kRange targets (indices into checked_targets)
  std::vector<uint8_t> range_field_of;  // per kRange target: its field's index in range_fields
  std::vector<int> range_slot;          // per checked target: its index in range_targets, or -1
  static constexpr int8_t kCheckEach = 0, kAllPass = 1, kAllFail = -1;
  std::vector<int8_t> range_verdicts;           // per kRange target, as the code lists now stand
  std::vector<char> prerouted;                  // per stream
  std::vector<char> stream_sink;                // per stream: the routing pass fills sink s
  std::vector<std::vector<uint8_t>> keep_code;  // per prerouted stream: 1 for the codes it keeps
  bool route_switches = false;
  size_t switch_sink = 0;
  // Per-op statistics without a second quantile insert per event: when a window group of this
  // shard keeps the durations of whole (source, op)s in its states (choose_stats_group), the
  // routing pass gives the statistics only each carried event's total and error count, and each
  // state's duration quantile is merged into them when it closes; an event the group's windows
  // refuse as late gives its duration directly. Every duration is then counted exactly once, and
  // OpStatsAccumulator::merge_quantile gives what per-event adds give. -1: none (every event is
  // added whole). Given up for good (give_up_stats_group) at a duration of 2^53 ns or more, where
  // the window's quantile takes a rounded value (AggregateState::duration_value).
  int stats_group = -1;
  uint16_t site_key_of(uint64_t stack_id) {
    if (stack_id == 0) return 0;
    if (const auto it = site_memo.find(stack_id); it != site_memo.end()) return it->second;
    const uint16_t idx = plan.stacks->site_index(stack_id);
    if (idx == 0) return 0;
    if (site_memo.size() >= (1u << 16)) site_memo.clear();
    site_memo.emplace(stack_id, idx);
    return idx;
  }

  Impl(const CompiledPlan& p, ShardTier tr, bool cs, const ShardTuning& t, std::vector<char> mask)
      : plan(p), tier(tr), group_mask(std::move(mask)), compute_stats(cs), tuning(t), stack_matcher(p.stacks.get()) {
    if (tuning.max_tail_calls == 0) tuning.max_tail_calls = 1;
    for (const auto& grp : plan.groups)
      if (grp.window.kind != WindowKind::kWhole)
        exit_horizon = std::max(exit_horizon, grp.window.size_ns + grp.window.lateness_ns);
    builder_of.assign(plan.streams.size(), -1);
    std::map<std::pair<int, uint64_t>, int> builder_index;  // (parent, min_ns) -> shared builder
    for (size_t i = 0; i < plan.streams.size(); ++i) {
      const OffCpuNode* node = plan.streams[i].offcpu;
      if (!node) continue;
      const auto [it, fresh] = builder_index.try_emplace({plan.streams[i].parent, node->min_ns},
                                                         static_cast<int>(shared_spans.size()));
      if (fresh) {
        shared_spans.emplace_back();
        shared_spans.back().builder = std::make_unique<OffCpuSpanBuilder>(OffCpuNode{node->min_ns, {}});
      }
      builder_of[i] = it->second;
    }
    accounts.resize(plan.streams.size());
    for (size_t i = 0; i < plan.streams.size(); ++i) {
      const AccountNode* node = plan.streams[i].account;
      if (!node) continue;
      accounts[i].acct = std::make_unique<TimeAccounting>();
      accounts[i].grid_ns = std::max<uint64_t>(node->grid_ns, 1);
      SliceOptions so;
      so.grid_ns = node->grid_ns;
      so.totals = true;
      std::shared_ptr<StackTable> stacks = plan.stacks;
      so.reason_of = [stacks](uint64_t id, BlockReason& r) {
        const auto st = stacks->find(id);
        if (!st) return false;
        r = block_reason(*st);
        return true;
      };
      accounts[i].acct->enable_slices(std::move(so));
    }
    step_steps.resize(plan.streams.size());
    for (size_t i = 0; i < plan.streams.size(); ++i)
      if (plan.streams[i].steps) {
        step_steps[i].tracker = std::make_unique<StepTracker>();
        if (plan.step_markers) step_steps[i].tracker->add_markers(*plan.step_markers);
      }
    group_of_pipe.assign(plan.pipes.size(), 0);
    for (size_t gi = 0; gi < plan.groups.size(); ++gi)
      for (size_t pi : plan.groups[gi].pipes) group_of_pipe[pi] = gi;
    pipes.resize(plan.pipes.size());
    for (size_t i = 0; i < plan.pipes.size(); ++i) {
      const auto& def = plan.pipes[i];
      if (!runs(def.global) || !runs_group(group_of_pipe[i])) continue;
      auto& ps = pipes[i];
      ps.active = true;
      ps.joins.resize(def.stages.size());
      ps.join_tags.assign(def.stages.size(), IntervalJoin::kAllTags);
      ps.trends.resize(def.stages.size());
      for (size_t s = 0; s < def.stages.size(); ++s) {
        const auto& st = def.stages[s];
        if (st.kind == StageKind::kTrend) ps.trends[s] = std::make_unique<TrendOp>(*st.trend);
      }
    }
    open_calls.resize(plan.groups.size());
    make_join_buffers();
    // Joins may prune only when every call their windows can receive is on time: the group's
    // stream is a filter chain over the scan (Routes) that keeps GPU API calls only (model/trace.h:
    // events delivered behind the watermark, flagged kLate, are never GPU API calls).
    std::vector<char> on_time(plan.groups.size(), 0);
    for (size_t gi = 0; gi < plan.groups.size(); ++gi) on_time[gi] = plan.routed[gi];
    for (const Routes* routes : route_tiers())
      for (uint32_t code = 0; code + 1 < routes->begin.size(); ++code)
        for (uint32_t t = routes->begin[code]; t < routes->begin[code + 1]; ++t)
          if (!is_gpu_api(static_cast<Source>(code >> 8))) on_time[routes->targets[t].group] = 0;
    for (auto& jb : join_buffers) {
      const bool all_on_time = std::all_of(jb.groups.begin(), jb.groups.end(),
                                           [&](size_t g) { return on_time[g] != 0; });
      if (tuning.prune_spans && all_on_time) jb.prune_at = std::max<size_t>(tuning.prune_min_spans, 1);
    }
    tail_cuts.resize(plan.pipes.size());
    join_ids.resize(plan.pipes.size());
    std::map<std::string, int> join_sig;
    for (size_t i = 0; i < plan.pipes.size(); ++i) {
      const auto& def = plan.pipes[i];
      tail_cuts[i].resize(def.stages.size());
      join_ids[i].assign(def.stages.size(), -1);
      for (size_t s = 0; s < def.stages.size(); ++s) {
        const auto& st = def.stages[s];
        if (st.kind != StageKind::kJoin) continue;
        const TailCut cut = tail_cut_of(st.tail.get());
        tail_cuts[i][s] = cut;
        if (!cut.fast) continue;
        const std::string sig = std::to_string(st.right_stream) + "|" +
                                std::to_string(static_cast<int>(st.join->kind)) + "|" +
                                std::to_string(static_cast<int>(st.join->key)) + "|" +
                                std::to_string(st.join->within_ns) + "|" + std::to_string(st.join->horizon_ns) + "|" +
                                std::to_string(st.join->max_exemplars) + "|" + std::to_string(st.retain_ns) + "|" +
                                (cut.strict ? ">" : ">=");
        join_ids[i][s] = join_sig.try_emplace(sig, static_cast<int>(join_sig.size())).first->second;
      }
    }
    if (tuning.join_resident_bytes > 0 && !join_spill)
      join_spill = std::make_unique<SpillFile>(tuning.join_resident_bytes);
    windows.resize(plan.groups.size());
    for (size_t g = 0; g < plan.groups.size(); ++g)
      if (runs_group(g))
        windows[g] = std::make_unique<WindowStore<WinState>>(plan.groups[g].window, plan.groups[g].window.lateness_ns);
    feeds.resize(plan.groups.size());
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      const auto& first = plan.pipes[plan.groups[g].pipes.front()];
      const WindowAssigner assigner(plan.groups[g].window);
      feeds[g] = {first.keys.hi_mask(),     first.keys.lo_mask(), first.keys.raw_hi_mask(),
                  first.keys.raw_lo_mask(), first.site_key,       plan.groups[g].needs_calls,
                  assigner.whole(),         assigner.size(),      first.layout.get()};
    }
    build_routes();
    win_cache.resize(plan.groups.size());
    win_cache_filled.resize(plan.groups.size());
    for (size_t g = 0; g < plan.groups.size(); ++g)
      if (windows[g] && plan.groups[g].window.kind != WindowKind::kSliding &&
          plan.groups[g].window.kind != WindowKind::kSteps)
        win_cache[g].resize(kWinCache);
    if (compute_stats) stats = std::make_unique<OpStatsAccumulator>();
    if (stats && tuning.stats_from_windows) choose_stats_group();
    outcomes = plan.rules;
    owned_out.resize(plan.streams.size());
    foreign_out.resize(plan.streams.size());
  }

  // Picks stats_group: of this shard's window groups whose states each hold the durations of one
  // (source, op) exactly as the per-op statistics take them - routed over codes that reach it with
  // no check (every owned event of such a code reaches its feed), tumbling or whole windows (each
  // event in one state), keyed by source and op, a duration quantile with at least the
  // statistics' exact limit and the same alpha - the one that covers the most codes.
  void choose_stats_group() {
    // Per sink, the codes that reach it with no check, counted in one pass over the 65,536 codes
    // (a pass per candidate group was a tenth of a shard's construction).
    std::vector<size_t> plain_codes(switch_sink + 1, 0);
    for (const CodeRoute& cr : code_routes)
      for (uint32_t i = 0; i < cr.plain; ++i) ++plain_codes[route_items[cr.begin + i]];
    size_t best_codes = 0;
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      const auto& grp = plan.groups[g];
      if (!windows[g] || !plan.routed[g] || grp.window.kind == WindowKind::kSliding ||
          grp.window.kind == WindowKind::kSteps)
        continue;
      const AggregateLayout* layout = feeds[g].layout;
      if (!layout || (layout->shape() != AggregateLayout::Shape::kDurQuantile &&
                      layout->shape() != AggregateLayout::Shape::kDurBoth))
        continue;
      if (layout->node().exact_limit < stats->exact_limit() || layout->node().sketch_alpha != stats->alpha()) continue;
      const KeyBy& keys = plan.pipes[grp.pipes.front()].keys;
      if (!keys.has(Field::kSource) || !keys.has(Field::kOp)) continue;
      const size_t codes = plain_codes[static_cast<size_t>(grp.stream)];
      if (codes > best_codes) {
        best_codes = codes;
        stats_group = static_cast<int>(g);
      }
    }
    if (stats_group < 0) return;
    const auto sink_of_group = static_cast<uint32_t>(plan.groups[static_cast<size_t>(stats_group)].stream);
    for (CodeRoute& cr : code_routes)
      for (uint32_t i = 0; i < cr.plain; ++i)
        if (route_items[cr.begin + i] == sink_of_group) cr.carried = 1;
  }
  // Stops carrying the per-op statistics' durations in stats_group's windows, before this batch's
  // events are fed to them: the states still open hold every carried duration before this batch
  // (merged now, and not again at their close), and this batch's carried events, which the
  // routing pass gave only their totals, give their durations now. From here on every event is
  // added whole.
  // `in` null: the batch was routed by another shard (route()), whose statistics took this
  // batch's carried durations when it gave up its own carrying.
  void give_up_stats_group(const ShardInput* in) {
    if (stats_group >= 0)
      windows[static_cast<size_t>(stats_group)]->for_each_open([&](WinState& w) {
        if (w.ready) merge_into_stats(w);
      });
    if (in)
      for_each_selected(*in->owned, in->indexed, in->owned_at, [&](const Event& e) {
        if (code_routes[static_cast<unsigned>(e.source) << 8 | e.op].carried) stats->add_duration(e);
      });
    for (CodeRoute& cr : code_routes) cr.carried = 0;
    stats_group = -1;
  }

  // The combined keep-mask of stream i when it is a chain of source/op-only filters (masks of
  // 0/1, no residual) over the scan; empty otherwise.
  std::vector<uint8_t> chain_mask(size_t i) const {
    std::vector<uint8_t> keep(size_t{1} << 16, 1);
    for (int s = static_cast<int>(i); !is_scan(static_cast<size_t>(s));) {
      const StreamDef& d = plan.streams[static_cast<size_t>(s)];
      if (d.offcpu || d.account || d.steps || d.source_op_mask.size() != keep.size() || !d.residuals.empty() ||
          d.parent < 0)
        return {};
      and_one(keep.data(), d.source_op_mask.data(), keep.size());
      s = d.parent;
    }
    return keep;
  }

  // Sets up routes_ and the sinks (see routes_), once per shard.
  void build_routes() {
    const size_t n_groups = plan.groups.size(), n_streams = plan.streams.size();
    prerouted.assign(n_streams, 0);
    keep_code.assign(n_streams, {});
    for (size_t p = 0; p < plan.pipes.size(); ++p) {
      if (!pipes[p].active) continue;
      for (const auto& st : plan.pipes[p].stages) {
        if (st.kind != StageKind::kJoin || st.right_stream < 0) continue;
        const auto r = static_cast<size_t>(st.right_stream);
        const StreamDef& d = plan.streams[r];
        if (d.offcpu && d.parent >= 0 && is_scan(static_cast<size_t>(d.parent))) {
          route_switches = true;
          shared_spans[static_cast<size_t>(builder_of[r])].prebuild = true;
        }
        if (prerouted[r] || d.offcpu || d.account || d.steps || is_scan(r)) continue;
        keep_code[r] = chain_mask(r);
        prerouted[r] = keep_code[r].empty() ? 0 : 1;
      }
    }
    switch_sink = n_streams;
    stream_sink = prerouted;
    for (size_t g = 0; g < n_groups; ++g)
      if (windows[g] && plan.routed[g]) stream_sink[static_cast<size_t>(plan.groups[g].stream)] = 1;
    const unsigned switch_code = static_cast<unsigned>(Source::kHost) << 8 | op::kSchedSwitch;
    // The tiers' tables in one (a kBoth shard: the pid tier's targets first, each tier's checks
    // indices moved past the checks before it).
    const std::vector<const Routes*> tiers = route_tiers();
    std::vector<uint32_t> check_base;
    routes_.checks.clear();
    for (const Routes* r : tiers) {
      check_base.push_back(static_cast<uint32_t>(routes_.checks.size()));
      routes_.checks.insert(routes_.checks.end(), r->checks.begin(), r->checks.end());
    }
    route_checks.clear();
    for (const Expr* check : routes_.checks) route_checks.push_back(RouteCheck::of(*check));
    const size_t n_begin = tiers.front()->begin.size();  // every tier's: one per code, plus one
    routes_.begin.assign(n_begin, 0);
    std::vector<size_t> prerouted_streams;  // the few streams with keep_code, walked per code
    for (size_t r = 0; r < n_streams; ++r)
      if (prerouted[r]) prerouted_streams.push_back(r);
    // Per sink, the last code that routed to it (a sink once per code, without a search).
    std::vector<uint32_t> sink_code(n_streams, UINT32_MAX);
    for (size_t code = 0; code + 1 < n_begin; ++code) {
      routes_.begin[code] = static_cast<uint32_t>(routes_.targets.size());
      // A sink once per code: groups over one stream have the same checks for it (compile_plan).
      auto add_once = [&](RouteTarget rt) {
        if (sink_code[rt.group] == code) return;
        sink_code[rt.group] = static_cast<uint32_t>(code);
        routes_.targets.push_back(rt);
      };
      for (size_t i = 0; i < tiers.size(); ++i) {
        for (uint32_t t = tiers[i]->begin[code]; t < tiers[i]->begin[code + 1]; ++t) {
          RouteTarget rt = tiers[i]->targets[t];
          if (!windows[rt.group]) continue;  // a group another shard runs
          rt.group = static_cast<uint32_t>(plan.groups[rt.group].stream);
          rt.checks_begin += check_base[i];
          rt.checks_end += check_base[i];
          add_once(rt);
        }
      }
      for (const size_t r : prerouted_streams)
        if (keep_code[r][code]) add_once({static_cast<uint32_t>(r), 0, 0});
      if (route_switches && code == switch_code) routes_.targets.push_back({static_cast<uint32_t>(switch_sink), 0, 0});
    }
    if (!routes_.begin.empty()) routes_.begin.back() = static_cast<uint32_t>(routes_.targets.size());
    code_routes.assign(routes_.begin.empty() ? 0 : routes_.begin.size() - 1, CodeRoute{});
    route_items.clear();
    for (size_t code = 0; code < code_routes.size(); ++code) {
      CodeRoute& cr = code_routes[code];
      cr.begin = static_cast<uint32_t>(route_items.size());
      for (uint32_t t = routes_.begin[code]; t < routes_.begin[code + 1]; ++t)
        if (routes_.targets[t].checks_begin == routes_.targets[t].checks_end) {
          route_items.push_back(routes_.targets[t].group);
          ++cr.plain;
        }
      for (uint32_t t = routes_.begin[code]; t < routes_.begin[code + 1]; ++t)
        if (routes_.targets[t].checks_begin != routes_.targets[t].checks_end) {
          route_items.push_back(t);
          ++cr.checked;
        }
    }
    checked_targets.assign(routes_.targets.size(), CheckedTarget{});
    for (size_t t = 0; t < routes_.targets.size(); ++t) {
      const RouteTarget& rt = routes_.targets[t];
      CheckedTarget& ct = checked_targets[t];
      ct.sink = rt.group;
      ct.target = static_cast<uint32_t>(t);
      if (rt.checks_end == rt.checks_begin) continue;
      const RouteCheck& first = route_checks[rt.checks_begin];
      if (rt.checks_end == rt.checks_begin + 1 && first.kind == RouteCheck::kRange) {
        ct.mode = CheckedTarget::kRange;
        ct.lo = first.lo;
        ct.span = first.span;
        ct.field = first.field;
        ct.negate = first.negate;
      } else if (first.kind == RouteCheck::kStack) {
        ct.mode = CheckedTarget::kStackFirst;
      }
    }
    sink_events.resize(switch_sink + 1);
    sink_sizes.assign(switch_sink + 1, 0);
    sink_cursor.assign(switch_sink + 1, nullptr);
    sink_data.assign(switch_sink + 1, nullptr);
    build_range_codes();
  }
  // range_codes, range_fields, range_targets (see RangeCode): after the code lists are built.
  void build_range_codes() {
    range_codes.clear();
    range_fields.clear();
    range_targets.clear();
    range_field_of.clear();
    range_slot.assign(checked_targets.size(), -1);
    for (size_t code = 0; code < code_routes.size(); ++code) {
      const CodeRoute& cr = code_routes[code];
      bool any = false;
      for (uint32_t i = cr.plain; i < cr.plain + cr.checked; ++i) {
        const uint32_t t = route_items[cr.begin + i];
        const CheckedTarget& ct = checked_targets[t];
        if (ct.mode != CheckedTarget::kRange) continue;
        any = true;
        if (range_slot[t] >= 0) continue;
        range_slot[t] = static_cast<int>(range_targets.size());
        range_targets.push_back(t);
        auto f = std::find(range_fields.begin(), range_fields.end(), ct.field);
        if (f == range_fields.end()) f = range_fields.insert(range_fields.end(), ct.field);
        range_field_of.push_back(static_cast<uint8_t>(f - range_fields.begin()));
      }
      if (any) range_codes.push_back({static_cast<uint32_t>(code), cr.begin, cr.plain, cr.checked, 0});
    }
    // Each code's second list, after every base list (nothing is appended to route_items later).
    for (RangeCode& rc : range_codes) {
      rc.alt = static_cast<uint32_t>(route_items.size());
      route_items.resize(route_items.size() + rc.base_plain + rc.base_checked);
    }
    range_verdicts.assign(range_targets.size(), kCheckEach);
  }

  // Before the routing pass: answers the kRange targets for the whole batch where its values
  // allow (see RangeCode) and points the codes with such targets at lists that say so. Each
  // answer is what checking every event would give: a range [lo, lo + span] (negated or not)
  // holds all values in [min, max] exactly when it holds both ends, and none of them when
  // [min, max] and it do not meet.
  void answer_range_checks(const ShardInput& in) {
    if (range_targets.empty()) return;
    constexpr size_t kMaxFields = 8;
    int64_t lo[kMaxFields], hi[kMaxFields];
    const size_t nf = std::min(range_fields.size(), kMaxFields);
    bool any = false;
    for (size_t f = 0; f < nf; ++f) {
      lo[f] = INT64_MAX;
      hi[f] = INT64_MIN;
      const Field field = range_fields[f];
      auto bounds = [&](auto get) {
        int64_t mn = INT64_MAX, mx = INT64_MIN;
        for_each_selected(*in.owned, in.indexed, in.owned_at, [&](const Event& e) {
          const int64_t v = get(e);
          mn = std::min(mn, v);
          mx = std::max(mx, v);
        });
        lo[f] = mn;
        hi[f] = mx;
      };
      if (field == Field::kRank) bounds([](const Event& e) -> int64_t { return e.rank; });
      else bounds([field](const Event& e) { return RouteCheck::small_field(e, field); });
      any = any || lo[f] <= hi[f];
    }
    if (!any) return;  // no event: nothing is routed
    bool changed = false;
    for (size_t r = 0; r < range_targets.size(); ++r) {
      const CheckedTarget& ct = checked_targets[range_targets[r]];
      const size_t f = range_field_of[r];
      int8_t v = kCheckEach;
      if (f < nf) {
        // The range is contiguous: it holds [min, max] when it holds both ends, and meets it
        // when max >= lo and min <= lo + span (in_range's form, without overflow).
        const bool all_in = RouteCheck::in_range(lo[f], ct.lo, ct.span) && RouteCheck::in_range(hi[f], ct.lo, ct.span);
        const bool none_in = hi[f] < ct.lo || (lo[f] >= ct.lo && !RouteCheck::in_range(lo[f], ct.lo, ct.span));
        if (all_in) v = ct.negate ? kAllFail : kAllPass;
        else if (none_in) v = ct.negate ? kAllPass : kAllFail;
      }
      if (v != range_verdicts[r]) {
        range_verdicts[r] = v;
        changed = true;
      }
    }
    if (!changed) return;
    for (const RangeCode& rc : range_codes) {
      uint32_t* out = route_items.data() + rc.alt;
      const uint32_t* base = route_items.data() + rc.base_begin;
      uint32_t plain = 0, checked = 0;
      for (uint32_t i = 0; i < rc.base_plain; ++i) out[plain++] = base[i];
      for (uint32_t i = rc.base_plain; i < rc.base_plain + rc.base_checked; ++i) {
        const uint32_t t = base[i];
        const int8_t v = verdict_of(t);
        if (v == kAllPass) out[plain++] = checked_targets[t].sink;
      }
      for (uint32_t i = rc.base_plain; i < rc.base_plain + rc.base_checked; ++i) {
        const uint32_t t = base[i];
        if (verdict_of(t) == kCheckEach) out[plain + checked++] = t;
      }
      CodeRoute& cr = code_routes[rc.code];
      cr.begin = rc.alt;
      cr.plain = plain;
      cr.checked = checked;
    }
  }
  // The batch's answer for checked target t: kCheckEach unless it is a kRange target answered.
  int8_t verdict_of(uint32_t t) const {
    return range_slot[t] < 0 ? kCheckEach : range_verdicts[static_cast<size_t>(range_slot[t])];
  }
  // Whether event e passes the checks of a route target that has some (routes_), each answered
  // as RouteCheck (engine/route_check.h) answers it: a field compared with a constant or a stack
  // predicate without eval()'s tree walk.
  [[gnu::noinline]] bool route_checks_hold(const RouteTarget& rt, const Event& e) const {
    for (uint32_t c = rt.checks_begin; c < rt.checks_end; ++c)
      if (!route_checks[c].holds(e, stack_matcher)) return false;
    return true;
  }
  // Whether the routing pass fills sink k this shard.
  bool sink_active(size_t k) const { return k < switch_sink ? stream_sink[k] != 0 : route_switches; }
  std::span<const Event* const> sink(size_t k) const { return {sink_data[k], sink_sizes[k]}; }
  // The owned events of stream i this batch (computed already unless it is the scan).
  std::span<const Event* const> owned_list(size_t i) const {
    return prerouted[i] ? sink(i) : std::span<const Event* const>(owned_out[i]);
  }

  // Computes stream i for this batch (memoised), for owned and foreign events.
  void compute(size_t i, const ShardInput& in) {
    if (computed[i]) return;
    computed[i] = 1;
    const auto& s = plan.streams[i];
    auto& own = owned_out[i];
    auto& foreign = foreign_out[i];
    own.clear();
    foreign.clear();
    if (s.parent < 0 && !s.offcpu && !s.filter) {
      // The scan itself.
      if (in.owned) for_each_selected(*in.owned, in.indexed, in.owned_at, [&](const Event& e) { own.push_back(&e); });
      if (in.foreign)
        for_each_selected(*in.foreign, in.indexed, in.foreign_at, [&](const Event& e) { foreign.push_back(&e); });
      return;
    }
    if (prerouted[i]) {  // the routing pass listed the owned events; the foreign ones by the chain's mask
      const uint8_t* keep = keep_code[i].data();
      if (in.foreign)
        for_each_selected(*in.foreign, in.indexed, in.foreign_at, [&](const Event& e) {
          if (keep[static_cast<unsigned>(e.source) << 8 | e.op]) foreign.push_back(&e);
        });
      return;
    }
    const auto parent = static_cast<size_t>(s.parent);
    if (s.offcpu) {
      SharedSpans& sh = shared_spans[static_cast<size_t>(builder_of[i])];
      if (!sh.built) {
        sh.built = true;
        if (sh.routed) {  // the router built them (take_routed)
          sh.view = *sh.routed;
        } else {
          sh.spans.clear();
          if (route_switches && is_scan(parent)) {  // the routing pass listed the scan's sched_switch events
            build_switch_spans(sh, in.final, sh.spans);
          } else {
            if (!is_scan(parent)) compute(parent, in);
            each_event(parent, in, true, [&](const Event* e) {
              if (e->source == Source::kHost && e->op == op::kSchedSwitch) sh.builder->add(*e, sh.spans);
            });
            if (in.final) sh.builder->finish(last_ts, sh.spans);
          }
          sh.view = sh.spans;
        }
      }
      const auto& states = s.offcpu->states;  // the filter OffCpuSpanBuilder::emit would apply
      for (const auto& e : sh.view)
        if (states.empty() || std::find(states.begin(), states.end(), e.prev_state) != states.end()) own.push_back(&e);
      return;  // off-CPU spans are never host-wide
    }
    if (s.account) {  // the owned events of the parent, as slices of the owned threads' time
      AccountStep& as = accounts[i];
      as.flushed.clear();
      if (!is_scan(parent)) compute(parent, in);
      if (is_scan(parent)) {
        if (in.owned && !in.indexed) as.acct->observe(in.owned->data(), in.owned->size());
        else if (in.owned)
          for_each_selected(*in.owned, in.indexed, in.owned_at, [&](const Event& e) { as.acct->observe(&e, 1); });
      } else {
        for (const Event* e : owned_list(parent)) as.acct->observe(e, 1);
      }
      as.acct->flush_cells(in.final ? kFinal : in.watermark, in.final, as.flushed);
      for (CellTotals& f : as.flushed) {  // a (cell, thread) may come in several flushes: summed
        const auto [it, fresh] = as.cells.try_emplace({f.cell, f.node, f.tid});
        if (fresh) {
          it->second = std::move(f);
          continue;
        }
        CellTotals& c = it->second;
        c.pid = f.pid;
        c.rank = f.rank;
        for (uint8_t b = 0; b < acct::kBuckets; ++b) c.b[b] += f.b[b];
        for (const auto& p : f.by) {
          const uint64_t task = p.first;
          auto t = std::find_if(c.by.begin(), c.by.end(), [task](const auto& x) { return x.first == task; });
          if (t != c.by.end()) t->second += p.second;
          else c.by.push_back(p);
        }
      }
      as.out.clear();
      const uint64_t gap = 1'000'000'000ull;  // SliceOptions::gap_ns (the default the step uses)
      while (!as.cells.empty()) {
        const auto it = as.cells.begin();
        const uint64_t cell = std::get<0>(it->first);
        if (!in.final && !(in.watermark > (cell + 1) * as.grid_ns + gap)) break;
        CellTotals& c = it->second;
        Event e;
        e.ts_ns = cell * as.grid_ns;
        e.node = std::get<1>(it->first);
        e.tid = std::get<2>(it->first);
        e.pid = c.pid;
        e.rank = c.rank;
        e.source = Source::kAccount;
        e.flags = event_flags::kSynthetic;
        for (uint8_t b = 0; b < acct::kBuckets; ++b) {
          if (!c.b[b] || b == acct::kPreempted) continue;
          e.op = b;
          e.dur_ns = c.b[b];
          as.out.push_back(e);
        }
        std::sort(c.by.begin(), c.by.end());
        e.op = acct::kPreempted;
        for (const auto& [task, ns] : c.by) {
          e.arg0 = task >> 32;
          e.arg1 = task & 0xffffffffu;
          e.dur_ns = ns;
          as.out.push_back(e);
        }
        as.cells.erase(it);
      }
      for (const Event& e : as.out) own.push_back(&e);
      return;  // never host-wide
    }
    if (s.steps) {  // the owned events of the parent -> the steps of the processes they belong to
      StepStep& ss = step_steps[i];
      ss.out.clear();
      if (!is_scan(parent)) compute(parent, in);
      if (is_scan(parent)) {
        if (in.owned && !in.indexed) ss.tracker->observe(in.owned->data(), in.owned->size());
        else if (in.owned)
          for_each_selected(*in.owned, in.indexed, in.owned_at, [&](const Event& e) { ss.tracker->observe(&e, 1); });
      } else {
        for (const Event* e : owned_list(parent)) ss.tracker->observe(e, 1);
      }
      ss.tracker->flush(in.final, ss.out);
      for (const Event& e : ss.out) own.push_back(&e);
      return;  // never host-wide
    }
    if (!is_scan(parent)) compute(parent, in);
    if (!s.source_op_mask.empty()) {
      const uint8_t* mask = s.source_op_mask.data();
      const ExprPtr* residuals = s.residuals.data();
      auto keep = [mask, residuals, this](const Event* e) {
        const uint8_t m = mask[static_cast<unsigned>(e->source) << 8 | e->op];
        return m == 1 || (m >= 2 && truthy(eval(*residuals[m - 2], e, nullptr, &stack_matcher)));
      };
      each_event(parent, in, true, [&](const Event* e) {
        if (keep(e)) own.push_back(e);
      });
      each_event(parent, in, false, [&](const Event* e) {
        if (keep(e)) foreign.push_back(e);
      });
    } else if (s.filter) {
      each_event(parent, in, true, [&](const Event* e) {
        if (truthy(eval(*s.filter, e, nullptr, &stack_matcher))) own.push_back(e);
      });
      each_event(parent, in, false, [&](const Event* e) {
        if (truthy(eval(*s.filter, e, nullptr, &stack_matcher))) foreign.push_back(e);
      });
    } else {
      each_event(parent, in, true, [&](const Event* e) { own.push_back(e); });
      each_event(parent, in, false, [&](const Event* e) { foreign.push_back(e); });
    }
  }

  // The scan itself (every event of the batch): its children read the input, not a copied list.
  bool is_scan(size_t i) const {
    const auto& s = plan.streams[i];
    return s.parent < 0 && !s.offcpu && !s.filter;
  }
  // Calls fn(const Event*) for every owned (or foreign) event of stream i, computed already
  // unless it is the scan.
  template <class Fn>
  void each_event(size_t i, const ShardInput& in, bool owned, Fn&& fn) {
    if (is_scan(i)) {
      if (const auto& v = owned ? in.owned : in.foreign)
        for_each_selected(*v, in.indexed, owned ? in.owned_at : in.foreign_at, [&](const Event& e) { fn(&e); });
      return;
    }
    for (const Event* e : owned ? owned_list(i) : std::span<const Event* const>(foreign_out[i])) fn(e);
  }

  // Folds a stats_group state's durations into the per-op statistics (at its close, or when the
  // group stops carrying them).
  void merge_into_stats(const WinState& w) {
    stats->merge_quantile(static_cast<Source>(w.code >> 8), static_cast<uint8_t>(w.code), *w.agg.duration_quantile());
  }
  // An event group g's windows refused (late): counted; its duration goes to the per-op
  // statistics directly when g carries them (stats_group).
  [[gnu::noinline]] void refused(size_t g, const Event& e) {
    ++counters.late_events;
    if (static_cast<int>(g) == stats_group) stats->add_duration(e);
  }
  // Binds a window state to the group's aggregate (and call buffer) at its first event `e`.
  [[gnu::noinline]] void init_state(size_t g, WinState& w, const Event& e) {
    const GroupFeed& gf = feeds[g];
    w.agg = AggregateState(gf.layout);
    w.ready = true;
    w.code = static_cast<uint16_t>(static_cast<unsigned>(e.source) << 8 | e.op);
    if (gf.needs_calls) {
      w.calls = CallBuffer(tuning.max_tail_calls, tuning.narrow_calls, e.pid, join_spill.get());
      w.open_index = static_cast<uint32_t>(open_calls[g].size());
      open_calls[g].push_back(&w);
    }
  }
  // Adds one event to a window state of group g (kCalls: the group buffers calls for a join; S:
  // the group's aggregate shape, so the aggregate's update is inlined with no dispatch).
  template <bool kCalls, AggregateLayout::Shape S>
  [[gnu::always_inline]] inline void feed_state(size_t g, WinState& w, const Event& e) {
    if (!w.ready) [[unlikely]]
      init_state(g, w, e);
    w.agg.add_as<S>(e);
    if constexpr (kCalls) w.calls.add(e);
  }

  // Feeds the events group g's stream kept this batch (in batch order) to the group's window
  // states, by key. One loop per group with what is fixed per group hoisted out of it: the key
  // masks, whether it buffers calls or keys by site and its aggregate's shape (template
  // arguments: no branch or dispatch per event), and, for tumbling and whole windows, the
  // direct-mapped cache of states (WinCacheEntry), probed first at the entry the previous event
  // used (keys come in runs) and with the window index recomputed only when an event leaves the
  // previous event's window (no division per event). The cache compares keys in their raw
  // packing (KeyBy::raw_key: two loads) and packs the real Key only on a miss; a group keyed by
  // site uses the real Key throughout. Sliding windows go to the WindowStore for every event.
  template <bool kCalls, bool kSite, AggregateLayout::Shape S>
  void feed_events(size_t g, std::span<const Event* const> events, SpreadPrefetch& prefetch) {
    const GroupFeed& gf = feeds[g];
    const uint64_t hi_mask = gf.hi_mask, lo_mask = gf.lo_mask;
    const uint64_t raw_hi_mask = gf.raw_hi_mask, raw_lo_mask = gf.raw_lo_mask;
    WindowStore<WinState>& store = *windows[g];
    auto key_of = [&](const Event& e) {
      const Key full = KeyBy::full_key(e);
      Key key{full.hi & hi_mask, full.lo & lo_mask};
      if constexpr (kSite) key.lo |= site_key_of(e.stack_id);
      return key;
    };
    // The cache's identity of an event's key: the raw packing, or the key itself by site.
    auto ident_of = [&](const Event& e) {
      if constexpr (kSite) {
        return key_of(e);
      } else {
        const Key raw = KeyBy::raw_key(e);
        return Key{raw.hi & raw_hi_mask, raw.lo & raw_lo_mask};
      }
    };
    if (store.by_steps()) {
      for (const Event* e : events) {
        prefetch.step();
        store.add_step(*e, key_of(*e), [&](uint64_t, WinState& w) { feed_state<kCalls, S>(g, w, *e); });
      }
      return;
    }
    if (win_cache[g].empty()) {
      for (const Event* e : events) {
        prefetch.step();
        const bool ok = store.add(e->ts_ns, key_of(*e),
                                  [&](uint64_t, WinState& w) { feed_state<kCalls, S>(g, w, *e); });
        if (!ok) refused(g, *e);
      }
      return;
    }
    // Tumbling or whole: exactly one window per event, index ts / size (0 for whole).
    WinCacheEntry* cache = win_cache[g].data();
    const bool whole = gf.whole;
    const uint64_t size = gf.size;
    // The previous event's window: index k, [k_start, k_start + k_len). A whole window is every
    // instant but the last (k_len = 2^64 - 1), so only an event at ts 2^64 - 1 leaves it.
    uint64_t k = 0, k_start = 0, k_len = whole ? UINT64_MAX : 0;
    WinCacheEntry* last = cache;
    for (const Event* ep : events) {
      prefetch.step();
      const Event& e = *ep;
      const Key ident = ident_of(e);
      if (e.ts_ns - k_start >= k_len) [[unlikely]] {  // outside the previous event's window
        k = whole ? 0 : e.ts_ns / size;
        k_start = whole ? 0 : k * size;
        k_len = whole ? UINT64_MAX : size;
      }
      WinState* st = last->state;
      if (!st || last->key != ident || last->k != k) {
        WinCacheEntry* set = cache + win_cache_set(ident);
        if (set[0].state && set[0].k == k && set[0].key == ident) {
          last = &set[0];
        } else if (set[1].state && set[1].k == k && set[1].key == ident) {
          last = &set[1];
        } else {
          st = nullptr;
          if (!store.add(e.ts_ns, key_of(e), [&](uint64_t, WinState& w) { st = &w; })) refused(g, e);
          if (!st) continue;
          // Bound here, at its first event: every state in the cache is, so the feed below
          // needs no first-event check.
          if (!st->ready) [[unlikely]]
            init_state(g, *st, e);
          set[1] = set[0];
          set[0] = {ident, k, st};
          last = &set[0];
          if (auto& filled = win_cache_filled[g]; filled.size() < kWinCache / 2)
            filled.push_back(static_cast<uint32_t>(set - cache));
        }
        st = last->state;
      }
      st->agg.add_as<S>(e);
      if constexpr (kCalls) st->calls.add(e);
    }
  }
  template <bool kCalls, bool kSite>
  void feed_events(size_t g, std::span<const Event* const> events, SpreadPrefetch& pf) {
    using Shape = AggregateLayout::Shape;
    switch (feeds[g].layout->shape()) {
      case Shape::kCount: feed_events<kCalls, kSite, Shape::kCount>(g, events, pf); return;
      case Shape::kDurStats: feed_events<kCalls, kSite, Shape::kDurStats>(g, events, pf); return;
      case Shape::kDurQuantile: feed_events<kCalls, kSite, Shape::kDurQuantile>(g, events, pf); return;
      case Shape::kDurBoth: feed_events<kCalls, kSite, Shape::kDurBoth>(g, events, pf); return;
      case Shape::kGeneral: feed_events<kCalls, kSite, Shape::kGeneral>(g, events, pf); return;
    }
  }
  // `pf`: a prefetch spread over the feeds (a shard given a routing pass: process()).
  void feed_events(size_t g, std::span<const Event* const> events, SpreadPrefetch& pf) {
    const GroupFeed& gf = feeds[g];
    if (gf.needs_calls) {
      if (gf.site_key) feed_events<true, true>(g, events, pf);
      else feed_events<true, false>(g, events, pf);
    } else {
      if (gf.site_key) feed_events<false, true>(g, events, pf);
      else feed_events<false, false>(g, events, pf);
    }
  }

  static uint64_t join_key(JoinKey k, uint32_t pid, uint32_t tid) {
    switch (k) {
      case JoinKey::kTid: return tid;
      case JoinKey::kPid: return pid;
      default: return 0;
    }
  }

  // The routing pass over the batch into `lists` (one per sink, sized here for the whole batch
  // at most once per growth: they keep their size between batches), which sink() then reads:
  // the batch's range checks answered, trace end, exits, per-op statistics (carried codes their
  // totals only) and, per sink, the events its routes keep (routes_), in batch order. Returns the
  // OR of the carried events' durations (a bit at 2^53 or above: give_up_stats_group).
  uint64_t route_batch(const ShardInput& in, std::vector<std::vector<const Event*>>& lists) {
    const size_t n = in.indexed ? in.owned_at.size() : in.owned->size();
    answer_range_checks(in);
    lists.resize(sink_cursor.size());
    for (size_t g = 0; g < sink_cursor.size(); ++g) {
      sink_cursor[g] = nullptr;
      if (!sink_active(g)) continue;
      if (lists[g].size() < n) lists[g].resize(n);
      sink_cursor[g] = lists[g].data();
    }
    // What the loop reads or updates per event, in locals (no member reloads after each store).
    uint64_t end_max = last_ts;
    OpStatsAccumulator* const op_stats = stats.get();
    const CodeRoute* const code_route = code_routes.data();
    const uint32_t* const items = route_items.data();
    const RouteTarget* const targets = routes_.targets.data();
    const CheckedTarget* const checked = checked_targets.data();
    const Event*** const cursors = sink_cursor.data();
    uint64_t carried_dur_bits = 0;  // OR of the carried events' durations (give_up_stats_group)
    // This pass reads the batch from cache (answer_range_checks' pass brought it in): it has the
    // time to bring the next one in (docs/history/issue-12.md, part 19).
    SpreadPrefetch prefetch(in.prefetch, n);
    for_each_selected(*in.owned, in.indexed, in.owned_at, [&] [[gnu::always_inline]] (const Event& e) {
      prefetch.step();
      end_max = std::max(end_max, e.end_ns());
      if (e.source == Source::kHost && e.op == op::kProcessExit) [[unlikely]]
        batch_exits.emplace_back(e.pid, e.ts_ns);
      const CodeRoute cr = code_route[static_cast<unsigned>(e.source) << 8 | e.op];
      if (op_stats) {
        if (cr.carried) {
          op_stats->add_totals(e);
          carried_dur_bits |= e.dur_ns;
        } else {
          op_stats->add(e);
        }
      }
      const uint32_t* const it = items + cr.begin;
      for (uint32_t i = 0; i < cr.plain; ++i) *cursors[it[i]]++ = &e;
      for (uint32_t i = cr.plain, end = cr.plain + cr.checked; i < end; ++i) [[unlikely]] {
          const CheckedTarget& ct = checked[it[i]];
          bool pass;
          if (ct.mode == CheckedTarget::kRange) {
            pass = RouteCheck::in_range(RouteCheck::small_field(e, ct.field), ct.lo, ct.span) != ct.negate;
          } else {
            pass = (ct.mode != CheckedTarget::kStackFirst || e.stack_id != 0) &&
                   route_checks_hold(targets[ct.target], e);
          }
          if (pass) *cursors[ct.sink]++ = &e;
        }
    });
    prefetch.rest();
    last_ts = end_max;
    for (size_t g = 0; g < sink_cursor.size(); ++g) {
      sink_data[g] = sink_cursor[g] ? lists[g].data() : nullptr;
      sink_sizes[g] = sink_cursor[g] ? static_cast<size_t>(sink_cursor[g] - lists[g].data()) : 0;
    }
    return carried_dur_bits;
  }

  // The pid's last exit in (start, start + covered), or 0 when it has none there.
  uint64_t last_exit_inside(uint32_t pid, uint64_t start, uint64_t covered) const {
    const uint64_t end = covered > std::numeric_limits<uint64_t>::max() - start ? std::numeric_limits<uint64_t>::max()
                                                                                : start + covered;
    auto at = exited.lower_bound({pid, end});  // the first of the pid at or past the end, or later
    if (at == exited.begin()) return 0;
    --at;
    return at->first == pid && at->second > start ? at->second : 0;
  }

  // A batch the router (a shard of every window group, route()) walked for this one: its sinks,
  // trace end and exits. The router's per-op statistics took every event's total (and the
  // durations this shard's stats_group does not carry); it says when carrying stops.
  void take_routed(const RoutedBatch& r) {
    last_ts = std::max(last_ts, r.end_max);
    exited.insert(r.exits.begin(), r.exits.end());
    for (size_t k = 0; k < sink_data.size(); ++k) {
      const bool have = sink_active(k) && k < r.sizes.size();
      sink_data[k] = have ? r.lists[k].data() : nullptr;
      sink_sizes[k] = have ? r.sizes[k] : 0;
    }
    if (r.gave_up_stats && stats) give_up_stats_group(nullptr);
    for (size_t b = 0; b < shared_spans.size(); ++b)
      if (b < r.spans_built.size() && r.spans_built[b]) shared_spans[b].routed = &r.spans[b];
  }

  // Pairs the sched_switch events the routing pass listed this batch into off-CPU spans with
  // sh's builder, appended to `out`; at the final batch, closes the spans still open at the
  // trace's end. A shard's compute() and the router's route() both build spans this way.
  void build_switch_spans(SharedSpans& sh, bool final, std::vector<Event>& out) {
    for (const Event* e : sink(switch_sink)) sh.builder->add(*e, out);
    if (final) sh.builder->finish(last_ts, out);
  }

  // Shard::route: this batch's exits, and the latest event end so far (the shards keep the running
  // maximum too).
  void route(const std::vector<Event>& events, RoutedBatch& out, PrefetchHint prefetch, bool final) {
    ShardInput in;
    in.owned = EventsPtr(EventsPtr(), &events);
    in.prefetch = prefetch;
    batch_exits.clear();
    const uint64_t carried_dur_bits = route_batch(in, out.lists);
    // The off-CPU spans of the joins over the scan, from the sched_switch events just listed
    // (still in this core's cache), as a shard's compute() would build them.
    out.spans.resize(shared_spans.size());
    out.spans_built.assign(shared_spans.size(), 0);
    for (size_t b = 0; b < shared_spans.size(); ++b) {
      if (!shared_spans[b].prebuild) continue;
      out.spans[b].clear();
      build_switch_spans(shared_spans[b], final, out.spans[b]);
      out.spans_built[b] = 1;
    }
    out.end_max = last_ts;
    out.exits.assign(batch_exits.begin(), batch_exits.end());
    out.sizes.assign(sink_sizes.begin(), sink_sizes.end());
    out.gave_up_stats = false;
    if (carried_dur_bits >> 53) [[unlikely]] {
      give_up_stats_group(&in);
      out.gave_up_stats = true;
    }
  }
  int carried_stats_group() const { return stats_group; }
  std::unique_ptr<OpStatsAccumulator> take_stats() { return std::move(stats); }

  ShardOutput process(const ShardInput& in) {
    ShardOutput out;
    ++counters.batches;
    dropped += in.dropped;
    last_ts = std::max(last_ts, in.trace_end);
    if (in.process_names) names = in.process_names;
    computed.assign(plan.streams.size(), 0);
    for (auto& sh : shared_spans) {
      sh.built = false;
      sh.routed = nullptr;  // take_routed() sets it when the router built them
    }
    std::fill(sink_sizes.begin(), sink_sizes.end(), size_t{0});
    if (in.owned) {
      // One pass over the batch: trace end, exits, per-op statistics, and the events of every
      // sink (routes_: routed window groups, prerouted streams, sched_switch events), listed per
      // sink in batch order and fed group by group below (feeding each event to all its groups
      // at once measured slower: more branch misses and a larger working set per event).
      counters.events_in += in.indexed ? in.owned_at.size() : in.owned->size();
      if (in.routed) {
        take_routed(*in.routed);
      } else {
        batch_exits.clear();
        if (route_batch(in, sink_events) >> 53) [[unlikely]]
          give_up_stats_group(&in);
        exited.insert(batch_exits.begin(), batch_exits.end());
      }
    }

    const uint64_t wm = in.final ? kFinal : in.watermark;
    if (exited.size() > 1024 && !in.final && wm > exit_horizon)
      std::erase_if(exited, [&](const auto& e) { return e.second + exit_horizon < wm; });
    // Right sides first, so a window closing in this batch sees this batch's spans.
    for (auto& jb : join_buffers) {
      const size_t right = jb.right_stream;
      compute(right, in);
      if (jb.builder >= 0) {  // every span the builder made this batch (off-CPU spans are never host-wide)
        for (const Event& e : shared_spans[static_cast<size_t>(jb.builder)].view)
          jb.join->add_right(join_key(jb.key, e.pid, e.tid), e);
        continue;
      }
      for (const auto list : {owned_list(right), std::span<const Event* const>(foreign_out[right])})
        for (const Event* e : list) jb.join->add_right(join_key(jb.key, e->pid, e->tid), *e);
    }
    // Given a routing pass (in.routed), this shard has no pass of its own to bring the next
    // batch in during: the feeds do, one step per event fed (the batch's events ahead of those
    // they feed; see SpreadPrefetch), over as many events as the batch holds.
    SpreadPrefetch prefetch(in.routed ? in.prefetch : PrefetchHint{}, in.owned ? in.owned->size() : 0);
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      if (!windows[g]) continue;
      // A tight loop per group (its state stays in cache, its branches predictable).
      if (plan.routed[g]) {
        feed_events(g, sink(static_cast<size_t>(plan.groups[g].stream)), prefetch);
      } else {
        const auto stream = static_cast<size_t>(plan.groups[g].stream);
        compute(stream, in);
        feed_events(g, owned_list(stream), prefetch);
      }
      const uint64_t closed_before = counters.windows_closed;
      close_group(g, wm, out);
      if (counters.windows_closed != closed_before && !win_cache[g].empty()) win_cache_clear(g);
    }
    prefetch.rest();
    for (auto& jb : join_buffers) jb.join->evict(wm, jb.retain_ns);

    if (!in.final) prune_joins(wm);

    if (in.final) {
      for (const auto& jb : join_buffers) {
        counters.evicted_spans += jb.join->evicted();
        out.pruned_spans += jb.join->pruned();
      }
      if (join_spill) {
        const SpillCounters& sc = join_spill->counters();
        counters.join_spilled_blocks += sc.blocks_out;
        counters.join_spill_peak_bytes += sc.peak_bytes_out;
        counters.join_spill_errors += sc.errors;
        counters.join_spill_read_errors += sc.read_errors;
      }
      out.stats = std::move(stats);
      out.outcomes = outcomes;
      out.counters = counters;
      out.global = tier == ShardTier::kGlobal;
    }
    return out;
  }

  // One span buffer per distinct way of reading spans (JoinBuffer); every join stage of the
  // shard's pipes points at its buffer. Off-CPU streams are the same spans when they come from
  // one builder (builder_of) and keep the same states.
  void make_join_buffers() {
    std::map<std::string, size_t> index;  // signature -> join_buffers
    for (size_t p = 0; p < plan.pipes.size(); ++p) {
      if (!pipes[p].active) continue;
      const auto& def = plan.pipes[p];
      for (size_t s = 0; s < def.stages.size(); ++s) {
        const auto& st = def.stages[s];
        if (st.kind != StageKind::kJoin) continue;
        const auto right = static_cast<size_t>(st.right_stream);
        // Off-CPU spans by their builder, the stage's states as tags (every tag when it keeps every
        // state; a state past kMaxTag cannot be told apart: the stage keeps a buffer of its own).
        uint64_t tags = IntervalJoin::kAllTags;
        bool tagged = false;
        if (const OffCpuNode* node = plan.streams[right].offcpu) {
          tagged = tuning.share_join_buffers;
          if (!node->states.empty()) tags = 0;
          for (const OffCpuState state : node->states) {
            if (static_cast<unsigned>(state) >= IntervalJoin::kMaxTag) tagged = false;
            else tags |= uint64_t{1} << static_cast<unsigned>(state);
          }
        }
        std::string sig = tagged ? "offcpu " + std::to_string(builder_of[right]) : "stream " + std::to_string(right);
        sig += "|" + std::to_string(static_cast<int>(st.join->key)) + "|" +
               std::to_string(static_cast<int>(st.join->kind)) + "|" + std::to_string(st.join->within_ns);
        if (!tuning.share_join_buffers) sig += "|" + std::to_string(p) + " " + std::to_string(s);
        const auto [it, fresh] = index.try_emplace(sig, join_buffers.size());
        if (fresh) {
          JoinBuffer jb;
          jb.join = std::make_unique<IntervalJoin>(st.join->kind, st.join->within_ns, tagged);
          if (tuning.join_resident_bytes > 0) {
            if (!join_spill) join_spill = std::make_unique<SpillFile>(tuning.join_resident_bytes);
            jb.join->set_spill(join_spill.get());
          }
          jb.right_stream = right;
          jb.builder = tagged ? builder_of[right] : -1;
          jb.key = st.join->key;
          join_buffers.push_back(std::move(jb));
        }
        pipes[p].join_tags[s] = tagged ? tags : IntervalJoin::kAllTags;
        JoinBuffer& jb = join_buffers[it->second];
        jb.retain_ns = std::max(jb.retain_ns, st.retain_ns);
        const size_t g = group_of_pipe[p];
        if (std::find(jb.groups.begin(), jb.groups.end(), g) == jb.groups.end()) {
          jb.groups.push_back(g);
          std::sort(jb.groups.begin(), jb.groups.end());
        }
        pipes[p].joins[s] = jb.join.get();
      }
    }
  }

  // Prunes the join buffers that are due (ShardTuning, IntervalJoin::prune): every call to come
  // starts at or after `watermark` (the batch contract; these joins' windows take on-time calls
  // only), and the candidates are every call held by an open window of a group that probes it.
  void prune_joins(uint64_t watermark) {
    for (auto& jb : join_buffers) {
      if (!jb.prune_at) continue;
      IntervalJoin& join = *jb.join;
      if (join.buffered() < jb.prune_at && !tuning.prune_every_batch) continue;
      size_t held = 0;
      for (size_t g : jb.groups)
        for (const WinState* w : open_calls[g]) held += w->calls.kept();
      // A prune costs O(held calls log + spans): only once the spans outnumber the calls.
      if (join.buffered() < held && !tuning.prune_every_batch) continue;
      // The candidates are the prune's transient memory (16 bytes per held call): built and
      // pruned one slice of the join keys at a time (key % parts), each slice's at most about
      // prune_candidates_per_pass calls when the keys spread evenly. Per slice, two passes over
      // the held calls: count per join key, then fill vectors of exact size.
      const size_t per_pass = std::max<size_t>(tuning.prune_candidates_per_pass, 1);
      const uint64_t parts = std::clamp<uint64_t>(held / per_pass + 1, 1, 64);
      const JoinKey key = jb.key;
      for (uint64_t part = 0; part < parts; ++part) {
        std::unordered_map<uint64_t, std::vector<IntervalJoin::CallRange>> candidates;
        std::unordered_map<uint64_t, size_t> per_key;
        for (size_t g : jb.groups)
          for (WinState* w : open_calls[g])
            w->calls.for_each_held([&](const Call& c) {
              const uint64_t k = join_key(key, c.pid, c.tid);
              if (k % parts == part) ++per_key[k];
            });
        for (const auto& [k, n] : per_key) candidates[k].reserve(n);
        for (size_t g : jb.groups)
          for (WinState* w : open_calls[g])
            w->calls.for_each_held([&](const Call& c) {
              const uint64_t k = join_key(key, c.pid, c.tid);
              if (k % parts == part) candidates[k].push_back({c.ts, c.ts + c.dur});
            });
        join.prune(watermark, candidates, parts, part);
      }
      const size_t left = join.buffered();
      jb.prune_at = std::max({tuning.prune_min_spans, left + left / 2, size_t{1}});
    }
  }

  // Closes the group's windows due at `watermark`; each closed (window, key) becomes one row per
  // pipe of the group. Rows headed for a Peer stage wait until every key of their window is in.
  void close_group(size_t g, uint64_t watermark, ShardOutput& out) {
    const auto& group = plan.groups[g];
    struct PeerWait {
      int stage = -1;
      uint64_t window = 0;
      std::vector<Row> rows;
    };
    std::vector<PeerWait> waits(group.pipes.size());
    for (size_t i = 0; i < group.pipes.size(); ++i) {
      const auto& def = plan.pipes[group.pipes[i]];
      for (size_t s = 0; s < def.stages.size(); ++s)
        if (def.stages[s].kind == StageKind::kPeer) waits[i].stage = static_cast<int>(s);
    }
    auto flush = [&](size_t i) {
      if (waits[i].rows.empty()) return;
      run_peers(group.pipes[i], static_cast<size_t>(waits[i].stage), waits[i].rows, out);
      waits[i].rows.clear();
    };
    const bool carries_stats = static_cast<int>(g) == stats_group;
    auto on_close = [&](uint64_t k, uint64_t start, uint64_t end, const Key& key, WinState& w) {
      ++counters.windows_closed;
      if (carries_stats) merge_into_stats(w);
      join_cache.clear();
      tail_.of = nullptr;
      if (w.open_index < open_calls[g].size()) {
        auto& list = open_calls[g];
        list[w.open_index] = list.back();
        list[w.open_index]->open_index = w.open_index;
        list.pop_back();
        w.open_index = std::numeric_limits<uint32_t>::max();
      }
      for (size_t i = 0; i < group.pipes.size(); ++i) {
        const size_t p = group.pipes[i];
        const auto& def = plan.pipes[p];
        Row row;
        row.key = key;
        row.window = k;
        row.start = start;
        row.end = end;
        row.values.assign(def.slots.size(), kNaN);
        size_t slot = 0;
        for (Field f : def.key_fields)
          row.values[slot++] = f == Field::kSite ? plan.stacks->site_value(site_of(key)) : KeyBy::field_value(key, f);
        row.values[static_cast<size_t>(def.slot_start)] = static_cast<double>(start);
        row.values[static_cast<size_t>(def.slot_end)] = end == kFinal ? kNaN : static_cast<double>(end);
        row.values[static_cast<size_t>(def.slot_events)] = static_cast<double>(w.agg.count());
        // A window the trace ends inside covers only [start, last event end): rates over it use
        // that span, or every trace that stops mid-window would end in a "throughput drop".
        uint64_t covered = def.window.kind == WindowKind::kWhole   ? 0
                           : def.window.kind == WindowKind::kSteps ? end - start
                                                                   : def.window.size_ns;
        if (covered && def.window.kind != WindowKind::kSteps && watermark == kFinal && end > last_ts && last_ts > start)
          covered = last_ts - start;
        // Likewise a process that exited inside the window: its rate is over the time it lived,
        // or every job that ends while the capture goes on would end in a "throughput drop".
        if (covered && def.keys.has(Field::kPid)) {
          const uint64_t ex = last_exit_inside(key.pid(), start, covered);
          if (ex) covered = ex - start;
        }
        w.agg.values(covered, row.values.data() + def.slot_aggs);
        if (waits[i].stage >= 0 && !waits[i].rows.empty() && k != waits[i].window) flush(i);
        waits[i].window = k;
        run_stages(p, 0, row, &w, waits[i].stage, waits[i].rows, out);
      }
    };
    if (watermark == kFinal) windows[g]->close_all(on_close);
    else windows[g]->close(watermark, on_close);
    join_cache.clear();
    tail_.of = nullptr;
    for (size_t i = 0; i < group.pipes.size(); ++i) flush(i);
  }

  // Runs stages [from, ...) on a row; stops at a failed predicate or parks the row at a Peer.
  void run_stages(size_t p, size_t from, Row& row, WinState* w, int peer_stage, std::vector<Row>& parked,
                  ShardOutput& out) {
    const auto& def = plan.pipes[p];
    auto& outcome = outcomes[def.rule_index];
    if (from == 0) ++outcome.windows;
    double* v = row.values.data();
    for (size_t s = from; s < def.stages.size(); ++s) {
      const auto& st = def.stages[s];
      switch (st.kind) {
        case StageKind::kLet:
          for (const auto& [slot, e] : st.lets) v[slot] = eval(*e, v);
          break;
        case StageKind::kRequire: {
          PredicateResult r = judge(*st.pred, st.label, v);
          r.lhs_text = format_value(r.lhs, st.lhs_unit);
          r.rhs_text = format_value(r.rhs, st.rhs_unit);
          if (!r.passed) {
            record_miss(def, static_cast<int>(s), r, row);
            return;
          }
          row.predicates.push_back(std::move(r));
          break;
        }
        case StageKind::kJoin: run_join(p, s, row, w); break;
        case StageKind::kTrend: {
          const auto t = pipes[p].trends[s]->observe(row.key, row.window, v[st.trend_value]);
          v[st.trend_first] = t.first;
          v[st.trend_last] = t.last;
          v[st.trend_peak] = t.peak;
          v[st.trend_change] = t.change;
          v[st.trend_median] = t.median;
          v[st.trend_mad] = t.mad;
          v[st.trend_history] = t.history;
          if (!t.holds) {
            PredicateResult r;
            r.label = std::string("trend ") + st.trend->value +
                      (st.trend->mode == TrendMode::kRising ? " rising over " : " below peak over ") +
                      std::to_string(st.trend->windows) + " windows";
            r.lhs = t.last;
            r.rhs = st.trend->mode == TrendMode::kRising ? t.first : st.trend->factor * t.peak;
            r.margin = st.trend->mode == TrendMode::kRising ? t.last - t.first : r.rhs - t.last;
            if (r.margin != r.margin) r.margin = -std::numeric_limits<double>::infinity();
            if (t.history < t.needed) {
              // Not judged at all: too few consecutive windows of this key (a short trace, or a
              // key that skipped a window). Say that, not "0 vs 0".
              r.label += ": too few consecutive windows of this key to judge";
              r.lhs = t.history;
              r.rhs = t.needed;
              r.margin = static_cast<double>(t.history) - static_cast<double>(t.needed);
              r.lhs_text = std::to_string(t.history) + " window(s)";
              r.rhs_text = std::to_string(t.needed) + " needed";
            }
            record_miss(def, static_cast<int>(s), r, row);
            return;
          }
          if (st.trend->mode == TrendMode::kBaseline) break;  // not a test: the rule's requires judge
          PredicateResult r;
          r.label = "trend " + st.trend->value;
          r.lhs = t.last;
          r.rhs = t.first;
          r.passed = true;
          r.margin = t.change;
          row.predicates.push_back(r);
          break;
        }
        case StageKind::kPeer:
          if (static_cast<int>(s) == peer_stage && from <= s) {
            parked.push_back(std::move(row));
            return;
          }
          break;
        case StageKind::kEmit:
          // The window fired: its value leaves the key's baseline (operators/trend.h retract()).
          for (size_t b = 0; b < s; ++b)
            if (def.stages[b].kind == StageKind::kTrend && pipes[p].trends[b])
              pipes[p].trends[b]->retract(row.key, row.window);
          emit(def, st, row, out);
          ++outcome.chains;
          return;
      }
    }
  }

  void run_peers(size_t p, size_t s, std::vector<Row>& rows, ShardOutput& out) {
    const auto& def = plan.pipes[p];
    const auto& st = def.stages[s];
    // Peer groups: rows whose keys agree on everything but the group field. A row of events
    // without a rank (rank -1) is no peer across rank: it is every rank-less process of the
    // window lumped together, not a rank, and would be compared with the ranks (and reported as
    // "rank -1") otherwise.
    std::map<Key, std::vector<size_t>> groups;
    for (size_t i = 0; i < rows.size(); ++i) {
      Key g = rows[i].key;
      if (st.peer->group == Field::kRank && g.rank() == -1) continue;
      // Ranks are job-global (torchrun RANK), so peers across rank span nodes: a window keyed
      // by (node, rank) on a merged multi-node trace compares every rank with every other.
      if (st.peer->group == Field::kRank) g.lo &= ~(uint64_t{0xFFFF} << 16 | uint64_t{0xFFFF} << 32);
      if (st.peer->group == Field::kNode) g.lo &= ~(uint64_t{0xFFFF} << 32);
      if (st.peer->group == Field::kPid) g.hi &= 0xFFFFFFFFull;
      if (st.peer->group == Field::kTid) g.hi &= ~0xFFFFFFFFull;
      groups[g].push_back(i);
    }
    std::vector<Row> none;
    for (auto& [g, members] : groups) {
      std::vector<double> values;
      for (size_t i : members) values.push_back(rows[i].values[static_cast<size_t>(st.peer_value)]);
      const auto scores = evaluate_peers(*st.peer, values);
      for (size_t m = 0; m < members.size(); ++m) {
        Row& row = rows[members[m]];
        double* v = row.values.data();
        v[st.peer_median] = scores[m].median;
        v[st.peer_mad] = scores[m].mad;
        v[st.peer_z] = scores[m].z;
        v[st.peer_count] = static_cast<double>(scores[m].peers);
        PredicateResult r;
        r.label = std::string("peer z(") + st.peer->value + ") > " + format_value(st.peer->z, Unit::kNone);
        r.lhs = scores[m].z;
        r.rhs = st.peer->z;
        r.margin = r.lhs - r.rhs;
        r.passed = scores[m].outlier;
        if (!r.passed) {
          record_miss(def, static_cast<int>(s), r, row);
          continue;
        }
        row.predicates.push_back(r);
        run_stages(p, s + 1, row, nullptr, -1, none, out);
      }
    }
  }

  // The calls of window state w a fast tail cut (TailCut) selects, `duration >= bound` (or `>`),
  // in the order visit_calls gives them (time order). Extracted once per (window, key) close and
  // cut: the joins of a window group's rules (the rule pack's tail families, one to four joins
  // each) mostly share one cut, so each probes the tail instead of filtering every call again.
  const std::vector<Call>& window_tail(WinState& w, double bound, bool strict) {
    const bool same_bound = tail_.bound == bound || (tail_.bound != tail_.bound && bound != bound);
    if (tail_.of == &w && same_bound && tail_.strict == strict) return tail_.calls;
    tail_.of = &w;
    tail_.bound = bound;
    tail_.strict = strict;
    tail_.calls.clear();
    // The final compaction of a capped buffer costs more than the tail's filter: skipped while
    // the tail fits the cap (CallBuffer::tail_without_compacting).
    if (tuning.tail_from_held && w.calls.tail_without_compacting(bound, strict, tail_.calls)) return tail_.calls;
    w.calls.visit_calls([&](const auto& calls, auto as_call) {
      for (const auto& item : calls) {
        // The comparison eval() makes for `duration >= bound` (or `>`); NaN selects nothing.
        const double d = static_cast<double>(item.dur);
        if (strict ? d > bound : d >= bound) tail_.calls.push_back(as_call(item));
      }
    });
    return tail_.calls;
  }

  void run_join(size_t p, size_t s, Row& row, WinState* w) {
    const PipeDef& def = plan.pipes[p];
    PipeState& ps = pipes[p];
    const auto& st = def.stages[s];
    double* v = row.values.data();
    const TailCut& cut = tail_cuts[p][s];
    const double bound = cut.fast ? eval(*cut.bound, nullptr, v) : 0;
    const int id = join_ids[p][s];
    const CachedJoin* cached = nullptr;
    if (w && id >= 0)
      for (const auto& c : join_cache)
        if (c.id == id && (c.bound == bound || (c.bound != c.bound && bound != bound))) cached = &c;
    JoinOutcome jo;
    if (w && cached) {
      if (w->calls.capped()) ++counters.tail_windows_capped;
      jo = cached->outcome;
    } else if (w) {
      if (w->calls.capped()) ++counters.tail_windows_capped;
      // Spans from the instant the window is due to close on are not counted, whatever batch
      // closed it (IntervalJoin::probe's horizon): a call longer than its window's lateness would
      // otherwise see more of them when one batch holds more of the trace.
      const uint64_t lateness = def.window.lateness_ns;
      const uint64_t horizon = row.end == kFinal || row.end > kFinal - lateness ? kFinal : row.end + lateness;
      auto probe_call = [&](const Call& c) {
        const auto r = ps.joins[s]->probe(join_key(st.join->key, c.pid, c.tid), c.ts, c.ts + c.dur, ps.join_tags[s],
                                          horizon);
        jo.add(c.id, c.dur, r, st.join->max_exemplars);
      };
      if (cut.fast) {
        for (const Call& c : window_tail(*w, bound, cut.strict)) probe_call(c);
      } else {
        Event probe{};
        w->calls.visit_calls([&](const auto& calls, auto as_call) {
          for (const auto& item : calls) {
            const Call c = as_call(item);
            probe.ts_ns = c.ts;
            probe.dur_ns = c.dur;
            probe.id = c.id;
            probe.pid = c.pid;
            probe.tid = c.tid;
            if (truthy(eval(*st.tail, &probe, v))) probe_call(c);
          }
        });
      }
      if (id >= 0) join_cache.push_back({id, bound, jo});
    }
    v[st.js.overlap_ns] = static_cast<double>(jo.overlap_ns);
    v[st.js.tail_ns] = static_cast<double>(jo.tail_ns);
    v[st.js.share] = jo.share();
    v[st.js.calls] = static_cast<double>(jo.calls);
    v[st.js.hit_calls] = static_cast<double>(jo.hit_calls);
    v[st.js.events] = static_cast<double>(jo.right_ids.size());
    v[st.js.right_ns] = static_cast<double>(jo.right_ns);
    v[st.js.sum_arg0] = static_cast<double>(jo.sum_arg0);
    EvidenceItem ev;
    ev.kind = st.join->name;
    ev.value = jo.share();
    ev.unit = "ratio";
    ev.detail = format_value(static_cast<double>(jo.hit_calls), Unit::kCount) + " of " +
                format_value(static_cast<double>(jo.calls), Unit::kCount) + " slow calls " +
                (st.join->kind == JoinKind::kOverlap ? "overlap " : "are within reach of ") +
                format_value(static_cast<double>(jo.right_ids.size()), Unit::kCount) + " " + st.join->name +
                " event(s); they cover " + format_ns(static_cast<double>(jo.overlap_ns)) + " of " +
                format_ns(static_cast<double>(jo.tail_ns)) + " slow-call time (" +
                format_value(jo.share(), Unit::kPercent) + ")";
    if (jo.sum_arg0 && st.join->name.find("mem") != std::string::npos)
      ev.detail += ", " + format_bytes(static_cast<double>(jo.sum_arg0));
    if (w && w->calls.capped())
      ev.detail += "; judged on the " + format_value(static_cast<double>(w->calls.cap()), Unit::kCount) +
                   " slowest of the window's " + format_value(static_cast<double>(w->calls.seen()), Unit::kCount) +
                   " calls";
    for (const auto& e : jo.exemplars) {
      ev.event_ids.push_back(e.call_id);
      for (uint64_t r : e.right_ids) ev.event_ids.push_back(r);
    }
    row.evidence.push_back(std::move(ev));
  }

  void record_miss(const PipeDef& def, int stage, const PredicateResult& r, const Row& row) {
    auto& o = outcomes[def.rule_index];
    // The key's text only when the miss is kept or the key decides: formatting it for every
    // window and key a rule misses was a tenth of the run on traces of many windows or keys
    // (docs/performance.md, "Speed on any shape").
    const int by = better_miss_unkeyed(stage, r, row.start, o);
    if (by < 0) return;
    std::string key = key_text(def, row.key, plan.stacks.get());
    if (by == 0 && !(key < o.miss_key)) return;
    o.has_miss = true;
    o.miss_stage = stage;
    o.miss = r;
    o.miss_key = std::move(key);
    o.miss_window_start = row.start;
    o.miss_window_end = row.end;
    o.miss_values.clear();
    for (size_t i = 0; i < def.slots.size(); ++i) o.miss_values.emplace_back(def.slots[i].name, row.values[i]);
  }

  void emit(const PipeDef& def, const Stage& st, Row& row, ShardOutput& out) {
    const EmitNode& em = *st.emit;
    const double* v = row.values.data();
    Chain c;
    c.rule = em.rule;
    c.rule_hash = em.rule_hash;
    c.category = em.category;
    c.over_time = def.over_time;
    c.severity = Severity::kMedium;
    for (const auto& [when, sev] : st.severity)
      if (!when || truthy(eval(*when, v))) {
        c.severity = sev;
        break;
      }
    if (def.keys.has(Field::kOp) || def.keys.has(Field::kSource)) {
      c.source = row.key.source();
      c.op = row.key.op();
    }
    c.pid = row.key.pid();
    c.tid = row.key.tid();
    c.node = row.key.node();
    c.rank = def.keys.has(Field::kRank) ? row.key.rank() : int16_t{-1};
    c.window_start = row.start;
    c.window_end = row.end == kFinal ? last_ts : row.end;
    c.summary = expand_template(em.summary, plan, def, row.key, v, names.get());
    c.root_cause = expand_template(em.root_cause, plan, def, row.key, v, names.get());
    c.explanation = expand_template(em.explanation, plan, def, row.key, v, names.get());
    for (const auto& r : em.recommendations)
      c.recommendations.push_back(expand_template(r, plan, def, row.key, v, names.get()));
    for (size_t i = 0; i < def.slots.size(); ++i) {
      const auto& name = def.slots[i].name;
      c.values.emplace_back(name, v[i]);
      if (name == "p50" && v[i] == v[i]) c.p50_ns = static_cast<uint64_t>(v[i]);
      if (name == "p99" && v[i] == v[i]) c.p99_ns = static_cast<uint64_t>(v[i]);
      if (name == "tail_ratio" && v[i] == v[i]) c.tail_ratio = v[i];
    }
    if (c.tail_ratio == 0 && c.p50_ns) c.tail_ratio = static_cast<double>(c.p99_ns) / static_cast<double>(c.p50_ns);
    if (c.p99_ns) {
      EvidenceItem tail;
      tail.kind = "tail";
      tail.unit = "ns";
      tail.value = static_cast<double>(c.p99_ns);
      tail.detail = op_name(c.source, c.op) + " p50=" + format_ns(static_cast<double>(c.p50_ns)) +
                    " p99=" + format_ns(static_cast<double>(c.p99_ns)) + " (" +
                    format_value(c.tail_ratio, Unit::kRatio) + ")";
      c.evidence.push_back(tail);
    }
    for (auto& e : row.evidence) c.evidence.push_back(std::move(e));
    c.predicates = std::move(row.predicates);
    c.dropped_events = dropped;
    c.id = em.rule + ":" + key_text(def, row.key, plan.stacks.get()) + ":" + std::to_string(row.start);
    for (auto& ch : c.id)
      if (ch == ' ') ch = ',';
    out.chains.push_back(std::move(c));
  }
};

Shard::Shard(const CompiledPlan& plan, ShardTier tier, bool compute_stats, const ShardTuning& tuning,
             std::vector<char> groups)
    : impl_(std::make_unique<Impl>(plan, tier, compute_stats, tuning, std::move(groups))) {}
Shard::~Shard() = default;
ShardOutput Shard::process(const ShardInput& in) { return impl_->process(in); }
void Shard::route(const std::vector<Event>& events, RoutedBatch& out, PrefetchHint prefetch, bool final) {
  impl_->route(events, out, prefetch, final);
}
int Shard::carried_stats_group() const { return impl_->carried_stats_group(); }
std::unique_ptr<OpStatsAccumulator> Shard::take_stats() { return impl_->take_stats(); }

}  // namespace ingero
