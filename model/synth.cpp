#include "model/synth.h"

#include <algorithm>
#include <array>
#include <limits>
#include <queue>

#include "model/ops.h"

namespace ingero::synth {
namespace {

constexpr uint64_t kUs = 1'000, kMs = 1'000'000, kSec = 1'000'000'000;
constexpr uint32_t kHogPid = 31337;

// splitmix64: tiny, fast, and the same on every platform (unlike <random>'s distributions).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Integer in [lo, hi].
  uint64_t range(uint64_t lo, uint64_t hi) { return lo + next() % (hi - lo + 1); }
  bool chance(double p) { return uniform() < p; }
  // base * (1 + spread * u): a narrow latency distribution whose p99/p50 stays near 1 + spread/2.
  uint64_t jitter(uint64_t base, double spread) {
    return base + static_cast<uint64_t>(static_cast<double>(base) * spread * uniform());
  }

 private:
  uint64_t s_;
};

uint64_t window_start(int k) { return kSynthEpochNs + static_cast<uint64_t>(k) * kWindowNs; }

// Collects events of one scenario; finish() sorts them and numbers them.
class Builder {
 public:
  Event& call(Source s, uint8_t o, uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, uint64_t arg0 = 0,
              uint64_t arg1 = 0) {
    Event e;
    e.source = s;
    e.op = o;
    e.pid = pid;
    e.tid = tid;
    e.ts_ns = ts;
    e.dur_ns = dur;
    e.arg0 = arg0;
    e.arg1 = arg1;
    events_.push_back(e);
    return events_.back();
  }
  Event& cuda(uint8_t o, uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, uint64_t arg0 = 0, uint64_t arg1 = 0) {
    return call(Source::kCuda, o, pid, tid, ts, dur, arg0, arg1);
  }
  // An off-CPU span of `tid` from switch-out `ts` for `dur`; `ran_instead` is who took the CPU.
  Event& offcpu(uint32_t pid, uint32_t tid, uint64_t ts, uint64_t dur, OffCpuState st, uint32_t ran_instead) {
    Event& e = call(Source::kHost, op::kSchedSwitch, pid, tid, ts, dur, 0, ran_instead);
    e.prev_state = st;
    return e;
  }
  SynthTrace finish(Scenario s, bool fault, std::map<uint32_t, std::string> names) {
    std::stable_sort(events_.begin(), events_.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
    SynthTrace t;
    uint64_t id = 0, last = 0;
    for (auto& e : events_) {
      e.id = ++id;
      e.flags |= event_flags::kSynthetic;
      last = std::max(last, e.end_ns());
    }
    const auto& info = scenario_info(s);
    t.meta.path = "<synthetic:" + std::string(info.name) + (fault ? ">" : ":control>");
    t.meta.format = "synthetic-1";
    t.meta.process_names = std::move(names);
    if (!events_.empty()) {
      t.meta.first_ts = events_.front().ts_ns;
      t.meta.last_ts = last;
    }
    t.meta.health.rows_read = events_.size();
    t.events = std::move(events_);
    t.scenario = s;
    t.fault = fault;
    if (fault) t.category = std::string(info.category);
    return t;
  }

 private:
  std::vector<Event> events_;
};

constexpr std::array kScenarios{
    ScenarioInfo{Scenario::kCpuContention, "cpu_contention", "cpu_contention",
                 "kernel launches preempted by a CPU hog on the launching thread's core",
                 "A CPU hog (stress-ng, pid 31337) preempted the launching thread (tid 4242) in "
                 "window 1: 5% of its cudaLaunchKernel calls were switched out while runnable for "
                 "2-4 ms inside the call.",
                 "pin the launcher to its own cores (taskset -c), renice or move the background "
                 "job, or use cgroup cpusets"},
    ScenarioInfo{Scenario::kDataLoader, "dataloader", "blocking",
                 "DataLoader starvation: the training thread sleeps waiting for batches",
                 "The DataLoader workers (pids 5101-5104) could not keep up: every 8th step the "
                 "training thread (tid 5100) slept 20-40 ms inside the batch's cudaMemcpy waiting "
                 "for a worker, in windows 1-2.",
                 "raise num_workers, enable pin_memory and persistent_workers, prefetch more "
                 "batches, or move decoding off the critical path"},
    ScenarioInfo{Scenario::kCheckpointIo, "checkpoint_io", "block_io", "checkpoint writes stall device-to-host copies",
                 "A 1.5 s checkpoint (4 MiB block writes at queue depth 2) in window 1 overlapped "
                 "the training thread's (tid 6000) cudaMemcpy calls, which took 8-15 ms instead "
                 "of ~0.4 ms.",
                 "checkpoint asynchronously (copy to pinned memory, write from another process), "
                 "write to a faster or separate disk, or checkpoint less often"},
    ScenarioInfo{Scenario::kTcpRetransmit, "tcp_retransmit", "network",
                 "TCP retransmits stall the collective the step waits for",
                 "A 3 s burst of TCP retransmits in window 1 (NCCL over sockets) made the "
                 "training thread's (tid 7000) cudaStreamSynchronize wait 220-400 ms (the "
                 "retransmission timeout) instead of ~18 ms.",
                 "check the NIC and switch for drops (ethtool -S, netstat -s), use RDMA/IB for "
                 "NCCL, or pin NCCL_SOCKET_IFNAME to the right interface"},
    ScenarioInfo{Scenario::kAllocator, "allocator", "allocator",
                 "cudaMalloc latency climbing window after window (fragmentation)",
                 "tid 8000's cudaMalloc tail grew from 4x to 64x its median over windows 1-5 "
                 "while the median stayed put: the allocator is searching an increasingly "
                 "fragmented pool.",
                 "reuse buffers (a caching allocator), allocate once up front, set "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or call cudaMalloc off the "
                 "critical path"},
    ScenarioInfo{Scenario::kThroughputDrop, "throughput_drop", "throughput_drop",
                 "kernel launch rate falls to 30% of its peak",
                 "tid 9000 launched 1000 kernels/s in windows 0-5 and only 300/s from window 6 "
                 "on: the step loop slowed while every call stayed fast.",
                 "look at what the loop waits on between calls (input pipeline, Python overhead, "
                 "host-side logging); compare with the step rate before the drop"},
    ScenarioInfo{Scenario::kStraggler, "straggler", "straggler",
                 "one rank's compute is slow, its peers wait in ncclAllReduce",
                 "From window 1 on, rank 5 (pid 10005) needed ~84 ms of compute per step against "
                 "~60 ms on its 7 peers; the peers spent the difference waiting inside "
                 "ncclAllReduce, so every rank's step time grew.",
                 "check rank 5's GPU (clocks, thermals, ECC, PCIe link), its host (CPU "
                 "contention, NUMA placement) and its data shard size"},
};

// --- scenarios ---------------------------------------------------------------------------------

SynthTrace cpu_contention(bool fault, uint64_t seed) {
  constexpr uint32_t kPid = 4242;
  Rng rng(seed ^ 0xC0);
  Builder b;
  const uint64_t end = window_start(3), f0 = window_start(1), f1 = window_start(2) - 10 * kMs;
  uint64_t t = window_start(0) + 100 * kUs;
  uint64_t n = 0;
  while (t < end - 5 * kMs) {
    const bool preempt = rng.chance(0.05);  // drawn always: control and fault share the stream
    const uint64_t span = rng.range(2 * kMs, 4 * kMs);
    if (fault && preempt && t >= f0 && t < f1) {
      const uint64_t dur = 3 * kUs + span + 9 * kUs;
      b.cuda(op::kCudaLaunchKernel, kPid, kPid, t, dur, 0x7f0000001000ull + (n % 64) * 0x100);
      b.offcpu(kPid, kPid, t + 3 * kUs, span, OffCpuState::kPreempted, kHogPid);
      t += dur;
    } else {
      const uint64_t dur = rng.jitter(12 * kUs, 0.6);
      b.cuda(op::kCudaLaunchKernel, kPid, kPid, t, dur, 0x7f0000001000ull + (n % 64) * 0x100);
      t += dur;
    }
    uint64_t gap = rng.range(400 * kUs, 800 * kUs);
    if (++n % 100 == 0) {
      // A voluntary sleep between calls (waiting on a queue): off-CPU, but overlapping no call.
      const uint64_t sleep = rng.range(50 * kUs, 80 * kUs);
      b.offcpu(kPid, kPid, t + 10 * kUs, sleep, OffCpuState::kSleeping, 0);
      gap = std::max(gap, sleep + 30 * kUs);
    }
    t += gap;
  }
  auto tr = b.finish(Scenario::kCpuContention, fault, {{kPid, "python3 train.py"}, {kHogPid, "stress-ng --cpu 8"}});
  tr.source = Source::kCuda;
  tr.op = op::kCudaLaunchKernel;
  tr.pid = tr.tid = kPid;
  if (fault) tr.fault_start = f0, tr.fault_end = window_start(2);
  return tr;
}

SynthTrace dataloader(bool fault, uint64_t seed) {
  constexpr uint32_t kPid = 5100;
  Rng rng(seed ^ 0xD1);
  Builder b;
  const uint64_t end = window_start(4), f0 = window_start(1), f1 = window_start(3) - 100 * kMs;
  uint64_t t = window_start(0) + 200 * kUs;
  uint64_t step = 0;
  while (t < end - 60 * kMs) {
    ++step;
    const bool starve = fault && step % 8 == 0 && t >= f0 && t < f1;
    const uint64_t wait = rng.range(20 * kMs, 40 * kMs);
    const uint64_t copy = rng.jitter(300 * kUs, 0.4);
    if (starve) {
      const auto worker = static_cast<uint32_t>(5101 + step / 8 % 4);
      b.cuda(op::kCudaMemcpy, kPid, kPid, t, 20 * kUs + wait + copy, 8ull << 20, 1);
      b.offcpu(kPid, kPid, t + 20 * kUs, wait, OffCpuState::kSleeping, worker);
      t += 20 * kUs + wait + copy;
    } else {
      b.cuda(op::kCudaMemcpy, kPid, kPid, t, copy, 8ull << 20, 1);
      t += copy;
    }
    t += rng.range(20 * kUs, 40 * kUs);
    for (int k = 0; k < 10; ++k) {
      const uint64_t d = rng.jitter(15 * kUs, 0.5);
      b.cuda(op::kCudaLaunchKernel, kPid, kPid, t, d, 0x7f0000002000ull + static_cast<uint64_t>(k) * 0x40);
      t += d + rng.range(20 * kUs, 40 * kUs);
    }
    const uint64_t sync = rng.jitter(35 * kMs, 0.1);
    b.cuda(op::kCudaStreamSync, kPid, kPid, t, sync);
    t += sync + rng.range(2 * kMs, 3 * kMs);
  }
  auto tr = b.finish(Scenario::kDataLoader, fault,
                     {{kPid, "python3 train.py"},
                      {5101, "pt_data_worker"},
                      {5102, "pt_data_worker"},
                      {5103, "pt_data_worker"},
                      {5104, "pt_data_worker"}});
  tr.source = Source::kCuda;
  tr.op = op::kCudaMemcpy;
  tr.pid = tr.tid = kPid;
  if (fault) tr.fault_start = f0, tr.fault_end = window_start(3);
  return tr;
}

SynthTrace checkpoint_io(bool fault, uint64_t seed) {
  constexpr uint32_t kPid = 6000, kWriter = 6100, kLoader = 6200;
  Rng rng(seed ^ 0xE2);
  Builder b;
  const uint64_t end = window_start(3);
  const uint64_t c0 = window_start(1) + 4 * kSec, c1 = c0 + 1500 * kMs;
  // Background data reads, constant rate in every window and in the control: I/O that overlaps
  // normal calls must not be blamed when there is no tail.
  for (uint64_t t = window_start(0) + 50 * kMs; t < end - 10 * kMs; t += 200 * kMs)
    b.call(Source::kIo, op::kBlockRead, kLoader, kLoader, t, rng.range(300 * kUs, 1 * kMs), 128 << 10);
  if (fault) {
    // Two queues of back-to-back 4 MiB writes: the device is busy for the whole burst.
    for (int lane = 0; lane < 2; ++lane) {
      for (uint64_t t = c0 + static_cast<uint64_t>(lane) * 3 * kMs; t < c1;) {
        const uint64_t d = rng.range(6 * kMs, 12 * kMs);
        b.call(Source::kIo, op::kBlockWrite, kWriter, kWriter + 1, t, d, 4ull << 20);
        t += d;
      }
    }
  }
  uint64_t t = window_start(0) + 300 * kUs;
  while (t < end - 30 * kMs) {
    const uint64_t slow = rng.range(8 * kMs, 15 * kMs);
    const uint64_t copy = rng.jitter(400 * kUs, 0.4);
    const uint64_t d = (fault && t >= c0 && t + slow < c1 - 5 * kMs) ? slow : copy;
    b.cuda(op::kCudaMemcpy, kPid, kPid, t, d, 16ull << 20, 2);
    t += d + rng.range(30 * kUs, 60 * kUs);
    for (int k = 0; k < 8; ++k) {
      const uint64_t l = rng.jitter(15 * kUs, 0.5);
      b.cuda(op::kCudaLaunchKernel, kPid, kPid, t, l, 0x7f0000003000ull + static_cast<uint64_t>(k) * 0x40);
      t += l + rng.range(20 * kUs, 40 * kUs);
    }
    const uint64_t sync = rng.jitter(15 * kMs, 0.1);
    b.cuda(op::kCudaStreamSync, kPid, kPid, t, sync);
    t += sync + rng.range(1 * kMs, 2 * kMs);
  }
  auto tr = b.finish(Scenario::kCheckpointIo, fault,
                     {{kPid, "python3 train.py"}, {kWriter, "python3 ckpt_writer"}, {kLoader, "pt_data_worker"}});
  tr.source = Source::kCuda;
  tr.op = op::kCudaMemcpy;
  tr.pid = tr.tid = kPid;
  if (fault) tr.fault_start = c0, tr.fault_end = c1;
  return tr;
}

SynthTrace tcp_retransmit(bool fault, uint64_t seed) {
  constexpr uint32_t kPid = 7000, kProxy = 7003;
  constexpr uint64_t kPort = 29500;
  Rng rng(seed ^ 0xF3);
  Builder b;
  const uint64_t end = window_start(3);
  const uint64_t r0 = window_start(1) + 3 * kSec, r1 = r0 + 3 * kSec;
  // A healthy network still retransmits now and then: one per window, at a constant rate.
  for (int w = 0; w < 3; ++w)
    b.call(Source::kTcp, op::kTcpRetransmit, kPid, kProxy, window_start(w) + 7 * kSec + 123 * kUs, 0, 0, kPort);
  uint64_t t = window_start(0) + 150 * kUs;
  while (t < end - 450 * kMs) {
    for (int k = 0; k < 8; ++k) {
      const uint64_t l = rng.jitter(15 * kUs, 0.5);
      b.cuda(op::kCudaLaunchKernel, kPid, kPid, t, l, 0x7f0000004000ull + static_cast<uint64_t>(k) * 0x40);
      t += l + rng.range(20 * kUs, 40 * kUs);
    }
    const uint64_t ar = rng.range(20 * kUs, 40 * kUs);
    b.call(Source::kNccl, op::kNcclAllReduce, kPid, kPid, t, ar, 64ull << 20);
    t += ar + rng.range(10 * kUs, 20 * kUs);
    const uint64_t rto = rng.range(220 * kMs, 400 * kMs);
    uint64_t sync = rng.jitter(18 * kMs, 0.1);
    if (fault && t >= r0 && t < r1) {
      sync = rto;
      // The collective's segments are retransmitted while the step waits: at the first loss,
      // after the RTO, and once more before the data gets through.
      for (uint64_t off : {5 * kMs, 205 * kMs, rto - 3 * kMs})
        b.call(Source::kTcp, op::kTcpRetransmit, kPid, kProxy, t + off, 0, 0, kPort);
    }
    b.cuda(op::kCudaStreamSync, kPid, kPid, t, sync);
    t += sync + rng.range(1 * kMs, 2 * kMs);
  }
  auto tr = b.finish(Scenario::kTcpRetransmit, fault, {{kPid, "python3 train.py"}});
  tr.source = Source::kCuda;
  tr.op = op::kCudaStreamSync;
  tr.pid = tr.tid = kPid;
  if (fault) tr.fault_start = r0, tr.fault_end = r1;
  return tr;
}

SynthTrace allocator(bool fault, uint64_t seed) {
  constexpr uint32_t kPid = 8000;
  constexpr int kWindows = 6;
  constexpr std::array<uint64_t, kWindows> kTail{0, 4, 8, 16, 32, 64};
  Builder b;
  for (int w = 0; w < kWindows; ++w) {
    // Every window replays the same random stream, so windows of the control are identical and
    // a noisy ratio can never look like a rising trend.
    Rng rng(seed ^ 0xA4);
    const uint64_t w0 = window_start(w);
    for (int i = 0; i < 500; ++i) {  // 50 cudaMalloc per second, one per 20 ms slot
      uint64_t t = w0 + static_cast<uint64_t>(i) * 20 * kMs + rng.range(100 * kUs, 300 * kUs);
      const bool tail = rng.chance(0.03);
      uint64_t d = rng.jitter(20 * kUs, 0.4);
      if (fault && tail && kTail[w]) d = kTail[w] * 20 * kUs + rng.range(0, 10 * kUs);
      b.cuda(op::kCudaMalloc, kPid, kPid, t, d, 32ull << 20);
      t += d + rng.range(20 * kUs, 40 * kUs);
      for (int k = 0; k < 10; ++k) {
        const uint64_t l = rng.jitter(15 * kUs, 0.5);
        b.cuda(op::kCudaLaunchKernel, kPid, kPid, t, l, 0x7f0000005000ull + static_cast<uint64_t>(k) * 0x40);
        t += l + rng.range(20 * kUs, 40 * kUs);
      }
      b.cuda(op::kCudaFree, kPid, kPid, t, rng.jitter(8 * kUs, 0.5));
    }
  }
  auto tr = b.finish(Scenario::kAllocator, fault, {{kPid, "python3 train.py"}});
  tr.source = Source::kCuda;
  tr.op = op::kCudaMalloc;
  tr.pid = tr.tid = kPid;
  if (fault) tr.fault_start = window_start(1), tr.fault_end = window_start(kWindows);
  return tr;
}

SynthTrace throughput_drop(bool fault, uint64_t seed) {
  constexpr uint32_t kPid = 9000;
  constexpr int kWindows = 9, kDropFrom = 6;
  Rng rng(seed ^ 0xB5);
  Builder b;
  for (int w = 0; w < kWindows; ++w) {
    // Fixed slots keep the count per window exact: 10000 launches (1000/s), 3000 after the drop.
    const uint64_t slots = (fault && w >= kDropFrom) ? 3000 : 10000;
    const uint64_t period = kWindowNs / slots;
    for (uint64_t i = 0; i < slots; ++i) {
      uint64_t t = window_start(w) + i * period + rng.range(0, 100 * kUs);
      const uint64_t l = rng.jitter(15 * kUs, 0.5);
      b.cuda(op::kCudaLaunchKernel, kPid, kPid, t, l, 0x7f0000006000ull + i % 16 * 0x40);
      if (i % 20 == 19) b.cuda(op::kCudaStreamSync, kPid, kPid, t + l + 10 * kUs, rng.jitter(200 * kUs, 0.2));
    }
  }
  auto tr = b.finish(Scenario::kThroughputDrop, fault, {{kPid, "python3 serve.py"}});
  tr.source = Source::kCuda;
  tr.op = op::kCudaLaunchKernel;
  tr.pid = tr.tid = kPid;
  if (fault) tr.fault_start = window_start(kDropFrom), tr.fault_end = window_start(kWindows);
  return tr;
}

SynthTrace straggler(bool fault, uint64_t seed) {
  constexpr int kRanks = 8, kSlow = 5, kWindows = 4;
  constexpr uint32_t kBasePid = 10000;
  Rng step_rng(seed ^ 0x57);  // the work of a step, the same on every rank
  std::array<Rng, kRanks> rank_rng{Rng(seed + 1), Rng(seed + 2), Rng(seed + 3), Rng(seed + 4),
                                   Rng(seed + 5), Rng(seed + 6), Rng(seed + 7), Rng(seed + 8)};
  Builder b;
  const uint64_t end = window_start(kWindows), f0 = window_start(1);
  uint64_t t = window_start(0) + 500 * kUs;
  std::map<uint32_t, std::string> names;
  for (int r = 0; r < kRanks; ++r) names[kBasePid + r] = "python3 train.py --rank " + std::to_string(r);
  while (t < end - 200 * kMs) {
    const uint64_t compute = step_rng.jitter(60 * kMs, 0.04);
    std::array<uint64_t, kRanks> ar_start{};
    uint64_t all_ready = 0;
    for (int r = 0; r < kRanks; ++r) {
      Rng& rng = rank_rng[r];
      const uint32_t pid = kBasePid + static_cast<uint32_t>(r);
      uint64_t c = rng.jitter(compute, 0.01);
      if (fault && r == kSlow && t >= f0) c = c * 7 / 5;
      uint64_t x = t;
      for (int k = 0; k < 20; ++k) {
        const uint64_t l = rng.jitter(15 * kUs, 0.5);
        Event& e = b.cuda(op::kCudaLaunchKernel, pid, pid, x, l, 0x7f0000007000ull + static_cast<uint64_t>(k) * 0x40);
        e.rank = static_cast<int16_t>(r);
        e.gpu_id = static_cast<uint8_t>(r);
        x += l + rng.range(10 * kUs, 20 * kUs);
      }
      // The sync waits for the rest of the step's compute (kernels run while launching).
      const uint64_t sync = c > x - t ? c - (x - t) : 50 * kUs;
      Event& s = b.cuda(op::kCudaStreamSync, pid, pid, x, sync);
      s.rank = static_cast<int16_t>(r);
      s.gpu_id = static_cast<uint8_t>(r);
      ar_start[r] = x + sync + rng.range(10 * kUs, 20 * kUs);
      all_ready = std::max(all_ready, ar_start[r]);
    }
    const uint64_t comm = step_rng.jitter(8 * kMs, 0.05);
    for (int r = 0; r < kRanks; ++r) {
      const uint32_t pid = kBasePid + static_cast<uint32_t>(r);
      Event& e = b.call(Source::kNccl, op::kNcclAllReduce, pid, pid, ar_start[r], all_ready + comm - ar_start[r],
                        256ull << 20);
      e.rank = static_cast<int16_t>(r);
      e.gpu_id = static_cast<uint8_t>(r);
    }
    t = all_ready + comm + 500 * kUs;
  }
  auto tr = b.finish(Scenario::kStraggler, fault, std::move(names));
  tr.source = Source::kCuda;
  tr.op = op::kCudaStreamSync;
  tr.pid = tr.tid = kBasePid + kSlow;
  tr.rank = kSlow;
  if (fault) tr.fault_start = f0, tr.fault_end = end;
  return tr;
}

// --- large generic trace ---------------------------------------------------------------------

// One simulated thread: produces its events one action at a time, each action's events sorted and
// at or after everything it produced before.
struct Actor {
  enum Kind : uint8_t { kLauncher, kWorker, kKworker, kNetwork } kind;
  uint32_t pid, tid;
  int16_t rank;
  uint64_t cursor;  // the time its next action starts
  uint64_t steps = 0;
  Rng rng;
  std::vector<Event> pending;
  size_t pos = 0;
};

}  // namespace

struct LargeTraceGenerator::Impl {
  uint64_t total = 0, produced = 0, last_ts = 0;
  std::vector<Actor> actors;
  // (next event ts, actor index): ties broken by index so the output is deterministic.
  std::priority_queue<std::pair<uint64_t, size_t>, std::vector<std::pair<uint64_t, size_t>>, std::greater<>> heap;
  TraceMeta meta;

