// Source and operation tables: numeric ids <-> names, with Ingero's ids kept as they are.
//
// Ingero's tables (shared/data/ingero/README.md) give CUDA 1-8, HOST 1-7, DRIVER 1-6, IO 1-3,
// TCP 1, NET 1-2. Ids above those are ours, for what Ingero does not record (driver syncs and
// copies by direction, cudaEventSynchronize, CUDA graph ops, NCCL collectives). A database we
// write carries these tables in `sources`/`ops`, so Ingero's readers still name every row.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "model/event.h"

namespace ingero {

namespace op {
// CUDA runtime (source 1): Ingero ids 1-8.
inline constexpr uint8_t kCudaMalloc = 1, kCudaFree = 2, kCudaLaunchKernel = 3, kCudaMemcpy = 4, kCudaStreamSync = 5,
                         kCudaDeviceSync = 6, kCudaMemcpyAsync = 7, kCudaMallocManaged = 8,
                         kCudaEventSync = 9;  // ours
// HOST (source 3): Ingero ids 1-7.
inline constexpr uint8_t kSchedSwitch = 1, kSchedWakeup = 2, kPageAlloc = 3, kOomKill = 4, kProcessExec = 5,
                         kProcessExit = 6, kProcessFork = 7,
                         kCpuSample = 8;  // ours: an on-CPU stack sample of a traced thread
// DRIVER (source 4): Ingero ids 1-6, ours from 7.
inline constexpr uint8_t kCuLaunchKernel = 1, kCuMemcpy = 2, kCuMemcpyAsync = 3, kCuCtxSynchronize = 4, kCuMemAlloc = 5,
                         kCuMemAllocManaged = 6, kCuStreamSynchronize = 7, kCuMemFree = 8, kCuMemcpyHtoD = 9,
                         kCuMemcpyDtoH = 10, kCuMemcpyHtoDAsync = 11, kCuMemcpyDtoHAsync = 12;
// IO (5), TCP (6), NET (7).
inline constexpr uint8_t kBlockRead = 1, kBlockWrite = 2, kBlockDiscard = 3;
inline constexpr uint8_t kTcpRetransmit = 1;
inline constexpr uint8_t kNetSend = 1, kNetRecv = 2;
// CUDA graph (8): ours.
inline constexpr uint8_t kGraphBeginCapture = 1, kGraphEndCapture = 2, kGraphInstantiate = 3, kGraphLaunch = 4;
// NCCL (9): ours.
inline constexpr uint8_t kNcclAllReduce = 1, kNcclAllGather = 2, kNcclReduceScatter = 3, kNcclBroadcast = 4,
                         kNcclSend = 5, kNcclRecv = 6, kNcclCommInitRank = 7;
}  // namespace op

// What kind of thing an op is; rules and reports group by it.
enum class OpKind : uint8_t {
  kCall,      // a timed API call on a thread (CUDA, driver, graph, NCCL)
  kOffCpu,    // an off-CPU span of a thread
  kInstant,   // a point event (wakeup, fork, exec, exit, OOM)
  kHostSpan,  // a host-wide timed span (block I/O request, socket I/O)
  kCounter,   // an amount (page allocation bytes, retransmit)
};

struct OpInfo {
  Source source;
  uint8_t op;
  std::string_view name;   // canonical name, Ingero's where it has one
  std::string_view alias;  // the API symbol when it differs (cudaStreamSynchronize), or ""
  OpKind kind;
  bool ingero;  // id exists in Ingero's tables
  std::string_view description;
};

struct SourceInfo {
  Source source;
  std::string_view name;  // CUDA, HOST, DRIVER, IO, TCP, NET, GRAPH, NCCL
  std::string_view description;
};

std::span<const OpInfo> all_ops();
std::span<const SourceInfo> all_sources();

const OpInfo* find_op(Source s, uint8_t op);
// By canonical name or alias, case-sensitive ("cudaLaunchKernel", "cudaStreamSynchronize").
const OpInfo* find_op(std::string_view name);
const SourceInfo* find_source(Source s);
// By name, case-insensitive ("cuda", "DRIVER").
std::optional<Source> find_source(std::string_view name);

// "cudaLaunchKernel", or "op(5:9)" for an id outside the table (never empty, never throws).
std::string op_name(Source s, uint8_t op);
std::string source_name(Source s);

inline bool is_gpu_api(Source s) {
  return s == Source::kCuda || s == Source::kDriver || s == Source::kGraph || s == Source::kNccl;
}

// An NCCL collective whose completion every rank waits for (the fleet's sync points: clock
// alignment, stragglers per step, the per-step waits on /metrics).
inline bool is_collective_call(const Event& e) {
  return e.source == Source::kNccl && (e.op == op::kNcclAllReduce || e.op == op::kNcclAllGather ||
                                       e.op == op::kNcclReduceScatter || e.op == op::kNcclBroadcast);
}

// A call that blocks the host until the GPU (and so the collective before it) is done: stream,
// device or event synchronisation, or a synchronous device-to-host copy.
inline bool is_blocking_wait(const Event& e) {
  if (e.source == Source::kCuda)
    return e.op == op::kCudaStreamSync || e.op == op::kCudaDeviceSync || e.op == op::kCudaEventSync ||
           (e.op == op::kCudaMemcpy && e.arg1 == 2 /* D2H */);
  if (e.source == Source::kDriver)
    return e.op == op::kCuStreamSynchronize || e.op == op::kCuCtxSynchronize || e.op == op::kCuMemcpyDtoH;
  return false;
}

}  // namespace ingero
