// Training/inference steps of one process, inferred from its GPU calls with no instrumentation
// (operators/step_inference.h says how), or taken from the step markers the program sent
// (StepMarker below). Kept in the model so the JSON, the reports and, later, the engine and the
// rules can read them without knowing the operator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ingero {

struct ProcessSteps {
  uint32_t pid = 0;
  int16_t rank = -1;   // Event::rank of the events this entry is about (-1 = unknown)
  uint16_t node = 0;   // index into TraceMeta::nodes
  uint64_t count = 0;  // steps seen over the whole trace (0 when method is "none")
  // The step length: the mean of the regular step intervals (those within 3 MADs of the median);
  // 0 when method is "none". p50/p99: nearest-rank percentiles of the step times between
  // consecutive boundaries (slow steps included: they are what a stall looks like).
  uint64_t period_ns = 0, p50_ns = 0, p99_ns = 0;
  // What recognised the steps: "<op> x<k>" (k markers of that op per step, e.g.
  // "cudaStreamSynchronize x1"), "<op> x<k> (call starts)" when the calls' starts were regular and
  // their ends were not, "launch bursts x<k> (gap >= 1.0 ms)", or "none".
  std::string method;
  std::string reason;     // method "none": why there is no period; otherwise ""
  double confidence = 0;  // 0..1; 0 for "none"
  // Unix ns. With a period: the step boundaries (marker times at the chosen phase) of the last
  // markers kept (operators/step_inference.h: at most kMaxMarkers per series), in time order.
  // With "none": the fallback grid, every `fallback_interval_ns` from the process's first GPU call
  // (at most the last kMaxMarkers points).
  std::vector<uint64_t> boundaries;
  uint64_t fallback_interval_ns = 0;   // "none" only: the fixed interval the grid above uses
  uint64_t first_ns = 0, last_ns = 0;  // the process's first GPU call start and last call end
  // Method "annotated (step)" only: the distinct epochs the markers named (0 when they named none).
  uint64_t epochs = 0;
};

// An explicit step boundary the program itself reported (`trace --annotate`: Ingero's annotation
// protocol, model/annotation.h; stored in ip_annotations and read back on replay). A process with
// markers gets its steps from them instead of inferring them (operators/step_inference.h).
struct StepMarker {
  uint64_t ts_ns = 0;                        // unix ns (CLOCK_REALTIME): when the program said it
  uint32_t pid = 0;                          // the process the marker is about
  uint32_t tid = 0;                          // its thread, when the program said (0 = not said)
  uint16_t node = 0;                         // index into TraceMeta::nodes
  bool has_step = false, has_epoch = false;  // which labels the annotation carried
  int64_t step = -1;                         // the "step" label as a number; -1 when absent or not a decimal integer
  int64_t epoch = -1;                        // the "epoch" label likewise
};

}  // namespace ingero
