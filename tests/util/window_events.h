// Events for window tests (tests/engine/window_feed_test.cpp, window_cache_test.cpp): a 10 s
// aligned start, time units, and an event of a source/op/pid (tid = pid + 1; HOST events are
// preempted off-CPU spans). And span_event(): a right-side span for IntervalJoin tests
// (interval_join_test, interval_join_storage_test, join_prune_test, join_share_test).
#pragma once

#include <cstdint>

#include "model/event.h"

namespace ingero::test {

constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;  // 10 s aligned
constexpr uint64_t kUs = 1000, kMs = 1000 * kUs, kWindow = 10'000 * kMs;

inline Event make(Source s, uint8_t o, uint32_t pid, uint64_t ts, uint64_t dur, uint64_t id) {
  Event e;
  e.source = s;
  e.op = o;
  e.pid = pid;
  e.tid = pid + 1;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.id = id;
  if (s == Source::kHost) e.prev_state = OffCpuState::kPreempted;
  return e;
}

inline Event span_event(uint64_t ts, uint64_t dur, uint64_t id, uint64_t arg0 = 0) {
  Event e;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.id = id;
  e.arg0 = arg0;
  return e;
}

}  // namespace ingero::test
