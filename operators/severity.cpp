#include "operators/severity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "model/format.h"

namespace ingero {
namespace {

std::string pct(double share) {
  char b[32];
  std::snprintf(b, sizeof b, share < 0.001 ? "%.3f%%" : share < 0.1 ? "%.1f%%" : "%.0f%%", share * 100);
  return b;
}

// The marker that starts the clause grade_chain appends to a root cause (removed before a regrade).
constexpr const char* kClause = " [severity ";

}  // namespace

SeverityDecision decide_severity(const SeverityFacts& f, const SeverityOptions& o) {
  SeverityDecision d;
  d.level = f.declared;
  auto lower = [&d](Severity to, SeverityReason r, std::string why) {
    if (to < d.level) {
      d.level = to;
      d.reason = r;
      d.why = std::move(why);
    }
  };
  const bool lost_known = f.lost_ns > 0 && f.base_ns > 0;
  const double share = lost_known ? static_cast<double>(f.lost_ns) / static_cast<double>(f.base_ns) : 0.0;
  if (f.lossy) {
    lower(Severity::kLow, SeverityReason::kLossy,
          "the capture lost events in this window and this chain stands on events missing");
    return d;
  }
  if (f.not_in_loop) {
    lower(Severity::kLow, SeverityReason::kNotInLoop, "its thread launched no kernel in this window");
    return d;
  }
  if (f.split_dominant_blocked && f.split_blocked >= 0.5) {
    lower(Severity::kLow, SeverityReason::kIdle, "the thread was idle (blocked off CPU), not slowed down");
    return d;
  }
  if (f.split_dominant_blocked || f.split_dominant_unknown)
    lower(Severity::kMedium, SeverityReason::kSplitCap, "capped by the launching thread's time split");
  if (f.warmup_only && !f.warmup_abnormal) {
    const bool contention_in_progress = f.evidence == EvidenceStrength::kRecorded && lost_known &&
                                        share >= o.medium_share;
    if (!contention_in_progress) {
      lower(Severity::kLow, SeverityReason::kWarmup, "it stands on the process's warm-up calls alone");
      return d;
    }
  }
  if (f.calls == 1) {
    lower(Severity::kLow, SeverityReason::kOneCall, "a single call stands behind it");
    return d;
  }
  if (lost_known && share < o.negligible_share && f.lost_ns < o.negligible_ns) {
    lower(Severity::kLow, SeverityReason::kNegligible,
          "it cost " + format_ns(static_cast<double>(f.lost_ns)) + ", " + pct(share) + " of its thread's time");
    return d;
  }
  if (f.over_time && f.evidence == EvidenceStrength::kRecorded && lost_known && share >= o.high_share &&
      f.lost_ns >= o.high_min_ns && d.level < Severity::kHigh) {
    d.level = Severity::kHigh;
    d.reason = SeverityReason::kHighImpact;
    d.why = "it cost " + format_ns(static_cast<double>(f.lost_ns)) + ", " + pct(share) + " of its thread's time";
  }
  if ((f.category == "cpu_contention" || f.category == "blocking") && f.evidence == EvidenceStrength::kUnknownState)
    lower(Severity::kMedium, SeverityReason::kUnknownState,
          "the trace records no off-CPU state, so contention cannot be told from a voluntary wait");
  return d;
}

std::pair<uint64_t, uint64_t> chain_lost_ns(const Chain& c) {
  const uint64_t window = c.window_end > c.window_start ? c.window_end - c.window_start : 0;
  if (c.over_time && c.accounting) {
    const ThreadAccounting& a = *c.accounting;
    if (a.wall_ns == 0) return {0, 0};
    uint64_t part = 0;
    if (c.category == "cpu_contention") {
      part = a.preempted_ns;
    } else {
      for (const char* k : {"lock", "io", "network"})
        if (auto it = a.blocked_ns.find(k); it != a.blocked_ns.end()) part += it->second;
    }
    // The thread's own baseline share (median of its previous windows) is not lost time.
    // The one before the run when the engine merged windows (later windows' baselines hold the run).
    const double base_share = std::clamp(chain_value_or(c, "trend.median.before",
                                                        chain_value_or(c, "trend.median", 0.0)),
                                         0.0, 1.0);
    const double base = base_share * static_cast<double>(a.wall_ns);
    const uint64_t lost = static_cast<double>(part) > base ? part - static_cast<uint64_t>(base) : 0;
    return {lost, a.wall_ns};
  }
  if (c.category == "throughput_drop") {
    // The work done in the window at the reduced rate would have taken drop x window at the recent
    // peak rate (the missing calls x the peak's time per call): the rest of the window is lost.
    const double drop = chain_value_or(c, "drop", -1.0);
    if (window == 0 || !(drop >= 0.0 && drop < 1.0)) return {0, 0};
    return {static_cast<uint64_t>(static_cast<double>(window) * (1.0 - drop)), window};
  }
  if (c.category == "launch_gap") {
    for (const auto& e : c.evidence)
      if (e.kind == "gap" && e.value > 0) return {static_cast<uint64_t>(e.value), window};
    return {0, 0};
  }
  const double excess = chain_value_or(c, "slow.excess_ns", 0.0);
  if (excess > 0 && window > 0) {
    // The share is of the thread's time: its accounted wall time when known, else the window.
    const uint64_t base = c.accounting && c.accounting->wall_ns ? c.accounting->wall_ns : window;
    return {static_cast<uint64_t>(excess), base};
  }
  return {0, 0};
}

SeverityFacts chain_facts(const Chain& c, const SeverityContext& ctx) {
  SeverityFacts f;
  f.declared = c.declared_severity.value_or(c.severity);
  f.category = c.category;
  f.over_time = c.over_time;
  std::tie(f.lost_ns, f.base_ns) = chain_lost_ns(c);
  f.calls = static_cast<uint64_t>(std::max(0.0, chain_value_or(c, "slow.calls", 0.0)));
  if (c.over_time) {
    f.evidence = EvidenceStrength::kRecorded;  // rules over time judge recorded states only
  } else if (c.accounting) {
    f.evidence = c.accounting->scheduler_data ? EvidenceStrength::kRecorded : EvidenceStrength::kUnknownState;
  } else if (c.category == "cpu_contention" || c.category == "blocking") {
    f.evidence = EvidenceStrength::kCallsOnly;  // nothing said about the states: no cap
  }
  f.lossy = chain_value_or(c, "lost_events", 0.0) > 0 &&
            (c.category == "launch_gap" || c.category == "throughput_drop");
  f.not_in_loop = c.category == "implicit_sync" && chain_value_or(c, "launches", -1.0) == 0.0;
  if (c.category == "throughput_drop" && c.time_split.present) {
    f.split_blocked = c.time_split.off_cpu_blocked;
    f.split_dominant_blocked = c.time_split.dominant == "off_cpu_blocked";
    f.split_dominant_unknown = c.time_split.dominant == "off_cpu_unknown";
  }
  f.warmup_only = chain_value_or(c, "warmup.only", 0.0) == 1.0;
  f.warmup_abnormal = chain_value_or(c, "warmup.abnormal", 0.0) == 1.0;
  // Warm-up as a phase: with the process's step period known, its warm-up is its first steps; a
  // chain whose window starts after them is not in it, whatever the fixed `param warmup` said.
  if (f.warmup_only && ctx.steps) {
    for (const ProcessSteps& s : *ctx.steps) {
      if (s.pid != c.pid || s.node != c.node || s.period_ns == 0 || s.method == "none") continue;
      const uint64_t phase_end = s.first_ns + ctx.options.warmup_steps * s.period_ns;
      if (c.window_start >= phase_end) f.warmup_only = false;
    }
  }
  return f;
}

SeverityDecision grade_chain(Chain& c, const SeverityContext& ctx) {
  if (!c.declared_severity) c.declared_severity = c.severity;
  SeverityDecision d = decide_severity(chain_facts(c, ctx), ctx.options);
  c.severity = d.level;
  if (const size_t at = c.root_cause.find(kClause); at != std::string::npos) c.root_cause.resize(at);
  if (d.reason != SeverityReason::kNone)
    c.root_cause += std::string(kClause) + severity_name(d.level) + ": " + d.why + "]";
  return d;
}

void grade_chains(std::vector<Chain>& chains, const SeverityContext& ctx) {
  for (Chain& c : chains) grade_chain(c, ctx);
  std::sort(chains.begin(), chains.end(), chain_canonical_order);
}

double chain_value_or(const Chain& c, const char* name, double dflt) {
  for (const auto& [k, v] : c.values)
    if (k == name && std::isfinite(v)) return v;
  return dflt;
}

}  // namespace ingero
