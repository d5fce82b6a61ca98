// ip-cuda-workload: loops of CUDA runtime calls against the real libcudart (no GPU needed: every
// call fails fast with an error code, which is still a call the tracer must see).
//
//   ip-cuda-workload mixed  --threads N --calls M [--wait]
//       thread i (0-based) makes (i+1)*M calls of each of kMixedOps; prints
//       "thread <i> tid <tid> calls <per-op count>" per thread, so a test can check exact counts
//       per op and per thread.
//   ip-cuda-workload loop --calls M [--rate R] [--wait]
//       one thread, M cudaLaunchKernel calls (paced to R calls/s when given); prints
//       "ns_per_call <x>" measured around the loop (the overhead benchmark's number).
//   ip-cuda-workload paced --threads N --period-us P --seconds S --log FILE [--busy]
//       N threads (created at once) each call cudaLaunchKernel then cudaStreamSynchronize every P
//       microseconds for S seconds or until SIGUSR1; prints "ready" when every thread is running,
//       then "tid <tid>" per thread, and at the end writes FILE: one line per call, "<tid> <op>
//       <unix ns just before the call>" (op: launch, sync), so a test can count the calls made
//       after any instant (a tracer's attach). --busy: between calls the thread spins on CPU for P
//       microseconds after the sync returns (a CPU-bound feeding thread that never sleeps, and
//       does not catch up on calls after losing its CPU) instead of sleeping until the next due
//       time.
//   ip-cuda-workload hog --seconds S [--name NAME]
//       a CPU-bound process that makes no CUDA call: names itself NAME (prctl PR_SET_NAME, default
//       "ip-hog"; its comm), prints "ready" and spins for S seconds or until SIGUSR1, then prints
//       "spun <unix ns> <unix ns>": when it started and stopped spinning.
//   --cpu C: the process (every thread) runs on CPU C only. --nice N: at priority N (root for
//   N < 0), in a session of its own whose scheduler autogroup is at N too (where autogroups are
//   on, nice alone does not rank a task against other sessions'). Both are set before any thread
//   is created, so every thread has them.
//   --wait: print "ready" and wait for a line on stdin before calling (so a tracer can attach to
//   this pid first).
#include <cuda_runtime_api.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> g_stop{false};
void on_usr1(int) { g_stop.store(true); }

const void* kernel_address() { return reinterpret_cast<const void*>(&kernel_address); }

// One call of each probed libcudart function; returns how many calls it made.
constexpr int kMixedOps = 9;
void mixed_round() {
  void* p = nullptr;
  cudaLaunchKernel(kernel_address(), dim3(1), dim3(1), nullptr, 0, nullptr);
  cudaMemcpy(&p, &p, sizeof(p), cudaMemcpyHostToHost);
  cudaMemcpyAsync(&p, &p, sizeof(p), cudaMemcpyHostToDevice, nullptr);
  cudaMalloc(&p, 4096);
  cudaFree(nullptr);
  cudaMallocManaged(&p, 8192, cudaMemAttachGlobal);
  cudaStreamSynchronize(nullptr);
  cudaDeviceSynchronize();
  cudaEventSynchronize(nullptr);
}

