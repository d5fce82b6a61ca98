// Record -> Event conversion and the reorder buffer; see records.h.
#include "bpf/records.h"

#include <cstddef>

#include "model/ops.h"

namespace ingero::bpf {

// The two sides agree on ids and layout.
static_assert(IP_SRC_CUDA == static_cast<int>(Source::kCuda));
static_assert(IP_SRC_HOST == static_cast<int>(Source::kHost));
static_assert(IP_SRC_DRIVER == static_cast<int>(Source::kDriver));
static_assert(IP_SRC_IO == static_cast<int>(Source::kIo));
static_assert(IP_SRC_TCP == static_cast<int>(Source::kTcp));
static_assert(IP_SRC_NET == static_cast<int>(Source::kNet));
static_assert(IP_SRC_GRAPH == static_cast<int>(Source::kGraph));
static_assert(IP_SRC_NCCL == static_cast<int>(Source::kNccl));
static_assert(IP_STATE_PREEMPTED == static_cast<int>(OffCpuState::kPreempted));
static_assert(IP_STATE_SLEEPING == static_cast<int>(OffCpuState::kSleeping));
static_assert(IP_STATE_DISKWAIT == static_cast<int>(OffCpuState::kDiskWait));
static_assert(IP_STATE_OTHER == static_cast<int>(OffCpuState::kOther));
static_assert(sizeof(ip_record) == 64 && offsetof(ip_record, pid) == 48);
static_assert(offsetof(ip_stack_record, fp) == 128 && sizeof(ip_py_frame) == 16);  // no holes
static_assert(op::kNcclCommInitRank == 7);  // gpu.bpf.c reads *comm on this op's return

uint32_t nccl_type_size(uint64_t t) {
  // ncclInt8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16,
  // Float8e4m3, Float8e5m2
  static constexpr uint32_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return t < std::size(kSizes) ? kSizes[t] : 0;
}

bool RecordConverter::convert(const ip_record& r, Event& e, std::string& reason) {
  const auto src = static_cast<Source>(r.source);
  if (!find_op(src, r.op)) {
    reason = "unknown BPF record (source " + std::to_string(r.source) + ", op " + std::to_string(r.op) + ")";
    return false;
  }
  e = Event{};
  e.ts_ns = to_unix(r.ts);
  e.dur_ns = r.dur;
  e.arg0 = r.arg0;
  e.arg1 = r.arg1;
  e.cgroup_id = r.cgroup;
  e.pid = r.pid;
  e.tid = r.tid;
  e.ret = r.ret;
  e.source = src;
  e.op = r.op;
  switch (src) {
    case Source::kHost:
      if (r.op == op::kSchedSwitch) e.prev_state = static_cast<OffCpuState>(r.state);
      break;
    case Source::kDriver:
      if (r.op == op::kCuMemcpyHtoD || r.op == op::kCuMemcpyHtoDAsync) e.arg1 = 1;
      if (r.op == op::kCuMemcpyDtoH || r.op == op::kCuMemcpyDtoHAsync) e.arg1 = 2;
      break;
    case Source::kNccl:
      if (r.op == op::kNcclCommInitRank) {
        // arg0 = rank, arg1 = nranks, arg2 = the communicator handle (read at return).
        if (r.ret == 0) {
          const auto rank = static_cast<int16_t>(r.arg0);
          if (r.arg2) comm_rank_[r.arg2] = rank;
          pid_rank_[r.pid] = rank;
        }
        e.rank = static_cast<int16_t>(r.arg0);
      } else {
        e.arg0 = r.arg0 * nccl_type_size(r.arg1);
        e.arg1 = r.arg2;
        if (auto it = comm_rank_.find(r.arg2); it != comm_rank_.end()) e.rank = it->second;
      }
      break;
    default: break;
  }
  if (e.rank < 0 && !pid_rank_.empty())
    if (auto it = pid_rank_.find(e.pid); it != pid_rank_.end()) e.rank = it->second;
  return true;
}

bool ReorderBuffer::push(const Event& e) {
  if (e.ts_ns < released_) return false;
  heap_.push(e);
  return true;
}

void ReorderBuffer::release(uint64_t watermark, std::vector<Event>& out) {
  while (!heap_.empty() && heap_.top().ts_ns < watermark) {
    out.push_back(heap_.top());
    heap_.pop();
  }
  if (watermark > released_) released_ = watermark;
}

}  // namespace ingero::bpf
