#include "operators/incidents.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>

#include "model/format.h"
#include "model/ops.h"

namespace ingero {
namespace {

std::string pct(double share) {
  char b[32];
  std::snprintf(b, sizeof b, share < 0.001 ? "%.2f%%" : share < 0.1 ? "%.1f%%" : "%.0f%%", share * 100);
  return b;
}

std::string num(double v, int digits) {
  char b[48];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

std::string gpu_hours_text(double h) {
  if (h >= 10) return num(h, 1);
  if (h >= 0.01) return num(h, 3);
  char b[48];
  std::snprintf(b, sizeof b, "%.2g", h);
  return b;
}

std::string money(double v, const std::string& currency) {
  const std::string n = v >= 100 ? num(v, 0) : v >= 0.01 ? num(v, 2) : num(v, 4);
  return currency == "USD" ? "$" + n : n + " " + currency;
}

const ProcessSteps* steps_of(const AnalysisResult& r, uint16_t node, uint32_t pid) {
  for (const auto& s : r.steps)
    if (s.pid == pid && s.node == node && s.period_ns > 0 && s.method != "none") return &s;
  return nullptr;
}

std::string who(const AnalysisResult& r, const Incident& in) {
  std::string p;
  if (auto it = r.meta.process_names.find(in.pid); it != r.meta.process_names.end() && !it->second.empty())
    p = it->second + " (pid " + std::to_string(in.pid) + ")";
  else if (in.pid) p = "pid " + std::to_string(in.pid);
  if (in.tid && in.tid != in.pid) p = "tid " + std::to_string(in.tid) + " of " + p;
  if (p.empty() && in.rank >= 0) p = "rank " + std::to_string(in.rank);
  if (p.empty()) p = "the job";
  return p;
}

// ", mostly stress-ng (pid 31337) ran instead": for a CPU contention, the task that took the CPU
// most over the incident's chains (their accounting's preempted_by), "" when none is known.
std::string ran_instead(const AnalysisResult& r, const Incident& in) {
  if (in.category != "cpu_contention") return "";
  std::map<std::pair<uint32_t, std::string>, uint64_t> by;
  for (const Chain& c : r.chains) {
    if (!c.accounting || std::find(in.chains.begin(), in.chains.end(), c.id) == in.chains.end()) continue;
    for (const PreemptedBy& p : c.accounting->preempted_by) by[{p.pid, p.comm}] += p.ns;
  }
  const std::pair<const std::pair<uint32_t, std::string>, uint64_t>* top = nullptr;
  for (const auto& e : by)
    if (!top || e.second > top->second) top = &e;
  if (!top || top->second == 0) return "";
  const auto& [pid, comm] = top->first;
  std::string name = comm.empty() ? "pid " + std::to_string(pid)
                                  : comm + (pid ? " (pid " + std::to_string(pid) + ")" : std::string());
  return ", mostly " + name + " running instead";
}

// Who took the main thread's CPU most, as in ran_instead: "" when none is known.
std::string top_preemptor(const ThreadAccounting& a) {
  if (a.preempted_by.empty() || a.preempted_by.front().ns == 0) return "";
  const PreemptedBy& p = a.preempted_by.front();
  return p.comm.empty() ? "pid " + std::to_string(p.pid)
                        : p.comm + (p.pid ? " (pid " + std::to_string(p.pid) + ")" : std::string());
}

}  // namespace

double GpuRates::rate_for(const std::string& node) const {
  if (auto it = by_node.find(node); it != by_node.end()) return it->second;
  return fallback;
}

bool parse_gpu_rates(const std::string& text, const std::string& file, GpuRates& out, std::string& error) {
  std::istringstream in(text);
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream ls(line);
    std::string name, value, extra;
    if (!(ls >> name)) continue;
    if (!(ls >> value) || (ls >> extra)) {
      error = file + ":" + std::to_string(n) + ": expected \"NAME PRICE\" (a node name or *, a price per GPU-hour)";
      return false;
    }
    if (name == "currency") {
      out.currency = value;
      continue;
    }
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0' || !(v >= 0) || !std::isfinite(v)) {
      error = file + ":" + std::to_string(n) + ": expected a price >= 0 after \"";
      error += name;
      error += "\", got \"";
      error += value;
      error += '"';
      return false;
    }
    if (name == "*") out.fallback = v;
    else out.by_node[name] = v;
  }
  return true;
}

