// ingero-pair-capacity: how much two threads on two CPUs get done together, right now, against
// one thread alone (docs/history/issue-12.md, part 20).
//
// On a small VM the two vCPUs are not always two whole cores: for seconds at a time the host runs
// them so that each goes slower while the other is busy (seen here: the same work 1.2-1.37x slower
// on each of two threads than on one, then 1.0x again a few seconds later), and it moves them
// between places that do and do not share an L3 (a cache line handed over in 25-32 ns, then in
// 160-169 ns). Two-thread benchmarks (bench/ab_run_phase.sh -c) print this probe beside each run,
// so that a figure comes with what the machine gave around it. (It did not explain the engine's
// own two-thread spread, which moves by half between runs next to the same probe readings.)
//
// Each round times one fixed piece of work (a pass over 80-byte records, with a little arithmetic
// and a small table per record, as the engine's feeds do) on one thread alone, then on both
// threads at once, pinned to CPUs 0 and 1. slowdown = mean of the two concurrent times / the solo
// time; capacity = 2 / slowdown (2.0: two whole cores). Prints the median over the rounds, and
// the handoff latency (pingpong_ns), measured before the rounds.
//
//   ingero-pair-capacity [SECONDS] [--json]     (default 0.3 s of rounds)
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Record {
  uint64_t field[10];  // 80 bytes, as an engine Event
};

bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// One pass: returns its seconds; `sink` keeps the compiler from dropping the work.
double pass(const std::vector<Record>& records, std::vector<uint64_t>& table, uint64_t& sink) {
  const auto t0 = Clock::now();
  uint64_t s = 0;
  const size_t mask = table.size() - 1;
  for (const Record& r : records) {
    const uint64_t h = (r.field[0] * 0x9E3779B97F4A7C15ull) >> 52;
    table[h & mask] += r.field[1];
    s += r.field[7] ^ (table[(h * 7) & mask] >> 3);
    for (int k = 0; k < 6; ++k) s = s * 31 + (r.field[k] >> k);
  }
  sink += s;
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One-way latency of handing a cache line to the other CPU and back (half a round trip), median
// of 20 runs of 2,000 round trips: tens of ns when both CPUs share an L3, a few hundred across
// dies.
double pingpong_ns() {
  alignas(64) static std::atomic<uint64_t> line{0};
  std::vector<double> runs;
  for (int run = 0; run < 20; ++run) {
    constexpr uint64_t kTrips = 2000;
    line.store(0);
    std::atomic<bool> ready{false};
    std::thread other([&ready] {
      pin_to(1);
      ready.store(true, std::memory_order_release);
      for (uint64_t i = 1; i <= kTrips; ++i) {
        while (line.load(std::memory_order_acquire) != 2 * i - 1) {
        }
        line.store(2 * i, std::memory_order_release);
      }
    });
    pin_to(0);
    while (!ready.load(std::memory_order_acquire)) {
    }
    const auto t0 = Clock::now();
    for (uint64_t i = 1; i <= kTrips; ++i) {
      line.store(2 * i - 1, std::memory_order_release);
      while (line.load(std::memory_order_acquire) != 2 * i) {
      }
    }
    runs.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kTrips / 2);
    other.join();
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.3;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "usage: ingero-pair-capacity [SECONDS] [--json]\n"
          "Times the same work on one thread, then on two threads at once (CPUs 0 and 1),\n"
          "for SECONDS (default 0.3) of rounds; prints the median slowdown, the capacity\n"
          "(2 / slowdown: 2.0 means two whole cores) and, measured first, the one-way latency\n"
          "of handing a cache line from one CPU to the other (tens of ns: a shared L3).\n");
      return 0;
    } else {
      seconds = std::atof(argv[i]);
      if (!(seconds > 0) || seconds > 600) {
        std::fprintf(stderr, "ingero-pair-capacity: SECONDS must be in (0, 600], got '%s'\n", argv[i]);
        return 2;
      }
    }
  }
  if (std::thread::hardware_concurrency() < 2) {
    std::fprintf(stderr, "ingero-pair-capacity: needs two CPUs, this machine has %u\n",
                 std::thread::hardware_concurrency());
    return 2;
  }
  const size_t n = 1'000'000;  // 80 MB per thread: streamed from memory, as a batch is
  std::vector<Record> a(n), b(n);
  for (size_t i = 0; i < n; ++i)
    for (uint64_t k = 0; k < 10; ++k) {
      a[i].field[k] = i * k + 1;
      b[i].field[k] = i * k + 3;
    }
  std::vector<uint64_t> table_a(4096), table_b(4096);
  uint64_t sink_a = 0, sink_b = 0;

  // Cross-core latency first, before the helper below exists: it spins on CPU 1 between rounds,
  // and would share that CPU with the ping-pong's thread.
  if (!pin_to(0)) std::fprintf(stderr, "ingero-pair-capacity: could not pin to CPU 0; going on unpinned\n");
  const double handoff_ns = pingpong_ns();

  // The helper runs round r's concurrent pass when `round` becomes r; `done` says it finished.
  std::atomic<int> round{0}, done{0};
  std::atomic<bool> stop{false};
  double helper_seconds = 0;
  std::thread helper([&] {
    pin_to(1);
    for (int r = 1;; ++r) {
      while (round.load(std::memory_order_acquire) < r)
        if (stop.load(std::memory_order_acquire)) return;
      helper_seconds = pass(b, table_b, sink_b);
      done.store(r, std::memory_order_release);
    }
  });
  std::vector<double> slowdowns;
  const auto start = Clock::now();
  for (int r = 1; r == 1 || std::chrono::duration<double>(Clock::now() - start).count() < seconds; ++r) {
    const double solo = pass(a, table_a, sink_a);
    round.store(r, std::memory_order_release);
    const double mine = pass(a, table_a, sink_a);
    while (done.load(std::memory_order_acquire) < r) {
    }
    slowdowns.push_back((mine + helper_seconds) / 2 / solo);
  }
  stop.store(true, std::memory_order_release);
  helper.join();

  std::sort(slowdowns.begin(), slowdowns.end());
  const double median = slowdowns[slowdowns.size() / 2];
  if (json)
    std::printf(
        "{\"rounds\": %zu, \"slowdown\": %.3f, \"capacity\": %.3f, \"min_slowdown\": %.3f, \"max_slowdown\": "
        "%.3f, \"handoff_ns\": %.0f}\n",
        slowdowns.size(), median, 2 / median, slowdowns.front(), slowdowns.back(), handoff_ns);
  else
    std::printf(
        "capacity %.2f (two threads each %.2fx slower than one alone; %zu rounds, %.2f-%.2fx); "
        "cache-line handoff %.0f ns\n",
        2 / median, median, slowdowns.size(), slowdowns.front(), slowdowns.back(), handoff_ns);
  volatile uint64_t keep = sink_a + sink_b;  // the passes' results are used
  (void)keep;
  return 0;
}
