// Unwinder: the native user stack of a thread from a copy of its registers and of the top of its
// stack, using .eh_frame / .debug_frame CFI through elfutils' libdw (no frame pointers needed).
// This is what `perf record --call-graph dwarf` does, done on a window captured by our BPF
// programs at the event. User-space only; no BPF, no libbpf (library ip_stacks).
//
// Contract:
// - unwind() returns the frames' addresses innermost first; the first is regs.ip (the exact ip),
//   the others are return addresses (symbolize them with Symbolizer::symbolize_user, which looks
//   return addresses up at ip-1).
// - Memory: addresses in [regs.sp, regs.sp + stack.size()) are served from `stack`; any other
//   address is read from the file backing its mapping in the Symbolizer's snapshot of the pid
//   (read-only data only: the process may be gone). Nothing else is read from the process.
// - `truncated` is set when the walk stopped at max_frames, or ran off the copied window (a read
//   of a stack address above the copy) before reaching the outermost frame (_start, clone, thread
//   start: a frame whose CFI marks the return address undefined). An unwind that fails in the
//   middle (no CFI for an ip, bad data) stops there and returns what it got, without `truncated`.
// - A single Unwinder is thread-compatible (it shares the Symbolizer, which has one owner thread).
//   Never throws. stats() counts calls, frames and failures.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "bpf/symbolizer.h"

namespace ingero::bpf {

struct UserRegs {  // x86-64, captured at the probe
  uint64_t ip = 0, sp = 0, bp = 0;
};

class Unwinder {
 public:
  explicit Unwinder(Symbolizer& s);
  ~Unwinder();
  Unwinder(const Unwinder&) = delete;
  Unwinder& operator=(const Unwinder&) = delete;

  // .eh_frame/DWARF unwind (libdw: dwfl_attach_state with next_thread / set_initial_registers /
  // memory_read callbacks, dwfl_getthread_frames) from the registers and a copy of the user stack
  // starting at regs.sp. See the contract above.
  std::vector<uint64_t> unwind(uint32_t pid, const UserRegs& regs, std::span<const uint8_t> stack, size_t max_frames,
                               bool& truncated);

  // A frame-pointer walk over the same copy (the cheap cross-check; what bpf_get_stack would give):
  // regs.ip, then [bp+8] while bp stays inside the copy and grows. Never reads outside the copy.
  static std::vector<uint64_t> unwind_fp(const UserRegs& regs, std::span<const uint8_t> stack, size_t max_frames);

  struct Stats {
    uint64_t calls = 0, frames = 0, failed = 0, truncated = 0;
  };
  Stats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ingero::bpf
