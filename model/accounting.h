// Where a GPU-feeding thread's wall time went (operators/time_accounting.h computes it; the JSON is
// model/result_json.h accounting_json; docs/accounting.md explains the buckets).
//
// Contract: for every thread the parts add up to the wall time exactly, in integer ns:
//   wall_ns = sum(in_calls_ns) + on_cpu_ns + preempted_ns + sum(blocked_ns) + unknown_ns
// and sum(preempted_by[].ns) <= preempted_ns (only the top tasks are listed).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ingero {

// A task that ran while the thread was preempted, with the time it took.
struct PreemptedBy {
  uint32_t pid = 0;  // 0 when the trace never shows that task's process
  uint32_t tid = 0;
  std::string comm;  // thread name, else process name, else ""
  uint64_t ns = 0;
};

struct ThreadAccounting {
  uint32_t pid = 0, tid = 0;
  std::string comm;  // thread name (comm) when known, else the process name, else ""
  uint16_t node = 0;
  int16_t rank = -1;
  uint64_t start_ns = 0, end_ns = 0;  // the interval accounted: [first event start, last event end] clipped
  uint64_t wall_ns = 0;               // end_ns - start_ns
  // Inside GPU API calls, by the kind of the outermost call: every key of kCallKinds, zeros kept.
  std::map<std::string, uint64_t> in_calls_ns;
  uint64_t on_cpu_ns = 0;                      // outside calls, not off CPU (scheduler_data)
  uint64_t preempted_ns = 0;                   // off CPU while runnable
  std::vector<PreemptedBy> preempted_by;       // top 5 by ns, desc (then tid)
  std::map<std::string, uint64_t> blocked_ns;  // by reason: every key of kBlockReasons
  uint64_t unknown_ns = 0;                     // off CPU in an unknown state, or outside calls with no scheduler data
  // The process has sched_switch spans with a recorded state (a full scheduler capture): false
  // means everything outside calls and off-CPU spans is in unknown_ns (nothing says whether the
  // thread was on CPU; Ingero's traces keep no state and only a sample of switches).
  bool scheduler_data = false;

  uint64_t in_calls_total() const {
    uint64_t s = 0;
    for (const auto& [k, v] : in_calls_ns) s += v;
    return s;
  }
  uint64_t blocked_total() const {
    uint64_t s = 0;
    for (const auto& [k, v] : blocked_ns) s += v;
    return s;
  }
};

// Slices of a feeding thread's time (the rules' `from accounting` stream, made by
// operators/time_accounting.h): Event::op of a Source::kAccount event is one of these buckets.
namespace acct {
inline constexpr uint8_t kPreempted = 0, kLaunch = 1, kCopy = 2, kSync = 3, kAlloc = 4, kCollective = 5, kOtherCall = 6,
                         kOnCpu = 7, kLock = 8, kIo = 9, kNetwork = 10, kSleep = 11, kBlockedOther = 12, kUnknown = 13;
inline constexpr uint8_t kBuckets = 14;
inline const char* bucket_name(uint8_t b) {
  constexpr const char* kNames[kBuckets] = {"preempted",  "launch",     "copy",          "sync",   "alloc",
                                            "collective", "other_call", "on_cpu",        "lock",   "io",
                                            "network",    "sleep",      "blocked_other", "unknown"};
  return b < kBuckets ? kNames[b] : "?";
}
}  // namespace acct

// One feeding thread's time second by second (operators/time_accounting.h series(), from the
// per-second bins it keeps with AccountingOptions::chain_accounting): bins[i] is the unix second
// first_sec + i, ns per acct:: bucket (index = the bucket). A second adds up to at most 1 s; the
// seconds before the thread's first GPU call and stretches with no event of it are zeros.
struct AccountingSeries {
  uint32_t pid = 0, tid = 0;
  uint16_t node = 0;
  uint64_t first_sec = 0;
  std::vector<std::array<uint64_t, acct::kBuckets>> bins;
};

inline constexpr const char* kCallKinds[] = {"launch", "copy", "sync", "alloc", "collective", "other"};
inline constexpr const char* kBlockReasons[] = {"lock", "io", "network", "sleep", "other"};

}  // namespace ingero
