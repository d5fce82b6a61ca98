// ip-contention-workload: one worker thread pinned to a CPU, calling the fake
// cudaStreamSynchronize (tests/workloads/fake_cudart.cpp spins inside it for `--spin-us`) for
// `--seconds`. With `--hogs K`, K busy threads are pinned to the same CPU, so the worker is
// preempted while runnable and its slow calls line up with off-CPU spans. With `--fifo`, the
// worker runs SCHED_FIFO and sleeps between calls (a quiet baseline the scheduler leaves alone).
//
// `--nest N`: instead, N calls of cudaLaunchKernel (which calls cudaMemcpy inside) and N calls of
// cudaEventSynchronize(3) (which recurses 3 levels: 4 calls) on the main thread, for the
// entry/return pairing tests.
//
// Prints "worker tid <tid> calls <n>" at the end. `--wait`: print "ready", wait for a stdin line.
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

extern "C" int cudaStreamSynchronize(void* stream);
extern "C" int cudaEventSynchronize(void* event);
struct FakeDim3 {
  unsigned x, y, z;
};
extern "C" int cudaLaunchKernel(const void*, FakeDim3, FakeDim3, void**, size_t, void*);

namespace {
double arg(int argc, char** argv, const char* name, double def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atof(argv[i + 1]);
  return def;
}
bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}
void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}
}  // namespace

int main(int argc, char** argv) {
  const int cpu = static_cast<int>(arg(argc, argv, "--cpu", 0));
  const int hogs = static_cast<int>(arg(argc, argv, "--hogs", 0));
  const double seconds = arg(argc, argv, "--seconds", 2);
  const long spin_us = static_cast<long>(arg(argc, argv, "--spin-us", 200));
  const bool fifo = flag(argc, argv, "--fifo");
  if (flag(argc, argv, "--wait")) {
    std::printf("ready\n");
    std::fflush(stdout);
    std::string line;
    std::getline(std::cin, line);
  }
  if (const long nest = static_cast<long>(arg(argc, argv, "--nest", 0)); nest > 0) {
    for (long i = 0; i < nest; ++i) {
      cudaLaunchKernel(reinterpret_cast<const void*>(&flag), {1, 1, 1}, {1, 1, 1}, nullptr, 0, nullptr);
      cudaEventSynchronize(reinterpret_cast<void*>(3));
    }
    std::printf("worker tid %ld calls %ld\n", static_cast<long>(syscall(SYS_gettid)), nest);
    return 0;
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> hog_threads;
  for (int i = 0; i < hogs; ++i)
    hog_threads.emplace_back([&, cpu] {
      pin(cpu);
      volatile unsigned long x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  long calls = 0, tid = 0;
  std::thread worker([&] {
    tid = syscall(SYS_gettid);
    pin(cpu);
    if (fifo) {
      sched_param sp{};
      sp.sched_priority = 10;
      pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      cudaStreamSynchronize(reinterpret_cast<void*>(spin_us));
      ++calls;
      if (fifo) std::this_thread::sleep_for(std::chrono::microseconds(spin_us));
    }
  });
  worker.join();
  stop = true;
  for (auto& t : hog_threads) t.join();
  std::printf("worker tid %ld calls %ld\n", tid, calls);
  return 0;
}
