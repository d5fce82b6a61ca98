#include "model/ops.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace ingero {
namespace {

constexpr std::array kSources{
    SourceInfo{Source::kCuda, "CUDA", "CUDA runtime API (libcudart uprobes)"},
    SourceInfo{Source::kHost, "HOST", "Host kernel tracepoints (scheduler, memory, processes)"},
    SourceInfo{Source::kDriver, "DRIVER", "CUDA driver API (libcuda uprobes)"},
    SourceInfo{Source::kIo, "IO", "Block I/O requests"},
    SourceInfo{Source::kTcp, "TCP", "TCP retransmissions"},
    SourceInfo{Source::kNet, "NET", "Socket send/recv"},
    SourceInfo{Source::kGraph, "GRAPH", "CUDA graph API (libcudart uprobes)"},
    SourceInfo{Source::kNccl, "NCCL", "NCCL collectives (libnccl uprobes)"},
};

using S = Source;
using K = OpKind;
constexpr std::array kOps{
    OpInfo{S::kCuda, op::kCudaMalloc, "cudaMalloc", "", K::kCall, true, "Allocate device memory"},
    OpInfo{S::kCuda, op::kCudaFree, "cudaFree", "", K::kCall, true, "Free device memory"},
    OpInfo{S::kCuda, op::kCudaLaunchKernel, "cudaLaunchKernel", "", K::kCall, true, "Launch a kernel"},
    OpInfo{S::kCuda, op::kCudaMemcpy, "cudaMemcpy", "", K::kCall, true, "Synchronous copy"},
    OpInfo{S::kCuda, op::kCudaStreamSync, "cudaStreamSync", "cudaStreamSynchronize", K::kCall, true,
           "Wait for a stream"},
    OpInfo{S::kCuda, op::kCudaDeviceSync, "cudaDeviceSync", "cudaDeviceSynchronize", K::kCall, true,
           "Wait for the device"},
    OpInfo{S::kCuda, op::kCudaMemcpyAsync, "cudaMemcpyAsync", "", K::kCall, true, "Asynchronous copy"},
    OpInfo{S::kCuda, op::kCudaMallocManaged, "cudaMallocManaged", "", K::kCall, true, "Allocate managed memory"},
    OpInfo{S::kCuda, op::kCudaEventSync, "cudaEventSynchronize", "", K::kCall, false, "Wait for an event"},
    OpInfo{S::kHost, op::kSchedSwitch, "sched_switch", "", K::kOffCpu, true,
           "Thread off CPU (span from switch-out to switch-in)"},
    OpInfo{S::kHost, op::kSchedWakeup, "sched_wakeup", "", K::kInstant, true, "Thread woken"},
    OpInfo{S::kHost, op::kPageAlloc, "mm_page_alloc", "", K::kCounter, true, "Page allocation"},
    OpInfo{S::kHost, op::kOomKill, "oom_kill", "", K::kInstant, true, "OOM killer victim"},
    OpInfo{S::kHost, op::kProcessExec, "process_exec", "", K::kInstant, true, "Process exec"},
    OpInfo{S::kHost, op::kProcessExit, "process_exit", "", K::kInstant, true, "Process exit"},
    OpInfo{S::kHost, op::kProcessFork, "process_fork", "", K::kInstant, true, "Process fork"},
    OpInfo{S::kHost, op::kCpuSample, "cpu_sample", "", K::kInstant, false,
           "On-CPU stack sample of a traced thread (stack_id = the sampled stack)"},
    OpInfo{S::kDriver, op::kCuLaunchKernel, "cuLaunchKernel", "", K::kCall, true, "Launch a kernel"},
    OpInfo{S::kDriver, op::kCuMemcpy, "cuMemcpy", "", K::kCall, true, "Synchronous copy"},
    OpInfo{S::kDriver, op::kCuMemcpyAsync, "cuMemcpyAsync", "", K::kCall, true, "Asynchronous copy"},
    OpInfo{S::kDriver, op::kCuCtxSynchronize, "cuCtxSynchronize", "", K::kCall, true, "Wait for the context"},
    OpInfo{S::kDriver, op::kCuMemAlloc, "cuMemAlloc", "cuMemAlloc_v2", K::kCall, true, "Allocate device memory"},
    OpInfo{S::kDriver, op::kCuMemAllocManaged, "cuMemAllocManaged", "", K::kCall, true, "Allocate managed memory"},
    OpInfo{S::kDriver, op::kCuStreamSynchronize, "cuStreamSynchronize", "", K::kCall, false, "Wait for a stream"},
    OpInfo{S::kDriver, op::kCuMemFree, "cuMemFree", "cuMemFree_v2", K::kCall, false, "Free device memory"},
    OpInfo{S::kDriver, op::kCuMemcpyHtoD, "cuMemcpyHtoD", "cuMemcpyHtoD_v2", K::kCall, false, "Host to device copy"},
    OpInfo{S::kDriver, op::kCuMemcpyDtoH, "cuMemcpyDtoH", "cuMemcpyDtoH_v2", K::kCall, false, "Device to host copy"},
    OpInfo{S::kDriver, op::kCuMemcpyHtoDAsync, "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", K::kCall, false,
           "Asynchronous host to device copy"},
    OpInfo{S::kDriver, op::kCuMemcpyDtoHAsync, "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", K::kCall, false,
           "Asynchronous device to host copy"},
    OpInfo{S::kIo, op::kBlockRead, "block_read", "", K::kHostSpan, true, "Block read request"},
    OpInfo{S::kIo, op::kBlockWrite, "block_write", "", K::kHostSpan, true, "Block write request"},
    OpInfo{S::kIo, op::kBlockDiscard, "block_discard", "", K::kHostSpan, true, "Block discard"},
    OpInfo{S::kTcp, op::kTcpRetransmit, "tcp_retransmit", "", K::kCounter, true, "TCP retransmit"},
    OpInfo{S::kNet, op::kNetSend, "net_send", "", K::kHostSpan, true, "Socket send"},
    OpInfo{S::kNet, op::kNetRecv, "net_recv", "", K::kHostSpan, true, "Socket receive"},
    OpInfo{S::kGraph, op::kGraphBeginCapture, "cudaStreamBeginCapture", "", K::kCall, false, "Begin stream capture"},
    OpInfo{S::kGraph, op::kGraphEndCapture, "cudaStreamEndCapture", "", K::kCall, false, "End stream capture"},
    OpInfo{S::kGraph, op::kGraphInstantiate, "cudaGraphInstantiate", "", K::kCall, false, "Instantiate a graph"},
    OpInfo{S::kGraph, op::kGraphLaunch, "cudaGraphLaunch", "", K::kCall, false, "Launch a graph"},
    OpInfo{S::kNccl, op::kNcclAllReduce, "ncclAllReduce", "", K::kCall, false, "All-reduce"},
    OpInfo{S::kNccl, op::kNcclAllGather, "ncclAllGather", "", K::kCall, false, "All-gather"},
    OpInfo{S::kNccl, op::kNcclReduceScatter, "ncclReduceScatter", "", K::kCall, false, "Reduce-scatter"},
    OpInfo{S::kNccl, op::kNcclBroadcast, "ncclBroadcast", "ncclBcast", K::kCall, false, "Broadcast"},
    OpInfo{S::kNccl, op::kNcclSend, "ncclSend", "", K::kCall, false, "Point-to-point send"},
    OpInfo{S::kNccl, op::kNcclRecv, "ncclRecv", "", K::kCall, false, "Point-to-point receive"},
    OpInfo{S::kNccl, op::kNcclCommInitRank, "ncclCommInitRank", "", K::kCall, false,
           "Communicator init (arg0 rank, arg1 nranks)"},
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::span<const OpInfo> all_ops() { return kOps; }
std::span<const SourceInfo> all_sources() { return kSources; }

// Every replayed row asks (the trace reader refuses unknown ops): one table lookup by
// source << 8 | op instead of a scan of kOps. Entry: 1 + the op's index in kOps, 0 when unknown
// (the first of duplicates, as the scan found).
const OpInfo* find_op(Source s, uint8_t o) {
  static_assert(kOps.size() < 255);
  static const std::array<uint8_t, 65536> index = [] {
    std::array<uint8_t, 65536> t{};
    for (size_t i = kOps.size(); i-- > 0;)
      t[static_cast<size_t>(kOps[i].source) << 8 | kOps[i].op] = static_cast<uint8_t>(i + 1);
    return t;
  }();
  const uint8_t i = index[static_cast<size_t>(static_cast<uint8_t>(s)) << 8 | o];
  return i ? &kOps[i - 1] : nullptr;
}

const OpInfo* find_op(std::string_view name) {
  for (const auto& info : kOps)
    if (info.name == name || (!info.alias.empty() && info.alias == name)) return &info;
  return nullptr;
}

const SourceInfo* find_source(Source s) {
  for (const auto& info : kSources)
    if (info.source == s) return &info;
  return nullptr;
}

std::optional<Source> find_source(std::string_view name) {
  for (const auto& info : kSources)
    if (iequals(info.name, name)) return info.source;
  return std::nullopt;
}

std::string op_name(Source s, uint8_t o) {
  if (const auto* info = find_op(s, o)) return std::string(info->name);
  return "op(" + std::to_string(static_cast<int>(s)) + ":" + std::to_string(o) + ")";
}

std::string source_name(Source s) {
  if (const auto* info = find_source(s)) return std::string(info->name);
  return "source(" + std::to_string(static_cast<int>(s)) + ")";
}

}  // namespace ingero