  static Event make(const Actor& a, Source s, uint8_t o, uint64_t ts, uint64_t dur, uint64_t arg0 = 0,
                    uint64_t arg1 = 0) {
    Event e;
    e.source = s;
    e.op = o;
    e.pid = a.pid;
    e.tid = a.tid;
    e.ts_ns = ts;
    e.dur_ns = dur;
    e.arg0 = arg0;
    e.arg1 = arg1;
    e.rank = a.rank;
    e.gpu_id = a.rank >= 0 ? static_cast<uint8_t>(a.rank) : 0;
    e.flags = event_flags::kSynthetic;
    return e;
  }

  void launcher_step(Actor& a) {
    auto& out = a.pending;
    Rng& r = a.rng;
    uint64_t t = a.cursor;
    const uint64_t step = a.steps++;
    const uint64_t h2d = r.jitter(9 * kUs, 0.6);
    out.push_back(make(a, Source::kCuda, op::kCudaMemcpyAsync, t, h2d, 8ull << 20, 1));
    t += h2d + r.range(5 * kUs, 10 * kUs);
    if (step % 16 == 0) {
      const uint64_t d = r.jitter(18 * kUs, 0.7);
      out.push_back(make(a, Source::kCuda, op::kCudaMalloc, t, d, 64ull << 20));
      t += d + r.range(5 * kUs, 10 * kUs);
    }
    // Every 6th window a CPU hog shares rank 1's core: 3% of its launches are preempted then,
    // enough for a real cpu_contention chain; elsewhere a rare preemption that makes no tail.
    const bool hog = a.rank == 1 && (t - kSynthEpochNs) / kWindowNs % 6 == 3;
    const double p_preempt = hog ? 0.03 : 0.0005;
    for (int k = 0; k < 40; ++k) {
      uint64_t d = r.jitter(11 * kUs, 0.9);
      if (r.chance(p_preempt)) {
        const uint64_t span = r.range(500 * kUs, 3 * kMs);
        out.push_back(make(a, Source::kHost, op::kSchedSwitch, t + 3 * kUs, span, 0, kHogPid));
        out.back().prev_state = OffCpuState::kPreempted;
        d += span;
      }
      out.push_back(
          make(a, Source::kCuda, op::kCudaLaunchKernel, t, d, 0x7f0000100000ull + static_cast<uint64_t>(k) * 0x80));
      out.push_back(make(a, Source::kDriver, op::kCuLaunchKernel, t + 2 * kUs, d - 4 * kUs,
                         0x7f0000100000ull + static_cast<uint64_t>(k) * 0x80));
      t += d + r.range(4 * kUs, 10 * kUs);
    }
    const uint64_t ar = r.range(20 * kUs, 40 * kUs);
    out.push_back(make(a, Source::kNccl, op::kNcclAllReduce, t, ar, 64ull << 20));
    t += ar + r.range(5 * kUs, 10 * kUs);
    const uint64_t sync = r.range(4 * kMs, 6 * kMs);
    out.push_back(make(a, Source::kCuda, op::kCudaStreamSync, t, sync));
    out.push_back(make(a, Source::kHost, op::kSchedSwitch, t + 8 * kUs, sync - 18 * kUs));
    out.back().prev_state = OffCpuState::kSleeping;
    t += sync + r.range(5 * kUs, 10 * kUs);
    if (step % 16 == 8) {
      const uint64_t d = r.jitter(10 * kUs, 0.5);
      out.push_back(make(a, Source::kCuda, op::kCudaFree, t, d));
      t += d;
    }
    a.cursor = t + r.range(50 * kUs, 150 * kUs);
  }

