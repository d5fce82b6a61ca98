// A stand-in libcudart.so.13 for live-capture tests: exports the runtime symbols the tracer
// probes, with behaviour a test can rely on (a real runtime without a GPU returns at once).
//   cudaStreamSynchronize(stream)  spins for `stream` microseconds (a "sync" of known length)
//   cudaEventSynchronize(event)    recurses `event` levels deep (recursion pairing)
//   cudaLaunchKernel(...)          calls cudaMemcpy inside (nested pairing), returns 0
//   cudaMemcpy(..., count, kind)   returns 0
// Everything else the tracer probes returns 0 (cudaSuccess).
#include <cstddef>
#include <cstdint>
#include <ctime>

namespace {
uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}
volatile uint64_t sink;
}  // namespace

extern "C" {
struct FakeDim3 {
  unsigned x, y, z;
};

__attribute__((noinline)) int cudaMemcpy(void*, const void*, size_t count, int kind) {
  sink = count + kind;
  return 0;
}

__attribute__((noinline)) int cudaLaunchKernel(const void* func, FakeDim3, FakeDim3, void**, size_t, void*) {
  sink = reinterpret_cast<uintptr_t>(func);
  int rc = cudaMemcpy(nullptr, nullptr, 64, 1);  // nested probed call
  return rc;
}

__attribute__((noinline)) int cudaStreamSynchronize(void* stream) {
  const uint64_t us = reinterpret_cast<uintptr_t>(stream);
  const uint64_t end = now_ns() + us * 1000;
  while (now_ns() < end) sink = sink + 1;
  return 0;
}

__attribute__((noinline)) int cudaEventSynchronize(void* event) {
  const uintptr_t depth = reinterpret_cast<uintptr_t>(event);
  int rc = depth > 0 ? cudaEventSynchronize(reinterpret_cast<void*>(depth - 1)) : 0;
  sink = sink + 1;  // work after the recursive call: keeps it from being a tail call
  return rc;
}

int cudaMemcpyAsync(void*, const void*, size_t, int, void*) { return 0; }
int cudaMalloc(void** p, size_t) {
  if (p) *p = nullptr;
  return 0;
}
int cudaFree(void*) { return 0; }
int cudaMallocManaged(void** p, size_t, unsigned) {
  if (p) *p = nullptr;
  return 0;
}
int cudaDeviceSynchronize() { return 0; }
int cudaGraphLaunch(void*, void*) { return 0; }
int cudaStreamBeginCapture(void*, int) { return 0; }
int cudaStreamEndCapture(void*, void**) { return 0; }
int cudaGraphInstantiate(void**, void*, unsigned long long) { return 0; }
}