void GpuUsage::observe(const Event* events, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const Event& e = events[i];
    if (e.source != Source::kCuda && e.source != Source::kDriver && e.source != Source::kGraph &&
        e.source != Source::kNccl)
      continue;
    auto& bits = seen_[uint64_t{e.node} << 32 | e.pid];
    bits[e.gpu_id / 64] |= uint64_t{1} << (e.gpu_id % 64);
  }
}

unsigned GpuUsage::devices(uint16_t node, uint32_t pid) const {
  auto it = seen_.find(uint64_t{node} << 32 | pid);
  if (it == seen_.end()) return 0;
  unsigned k = 0;
  for (uint64_t w : it->second) k += static_cast<unsigned>(__builtin_popcountll(w));
  return k;
}

void assemble_incidents(AnalysisResult& r, const IncidentOptions& o, const GpuUsage* usage) {
  SeverityContext ctx;
  ctx.steps = &r.steps;
  ctx.options = o.severity;
  grade_chains(r.chains, ctx);
  r.incidents.clear();
  const uint64_t t0 = r.meta.first_ts, t1 = std::max(r.meta.first_ts, r.meta.last_ts);
  const uint64_t job_ns = t1 - t0;
  // Chains by key, in time order.
  std::vector<const Chain*> order;
  for (const Chain& c : r.chains) order.push_back(&c);
  auto key = [](const Chain* c) { return std::tie(c->rule, c->category, c->node, c->pid, c->tid, c->rank); };
  std::sort(order.begin(), order.end(), [&](const Chain* a, const Chain* b) {
    return std::tuple_cat(key(a), std::tie(a->window_start, a->id)) <
           std::tuple_cat(key(b), std::tie(b->window_start, b->id));
  });
  for (size_t i = 0; i < order.size();) {
    const Chain& first = *order[i];
    const ProcessSteps* st = steps_of(r, first.node, first.pid);
    const uint64_t slack = o.slack_ns + (st ? 2 * st->period_ns : 0);
    auto start_of = [&](const Chain& c) { return c.window_end > c.window_start ? c.window_start : t0; };
    auto end_of = [&](const Chain& c) { return c.window_end > c.window_start ? c.window_end : t1; };
    size_t j = i + 1;
    uint64_t end = end_of(first);
    while (j < order.size() && key(order[j]) == key(&first) && start_of(*order[j]) <= end + slack) {
      end = std::max(end, end_of(*order[j]));
      ++j;
    }
    Incident in;
    in.id = first.id;
    in.rule = first.rule;
    in.category = first.category;
    in.pid = first.pid;
    in.tid = first.tid;
    in.node = first.node;
    in.rank = first.rank;
    in.start_ns = start_of(first);
    in.end_ns = end;
    SeverityFacts f;
    f.declared = Severity::kLow;
    f.category = first.category;
    f.over_time = first.over_time;
    const Chain* worst = &first;
    // Rate findings: one per op (cudaLaunchKernel and cuLaunchKernel of one process can both
    // fire for the same window); the window's time is lost once, the largest of them.
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> rate_lost;  // window start -> (lost, base)
    for (size_t k = i; k < j; ++k) {
      const Chain& c = *order[k];
      in.chains.push_back(c.id);
      if (c.severity > f.declared) f.declared = c.severity;
      if (c.severity > worst->severity) worst = &c;
      f.calls += static_cast<uint64_t>(std::max(0.0, chain_value_or(c, "slow.calls", 0.0)));
      if (c.category == "straggler") {
        const double ranks_waiting = r.meta.nodes.size() > 1 ? static_cast<double>(r.meta.nodes.size() - 1) : 1.0;
        const double lost = chain_value_or(c, "median_lag_ms", 0.0) * 1e6 * chain_value_or(c, "collectives", 0.0) *
                            ranks_waiting;
        in.lost_ns += static_cast<uint64_t>(std::max(0.0, lost));
        in.lost_basis = "median lag x collectives it was last at x ranks waiting";
        continue;
      }
      const auto [lost, base] = chain_lost_ns(c);
      if (c.category == "throughput_drop") {
        auto& [l, b] = rate_lost[c.window_start];
        if (lost >= l) {
          l = lost;
          b = base;
        }
        in.lost_basis = "the window's time the launch rate fell short of its recent peak: window x (1 - rate / peak)";
        continue;
      }
      in.lost_ns += lost;
      f.base_ns += base;
      if (c.over_time) {
        in.lost_basis = c.category == "cpu_contention"
                            ? "preempted time above the thread's baseline"
                            : "blocked time (locks, pipes/sockets, disk) above the thread's baseline";
        f.evidence = EvidenceStrength::kRecorded;
      } else if (c.category == "launch_gap") {
        in.lost_basis = "the gap without launches";
      } else if (chain_value_or(c, "slow.excess_ns", 0.0) > 0) {
        in.lost_basis = "slow calls' time beyond the median call";
        if (c.accounting)
          f.evidence = std::max(f.evidence, c.accounting->scheduler_data ? EvidenceStrength::kRecorded
                                                                         : EvidenceStrength::kUnknownState);
      }
    }
    for (const auto& [start, lb] : rate_lost) {
      in.lost_ns += lb.first;
      f.base_ns += lb.second;
    }
    if (in.lost_basis.empty()) in.lost_basis = "not measured for this kind of finding";
    f.lost_ns = in.lost_ns;
    if (first.category == "straggler") f.base_ns = job_ns;
    in.severity = decide_severity(f, o.severity).level;
    in.lost_share = job_ns ? static_cast<double>(in.lost_ns) / static_cast<double>(job_ns) : 0.0;
    const unsigned dev = usage ? usage->devices(in.node, in.pid) : 0;
    if (dev > 1) {
      in.gpus = dev;
      in.gpus_from = "trace";
    } else if (o.gpus > 0) {
      in.gpus = o.gpus;
      in.gpus_from = "--gpus";
    } else {
      in.gpus = 1;
      in.gpus_from = "assumed";
    }
    in.gpu_hours = static_cast<double>(in.lost_ns) / 3.6e12 * in.gpus;
    const std::string node_name = in.node < r.meta.nodes.size() ? r.meta.nodes[in.node] : "";
    if (const double rate = o.rates.rate_for(node_name); rate > 0) {
      in.cost = in.gpu_hours * rate;
      in.currency = o.rates.currency;
    }
    if (st) {
      in.step_ns = st->p50_ns ? st->p50_ns : st->period_ns;
      in.steps = std::max<uint64_t>(1, (in.end_ns - in.start_ns) / st->period_ns);
      if (in.lost_ns > 0) {
        const uint64_t per_step = in.lost_ns / in.steps;
        in.what_if_step_ns = in.step_ns > per_step ? in.step_ns - per_step : 0;
      }
    }
    in.summary = worst->summary;
    r.incidents.push_back(std::move(in));
    i = j;
  }
  std::sort(r.incidents.begin(), r.incidents.end(), [](const Incident& a, const Incident& b) {
    if (a.lost_ns != b.lost_ns) return a.lost_ns > b.lost_ns;
    if (a.severity != b.severity) return a.severity > b.severity;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.id < b.id;
  });
  r.bound = make_verdict(r, r.verdict);
}

