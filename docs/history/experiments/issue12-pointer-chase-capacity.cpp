// Throwaway probe of docs/performance.md, part 21 (not built by CMake): two threads pinned to
// vCPUs 0 and 1, each chasing four random pointer chains through its own working set of 0.5-48
// MiB; per size, seven rounds of capacity = 2 x (the time alone on vCPU 0) / (the slower of the
// two run together). Shows whether two busy vCPUs slow each other down as a function of the
// working set (shared cache) or whatever the size (the host).
//   g++ -O2 -std=c++20 -pthread docs/experiments/issue12-pointer-chase-capacity.cpp -o /tmp/ws && /tmp/ws
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

// One 64-byte line per node; next[i * 16] is the index of the next node's line, a random cycle.
static std::vector<uint32_t> make_ring(size_t bytes, unsigned seed) {
  const size_t n = bytes / 64;
  std::vector<uint32_t> perm(n);
  for (size_t i = 0; i < n; ++i) perm[i] = static_cast<uint32_t>(i);
  std::mt19937 g(seed);
  std::shuffle(perm.begin(), perm.end(), g);
  std::vector<uint32_t> next(n * 16, 0);
  for (size_t i = 0; i < n; ++i) next[perm[i] * 16] = perm[(i + 1) % n] * 16;
  return next;
}

static double chase(const std::vector<uint32_t>& ring, size_t steps) {
  const uint32_t* p = ring.data();
  const size_t n = ring.size();
  uint32_t a = 0, b = p[16 * (n / 64 / 3)], c = p[16 * (n / 64 / 2)], d = p[16 * (n / 64 * 2 / 3)];
  const auto t = Clock::now();
  for (size_t i = 0; i < steps; ++i) {
    a = p[a];
    b = p[b];
    c = p[c];
    d = p[d];
  }
  volatile uint32_t sink = a + b + c + d;
  (void)sink;
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int main() {
  const size_t steps = 2'000'000;
  for (const double mib : {0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 48.0}) {
    const auto bytes = static_cast<size_t>(mib * (1 << 20));
    const auto r0 = make_ring(bytes, 1), r1 = make_ring(bytes, 2);
    chase(r0, steps);
    chase(r1, steps);
    std::vector<double> caps;
    for (int rep = 0; rep < 7; ++rep) {
      pin(0);
      const double alone = chase(r0, steps);
      std::atomic<int> go{0};
      double t0 = 0, t1 = 0;
      std::thread other([&] {
        pin(1);
        chase(r1, steps / 10);
        go.fetch_add(1);
        while (go.load() < 2) {
        }
        t1 = chase(r1, steps);
      });
      chase(r0, steps / 10);
      go.fetch_add(1);
      while (go.load() < 2) {
      }
      t0 = chase(r0, steps);
      other.join();
      caps.push_back(2 * alone / std::max(t0, t1));
    }
    std::sort(caps.begin(), caps.end());
    std::printf("%5.1f MiB per thread: capacity min %.2f median %.2f max %.2f\n", mib, caps.front(), caps[3],
                caps.back());
  }
}
