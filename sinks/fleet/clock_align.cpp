#include "sinks/fleet/clock_align.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "model/ops.h"

namespace ingero {
namespace {

bool is_collective(const Event& e) {
  return e.source == Source::kNccl && (e.op == op::kNcclAllReduce || e.op == op::kNcclAllGather ||
                                       e.op == op::kNcclReduceScatter || e.op == op::kNcclBroadcast);
}

bool is_blocking_wait(const Event& e) {
  if (e.source == Source::kCuda)
    return e.op == op::kCudaStreamSync || e.op == op::kCudaDeviceSync || e.op == op::kCudaEventSync ||
           (e.op == op::kCudaMemcpy && e.arg1 == 2 /* D2H */);
  if (e.source == Source::kDriver)
    return e.op == op::kCuStreamSynchronize || e.op == op::kCuCtxSynchronize || e.op == op::kCuMemcpyDtoH;
  return false;
}

int64_t mad_of(const std::vector<int64_t>& v, int64_t med) {
  std::vector<int64_t> dev;
  dev.reserve(v.size());
  for (int64_t x : v) dev.push_back(x > med ? x - med : med - x);
  return median_of(std::move(dev));
}

}  // namespace

int64_t median_of(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2) return v[mid];
  const int64_t hi = v[mid];
  const int64_t lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return lo + (hi - lo) / 2;
}

void SyncPointCollector::add(const Event& e) {
  if (is_collective(e)) {
    ++collectives_;
    const CommKey key{e.pid, e.arg1};
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

OffsetEstimate estimate_offset(const std::vector<SyncPoint>& reference, const std::vector<SyncPoint>& node,
                               int64_t prior_ns, int64_t max_shift, uint64_t min_pairs) {
  OffsetEstimate best;
  if (reference.empty() || node.empty()) {
    best.why = "no blocking waits after collectives on one side";
    return best;
  }
  std::unordered_map<uint64_t, const SyncPoint*> by_ord;
  by_ord.reserve(node.size() * 2);
  for (const auto& p : node) by_ord.emplace(p.ordinal, &p);

  struct Candidate {
    int64_t shift, median, mad;
    uint64_t pairs;
  };
  std::vector<Candidate> cands;
  std::vector<int64_t> diffs;
  for (int64_t s = -max_shift; s <= max_shift; ++s) {
    diffs.clear();
    uint64_t mismatched = 0;
    for (const auto& r : reference) {
      const int64_t k = static_cast<int64_t>(r.ordinal) + s;
      if (k < 0) continue;
      auto it = by_ord.find(static_cast<uint64_t>(k));
      if (it == by_ord.end()) continue;
      if (it->second->op != r.op) {
        ++mismatched;
        continue;
      }
      diffs.push_back(static_cast<int64_t>(it->second->exit_ns) - static_cast<int64_t>(r.exit_ns));
    }
    if (diffs.size() < min_pairs || mismatched * 10 > diffs.size()) continue;
    const int64_t med = median_of(diffs);
    cands.push_back({s, med, mad_of(diffs, med), diffs.size()});
  }
  if (cands.empty()) {
    best.why = "fewer than " + std::to_string(min_pairs) + " matched collectives with a blocking wait on both nodes";
    return best;
  }
  int64_t min_mad = std::numeric_limits<int64_t>::max();
  for (const auto& c : cands) min_mad = std::min(min_mad, c.mad);
  const Candidate* pick = nullptr;
  for (const auto& c : cands) {
    if (c.mad > 2 * min_mad + 2'000) continue;  // not among the tightest alignments
    if (!pick || std::llabs(c.median - prior_ns) < std::llabs(pick->median - prior_ns)) pick = &c;
  }
  best.ok = true;
  best.offset_ns = pick->median;
  best.uncertainty_ns = std::max<int64_t>(static_cast<int64_t>(std::llround(1.4826 * static_cast<double>(pick->mad))),
                                          1'000);
  best.ordinal_shift = pick->shift;
  best.pairs = pick->pairs;
  return best;
}

std::vector<ArrivalCount> count_last_arrivals(const std::vector<ArrivalNode>& nodes) {
  std::vector<ArrivalCount> out(nodes.size());
  // Reference ordinal -> (node index, corrected entry).
  std::map<int64_t, std::vector<std::pair<size_t, int64_t>>> by_ordinal;
  for (size_t i = 0; i < nodes.size(); ++i) {
    out[i].node = nodes[i].node;
    if (!nodes[i].matched) continue;
    for (const auto& p : nodes[i].points)
      by_ordinal[static_cast<int64_t>(p.ordinal) - nodes[i].ordinal_shift].push_back(
          {i, static_cast<int64_t>(p.entry_ns)});
  }
  for (auto& [ord, arrivals] : by_ordinal) {
    if (arrivals.size() < 2) continue;
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
