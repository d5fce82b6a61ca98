#include "sinks/fleet/stragglers.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "model/format.h"
#include "model/plan.h"

namespace ingero {
namespace {

// Median of the sorted vector `s` without its element at index p (s.size() >= 2).
int64_t median_without(const std::vector<int64_t>& s, size_t p) {
  const size_t m = s.size() - 1;
  auto at = [&](size_t q) { return s[q < p ? q : q + 1]; };
  if (m % 2) return at(m / 2);
  return at(m / 2 - 1) + (at(m / 2) - at(m / 2 - 1)) / 2;
}

// Median step between consecutive collectives of one node, on its own clock (0: too few).
int64_t node_step(const std::vector<SyncPoint>& pts) {
  std::vector<int64_t> d;
  for (size_t k = 1; k < pts.size(); ++k) {
    const uint64_t dord = pts[k].ordinal - pts[k - 1].ordinal;
    if (dord == 0 || pts[k].exit_ns <= pts[k - 1].exit_ns) continue;
    d.push_back(static_cast<int64_t>((pts[k].exit_ns - pts[k - 1].exit_ns) / dord));
  }
  return d.empty() ? 0 : median_of(std::move(d));
}

}  // namespace

StragglerReport find_stragglers(const std::vector<ArrivalNode>& nodes, const StragglerOptions& o) {
  StragglerReport r;
  r.nodes.resize(nodes.size());
  std::vector<int64_t> steps;
  size_t with_points = 0, matched = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    r.nodes[i].node = nodes[i].node;
    const auto& pts = nodes[i].points;
    if (pts.size() >= 3) {
      ++with_points;
      if (const int64_t s = node_step(pts); s > 0) steps.push_back(s);
    }
    if (nodes[i].matched) ++matched;
    std::vector<int64_t> waits;
    for (const auto& p : pts)
      if (p.exit_ns >= p.entry_ns) waits.push_back(static_cast<int64_t>(p.exit_ns - p.entry_ns));
    r.nodes[i].waits = waits.size();
    if (waits.size() >= o.min_collectives) r.nodes[i].median_wait_ns = median_of(std::move(waits));
  }
  r.step_ns = steps.empty() ? 0 : median_of(steps);
  if (r.step_ns <= 0 || with_points < 2) {
    r.note = "fewer than two nodes with collectives and blocking waits: no straggler judged";
    return r;
  }
  const auto floor_ns = static_cast<int64_t>(std::ceil(o.min_lag_share * static_cast<double>(r.step_ns)));

  // Wait-least on every node's own clock: its median wait against the median of the others'.
  {
    std::vector<std::pair<int64_t, size_t>> w;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (r.nodes[i].median_wait_ns >= 0) w.emplace_back(r.nodes[i].median_wait_ns, i);
    std::sort(w.begin(), w.end());
    std::vector<int64_t> sorted;
    sorted.reserve(w.size());
    for (const auto& x : w) sorted.push_back(x.first);
    if (sorted.size() >= 2)
      for (size_t p = 0; p < w.size(); ++p)
        r.nodes[w[p].second].wait_shortfall_ns = median_without(sorted, p) - w[p].first;
  }