std::string make_verdict(const AnalysisResult& r, std::string& text) {
  text.clear();
  constexpr double kMaterialShare = 0.15;  // preempted or blocked on input: never "gpu-bound" from here
  // Where the main feeding thread's time went.
  const ThreadAccounting* main = r.accounting.empty() ? nullptr : &r.accounting.front();
  double sync = 0, calls = 0, on_cpu = 0, preempted = 0, input = 0, idle = 0, unknown = 0;
  if (main && main->wall_ns) {
    const double w = static_cast<double>(main->wall_ns);
    auto at = [](const std::map<std::string, uint64_t>& m, const char* k) {
      auto it = m.find(k);
      return it == m.end() ? 0.0 : static_cast<double>(it->second);
    };
    sync = at(main->in_calls_ns, "sync") / w;
    calls = static_cast<double>(main->in_calls_total()) / w;
    on_cpu = static_cast<double>(main->on_cpu_ns) / w;
    preempted = static_cast<double>(main->preempted_ns) / w;
    input = (at(main->blocked_ns, "lock") + at(main->blocked_ns, "io") + at(main->blocked_ns, "network")) / w;
    idle = (at(main->blocked_ns, "sleep") + at(main->blocked_ns, "other")) / w;
    unknown = static_cast<double>(main->unknown_ns) / w;
    std::string name = main->comm.empty() ? "" : " (" + main->comm + ")";
    text = "The main GPU-feeding thread, tid " + std::to_string(main->tid) + name + " of pid " +
           std::to_string(main->pid) + ", spent its " + format_ns(static_cast<double>(main->wall_ns)) + ": " +
           pct(calls) + " in GPU calls (" + pct(sync) + " waiting for the GPU), " + pct(on_cpu) + " on CPU, " +
           pct(preempted) + " preempted, " + pct(input) + " blocked on input (locks, pipes, disk), " + pct(idle) +
           " asleep" + (unknown > 0.0005 ? ", " + pct(unknown) + " in an unknown state" : "") + ". ";
  }
  std::vector<const Incident*> named;
  uint64_t lost = 0;
  for (const auto& in : r.incidents)
    if (in.severity >= Severity::kMedium) {
      named.push_back(&in);
      lost += in.lost_ns;
    }
  if (!named.empty()) {
    const uint64_t job = r.meta.last_ts > r.meta.first_ts ? r.meta.last_ts - r.meta.first_ts : 0;
    text += std::to_string(named.size()) + (named.size() == 1 ? " incident" : " incidents") + " cost this job " +
            format_ns(static_cast<double>(lost)) +
            (job ? " (" + pct(static_cast<double>(lost) / static_cast<double>(job)) + " of its wall time)" : "") +
            ", worst first: ";
    for (size_t k = 0; k < named.size() && k < 3; ++k) {
      const Incident& in = *named[k];
      text += std::string(k ? "; " : "") + std::to_string(k + 1) + ") " + severity_name(in.severity) + " " +
              in.category + " on " + who(r, in) + ran_instead(r, in) + " for " +
              format_ns(static_cast<double>(in.end_ns - in.start_ns));
      if (in.lost_ns) {
        text += ", lost " + format_ns(static_cast<double>(in.lost_ns)) + " (" + pct(in.lost_share) + "), " +
                gpu_hours_text(in.gpu_hours) + " GPU-hours";
        if (in.cost) text += ", " + money(*in.cost, in.currency);
        if (in.what_if_step_ns)
          text += "; without it a step would take " + format_ns(static_cast<double>(*in.what_if_step_ns)) +
                  " instead of " + format_ns(static_cast<double>(in.step_ns));
      } else {
        text += " (time lost not measured for this kind)";
      }
    }
    if (named.size() > 3) text += "; and " + std::to_string(named.size() - 3) + " more";
    text += ".";
    return "";
  }
  std::string bound, why;
  if (!main || !main->wall_ns) {
    bound = "unknown";
    why = "no GPU-feeding thread was accounted, so nothing says what bounds it";
  } else if (unknown >= 0.5) {
    bound = "unknown";
    why =
        "most of the feeding thread's time is in an unknown state (this trace records no off-CPU state; "
        "capture with `ingero-pipeline trace` to see it)";
  } else if (preempted >= kMaterialShare && preempted >= input) {
    // Material contention or waiting is never called healthy, whatever else the thread does.
    bound = "cpu-contended";
    const std::string by = top_preemptor(*main);
    why = "its feeding thread loses " + pct(preempted) + " of its time to other tasks" +
          (by.empty() ? "" : ", mostly " + by);
  } else if (input >= kMaterialShare) {
    bound = "input-bound";
    why = input >= 0.5 ? "its feeding thread spends most of its time waiting for its input"
                       : "its feeding thread waits for its input " + pct(input) + " of its time";
  } else if (sync >= 0.5) {
    bound = "gpu-bound";
    why = "its feeding thread spends most of its time waiting for the GPU, the healthy outcome";
  } else if (on_cpu >= 0.5) {
    bound = "host-bound";
    why = "its feeding thread spends most of its time computing on the CPU between GPU calls";
  } else if (idle >= 0.5) {
    bound = "idle";
    why = "its feeding thread is mostly asleep";
  } else {
    bound = "mixed";
    why = "no single part holds half of the feeding thread's time";
  }
  if (bound == "unknown")
    text += "No incident of MEDIUM or HIGH severity; what bounds the job is unknown: " + why + ".";
  else text += "No incident of MEDIUM or HIGH severity: the job is " + bound + " (" + why + ").";
  return bound;
}

}  // namespace ingero
