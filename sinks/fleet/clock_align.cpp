#include "sinks/fleet/clock_align.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "model/format.h"
#include "model/ops.h"

namespace ingero {
namespace {

int64_t mad_of(const std::vector<int64_t>& v, int64_t med) {
  std::vector<int64_t> dev;
  dev.reserve(v.size());
  for (int64_t x : v) dev.push_back(x > med ? x - med : med - x);
  return median_of(std::move(dev));
}

}  // namespace

void SyncPointCollector::add(const Event& e) {
  if (e.source == Source::kHost && e.op == op::kProcessExec) {
    auto& st = starts_[e.pid];
    st.exec_ns = std::min<uint64_t>(st.exec_ns, e.ts_ns);
    return;
  }
  if (e.source == Source::kNccl && e.op == op::kNcclCommInitRank) {
    auto& inits = starts_[e.pid].inits;
    if (e.ret == 0 && inits.size() < 256) inits.push_back(e.ts_ns);
    return;
  }
  if (is_collective_call(e)) {
    ++collectives_;
    const CommKey key{e.pid, e.arg1};
    first_collective_.emplace(key, e.ts_ns);
    auto& st = threads_[e.tid];
    st.pending = true;
    st.ordinal = next_ordinal_[key]++;
    st.op = e.op;
    st.entry_ns = e.ts_ns;
    // Remember which communicator the pending collective belongs to through the points map key.
    pending_comm_[e.tid] = e.arg1;
    return;
  }
  if (!is_blocking_wait(e)) return;
  auto it = threads_.find(e.tid);
  if (it == threads_.end() || !it->second.pending) return;
  it->second.pending = false;            // only the FIRST wait after a collective is its sync point
  if (e.dur_ns < min_block_ns_) return;  // did not really block: the GPU was already done
  const CommKey key{e.pid, pending_comm_[e.tid]};
  points_[key].push_back({it->second.ordinal, e.end_ns(), it->second.op, it->second.entry_ns});
}

std::vector<SyncPoint> SyncPointCollector::points() const {
  // Per pid, the communicator with the most sync points stands for the process.
  std::map<uint32_t, const std::vector<SyncPoint>*> best;
  for (const auto& [key, pts] : points_) {
    auto& b = best[key.pid];
    if (!b || pts.size() > b->size()) b = &pts;
  }
  std::map<uint64_t, std::vector<int64_t>> by_ordinal, entries;
  std::map<uint64_t, uint8_t> op_of;
  for (const auto& [pid, pts] : best)
    for (const auto& p : *pts) {
      by_ordinal[p.ordinal].push_back(static_cast<int64_t>(p.exit_ns));
      entries[p.ordinal].push_back(static_cast<int64_t>(p.entry_ns));
      op_of[p.ordinal] = p.op;
    }
  std::vector<SyncPoint> out;
  out.reserve(by_ordinal.size());
  for (auto& [ord, exits] : by_ordinal)
    out.push_back({ord, static_cast<uint64_t>(median_of(std::move(exits))), op_of[ord],
                   static_cast<uint64_t>(median_of(std::move(entries[ord])))});
  return out;
}

bool SyncPointCollector::covers_start() const {
  std::map<uint32_t, std::pair<CommKey, size_t>> best;  // pid -> busiest communicator (as points())
  for (const auto& [key, pts] : points_) {
    auto it = best.find(key.pid);
    if (it == best.end() || pts.size() > it->second.second) best.insert_or_assign(key.pid, std::pair{key, pts.size()});
  }
  if (best.empty()) return false;
  for (const auto& [pid, kb] : best) {
    const auto first = first_collective_.find(kb.first);
    if (first == first_collective_.end()) return false;
    const uint64_t t_first = first->second;
    const auto st = starts_.find(pid);
    if (st == starts_.end()) return false;
    if (st->second.exec_ns < t_first) continue;  // the process started inside the capture
    // Communicators in use by then, each needs its own init seen before it.
    size_t comms = 0;
    for (const auto& [key, t] : first_collective_)
      if (key.pid == pid && t <= t_first) ++comms;
    size_t inits = 0;
    for (uint64_t t : st->second.inits)
      if (t < t_first) ++inits;
    if (inits < comms) return false;
  }
  return true;
}

namespace {

struct Candidate {
  int64_t shift = 0, median = 0, mad = 0;
  uint64_t pairs = 0;
};

int64_t spread_of(int64_t mad) {
  return std::max<int64_t>(static_cast<int64_t>(std::llround(1.4826 * static_cast<double>(mad))), 1'000);
}

// Ordinal -> index lookup into a node's points: dense when the ordinals are, else hashed.
class OrdinalIndex {
 public:
  explicit OrdinalIndex(const std::vector<SyncPoint>& pts) {
    lo_ = UINT64_MAX;
    hi_ = 0;
    for (const auto& p : pts) {
      lo_ = std::min(lo_, p.ordinal);
      hi_ = std::max(hi_, p.ordinal);
    }
    if (pts.empty()) return;
    if (hi_ - lo_ <= 8 * pts.size() + 1024) {
      dense_.assign(hi_ - lo_ + 1, -1);
      for (size_t i = 0; i < pts.size(); ++i) dense_[pts[i].ordinal - lo_] = static_cast<int64_t>(i);
    } else {
      for (size_t i = 0; i < pts.size(); ++i) sparse_.emplace(pts[i].ordinal, i);
    }
  }
  int64_t find(int64_t k) const {
    if (k < static_cast<int64_t>(lo_) || k > static_cast<int64_t>(hi_)) return -1;
    if (!dense_.empty()) return dense_[static_cast<uint64_t>(k) - lo_];
    auto it = sparse_.find(static_cast<uint64_t>(k));
    return it == sparse_.end() ? -1 : static_cast<int64_t>(it->second);
  }
  uint64_t lo() const { return lo_; }
  uint64_t hi() const { return hi_; }

 private:
  uint64_t lo_ = 0, hi_ = 0;
  std::vector<int64_t> dense_;
  std::unordered_map<uint64_t, size_t> sparse_;
};

// Differences (node exit - reference exit) at one shift over reference points [a, b), every
// `stride`-th. Returns false when the ops disagree too often (not the same collectives).
bool diffs_at(const std::vector<SyncPoint>& ref, size_t a, size_t b, size_t stride, const std::vector<SyncPoint>& node,
              const OrdinalIndex& idx, int64_t shift, std::vector<int64_t>& diffs) {
  diffs.clear();
  uint64_t mismatched = 0;
  for (size_t i = a; i < b; i += stride) {
    const int64_t j = idx.find(static_cast<int64_t>(ref[i].ordinal) + shift);
    if (j < 0) continue;
    const SyncPoint& q = node[static_cast<size_t>(j)];
    if (q.op != ref[i].op) {
      ++mismatched;
      continue;
    }
    diffs.push_back(static_cast<int64_t>(q.exit_ns) - static_cast<int64_t>(ref[i].exit_ns));
  }
  return mismatched * 10 <= diffs.size();
}

}  // namespace

OffsetEstimate estimate_offset(const std::vector<SyncPoint>& reference, const std::vector<SyncPoint>& node,
                               int64_t prior_ns) {
  AlignHints h;
  h.prior_ns = prior_ns;
  return estimate_offset(reference, node, h);
}

OffsetEstimate estimate_offset(const std::vector<SyncPoint>& reference_in, const std::vector<SyncPoint>& node,
                               const AlignHints& hints) {
  OffsetEstimate out;
  const uint64_t min_pairs = std::max<uint64_t>(hints.min_pairs, 1);
  if (reference_in.empty() || node.empty()) {
    out.why = "no blocking waits after collectives on one side";
    return out;
  }
  std::vector<SyncPoint> ref = reference_in;
  std::sort(ref.begin(), ref.end(), [](const SyncPoint& a, const SyncPoint& b) { return a.ordinal < b.ordinal; });
  const OrdinalIndex idx(node);

  // The reference's step: median exit-to-exit time per collective between consecutive points.
  {
    std::vector<int64_t> steps;
    for (size_t i = 1; i < ref.size(); ++i) {
      const uint64_t dk = ref[i].ordinal - ref[i - 1].ordinal;
      if (dk == 0) continue;
      steps.push_back((static_cast<int64_t>(ref[i].exit_ns) - static_cast<int64_t>(ref[i - 1].exit_ns)) /
                      static_cast<int64_t>(dk));
    }
    out.period_ns = std::max<int64_t>(median_of(std::move(steps)), 0);
  }

  // ---- Every shift at which the two sequences overlap by >= min_pairs collectives. At most
  // kMaxPairs evenly spread pairs per shift while scanning (the picked one is redone with all).
  constexpr size_t kMaxPairs = 96;
  const int64_t s_lo = std::max(static_cast<int64_t>(idx.lo()) - static_cast<int64_t>(ref.back().ordinal),
                                -hints.max_shift);
  const int64_t s_hi = std::min(static_cast<int64_t>(idx.hi()) - static_cast<int64_t>(ref.front().ordinal),
                                hints.max_shift);
  std::vector<Candidate> cands;
  std::vector<int64_t> diffs;
  auto range_of = [&](int64_t s) {  // reference indices whose ordinal + s is within the node's
    const auto lo_ord = static_cast<uint64_t>(std::max<int64_t>(0, static_cast<int64_t>(idx.lo()) - s));
    const int64_t hi_s = static_cast<int64_t>(idx.hi()) - s;
    const auto cmp = [](const SyncPoint& p, uint64_t k) { return p.ordinal < k; };
    const size_t a = static_cast<size_t>(std::lower_bound(ref.begin(), ref.end(), lo_ord, cmp) - ref.begin());
    size_t b = a;
    if (hi_s >= 0)
      b = static_cast<size_t>(std::lower_bound(ref.begin(), ref.end(), static_cast<uint64_t>(hi_s) + 1, cmp) -
                              ref.begin());
    return std::pair<size_t, size_t>{a, std::max(a, b)};
  };
  for (int64_t s = s_lo; s <= s_hi; ++s) {
    const auto [a, b] = range_of(s);
    if (b - a < min_pairs) continue;
    const size_t stride = std::max<size_t>(1, (b - a) / kMaxPairs);
    if (!diffs_at(ref, a, b, stride, node, idx, s, diffs) || diffs.size() < min_pairs) continue;
    Candidate c;
    c.shift = s;
    c.median = median_of(diffs);
    c.mad = mad_of(diffs, c.median);
    c.pairs = diffs.size();
    cands.push_back(c);
  }
  if (cands.empty()) {
    out.why = "fewer than " + std::to_string(min_pairs) + " matched collectives with a blocking wait on both nodes";
    return out;
  }

  // ---- Which shifts fit. Only shifts with enough pairs can show that they do NOT fit.
  uint64_t max_pairs = 0;
  for (const auto& c : cands) max_pairs = std::max(max_pairs, c.pairs);
  const uint64_t n_floor = std::max<uint64_t>(min_pairs, std::min<uint64_t>(16, max_pairs));
  const Candidate* best = nullptr;
  for (const auto& c : cands)
    if (c.pairs >= n_floor && (!best || c.mad < best->mad)) best = &c;
  const int64_t best_mad = best->mad;
  auto fits = [&](const Candidate& c) {
    const int64_t factor = std::min(c.pairs, best->pairs) >= 16 ? 3 : 6;
    return c.mad <= factor * best_mad + 5'000;
  };
  std::vector<const Candidate*> fitting, fitting_checked;
  size_t checked = 0;
  for (const auto& c : cands) {
    if (c.pairs >= n_floor) ++checked;
    if (!fits(c)) continue;
    fitting.push_back(&c);
    if (c.pairs >= n_floor) fitting_checked.push_back(&c);
  }
  out.fitting = fitting.size();

  auto finalize = [&](const Candidate& c, const char* method) {
    const auto [a, b] = range_of(c.shift);
    diffs_at(ref, a, b, 1, node, idx, c.shift, diffs);
    out.ok = true;
    out.method = method;
    out.ordinal_shift = c.shift;
    out.pairs = diffs.size();
    out.offset_ns = diffs.empty() ? c.median : median_of(diffs);
    out.uncertainty_ns = spread_of(diffs.empty() ? c.mad : mad_of(diffs, out.offset_ns));
  };
  const bool bounded = hints.prior_bound_ns >= 0;
  auto in_window = [&](const Candidate& c) {
    return std::llabs(c.median - hints.prior_ns) <= hints.prior_bound_ns + spread_of(c.mad);
  };

  // 1. Per-communicator order, when both captures count from the communicators' start.
  if (hints.start_aligned) {
    const Candidate* zero = nullptr;
    for (const auto* c : fitting)
      if (c->shift == 0) zero = c;
    if (zero) {
      finalize(*zero, "collective_order");
      out.note = "ordinal k is the same collective on both nodes (both captures cover the communicator's start)";
      if (bounded && !in_window(*zero))
        out.note += "; the clock anchors disagree (" + format_ms_fixed(static_cast<double>(hints.prior_ns), 3) +
                    " +- " + format_ms_fixed(static_cast<double>(hints.prior_bound_ns), 3) + ")";
      return out;
    }
    out.note =
        "both captures cover the communicator's start, but ordinal 0 against 0 does not fit "
        "(collectives lost?): not used; ";
  }
  // 2. The data alone: one shift fits and at least one other, with enough pairs, does not.
  if (fitting_checked.size() == 1 && checked >= 2) {
    finalize(*fitting_checked[0], "collectives");
    out.note += "the only ordinal shift that fits (" + std::to_string(checked - 1) +
                " others ruled out by step jitter)";
    if (bounded && !in_window(*fitting_checked[0]))
      out.note += "; the clock anchors disagree (" + format_ms_fixed(static_cast<double>(hints.prior_ns), 3) + " +- " +
                  format_ms_fixed(static_cast<double>(hints.prior_bound_ns), 3) + ")";
    return out;
  }
  // 3. The wall-clock anchors pick among the fitting shifts.
  std::vector<const Candidate*> window;
  if (bounded) {
    for (const auto* c : fitting)
      if (in_window(*c)) window.push_back(c);
    if (window.size() == 1) {
      finalize(*window[0], "collectives_anchors");
      out.note += std::to_string(fitting.size()) + " ordinal shifts fit the collectives; the clock anchors (" +
                  format_ms_fixed(static_cast<double>(hints.prior_ns), 3) + " +- " +
                  format_ms_fixed(static_cast<double>(hints.prior_bound_ns), 3) + ") allow only this one";
      return out;
    }
    if (window.empty()) {
      out.note += "no fitting shift lies within the clock anchors' bound (" +
                  format_ms_fixed(static_cast<double>(hints.prior_ns), 3) + " +- " +
                  format_ms_fixed(static_cast<double>(hints.prior_bound_ns), 3) + "): anchors not trusted; ";
      window = fitting;
    }
  } else {
    window = fitting;
  }
  // 4. Nothing decides: report the fitting shift closest to the prior, uncertain by all of them.
  const Candidate* pick = window.front();
  for (const auto* c : window)
    if (std::llabs(c->median - hints.prior_ns) < std::llabs(pick->median - hints.prior_ns)) pick = c;
  finalize(*pick, "ambiguous");
  out.ambiguous = true;
  int64_t u = out.period_ns + out.uncertainty_ns;
  for (const auto* c : window) u = std::max<int64_t>(u, std::llabs(c->median - out.offset_ns) + spread_of(c->mad));
  out.uncertainty_ns = u;
  out.note += std::to_string(window.size()) + " ordinal shifts (step " +
              format_ms_fixed(static_cast<double>(out.period_ns), 3) +
              ") fit the collectives equally well and nothing tells them apart: the offset closest to " +
              (bounded ? "the clock anchors" : "zero") + " is kept, uncertain by +- " +
              format_ms_fixed(static_cast<double>(u), 3);
  return out;
}

std::vector<ArrivalCount> count_last_arrivals(const std::vector<ArrivalNode>& nodes) {
  std::vector<ArrivalCount> out(nodes.size());
  // Reference ordinal -> (node index, corrected entry).
  std::map<int64_t, std::vector<std::pair<size_t, int64_t>>> by_ordinal;
  size_t matched = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    out[i].node = nodes[i].node;
    if (!nodes[i].matched) continue;
    ++matched;
    for (const auto& p : nodes[i].points)
      by_ordinal[static_cast<int64_t>(p.ordinal) - nodes[i].ordinal_shift].push_back(
          {i, static_cast<int64_t>(p.entry_ns)});
  }
  for (auto& [ord, arrivals] : by_ordinal) {
    // Only a collective every matched node has: "last" among some of the ranks says nothing about
    // one whose capture had not started yet (or whose wait did not block).
    if (arrivals.size() < 2 || arrivals.size() < matched) continue;
    std::sort(arrivals.begin(), arrivals.end(),
              [](const auto& a, const auto& b) { return a.second > b.second; });  // latest first
    for (const auto& a : arrivals) ++out[a.first].compared;
    const auto& [last, t_last] = arrivals[0];
    const int64_t lead = t_last - arrivals[1].second;
    const int64_t u_last = nodes[last].uncertainty_ns;
    // Two clocks may be off by their uncertainties in opposite directions: `last` is last only if
    // it leads EVERY other node by more than the two uncertainties added.
    bool resolved = u_last >= 0;
    for (size_t k = 1; k < arrivals.size() && resolved; ++k) {
      const int64_t u = nodes[arrivals[k].first].uncertainty_ns;
      resolved = u >= 0 && t_last - arrivals[k].second > u_last + u;
    }
    if (resolved) {
      ++out[last].last;
      out[last].max_lead_ns = std::max(out[last].max_lead_ns, lead);
    } else {
      ++out[last].last_unresolved;
    }
  }
  return out;
}

}  // namespace ingero