long arg_long(int argc, char** argv, const char* name, long def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::strtol(argv[i + 1], nullptr, 10);
  return def;
}
bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s mixed|loop|paced|hog [--threads N] [--calls M] [--rate R] [--period-us P] [--seconds S] "
                 "[--log F] [--busy] [--cpu C] [--nice N] [--wait]\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const long threads = arg_long(argc, argv, "--threads", 4);
  const long calls = arg_long(argc, argv, "--calls", 1000);
  const long rate = arg_long(argc, argv, "--rate", 0);
  const long cpu = arg_long(argc, argv, "--cpu", -1);
  if (cpu >= 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(static_cast<int>(cpu), &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) {
      std::perror("sched_setaffinity");
      return 1;
    }
  }
  if (const long nice = arg_long(argc, argv, "--nice", 0); nice != 0) {
    // With scheduler autogroups (sched_autogroup_enabled), nice only ranks tasks within their
    // session's group, and each session's group gets an equal share of a CPU: a new session, its
    // group at the same nice, makes the priority count against other sessions' tasks too.
    if (setsid() >= 0) {
      if (FILE* f = std::fopen("/proc/self/autogroup", "w")) {
        std::fprintf(f, "%ld\n", nice);
        std::fclose(f);
      }
    }
    if (setpriority(PRIO_PROCESS, 0, static_cast<int>(nice)) != 0) {
      std::perror("setpriority");
      return 1;
    }
  }
  if (has_flag(argc, argv, "--wait")) {
    std::printf("ready\n");
    std::fflush(stdout);
    std::string line;
    std::getline(std::cin, line);
  }
  if (mode == "mixed") {
    std::vector<std::thread> ts;
    std::vector<long> tids(threads);
    for (long i = 0; i < threads; ++i)
      ts.emplace_back([i, calls, &tids] {
        tids[i] = syscall(SYS_gettid);
        for (long n = 0; n < (i + 1) * calls; ++n) mixed_round();
      });
    for (auto& t : ts) t.join();
    for (long i = 0; i < threads; ++i) std::printf("thread %ld tid %ld calls %ld\n", i, tids[i], (i + 1) * calls);
    std::printf("ops %d\n", kMixedOps);
    return 0;
  }
  if (mode == "paced") {
    const long period_us = arg_long(argc, argv, "--period-us", 500);
    const long seconds = arg_long(argc, argv, "--seconds", 5);
    std::string log;
    for (int i = 1; i + 1 < argc; ++i)
      if (std::strcmp(argv[i], "--log") == 0) log = argv[i + 1];
    struct Call {
      long tid;
      char op;  // 'l' launch, 's' sync
      long long ts;
    };
    std::signal(SIGUSR1, on_usr1);
    std::vector<std::vector<Call>> calls_of(threads);
    std::vector<long> tids(threads);
    std::atomic<long> running{0};
    const bool busy = has_flag(argc, argv, "--busy");
    const auto unix_ns = [] {
      timespec t{};
      clock_gettime(CLOCK_REALTIME, &t);
      return static_cast<long long>(t.tv_sec) * 1'000'000'000LL + t.tv_nsec;
    };
    std::vector<std::thread> ts;
    const void* k = kernel_address();
    for (long i = 0; i < threads; ++i)
      ts.emplace_back([&, i] {
        const long tid = syscall(SYS_gettid);
        tids[i] = tid;
        auto& mine = calls_of[i];
        mine.reserve(
            std::min<size_t>(static_cast<size_t>(seconds * 2'000'000 / std::max(1L, period_us) + 16), 1u << 22));
        running.fetch_add(1);
        const auto t0 = std::chrono::steady_clock::now();
        const auto end = t0 + std::chrono::seconds(seconds);
        for (long n = 1;; ++n) {
          mine.push_back({tid, 'l', unix_ns()});
          cudaLaunchKernel(k, dim3(1), dim3(1), nullptr, 0, nullptr);
          mine.push_back({tid, 's', unix_ns()});
          cudaStreamSynchronize(nullptr);
          if (busy) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(period_us);
            if (until >= end || g_stop.load(std::memory_order_relaxed)) break;
            while (std::chrono::steady_clock::now() < until) {
            }
            continue;
          }
          const auto due = t0 + std::chrono::microseconds(period_us * n);
          if (due >= end || g_stop.load(std::memory_order_relaxed)) break;
          std::this_thread::sleep_until(due);
        }
      });
    while (running.load() < threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::printf("ready\n");
    for (long t : tids) std::printf("tid %ld\n", t);
    std::fflush(stdout);
    for (auto& t : ts) t.join();
    if (FILE* f = log.empty() ? nullptr : std::fopen(log.c_str(), "w")) {
      for (const auto& mine : calls_of)
        for (const Call& c : mine) std::fprintf(f, "%ld %s %lld\n", c.tid, c.op == 'l' ? "launch" : "sync", c.ts);
      std::fclose(f);
    }
    return 0;
  }
  if (mode == "hog") {
    std::string name = "ip-hog";
    for (int i = 1; i + 1 < argc; ++i)
      if (std::strcmp(argv[i], "--name") == 0) name = argv[i + 1];
    prctl(PR_SET_NAME, name.c_str(), 0, 0, 0);
    std::signal(SIGUSR1, on_usr1);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(arg_long(argc, argv, "--seconds", 10));
    const auto unix_ns = [] {
      timespec t{};
      clock_gettime(CLOCK_REALTIME, &t);
      return static_cast<long long>(t.tv_sec) * 1'000'000'000LL + t.tv_nsec;
    };
    std::printf("ready\n");
    std::fflush(stdout);
    const long long from = unix_ns();
    volatile unsigned long x = 0;
    while (std::chrono::steady_clock::now() < end && !g_stop.load(std::memory_order_relaxed)) x = x + 1;
    std::printf("spun %lld %lld\n", from, unix_ns());
    return 0;
  }
  if (mode == "loop") {
    const void* k = kernel_address();
    const auto t0 = std::chrono::steady_clock::now();
    if (rate > 0) {
      // Paced: call in bursts of 100 and sleep to keep the average at `rate` calls/s.
      const double period_ns = 1e9 / static_cast<double>(rate);
      for (long n = 0; n < calls; ++n) {
        cudaLaunchKernel(k, dim3(1), dim3(1), nullptr, 0, nullptr);
        if (n % 100 == 99) {
          const auto due = t0 + std::chrono::nanoseconds(static_cast<long>(period_ns * (n + 1)));
          std::this_thread::sleep_until(due);
        }
      }
    } else {
      for (long n = 0; n < calls; ++n) cudaLaunchKernel(k, dim3(1), dim3(1), nullptr, 0, nullptr);
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    std::printf("ns_per_call %.1f calls %ld seconds %.3f\n", ns / calls, calls, ns / 1e9);
    return 0;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
