#include "sinks/fleet/replica_steps.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "model/format.h"
#include "model/median.h"

namespace ingero {
namespace {

struct Replica {
  const ProcessSteps* steps = nullptr;
  std::vector<uint64_t> decode, prefill;
};

}  // namespace

std::vector<SlowReplica> slow_replicas(const std::vector<ProcessSteps>& all, const std::vector<std::string>& node_names,
                                       const ReplicaStepOptions& o) {
  // The replica of each node: its process with a period and the most steps.
  std::map<uint16_t, const ProcessSteps*> main_of;
  for (const ProcessSteps& s : all) {
    if (s.method == "none" || s.period_ns == 0 || s.boundaries.size() < 3) continue;
    const ProcessSteps*& m = main_of[s.node];
    if (!m || s.count > m->count) m = &s;
  }
  std::vector<Replica> reps;
  for (const auto& [node, s] : main_of) {
    Replica r;
    r.steps = s;
    std::vector<uint64_t> d;
    for (size_t k = 1; k < s->boundaries.size(); ++k)
      if (s->boundaries[k] > s->boundaries[k - 1]) d.push_back(s->boundaries[k] - s->boundaries[k - 1]);
    const double cut = o.prefill_factor * static_cast<double>(median_of(d));
    for (uint64_t x : d) (static_cast<double>(x) > cut ? r.prefill : r.decode).push_back(x);
    reps.push_back(std::move(r));
  }
  std::vector<SlowReplica> out;
  for (const bool prefill : {false, true}) {
    std::vector<const Replica*> judged;
    std::vector<double> medians;
    for (const Replica& r : reps) {
      const auto& v = prefill ? r.prefill : r.decode;
      if (v.size() < o.min_steps) continue;
      judged.push_back(&r);
      medians.push_back(static_cast<double>(median_of(v)));
    }
    if (judged.size() < o.min_replicas) continue;
    for (size_t i = 0; i < judged.size(); ++i) {
      std::vector<double> others;
      for (size_t j = 0; j < judged.size(); ++j)
        if (j != i) others.push_back(medians[j]);
      const double peer = median_of(others);
      if (!(peer > 0)) continue;
      std::vector<double> dev;
      dev.reserve(others.size());
      for (double x : others) dev.push_back(std::fabs(x - peer));
      const double mad = std::max(median_of(dev), o.mad_floor * peer);
      const double excess = medians[i] / peer - 1;
      const double z = 0.6745 * (medians[i] - peer) / mad;
      if (excess < o.min_excess || z < o.z) continue;
      const Replica& r = *judged[i];
      SlowReplica s;
      s.node_index = r.steps->node;
      s.node = r.steps->node < node_names.size() ? node_names[r.steps->node] : "node#" + std::to_string(r.steps->node);
      s.pid = r.steps->pid;
      s.kind = prefill ? "prefill" : "decode";
      s.steps = (prefill ? r.prefill : r.decode).size();
      s.median_ns = static_cast<uint64_t>(medians[i]);
      s.peer_median_ns = static_cast<uint64_t>(peer);
      s.peers = others.size();
      s.excess = excess;
      s.z = z;
      s.prefill_share = static_cast<double>(r.prefill.size()) /
                        static_cast<double>(std::max<size_t>(1, r.prefill.size() + r.decode.size()));
      s.first_ns = r.steps->boundaries.front();
      s.last_ns = r.steps->boundaries.back();
      s.severity = excess >= o.high_excess ? Severity::kHigh : Severity::kMedium;
      out.push_back(std::move(s));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const SlowReplica& a, const SlowReplica& b) { return a.excess > b.excess; });
  return out;
}

std::vector<Chain> replica_step_chains(const std::vector<SlowReplica>& slow) {
  std::vector<Chain> out;
  for (const SlowReplica& s : slow) {
    Chain c;
    c.rule = "fleet_replica_step";
    c.id = "fleet_replica_step:" + s.node + ":" + s.kind;
    c.category = "straggler";
    c.severity = s.severity;
    c.pid = s.pid;
    c.node = s.node_index;
    c.window_start = s.first_ns;
    c.window_end = s.last_ns;
    c.summary = "replica on node " + s.node + ": its " + s.kind + " step takes " +
                format_ms_fixed(static_cast<double>(s.median_ns), 2) + " (median of " + std::to_string(s.steps) +
                "), " + format_percent_fixed(s.excess, 0) + " longer than the median of " + std::to_string(s.peers) +
                " peer replicas (" + format_ms_fixed(static_cast<double>(s.peer_median_ns), 2) + ")";
    c.explanation =
        "Step times from each replica's own step inference (no markers needed); steps longer than 1.5x a "
        "replica's median are prefill-like and compared apart (" +
        format_percent_fixed(s.prefill_share, 0) + " of this replica's steps). Modified z against the peers: " +
        std::to_string(static_cast<int>(std::lround(s.z))) + ".";
    c.root_cause = "One replica does the same " + s.kind + " work more slowly than its peers: its host or GPU differs";
    c.recommendations = {
        "Look at that node's own chains (cpu_contention, blocking, input wait) over the same time",
        "Compare its GPU clocks, power and thermal state, its driver and its batch size with a peer's"};
    c.values = {{"median_step_ms", static_cast<double>(s.median_ns) / 1e6},
                {"peer_median_step_ms", static_cast<double>(s.peer_median_ns) / 1e6},
                {"excess", s.excess},
                {"z", s.z},
                {"steps", static_cast<double>(s.steps)},
                {"peers", static_cast<double>(s.peers)},
                {"prefill_share", s.prefill_share}};
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace ingero
