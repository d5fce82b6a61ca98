#include "model/plan.h"

#include <cstdio>
#include <map>
#include <sstream>

#include "model/ops.h"

namespace ingero {
namespace {

template <class... Ts>
struct Overload : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overload(Ts...) -> Overload<Ts...>;

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string expr_text(const ExprPtr& e) { return e ? e->to_string() : "-"; }

const char* state_name(OffCpuState s) {
  switch (s) {
    case OffCpuState::kPreempted: return "preempted";
    case OffCpuState::kSleeping: return "sleeping";
    case OffCpuState::kDiskWait: return "disk_wait";
    case OffCpuState::kOther: return "other";
    default: return "unknown";
  }
}

std::string node_text(const NodeBody& body) {
  return std::visit(Overload{
                        [](const ScanNode&) { return std::string("scan"); },
                        [](const FilterNode& n) { return "filter pred=" + expr_text(n.pred); },
                        [](const OffCpuNode& n) {
                          std::string s = "offcpu_spans min=" + format_duration(n.min_ns) + " states=[";
                          for (size_t i = 0; i < n.states.size(); ++i)
                            s += std::string(i ? "," : "") + state_name(n.states[i]);
                          return s + "]";
                        },
                        [](const AccountNode& n) { return "account grid=" + format_duration(n.grid_ns); },
                        [](const StepNode&) { return std::string("steps"); },
                        [](const WindowNode& n) {
                          std::string s = "window kind=";
                          s += n.kind == WindowKind::kTumbling  ? "tumbling"
                               : n.kind == WindowKind::kSliding ? "sliding"
                               : n.kind == WindowKind::kSteps   ? "steps"
                                                                : "whole";
                          if (n.kind == WindowKind::kSteps) s += " steps=" + std::to_string(n.steps);
                          else if (n.kind != WindowKind::kWhole) s += " size=" + format_duration(n.size_ns);
                          if (n.kind == WindowKind::kSliding) s += " slide=" + format_duration(n.slide_ns);
                          s += " by=[";
                          for (size_t i = 0; i < n.keys.size(); ++i)
                            s += std::string(i ? "," : "") + field_name(n.keys[i]);
                          s += "]";
                          if (n.lateness_ns) s += " lateness=" + format_duration(n.lateness_ns);
                          return s;
                        },
                        [](const AggregateNode& n) {
                          std::string s = "aggregate";
                          for (const auto& a : n.aggs) {
                            s += " " + a.name + "=" + agg_name(a.kind) + "(";
                            if (a.buckets) s += "buckets=" + std::to_string(a.buckets);
                            else if (a.kind != AggKind::kCount && a.kind != AggKind::kRate) s += field_name(a.field);
                            if (a.kind == AggKind::kQuantile) s += "," + number(a.q);
                            s += ")";
                          }
                          s += " exact_limit=" + std::to_string(n.exact_limit) + " alpha=" + number(n.sketch_alpha);
                          return s;
                        },
                        [](const LetNode& n) {
                          std::string s = "let";
                          for (const auto& [name, e] : n.lets) s += " " + name + "=" + expr_text(e);
                          return s;
                        },
                        [](const RequireNode& n) {
                          return "require pred=" + expr_text(n.pred) + " label=" + quote(n.label);
                        },
                        [](const JoinNode& n) {
                          std::string s = "join name=" + n.name + " kind=";
                          s += n.kind == JoinKind::kOverlap ? "overlap" : "within";
                          s += " key=";
                          s += n.key == JoinKey::kTid ? "tid" : n.key == JoinKey::kPid ? "pid" : "none";
                          s += " tail=" + expr_text(n.tail);
                          if (n.kind == JoinKind::kWithin) s += " within=" + format_duration(n.within_ns);
                          s += " horizon=" + format_duration(n.horizon_ns);
                          s += " exemplars=" + std::to_string(n.max_exemplars);
                          return s;
                        },
                        [](const TrendNode& n) {
                          std::string s = "trend value=" + n.value + " windows=" + std::to_string(n.windows);
                          s += n.mode == TrendMode::kRising     ? std::string(" mode=rising")
                               : n.mode == TrendMode::kBaseline ? std::string(" mode=baseline")
                                                                : " mode=below_peak factor=" + number(n.factor);
                          return s;
                        },
                        [](const PeerNode& n) {
                          return std::string("peer group=") + field_name(n.group) + " value=" + n.value +
                                 " z=" + number(n.z) + " floor=" + number(n.floor) +
                                 " min_peers=" + std::to_string(n.min_peers);
                        },
                        [](const EmitNode& n) {
                          std::string s = "emit rule=" + n.rule + " category=" + n.category + " severity=[";
                          for (size_t i = 0; i < n.severity.size(); ++i) {
                            const auto& c = n.severity[i];
                            s += std::string(i ? ", " : "") + severity_name(c.severity);
                            if (c.when) s += " when " + c.when->to_string();
                          }
                          s += "] summary=" + quote(n.summary);
                          if (!n.root_cause.empty()) s += " root_cause=" + quote(n.root_cause);
                          if (!n.recommendations.empty()) {
                            s += " fix=[";
                            for (size_t i = 0; i < n.recommendations.size(); ++i)
                              s += std::string(i ? ", " : "") + quote(n.recommendations[i]);
                            s += "]";
                          }
                          if (!n.rule_hash.empty()) s += " hash=" + n.rule_hash;
                          return s;
                        },
                    },
                    body);
}

}  // namespace

const char* severity_name(Severity s) {
  switch (s) {
    case Severity::kHigh: return "HIGH";
    case Severity::kMedium: return "MEDIUM";
    default: return "LOW";
  }
}

const char* agg_name(AggKind k) {
  switch (k) {
    case AggKind::kCount: return "count";
    case AggKind::kSum: return "sum";
    case AggKind::kMin: return "min";
    case AggKind::kMax: return "max";
    case AggKind::kMean: return "mean";
    case AggKind::kRate: return "rate";
    case AggKind::kQuantile: return "quantile";
    case AggKind::kTime: return "time";
    case AggKind::kTopTask: return "top_task";
    case AggKind::kTopTaskTime: return "top_task_time";
  }
  return "?";
}

std::string format_duration(uint64_t ns) {
  struct UnitDef {
    uint64_t scale;
    const char* suffix;
  };
  static constexpr UnitDef kUnits[] = {{3'600'000'000'000ull, "h"},
                                       {60'000'000'000ull, "m"},
                                       {1'000'000'000ull, "s"},
                                       {1'000'000ull, "ms"},
                                       {1'000ull, "us"}};
  if (ns == 0) return "0s";
  for (const auto& u : kUnits)
    if (ns % u.scale == 0) return std::to_string(ns / u.scale) + u.suffix;
  return std::to_string(ns) + "ns";
}

int Plan::add(NodeBody body, std::vector<int> inputs) {
  PlanNode n;
  n.id = static_cast<int>(nodes.size());
  n.inputs = std::move(inputs);
  n.body = std::move(body);
  nodes.push_back(std::move(n));
  return nodes.back().id;
}

std::string Plan::to_string() const {
  std::ostringstream out;
  for (const auto& n : nodes) {
    out << "%" << n.id << " = ";
    const std::string text = node_text(n.body);
    const auto space = text.find(' ');
    out << text.substr(0, space) << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) out << (i ? ", " : "") << "%" << n.inputs[i];
    out << ")";
    if (space != std::string::npos) out << text.substr(space);
    out << "\n";
  }
  return out.str();
}

void Plan::merge(const Plan& other) {
  std::map<int, int> remap;
  int shared_scan = -1;
  for (const auto& n : nodes)
    if (std::holds_alternative<ScanNode>(n.body)) shared_scan = n.id;
  for (const auto& n : other.nodes) {
    if (std::holds_alternative<ScanNode>(n.body) && shared_scan >= 0) {
      remap[n.id] = shared_scan;
      continue;
    }
    std::vector<int> inputs;
    for (int in : n.inputs) inputs.push_back(remap.count(in) ? remap[in] : -1);
    const int id = add(n.body, inputs);
    nodes.back().line = n.line;
    nodes.back().col = n.col;
    remap[n.id] = id;
    if (std::holds_alternative<ScanNode>(n.body)) shared_scan = id;
  }
}

std::vector<std::string> Plan::validate() const {
  std::vector<std::string> errors;
  auto err = [&](const PlanNode& n, const std::string& msg) {
    errors.push_back("%" + std::to_string(n.id) + ": " + msg);
  };
  auto kind_of = [&](int id) -> const NodeBody* {
    if (id < 0 || id >= static_cast<int>(nodes.size())) return nullptr;
    return &nodes[static_cast<size_t>(id)].body;
  };
  for (const auto& n : nodes) {
    for (int in : n.inputs)
      if (in < 0 || in >= n.id) err(n, "input %" + std::to_string(in) + " does not precede it");
    const size_t want = std::holds_alternative<ScanNode>(n.body) ? 0 : std::holds_alternative<JoinNode>(n.body) ? 2 : 1;
    if (n.inputs.size() != want) {
      err(n, "takes " + std::to_string(want) + " input(s), has " + std::to_string(n.inputs.size()));
      continue;
    }
    if (const auto* f = std::get_if<FilterNode>(&n.body); f && !f->pred) err(n, "filter without predicate");
    if (const auto* r = std::get_if<RequireNode>(&n.body); r && !r->pred) err(n, "require without predicate");
    if (const auto* w = std::get_if<WindowNode>(&n.body)) {
      if (w->kind != WindowKind::kWhole && w->kind != WindowKind::kSteps && w->size_ns == 0) err(n, "window size is 0");
      if (w->kind == WindowKind::kSteps && w->steps == 0) err(n, "a steps window needs at least 1 step");
      // Steps come out late (once settled): only a steps window reads them, and it reads only them.
      int in = n.inputs[0];
      while (in >= 0 && in < n.id && std::holds_alternative<FilterNode>(nodes[static_cast<size_t>(in)].body))
        in = nodes[static_cast<size_t>(in)].inputs.empty() ? -1 : nodes[static_cast<size_t>(in)].inputs[0];
      const bool over_steps = in >= 0 && in < n.id &&
                              std::holds_alternative<StepNode>(nodes[static_cast<size_t>(in)].body);
      if (over_steps != (w->kind == WindowKind::kSteps))
        err(n, over_steps ? "a steps stream needs a steps window" : "a steps window needs a steps stream");
      if (w->kind == WindowKind::kSliding && (w->slide_ns == 0 || w->slide_ns > w->size_ns))
        err(n, "sliding window needs 0 < slide <= size");
    }
    if (const auto* a = std::get_if<AggregateNode>(&n.body)) {
      if (!std::holds_alternative<WindowNode>(*kind_of(n.inputs[0]))) err(n, "aggregate must follow a window");
      for (const auto& s : a->aggs)
        if (s.kind == AggKind::kQuantile && !(s.q > 0 && s.q <= 1)) err(n, s.name + ": quantile outside (0, 1]");
    }
    if (std::holds_alternative<WindowNode>(n.body)) {
      const auto* in = kind_of(n.inputs[0]);
      if (!(std::holds_alternative<ScanNode>(*in) || std::holds_alternative<FilterNode>(*in) ||
            std::holds_alternative<OffCpuNode>(*in) || std::holds_alternative<AccountNode>(*in) ||
            std::holds_alternative<StepNode>(*in)))
        err(n, "window input must be an event stream");
    }
    if (std::holds_alternative<JoinNode>(n.body)) {
      const auto* right = kind_of(n.inputs[1]);
      if (!(std::holds_alternative<ScanNode>(*right) || std::holds_alternative<FilterNode>(*right) ||
            std::holds_alternative<OffCpuNode>(*right)))
        err(n, "join's second input must be an event stream");
      if (!std::get<JoinNode>(n.body).tail) err(n, "join without tail predicate");
    }
  }
  return errors;
}

}  // namespace ingero
