// Synthetic per-node traces of a synchronous data-parallel training job, for the fleet tests.
//
// Contract: every rank runs `steps` steps of `period_ns`; in each it launches kernels for its
// compute time (base + jitter, + `slow_extra_ns` on the slowed rank), enqueues ncclAllReduce
// (returns in ~15 us) and blocks in cudaStreamSynchronize until the collective completes on ALL
// ranks at once: max over ranks of the enqueue time + a 2 ms transfer, plus a per-rank wake-up of
// 5-30 us. So the slowed rank waits least and the others wait for it. Node r's events carry its
// clock error `clock_offset_ns[r]` (observed ts = true ts + offset) and start at step
// `first_step[r]` (captures start at different moments). `collectives = false` leaves out NCCL
// and the waits (the anchor fallback). Deterministic for a seed.
// Step shape (defaults = the original workload): compute jitter uniform in [0, compute_jitter_ns]
// per rank, transfer `transfer_ns`, a kernel launch every `launch_gap_ns` (0 = none), and each
// step's length `period_ns` + uniform in [-period_jitter_ns, +period_jitter_ns] (0 = strictly
// periodic starts). `job_start_events`: a rank whose capture starts at step 0 also records its
// process_exec and a successful ncclCommInitRank before the first step (the capture covers the
// communicator's start).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/event.h"

namespace ingero::test {

struct FleetSpec {
  int ranks = 4;
  int steps = 120;
  uint64_t period_ns = 50'000'000;
  uint64_t compute_ns = 20'000'000;
  int slow_rank = -1;
  uint64_t slow_extra_ns = 10'000'000;
  int slow_from_step = 0;  // the slowed rank turns straggler at this step (an onset at a known moment)
  bool collectives = true;
  uint64_t compute_jitter_ns = 1'000'000;
  uint64_t transfer_ns = 2'000'000;
  uint64_t launch_gap_ns = 500'000;
  uint64_t period_jitter_ns = 0;
  bool job_start_events = false;
  // Back to back: the next step starts when this one's collective has completed on every rank
  // (the latest wake-up), not every period_ns; a late rank then lengthens the job's step, as in a
  // real synchronous job (period_ns and period_jitter_ns are not used).
  bool back_to_back = false;
  std::vector<int64_t> clock_offset_ns;  // by rank; missing = 0
  std::vector<int> first_step;           // by rank; missing = 0
  uint64_t seed = 7;
};

// Events of one rank (pid 1000 + rank, node index 0, Event::rank = rank), sorted by ts.
std::vector<Event> fleet_node_events(const FleetSpec& spec, int rank);

// Writes rank `rank` as a single-node SQLite store named `node` at `path`. Returns "" or an error.
std::string write_fleet_node(const FleetSpec& spec, int rank, const std::string& node, const std::string& path);

}  // namespace ingero::test
