// The one event type shared by every source, operator and sink.
//
// Contract:
// - Fixed size (80 bytes), trivially copyable: BPF records, replay rows and LMDB chunks all decode
//   into it, and batches of it are what moves between flow-graph nodes.
// - `ts_ns` is ALWAYS the start of the interval the event covers, in unix nanoseconds, and
//   `dur_ns` its length. For a CUDA/driver call that is entry and entry-to-return. For an off-CPU
//   span (HOST sched_switch) it is the switch-out time and the time off CPU: Ingero stores the
//   switch-IN time, so its rows are converted on replay (ts = timestamp - duration) and converted
//   back when we write an Ingero-compatible database.
// - `source` and `op` use Ingero's numeric ids where Ingero has them (so databases we write are
//   readable by Ingero's tools), extended with ids Ingero lacks; see ops.h.
#pragma once

#include <cstdint>
#include <type_traits>

namespace ingero {

enum class Source : uint8_t {
  kUnknown = 0,
  kCuda = 1,    // libcudart uprobes
  kHost = 3,    // kernel tracepoints: scheduler, memory, process lifecycle
  kDriver = 4,  // libcuda uprobes
  kIo = 5,      // block I/O
  kTcp = 6,     // TCP retransmits
  kNet = 7,     // socket send/recv
  kGraph = 8,   // CUDA graph API (Ingero uses 8 in code, absent from its tables)
  kNccl = 9,    // NCCL collectives (Ingero uses 9 in code, absent from its tables)
  // Made inside the engine, never stored: slices of a GPU-feeding thread's time (the rules'
  // `from accounting` stream; operators/time_accounting.h, op = the bucket).
  kAccount = 10,
  // Made inside the engine, never stored: one event per training/inference step of a process (the
  // rules' `from steps` stream; operators/step_tracker.h).
  kStep = 11,
};

// Why a thread was off CPU, recorded on HOST sched_switch spans.
enum class OffCpuState : uint8_t {
  kUnknown = 0,    // Ingero traces do not record it
  kPreempted = 1,  // switched out while runnable (TASK_RUNNING): CPU contention
  kSleeping = 2,   // TASK_INTERRUPTIBLE: voluntary wait (futex, poll, sleep)
  kDiskWait = 3,   // TASK_UNINTERRUPTIBLE: usually I/O
  kOther = 4,
};

namespace event_flags {
inline constexpr uint8_t kTruncated = 1u << 0;  // span still open when the trace ended
inline constexpr uint8_t kSynthetic = 1u << 1;  // made by an operator, not observed
// Live sched_switch halves, for sources that do not pair in the kernel: a switch-out opens an
// off-CPU span at ts_ns (dur 0), the next switch-in of the same tid closes it (operators/offcpu_spans.h).
inline constexpr uint8_t kSwitchOut = 1u << 2;
inline constexpr uint8_t kSwitchIn = 1u << 3;
// A context interval (off-CPU span, I/O request, socket call; never a probed call) delivered after
// a watermark later than its start: it was open longer than the live source holds results back
// for (model/trace.h, Batch).
inline constexpr uint8_t kLate = 1u << 4;
// Source::kStep: the step was not within 20% of its process's period (operators/step_tracker.h).
inline constexpr uint8_t kStepIrregular = 1u << 5;
}  // namespace event_flags

struct Event {
  uint64_t ts_ns = 0;     // interval start, unix ns
  uint64_t dur_ns = 0;    // interval length, ns
  uint64_t id = 0;        // unique per (node, trace); Ingero 0.8 `id`, 0.9 `{node}:{seq}` -> seq
  uint64_t arg0 = 0;      // op-specific: bytes for alloc/memcpy, kernel pointer for launch
  uint64_t arg1 = 0;      // op-specific: memcpy kind; for sched_switch the task that ran instead
  uint64_t stack_id = 0;  // Ingero stack_hash (FNV-64, bit-cast); 0 = no stack
  uint64_t cgroup_id = 0;
  uint32_t pid = 0;
  uint32_t tid = 0;
  int32_t ret = 0;    // CUDA return code; 0 = success; host events 0
  uint16_t node = 0;  // index into TraceMeta::nodes; 0 = local / unnamed
  int16_t rank = -1;  // distributed rank, -1 = unknown
  Source source = Source::kUnknown;
  uint8_t op = 0;
  OffCpuState prev_state = OffCpuState::kUnknown;
  uint8_t gpu_id = 0;
  uint8_t flags = 0;
  uint8_t reserved[3] = {0, 0, 0};

  uint64_t end_ns() const { return ts_ns + dur_ns; }
};

static_assert(sizeof(Event) == 80, "Event must stay 80 bytes: BPF, LMDB and batches depend on it");
static_assert(std::is_trivially_copyable_v<Event>);

}  // namespace ingero