  // Arrival order on the corrected clock: reference ordinal -> (node, corrected entry).
  r.order_usable = matched == with_points && matched >= 2;
  for (const auto& n : nodes)
    if (n.matched && (n.uncertainty_ns < 0 || n.uncertainty_ns >= floor_ns)) r.order_usable = false;
  std::map<int64_t, std::vector<std::pair<size_t, int64_t>>> by_ordinal;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!nodes[i].matched) continue;
    for (const auto& p : nodes[i].points)
      by_ordinal[static_cast<int64_t>(p.ordinal) - nodes[i].ordinal_shift].push_back(
          {i, static_cast<int64_t>(p.entry_ns)});
  }
  std::vector<std::vector<int64_t>> lateness(nodes.size()), lag_when_last(nodes.size());
  std::vector<int64_t> sorted;
  for (auto& [ord, arr] : by_ordinal) {
    if (arr.size() < 2 || arr.size() < matched) continue;
    ++r.compared;
    std::sort(arr.begin(), arr.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    sorted.clear();
    for (const auto& a : arr) sorted.push_back(a.second);
    for (size_t p = 0; p < arr.size(); ++p) {
      ++r.nodes[arr[p].first].compared;
      lateness[arr[p].first].push_back(arr[p].second - median_without(sorted, p));
    }
    const size_t n = arr.size();
    const auto [last, t_last] = arr[n - 1];
    const int64_t u_last = nodes[last].uncertainty_ns;
    bool resolved = u_last >= 0;
    for (size_t k = 0; k + 1 < n && resolved; ++k) {
      const int64_t u = nodes[arr[k].first].uncertainty_ns;
      resolved = u >= 0 && t_last - arr[k].second > u_last + u;
    }
    if (resolved) {
      ++r.nodes[last].last;
      r.nodes[last].lead_sum_ns += t_last - arr[n - 2].second;
      lag_when_last[last].push_back(lateness[last].back());
    } else {
      ++r.nodes[last].last_unresolved;
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!lateness[i].empty()) r.nodes[i].median_lateness_ns = median_of(std::move(lateness[i]));
    if (!lag_when_last[i].empty()) r.nodes[i].median_lag_ns = median_of(std::move(lag_when_last[i]));
  }

  // The node that waits least (ties: the first), for the cross-check and the fallback.
  size_t least = SIZE_MAX;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (r.nodes[i].median_wait_ns >= 0 && r.nodes[i].wait_shortfall_ns >= floor_ns &&
        (least == SIZE_MAX || r.nodes[i].median_wait_ns < r.nodes[least].median_wait_ns))
      least = i;

  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& s = r.nodes[i];
    if (s.compared < o.min_collectives || s.median_lateness_ns < floor_ns) continue;
    const double share = static_cast<double>(s.last) / static_cast<double>(s.compared);
    if (share < o.min_last_share) continue;
    Straggler g;
    g.node = s.node;
    g.method = "arrival_order";
    g.collectives = s.compared;
    g.last_share = share;
    g.median_lag_ns = s.median_lag_ns;
    g.step_ns = r.step_ns;
    g.cost_share = static_cast<double>(s.lead_sum_ns) /
                   (static_cast<double>(s.compared) * static_cast<double>(r.step_ns));
    g.cross_check = s.median_wait_ns < 0 ? "n/a" : i == least ? "agrees" : "disagrees";
    r.stragglers.push_back(g);
  }
  if (r.stragglers.empty() && !r.order_usable && least != SIZE_MAX) {
    const auto& s = r.nodes[least];
    Straggler g;
    g.node = s.node;
    g.method = "wait_least";
    g.collectives = s.waits;
    g.median_lag_ns = s.wait_shortfall_ns;
    g.step_ns = r.step_ns;
    g.cost_share = static_cast<double>(s.wait_shortfall_ns) / static_cast<double>(r.step_ns);
    g.cross_check = "n/a";
    r.stragglers.push_back(g);
    r.note = "arrival order not decidable (a clock unmatched, unknown or coarser than " +
             format_ms_fixed(static_cast<double>(floor_ns), 3) +
             "): the node that waits least is named from its own clock";
  } else if (r.stragglers.empty()) {
    r.note = "no node arrived last at >= " + format_percent_fixed(o.min_last_share, 1) +
             " of >= " + std::to_string(o.min_collectives) +
             " collectives by >= " + format_percent_fixed(o.min_lag_share, 1) + " of the " +
             format_ms_fixed(static_cast<double>(r.step_ns), 3) + " step";
  }
  for (auto& g : r.stragglers) g.severity = g.cost_share >= o.high_cost_share ? Severity::kHigh : Severity::kMedium;
  std::stable_sort(r.stragglers.begin(), r.stragglers.end(),
                   [](const Straggler& a, const Straggler& b) { return a.cost_share > b.cost_share; });
  return r;
}

std::vector<Chain> straggler_chains(const StragglerReport& report) {
  std::vector<Chain> out;
  for (const auto& g : report.stragglers) {
    Chain c;
    c.rule = "fleet_step_straggler";
    c.id = "fleet_step_straggler:" + g.node;
    c.category = "straggler";
    c.severity = g.severity;
    c.rank = static_cast<int16_t>(g.rank);
    const std::string who = (g.rank >= 0 ? "rank " + std::to_string(g.rank) + " (node " + g.node + ")"
                                         : "node " + g.node);
    if (g.method == "arrival_order") {
      c.summary = who + " arrived last in " + format_percent_fixed(g.last_share, 1) + " of " +
                  std::to_string(g.collectives) + " steps, a median " +
                  format_ms_fixed(static_cast<double>(g.median_lag_ns), 3) + " late, costing the job " +
                  format_percent_fixed(g.cost_share, 1) + " of its step time";
      c.explanation = "On the corrected clock it entered the collective last, beyond both clocks' uncertainties, at " +
                      format_percent_fixed(g.last_share, 1) + " of the collectives every node took part in (step " +
                      format_ms_fixed(static_cast<double>(g.step_ns), 3) +
                      "); the others waited for it. Wait-least cross-check: " + g.cross_check + ".";
    } else {
      c.summary = who + " waits a median " + format_ms_fixed(static_cast<double>(g.median_lag_ns), 3) +
                  " less per step than its peers (" +
                  format_percent_fixed(static_cast<double>(g.median_lag_ns) / static_cast<double>(g.step_ns), 1) +
                  " of the step): the others wait for it, costing the job about " +
                  format_percent_fixed(g.cost_share, 1) + " of its step time";
      c.explanation = "The clocks could not be aligned finely enough to order arrivals (" + report.note +
                      "); the rank that waits least in the blocking wait after the collective is the one the others "
                      "wait for. No per-step arrival order is claimed.";
    }
    c.root_cause =
        "A straggling rank: its work before each collective takes longer, so every other rank blocks at the "
        "collective until it arrives";
    c.recommendations = {"Look at that rank's own chains (cpu_contention, blocking, block_io) in the same window",
                         "Check its GPU (clocks, thermal throttling), its interconnect and its input pipeline"};
    c.values = {{"last_share", g.last_share},
                {"median_lag_ms", static_cast<double>(g.median_lag_ns) / 1e6},
                {"cost_share", g.cost_share},
                {"step_ms", static_cast<double>(g.step_ns) / 1e6},
                {"collectives", static_cast<double>(g.collectives)}};
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace ingero
