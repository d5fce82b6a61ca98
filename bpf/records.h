// Conversion of BPF ring-buffer records (struct ip_record) into engine Events, and the reorder
// buffer that turns per-CPU, return-ordered arrivals into timestamp-ordered batches.
//
// RecordConverter contract:
// - ts_ns = record ts (CLOCK_MONOTONIC) + the realtime-monotonic offset taken at start: unix ns
//   of the START of the interval. Off-CPU spans: ts = switch-out, dur = time off CPU,
//   prev_state = OffCpuState, arg1 = the task that ran instead.
// - Driver copies get arg1 = the cudaMemcpyKind of their direction (1 = HtoD, 2 = DtoH); NCCL
//   collectives get arg0 = bytes (count x datatype size) and arg1 = communicator, and every event
//   of a process carries the rank of its ncclCommInitRank once one was seen.
// - A record with an unknown source/op is refused (returns false) with a reason to count.
//
// ReorderBuffer contract:
// - push() any order; release(wm) appends every held event with ts_ns < wm in ts order.
// - An event pushed with ts_ns below a watermark already released is late: it is refused
//   (push returns false) so the batches never break the watermark promise, and so a replay of
//   what was written gives what the live run saw.
#pragma once

#include <cstdint>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "bpf/ingero_bpf.h"
#include "model/event.h"

namespace ingero::bpf {

// Bytes per element of an ncclDataType_t (0 for an unknown type).
uint32_t nccl_type_size(uint64_t datatype);

class RecordConverter {
 public:
  explicit RecordConverter(int64_t realtime_offset_ns) : offset_(realtime_offset_ns) {}
  // Fills `out` (id left 0). Returns false and sets `reason` for a record it cannot name.
  bool convert(const ip_record& r, Event& out, std::string& reason);
  int64_t offset() const { return offset_; }
  uint64_t to_unix(uint64_t mono) const { return static_cast<uint64_t>(mono + offset_); }

 private:
  int64_t offset_;
  std::unordered_map<uint64_t, int16_t> comm_rank_;  // NCCL communicator -> rank
  std::unordered_map<uint32_t, int16_t> pid_rank_;
};

class ReorderBuffer {
 public:
  bool push(const Event& e);
  void release(uint64_t watermark, std::vector<Event>& out);
  size_t size() const { return heap_.size(); }
  uint64_t released_watermark() const { return released_; }

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const { return a.ts_ns > b.ts_ns; }
  };
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  uint64_t released_ = 0;
};

}  // namespace ingero::bpf
