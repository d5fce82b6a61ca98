// Inference replicas judged at the step: a replica (a node's main GPU process) whose decode step
// is slower than its peers', with prefill-like steps judged apart, from the steps each process's
// step inference found (model/steps.h ProcessSteps). `explain` on a merged trace of several nodes
// adds a chain per slow replica (docs/fleet.md "Inference replicas at the step"). Pure, no I/O.
//
// Contract:
// - The replica of a node: its process with the most steps among those with a period (method not
//   "none"); nodes without one are not judged. Its step times: the intervals between consecutive
//   ProcessSteps::boundaries (the latest kept).
// - Decode and prefill apart: a step longer than prefill_factor x the replica's own median step is
//   prefill-like (a batch with new prompts, or a stall); the others are decode steps. Each kind is
//   compared only with the same kind on the other replicas, so a replica that takes more prompts
//   (more long steps) is not a slow replica, and one whose decode steps slowed is found however
//   its prefill mix looks.
// - A kind is judged over the replicas with >= min_steps steps of it, when there are at least
//   min_replicas of them. Per replica: the median of that kind's step times; peers: the median
//   and MAD of the other replicas' medians (the replica itself left out). Named when its median
//   is >= (1 + min_excess) x the peers' median AND its modified z (0.6745 (x - median) / MAD,
//   the MAD floored at mad_floor of the median so identical peers do not make any excess
//   infinite) is >= z. Severity high when the excess is >= high_excess, else medium.
// - Training ranks synchronised by collectives have equal step times: a straggling rank is not
//   a slow replica (the per-step straggler judgement covers it, sinks/fleet/stragglers.h).
// - Never throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/result.h"
#include "model/steps.h"

namespace ingero {

struct ReplicaStepOptions {
  uint64_t min_steps = 20;
  size_t min_replicas = 4;
  double prefill_factor = 1.5;
  double min_excess = 0.10;
  double z = 3.5;
  double mad_floor = 0.01;
  double high_excess = 0.5;
};

struct SlowReplica {
  std::string node;
  uint16_t node_index = 0;
  uint32_t pid = 0;
  std::string kind;             // "decode" or "prefill"
  uint64_t steps = 0;           // of that kind
  uint64_t median_ns = 0;       // its median step of that kind
  uint64_t peer_median_ns = 0;  // the other replicas' median of medians
  size_t peers = 0;
  double excess = 0;  // median / peer median - 1
  double z = 0;
  double prefill_share = 0;  // of its steps, prefill-like
  uint64_t first_ns = 0, last_ns = 0;
  Severity severity = Severity::kMedium;
};

// `node_names`: TraceMeta::nodes (ProcessSteps::node indexes into it).
std::vector<SlowReplica> slow_replicas(const std::vector<ProcessSteps>& steps,
                                       const std::vector<std::string>& node_names,
                                       const ReplicaStepOptions& options = {});

// One chain per slow replica: rule "fleet_replica_step", category "straggler".
std::vector<Chain> replica_step_chains(const std::vector<SlowReplica>& slow);

}  // namespace ingero
