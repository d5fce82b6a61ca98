// An operator that sees every event of a run, in the order the source delivers it (batches sorted
// by ts_ns), and adds what it found to the result at the end. Observers run on the source's thread.
#pragma once
#include "model/event.h"
#include "model/result.h"
#include <cstddef>
namespace ingero {
class EventObserver {
 public:
  virtual ~EventObserver() = default;
  virtual void observe(const Event* events, size_t n) = 0;
  // After the last batch: `meta` is the source's final metadata (names, stacks).
  virtual void finish(const TraceMeta& meta, AnalysisResult& result) = 0;
};
}  // namespace ingero
