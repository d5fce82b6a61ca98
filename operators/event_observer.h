// An operator that sees every event of a run, in the order the source delivers it (batches sorted
// by ts_ns), and adds what it found to the result at the end. Observers run on the source's thread.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "model/event.h"
#include "model/result.h"
#include "model/trace.h"
namespace ingero {
class EventObserver {
 public:
  virtual ~EventObserver() = default;
  virtual void observe(const Event* events, size_t n) = 0;
  // After the last batch: `meta` is the source's final metadata (names, stacks).
  virtual void finish(const TraceMeta& meta, AnalysisResult& result) = 0;
};

// A pass-through source that shows every batch to observers on the thread that pulls it, then
// finish() hands them the source's final metadata and the result.
//   ObservingSource obs(in, {&accounting});
//   AnalysisResult r = run_plan(plan, obs, opts);
//   obs.finish(r);
class ObservingSource final : public EventSource {
 public:
  ObservingSource(EventSource& in, std::vector<EventObserver*> observers) : in_(in), observers_(std::move(observers)) {}
  bool next(Batch& out) override {
    if (!in_.next(out)) return false;
    const std::vector<Event>& v = out.view();
    for (EventObserver* o : observers_) o->observe(v.data(), v.size());
    return true;
  }
  TraceMeta& meta() override { return in_.meta(); }
  PrefetchHint upcoming() override { return in_.upcoming(); }
  unsigned busy_threads() const override { return in_.busy_threads(); }
  void finish(AnalysisResult& r) {
    for (EventObserver* o : observers_) o->finish(in_.meta(), r);
  }

 private:
  EventSource& in_;
  std::vector<EventObserver*> observers_;
};

}  // namespace ingero