  void worker_step(Actor& a) {
    Rng& r = a.rng;
    const uint64_t run = r.range(1 * kMs, 3 * kMs);
    if (a.steps++ % 4 == 0)
      a.pending.push_back(make(a, Source::kHost, op::kPageAlloc, a.cursor + run / 2, 0, 4096ull << r.range(0, 4)));
    const uint64_t sleep = r.range(500 * kUs, 5 * kMs);
    a.pending.push_back(make(a, Source::kHost, op::kSchedSwitch, a.cursor + run, sleep));
    a.pending.back().prev_state = OffCpuState::kSleeping;
    a.cursor += run + sleep;
  }

  void kworker_step(Actor& a) {
    Rng& r = a.rng;
    const bool write = r.chance(0.4);
    a.pending.push_back(make(a, Source::kIo, write ? op::kBlockWrite : op::kBlockRead, a.cursor,
                             r.range(200 * kUs, 5 * kMs), (64ull << 10) << r.range(0, 4)));
    a.cursor += r.range(5 * kMs, 15 * kMs);
  }

  void network_step(Actor& a) {
    a.pending.push_back(make(a, Source::kTcp, op::kTcpRetransmit, a.cursor, 0, 0, 29500));
    a.cursor += a.rng.range(500 * kMs, 3 * kSec);
  }

