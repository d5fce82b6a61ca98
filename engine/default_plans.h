// The default analyses, built by hand as plans. The rule DSL's default pack (rules/*.rules)
// reproduces these chain families; benchmarks compare the two.
//
// Chain families (category -> what must line up in time with the slow calls):
//   cpu_contention   tail calls of a CUDA/driver op overlap off-CPU time of the SAME thread,
//                    mostly preempted-while-runnable (or state unknown, as in Ingero traces)
//   blocking         same join, but the thread was blocked (sleeping / disk wait)
//   block_io         tail calls overlap block I/O requests (host-wide)
//   network          tail calls within reach of TCP retransmits (host-wide)
//   socket_io        tail calls overlap socket send/recv of the same process
//   memory_pressure  page allocations (bytes) during the tail calls (host-wide)
//   allocator        cudaMalloc/cuMemAlloc p99/p50 rising over 3 consecutive windows
//   throughput_drop  an op's call rate falls below 0.6x its recent peak
//   straggler        one rank's pre-collective time is an outlier among its peers
//   unexplained_tail a heavy tail (p99/p50 >= 3) that no host signal covers
#pragma once

#include "model/plan.h"

namespace ingero {

struct DefaultPlanOptions {
  uint64_t window_ns = 10'000'000'000ull;  // tumbling window for tail analyses
  uint64_t min_calls = 10;                 // calls per window before a tail is judged
  double min_tail_ratio = 3.0;             // p99 / p50
  double min_share = 0.5;                  // share of tail time a cause must cover
};

Plan default_plan(const DefaultPlanOptions& opts = {});

}  // namespace ingero
