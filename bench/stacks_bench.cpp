// Cost of the user-space half of stack capture (ip_stacks): unwinding a captured 16 KiB stack
// window with libdw from .eh_frame, and symbolizing the result, per stack. The window is this
// process's own stack, captured at the bottom of a recursion built without frame pointers, so the
// depth is known (8, 32, 64 frames of recursion plus the benchmark's own ~10). "Cold" includes a
// fresh Symbolizer (maps snapshot, opening every ELF) and libdw session: the once-per-process cost.
// Figures in docs/stacks.md.
//
//   ./build/ingero-bench --benchmark_filter=Stacks --benchmark_min_time=1
#ifdef INGERO_HAVE_STACKS
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "bpf/symbolizer.h"
#include "bpf/unwind.h"

namespace ingero::bpf {
namespace {

struct Window {
  UserRegs regs;
  std::vector<uint8_t> stack;
};

uint64_t stack_top(uint64_t sp) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return 0;
  char line[512];
  uint64_t top = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long s = 0, e = 0;
    if (std::sscanf(line, "%llx-%llx", &s, &e) == 2 && sp >= s && sp < e) top = e;
  }
  std::fclose(f);
  return top;
}

__attribute__((noinline)) void copy_window(Window* w) {
  const uint64_t top = stack_top(w->regs.sp);
  const size_t n = top > w->regs.sp ? std::min<uint64_t>(16384, top - w->regs.sp) : 0;
  w->stack.resize(n);
  std::memcpy(w->stack.data(), reinterpret_cast<const void*>(w->regs.sp), n);
}

__attribute__((noinline, optimize("omit-frame-pointer"))) int recurse(int depth, Window* w) {
  if (depth == 0) {
    uint64_t ip, sp, bp;
    asm volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(ip), "=r"(sp), "=r"(bp));
    w->regs = UserRegs{ip, sp, bp};
    copy_window(w);
    return 0;
  }
  const int r = recurse(depth - 1, w);
  asm volatile("" ::: "memory");
  return r + 1;
}

Window capture(int depth) {
  Window w;
  recurse(depth, &w);
  return w;
}

void BM_StacksUnwind(benchmark::State& state) {
  const Window w = capture(static_cast<int>(state.range(0)));
  Symbolizer sym;
  sym.note_process(static_cast<uint32_t>(getpid()));
  Unwinder uw(sym);
  size_t frames = 0;
  for (auto _ : state) {
    bool truncated = false;
    auto ips = uw.unwind(static_cast<uint32_t>(getpid()), w.regs, w.stack, 256, truncated);
    frames = ips.size();
    benchmark::DoNotOptimize(ips.data());
  }
  state.counters["frames"] = static_cast<double>(frames);
}
BENCHMARK(BM_StacksUnwind)->Arg(8)->Arg(32)->Arg(64)->Unit(benchmark::kMicrosecond);

void BM_StacksUnwindAndSymbolize(benchmark::State& state) {
  const Window w = capture(static_cast<int>(state.range(0)));
  Symbolizer sym;
  sym.note_process(static_cast<uint32_t>(getpid()));
  Unwinder uw(sym);
  size_t frames = 0;
  for (auto _ : state) {
    bool truncated = false;
    auto ips = uw.unwind(static_cast<uint32_t>(getpid()), w.regs, w.stack, 256, truncated);
    auto fr = sym.symbolize_user(static_cast<uint32_t>(getpid()), ips, true);
    frames = fr.size();
    benchmark::DoNotOptimize(fr.data());
  }
  state.counters["frames"] = static_cast<double>(frames);
}
BENCHMARK(BM_StacksUnwindAndSymbolize)->Arg(8)->Arg(32)->Arg(64)->Unit(benchmark::kMicrosecond);

// Once per traced process: snapshot, open every ELF (none cached), build the libdw session,
// unwind and symbolize the first stack (symbol tables loaded on first use).
void BM_StacksColdFirstStack(benchmark::State& state) {
  const Window w = capture(8);
  for (auto _ : state) {
    Symbolizer sym;
    sym.note_process(static_cast<uint32_t>(getpid()));
    Unwinder uw(sym);
    bool truncated = false;
    auto ips = uw.unwind(static_cast<uint32_t>(getpid()), w.regs, w.stack, 256, truncated);
    auto fr = sym.symbolize_user(static_cast<uint32_t>(getpid()), ips, true);
    benchmark::DoNotOptimize(fr.data());
  }
}
BENCHMARK(BM_StacksColdFirstStack)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ingero::bpf
#endif  // INGERO_HAVE_STACKS