  void refill(Actor& a) {
    a.pending.clear();
    a.pos = 0;
    switch (a.kind) {
      case Actor::kLauncher: launcher_step(a); break;
      case Actor::kWorker: worker_step(a); break;
      case Actor::kKworker: kworker_step(a); break;
      case Actor::kNetwork: network_step(a); break;
    }
    std::stable_sort(a.pending.begin(), a.pending.end(),
                     [](const Event& x, const Event& y) { return x.ts_ns < y.ts_ns; });
  }
};

LargeTraceGenerator::LargeTraceGenerator(uint64_t n_events, uint64_t seed) : impl_(new Impl) {
  impl_->total = n_events;
  auto& actors = impl_->actors;
  auto add = [&](Actor::Kind k, uint32_t pid, uint32_t tid, int16_t rank, uint64_t offset) {
    actors.push_back(Actor{k, pid, tid, rank, kSynthEpochNs + offset, 0, Rng(seed * 1000 + actors.size()), {}, 0});
  };
  auto& names = impl_->meta.process_names;
  for (int16_t r = 0; r < 4; ++r) {
    const uint32_t pid = 20000 + static_cast<uint32_t>(r) * 100;
    names[pid] = "python3 train.py --rank " + std::to_string(r);
    add(Actor::kLauncher, pid, pid, r, 100 * kUs + static_cast<uint64_t>(r) * 37 * kUs);
    for (uint32_t w = 1; w <= 2; ++w) {
      names[pid + w] = "pt_data_worker";
      add(Actor::kWorker, pid + w, pid + w, -1, static_cast<uint64_t>(w) * 211 * kUs);
    }
  }
  names[150] = "kworker/u16:2";
  add(Actor::kKworker, 150, 150, -1, 1 * kMs);
  add(Actor::kNetwork, 20000, 20003, -1, 700 * kMs);
  names[kHogPid] = "stress-ng --cpu 8";
  for (size_t i = 0; i < actors.size(); ++i) {
    impl_->refill(actors[i]);
    impl_->heap.emplace(actors[i].pending.front().ts_ns, i);
  }
  impl_->meta.path = "<synthetic:large>";
  impl_->meta.format = "synthetic-1";
  impl_->meta.first_ts = kSynthEpochNs;
}

LargeTraceGenerator::~LargeTraceGenerator() { delete impl_; }

bool LargeTraceGenerator::next(std::vector<Event>& out, size_t max) {
  Impl& m = *impl_;
  size_t n = 0;
  while (n < max && m.produced < m.total) {
    const size_t i = m.heap.top().second;
    m.heap.pop();
    Actor& a = m.actors[i];
    Event e = a.pending[a.pos++];
    e.id = ++m.produced;
    m.last_ts = std::max(m.last_ts, e.end_ns());
    out.push_back(e);
    ++n;
    if (a.pos == a.pending.size()) m.refill(a);
    m.heap.emplace(a.pending[a.pos].ts_ns, i);
  }
  return n > 0;
}

uint64_t LargeTraceGenerator::produced() const { return impl_->produced; }
uint64_t LargeTraceGenerator::total() const { return impl_->total; }

TraceMeta LargeTraceGenerator::meta() const {
  TraceMeta m = impl_->meta;
  m.last_ts = impl_->last_ts;
  m.health.rows_read = impl_->produced;
  return m;
}

std::vector<Event> make_large_trace(uint64_t n_events, uint64_t seed) {
  LargeTraceGenerator gen(n_events, seed);
  std::vector<Event> out;
  out.reserve(n_events);
  while (gen.next(out, 1 << 16)) {
  }
  return out;
}

LargeTraceSource::LargeTraceSource(uint64_t n_events, uint64_t seed, size_t batch_size)
    : gen_(n_events, seed), batch_size_(batch_size ? batch_size : 4096), meta_(gen_.meta()) {}

bool LargeTraceSource::next(Batch& out) {
  if (done_) return false;
  out.events.clear();
  gen_.next(out.events, batch_size_);
  out.seq = seq_++;
  out.final = gen_.produced() >= gen_.total();
  out.watermark = out.final ? std::numeric_limits<uint64_t>::max() : (out.events.empty() ? 0 : out.events.back().ts_ns);
  if (out.final) {
    done_ = true;
    meta_ = gen_.meta();
  }
  return true;
}

// --- scenario table ----------------------------------------------------------------------------

std::span<const ScenarioInfo> all_scenarios() { return kScenarios; }

const ScenarioInfo* find_scenario(std::string_view name) {
  for (const auto& s : kScenarios)
    if (s.name == name) return &s;
  return nullptr;
}

const ScenarioInfo& scenario_info(Scenario s) {
  for (const auto& info : kScenarios)
    if (info.id == s) return info;
  return kScenarios[0];
}

SynthTrace make_scenario(Scenario s, bool fault, uint64_t seed) {
  switch (s) {
    case Scenario::kCpuContention: return cpu_contention(fault, seed);
    case Scenario::kDataLoader: return dataloader(fault, seed);
    case Scenario::kCheckpointIo: return checkpoint_io(fault, seed);
    case Scenario::kTcpRetransmit: return tcp_retransmit(fault, seed);
    case Scenario::kAllocator: return allocator(fault, seed);
    case Scenario::kThroughputDrop: return throughput_drop(fault, seed);
    case Scenario::kStraggler: return straggler(fault, seed);
  }
  return cpu_contention(fault, seed);
}

SynthTrace make_cpu_contention(bool fault, uint64_t seed) { return cpu_contention(fault, seed); }
SynthTrace make_dataloader(bool fault, uint64_t seed) { return dataloader(fault, seed); }
SynthTrace make_checkpoint_io(bool fault, uint64_t seed) { return checkpoint_io(fault, seed); }
SynthTrace make_tcp_retransmit(bool fault, uint64_t seed) { return tcp_retransmit(fault, seed); }
SynthTrace make_allocator(bool fault, uint64_t seed) { return allocator(fault, seed); }
SynthTrace make_throughput_drop(bool fault, uint64_t seed) { return throughput_drop(fault, seed); }
SynthTrace make_straggler(bool fault, uint64_t seed) { return straggler(fault, seed); }

}  // namespace ingero::synth
