#include "tests/sinks/fleet/fleet_synth.h"

#include <algorithm>
#include <random>

#include "model/ops.h"
#include "model/trace.h"
#include "sinks/store/sqlite_store.h"

namespace ingero::test {

std::vector<Event> fleet_node_events(const FleetSpec& spec, int rank) {
  constexpr uint64_t kBase = 1'760'000'000'000'000'000ULL;
  std::mt19937_64 rng(spec.seed);
  std::mt19937_64 step_rng(spec.seed ^ 0x5bd1e995ULL);  // step lengths: the same on every rank
  std::uniform_int_distribution<uint64_t> jitter(0, spec.compute_jitter_ns), wake(5'000, 30'000);
  const auto pj = static_cast<int64_t>(spec.period_jitter_ns);
  std::uniform_int_distribution<int64_t> step_len(-pj, pj);
  const int64_t off = rank < static_cast<int>(spec.clock_offset_ns.size()) ? spec.clock_offset_ns[rank] : 0;
  const int first = rank < static_cast<int>(spec.first_step.size()) ? spec.first_step[rank] : 0;
  std::vector<Event> out;
  uint64_t id = 1;
  auto add = [&](Source s, uint8_t o, uint64_t ts, uint64_t dur, uint64_t arg1 = 0) {
    Event e;
    e.ts_ns = static_cast<uint64_t>(static_cast<int64_t>(ts) + off);
    e.dur_ns = dur;
    e.id = id++;
    e.pid = e.tid = 1000 + static_cast<uint32_t>(rank);
    e.rank = static_cast<int16_t>(rank);
    e.source = s;
    e.op = o;
    e.arg1 = arg1;
    out.push_back(e);
  };
  if (spec.job_start_events && first == 0) {
    add(Source::kHost, op::kProcessExec, kBase - 2'000'000'000ULL, 0);
    add(Source::kNccl, op::kNcclCommInitRank, kBase - 1'000'000'000ULL, 300'000'000);
  }
  uint64_t next_t0 = kBase;
  for (int k = 0; k < spec.steps; ++k) {
    const uint64_t t0 = next_t0;
    next_t0 += static_cast<uint64_t>(static_cast<int64_t>(spec.period_ns) + (pj > 0 ? step_len(step_rng) : 0));
    // Every rank draws the same random numbers in the same order, so all ranks know all enqueue
    // times (the collective's completion) and each takes its own.
    std::vector<uint64_t> enq(spec.ranks), wk(spec.ranks);
    for (int r = 0; r < spec.ranks; ++r) {
      enq[r] = t0 + spec.compute_ns + jitter(rng) +
               (r == spec.slow_rank && k >= spec.slow_from_step ? spec.slow_extra_ns : 0);
      wk[r] = wake(rng);
    }
    const uint64_t done = *std::max_element(enq.begin(), enq.end()) + spec.transfer_ns;
    if (spec.back_to_back) next_t0 = done + *std::max_element(wk.begin(), wk.end());
    if (k < first) continue;
    const uint64_t my_enq = enq[rank];
    if (spec.launch_gap_ns)
      for (uint64_t t = t0; t + 12'000 < my_enq; t += spec.launch_gap_ns)
        add(Source::kCuda, op::kCudaLaunchKernel, t, 8'000 + (t / 500'000) % 5 * 1'000);
    if (!spec.collectives) continue;
    add(Source::kNccl, op::kNcclAllReduce, my_enq, 15'000, 0xC0000 + static_cast<uint64_t>(rank));
    const uint64_t wait_start = my_enq + 20'000;
    add(Source::kCuda, op::kCudaStreamSync, wait_start, done + wk[rank] - wait_start);
  }
  std::stable_sort(out.begin(), out.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return out;
}

std::string write_fleet_node(const FleetSpec& spec, int rank, const std::string& node, const std::string& path) {
  std::string error;
  auto sink = SqliteSink::create(path, error);
  if (!sink) return error;
  TraceMeta meta;
  meta.nodes = {node};
  meta.process_names[1000 + static_cast<uint32_t>(rank)] = "python3 train.py";
  const auto events = fleet_node_events(spec, rank);
  if (!sink->write_meta(meta) || !sink->write_events(events)) return sink->error();
  if (!sink->close(error)) return error;
  return "";
}

}  // namespace ingero::test
