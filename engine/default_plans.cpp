#include "engine/default_plans.h"

#include "model/ops.h"

namespace ingero {
namespace {

using namespace ex;

double src(Source s) { return static_cast<double>(s); }

ExprPtr is_op(Source s, std::vector<uint8_t> ops) {
  std::vector<double> set(ops.begin(), ops.end());
  return land(eq(field(Field::kSource), num(src(s))), in(field(Field::kOp), set));
}

struct Streams {
  int scan, gpu_calls, offcpu_cpu, offcpu_blocked, offcpu_all, io, tcp, net, mem, allocs, launches;
};

Streams add_streams(Plan& p) {
  Streams s{};
  s.scan = p.add(ScanNode{});
  s.gpu_calls = p.add(FilterNode{in(field(Field::kSource), {src(Source::kCuda), src(Source::kDriver)})}, {s.scan});
  s.offcpu_cpu = p.add(OffCpuNode{0, {OffCpuState::kPreempted, OffCpuState::kUnknown}}, {s.scan});
  s.offcpu_blocked = p.add(OffCpuNode{0, {OffCpuState::kSleeping, OffCpuState::kDiskWait}}, {s.scan});
  s.offcpu_all = p.add(OffCpuNode{0, {}}, {s.scan});
  s.io = p.add(FilterNode{eq(field(Field::kSource), num(src(Source::kIo)))}, {s.scan});
  s.tcp = p.add(FilterNode{eq(field(Field::kSource), num(src(Source::kTcp)))}, {s.scan});
  s.net = p.add(FilterNode{eq(field(Field::kSource), num(src(Source::kNet)))}, {s.scan});
  s.mem = p.add(FilterNode{is_op(Source::kHost, {op::kPageAlloc})}, {s.scan});
  s.allocs = p.add(FilterNode{lor(is_op(Source::kCuda, {op::kCudaMalloc, op::kCudaMallocManaged}),
                                  is_op(Source::kDriver, {op::kCuMemAlloc, op::kCuMemAllocManaged}))},
                   {s.scan});
  s.launches = p.add(FilterNode{lor(is_op(Source::kCuda, {op::kCudaLaunchKernel}),
                                    is_op(Source::kDriver, {op::kCuLaunchKernel}))},
                     {s.scan});
  return s;
}

// A tumbling window of the configured size over `stream`, keyed by `keys`; returns its node.
int tumbling(Plan& p, int stream, std::vector<Field> keys, const DefaultPlanOptions& o) {
  WindowNode w;
  w.kind = WindowKind::kTumbling;
  w.size_ns = w.slide_ns = o.window_ns;
  w.keys = std::move(keys);
  return p.add(w, {stream});
}

const std::vector<Field> kPerProcessOp = {Field::kPid, Field::kSource, Field::kOp};

// Window -> tail statistics -> gates shared by every tail family. Returns the last node.
int tail_head(Plan& p, int stream, const DefaultPlanOptions& o) {
  int id = tumbling(p, stream, kPerProcessOp, o);
  AggregateNode agg;
  agg.aggs = {{"n", AggKind::kCount, Field::kDuration, 0},         {"p50", AggKind::kQuantile, Field::kDuration, 0.50},
              {"p95", AggKind::kQuantile, Field::kDuration, 0.95}, {"p99", AggKind::kQuantile, Field::kDuration, 0.99},
              {"max", AggKind::kMax, Field::kDuration, 0},         {"total", AggKind::kSum, Field::kDuration, 0}};
  id = p.add(agg, {id});
  id = p.add(LetNode{{{"tail_ratio", div(ref("p99"), ref("p50"))},
                      {"slow", bin(ExprOp::kMax, ref("p95"), mul(num(3), ref("p50")))}}},
             {id});
  id = p.add(RequireNode{ge(ref("n"), num(static_cast<double>(o.min_calls))),
                         "count() >= " + std::to_string(o.min_calls)},
             {id});
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%g", o.min_tail_ratio);
  id = p.add(RequireNode{ge(ref("tail_ratio"), num(o.min_tail_ratio, Unit::kRatio)),
                         std::string("p99 / p50 >= ") + ratio},
             {id});
  return id;
}

int join(Plan& p, int left, int right, const std::string& name, JoinKind kind, JoinKey key, uint64_t within = 0) {
  JoinNode j;
  j.kind = kind;
  j.key = key;
  j.name = name;
  j.tail = ge(field(Field::kDuration), ref("slow"));
  j.within_ns = within;
  return p.add(j, {left, right});
}

int require_share(Plan& p, int id, const std::string& name, double min_share) {
  char label[96];
  std::snprintf(label, sizeof label, "%s.share >= %g%%", name.c_str(), min_share * 100);
  return p.add(RequireNode{ge(ref(name + ".share"), num(min_share, Unit::kPercent)), label}, {id});
}

EmitNode emit(std::string rule, std::string category, std::vector<SeverityCase> sev, std::string summary,
              std::string root, std::string explanation, std::vector<std::string> fix) {
  EmitNode e;
  e.rule = std::move(rule);
  e.category = std::move(category);
  e.severity = std::move(sev);
  e.summary = std::move(summary);
  e.root_cause = std::move(root);
  e.explanation = std::move(explanation);
  e.recommendations = std::move(fix);
  return e;
}

constexpr uint64_t kTcpReach = 200'000'000;  // a retransmit timeout is at least 200 ms on Linux
constexpr double kMemBytes = 64.0 * 1024 * 1024;

}  // namespace

Plan default_plan(const DefaultPlanOptions& o) {
  Plan p;
  const Streams s = add_streams(p);
  const std::string tail_facts =
      "{op} in pid {pid} ({process}): p50={p50}, p99={p99} ({tail_ratio} the median) over {n} calls; "
      "slow calls are those >= {slow}. ";

  // cpu_contention: slow calls overlap off-CPU time (preempted, or state not recorded) of their thread.
  {
    int id = tail_head(p, s.gpu_calls, o);
    id = join(p, id, s.offcpu_cpu, "offcpu", JoinKind::kOverlap, JoinKey::kTid);
    id = require_share(p, id, "offcpu", o.min_share);
    p.add(emit("cpu_contention", "cpu_contention",
               {{land(ge(ref("offcpu.share"), num(0.8, Unit::kPercent)), ge(ref("tail_ratio"), num(10))),
                 Severity::kHigh},
                {nullptr, Severity::kMedium}},
               "{op} p99={p99} ({tail_ratio} p50) in {process}: the calling thread was off CPU for "
               "{offcpu.share} of the slow-call time",
               "CPU contention: the thread issuing {op} lost its CPU while its slow calls were in flight",
               tail_facts + "{offcpu.hit_calls} of {offcpu.calls} slow calls overlap off-CPU spans of the SAME thread, "
                            "covering {offcpu.overlap_ns} of {offcpu.tail_ns} slow-call time ({offcpu.share}). "
                            "Spans are runnable-but-preempted, or of unrecorded state (Ingero traces do not say "
                            "why a thread was off CPU; live capture does).",
               {"Pin the training process and its launcher threads to dedicated cores "
                "(taskset -c / numactl --physcpubind)",
                "Move or renice CPU-heavy neighbours (nice -n 19, cgroup cpu.weight)",
                "Keep DataLoader num_workers below the cores actually free"}),
          {id});
  }
  // blocking: slow calls overlap time the thread spent blocked (sleeping or in disk wait).
  {
    int id = tail_head(p, s.gpu_calls, o);
    id = join(p, id, s.offcpu_blocked, "blocked", JoinKind::kOverlap, JoinKey::kTid);
    id = require_share(p, id, "blocked", o.min_share);
    p.add(emit("blocking", "blocking", {{nullptr, Severity::kMedium}},
               "{op} p99={p99} ({tail_ratio} p50) in {process}: the calling thread was blocked for "
               "{blocked.share} of the slow-call time",
               "The thread issuing {op} blocked (lock, futex, I/O wait) inside its slow calls",
               tail_facts +
                   "{blocked.hit_calls} of {blocked.calls} slow calls overlap spans in which the same thread "
                   "slept or waited on disk, covering {blocked.overlap_ns} of {blocked.tail_ns} ({blocked.share}).",
               {"Look at the stacks of the slow calls (get_stacks) for locks taken inside the CUDA call path",
                "Check for Python GIL contention between the training loop and other threads"}),
          {id});
  }
  // block_io: block I/O requests in flight during the slow calls (host-wide).
  {
    int id = tail_head(p, s.gpu_calls, o);
    id = join(p, id, s.io, "io", JoinKind::kOverlap, JoinKey::kNone);
    id = require_share(p, id, "io", o.min_share);
    p.add(emit("block_io", "block_io",
               {{ge(ref("io.share"), num(0.8, Unit::kPercent)), Severity::kHigh}, {nullptr, Severity::kMedium}},
               "{op} p99={p99} ({tail_ratio} p50) in {process}: block I/O was in flight for {io.share} of "
               "the slow-call time ({io.events} requests)",
               "Block I/O concurrent with the slow {op} calls (data loading, checkpointing or swap)",
               tail_facts + "{io.hit_calls} of {io.calls} slow calls overlap {io.events} block I/O requests, covering "
                            "{io.overlap_ns} of {io.tail_ns} ({io.share}).",
               {"Pre-load or cache the dataset (page cache, /dev/shm) and raise DataLoader prefetch_factor",
                "Write checkpoints asynchronously or to a separate device"}),
          {id});
  }
  // network: TCP retransmits within reach of the slow calls (host-wide).
  {
    int id = tail_head(p, s.gpu_calls, o);
    id = join(p, id, s.tcp, "tcp", JoinKind::kWithin, JoinKey::kNone, kTcpReach);
    id = require_share(p, id, "tcp", o.min_share);
    p.add(emit("tcp_retransmit", "network", {{nullptr, Severity::kMedium}},
               "{op} p99={p99} ({tail_ratio} p50) in {process}: {tcp.events} TCP retransmits within 200ms of "
               "slow calls ({tcp.share} of slow-call time)",
               "TCP retransmissions around the slow {op} calls (lossy or congested network)",
               tail_facts + "{tcp.hit_calls} of {tcp.calls} slow calls have a TCP retransmit within 200ms.",
               {"Check NIC errors and drops (ethtool -S, ip -s link) and the switch path",
                "For multi-node jobs check NCCL_SOCKET_IFNAME / IB settings so collectives avoid the lossy link"}),
          {id});
  }
  // socket_io: socket send/recv of the same process during the slow calls.
  {
    int id = tail_head(p, s.gpu_calls, o);
    id = join(p, id, s.net, "sock", JoinKind::kOverlap, JoinKey::kPid);
    id = require_share(p, id, "sock", o.min_share);
    p.add(emit("socket_io", "network", {{nullptr, Severity::kLow}},
               "{op} p99={p99} ({tail_ratio} p50) in {process}: socket I/O of the process overlaps "
               "{sock.share} of the slow-call time",
               "The process was sending or receiving on sockets during its slow {op} calls",
               tail_facts + "{sock.hit_calls} of {sock.calls} slow calls overlap {sock.events} socket calls.",
               {"Move data fetching / logging off the thread that feeds the GPU"}),
          {id});
  }
  // memory_pressure: page allocations during the slow calls (host-wide).
  {
    int id = tail_head(p, s.gpu_calls, o);
    id = join(p, id, s.mem, "mem", JoinKind::kWithin, JoinKey::kNone, 0);
    id = p.add(RequireNode{ge(ref("mem.sum_arg0"), num(kMemBytes, Unit::kBytes)), "mem.sum_arg0 >= 64MiB"}, {id});
    id = require_share(p, id, "mem", o.min_share);
    p.add(emit("memory_pressure", "memory_pressure", {{nullptr, Severity::kMedium}},
               "{op} p99={p99} ({tail_ratio} p50) in {process}: {mem.sum_arg0} of host page allocations "
               "during the slow calls",
               "Host memory pressure: heavy page allocation while the slow {op} calls ran",
               tail_facts + "{mem.hit_calls} of {mem.calls} slow calls saw {mem.events} page allocations "
                            "totalling {mem.sum_arg0}.",
               {"Use pinned (page-locked) host buffers allocated once, not per step",
                "Check free memory and swap; lower DataLoader workers or prefetch"}),
          {id});
  }
  // allocator: allocation latency climbing over consecutive windows.
  {
    int id = tumbling(p, s.allocs, kPerProcessOp, o);
    AggregateNode agg;
    agg.aggs = {{"n", AggKind::kCount, Field::kDuration, 0},
                {"p50", AggKind::kQuantile, Field::kDuration, 0.50},
                {"p99", AggKind::kQuantile, Field::kDuration, 0.99}};
    id = p.add(agg, {id});
    id = p.add(LetNode{{{"tail_ratio", div(ref("p99"), ref("p50"))}}}, {id});
    id = p.add(RequireNode{ge(ref("n"), num(3)), "count() >= 3"}, {id});
    id = p.add(TrendNode{"p99", 3, TrendMode::kRising, 0}, {id});
    id = p.add(RequireNode{ge(ref("trend.change"), num(2, Unit::kRatio)), "trend.change >= 2x"}, {id});
    p.add(emit("allocator_climb", "allocator",
               {{ge(ref("trend.change"), num(5, Unit::kRatio)), Severity::kHigh}, {nullptr, Severity::kMedium}},
               "{op} p99 climbed {trend.change} over 3 windows in {process} ({trend.first} -> {trend.last})",
               "Allocator latency climbing: device memory allocation gets slower window after window",
               "{op} p99 rose in each of 3 consecutive windows, from {trend.first} to {trend.last}; p50 is now "
               "{p50} over {n} calls. Typical causes: fragmentation, allocations growing with the step, or the "
               "caching allocator missing and falling through to the driver.",
               {"Allocate once and reuse buffers; avoid cudaMalloc/cudaFree inside the step",
                "With PyTorch, check torch.cuda.memory_stats() for allocation retries and set "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}),
          {id});
  }
  // throughput_drop: launch rate below 0.6x its recent peak.
  {
    int id = tumbling(p, s.launches, kPerProcessOp, o);
    AggregateNode agg;
    agg.aggs = {{"n", AggKind::kCount, Field::kDuration, 0}, {"rate", AggKind::kRate, Field::kDuration, 0}};
    id = p.add(agg, {id});
    id = p.add(TrendNode{"rate", 3, TrendMode::kBelowPeak, 0.6}, {id});
    id = p.add(RequireNode{ge(ref("trend.peak"), num(10, Unit::kPerSecond)), "trend.peak >= 10/s"}, {id});
    id = p.add(LetNode{{{"drop", div(ref("rate"), ref("trend.peak"))}}}, {id});
    p.add(emit("throughput_drop", "throughput_drop",
               {{lt(ref("drop"), num(0.3, Unit::kRatio)), Severity::kHigh}, {nullptr, Severity::kMedium}},
               "{op} rate fell to {rate} in {process}, {drop} of its recent peak {trend.peak}",
               "Throughput drop: the process launches GPU work far less often than it did moments ago",
               "{op} ran {n} times in this window ({rate}) against a peak of {trend.peak} in the previous "
               "3 windows. The GPU is being fed less: look for input starvation (DataLoader), blocking on the "
               "host, or a phase change in the job.",
               {"Check whether the input pipeline keeps up (DataLoader workers, pin_memory, prefetch)",
                "Compare with off-CPU and blocking chains for the same process and window"}),
          {id});
  }
  // straggler: one rank's CUDA API time is an outlier among its peers (same window).
  {
    int id = tumbling(p, s.gpu_calls, {Field::kRank}, o);
    AggregateNode agg;
    agg.aggs = {{"n", AggKind::kCount, Field::kDuration, 0}, {"busy", AggKind::kSum, Field::kDuration, 0}};
    id = p.add(agg, {id});
    id = p.add(RequireNode{ge(ref("n"), num(10)), "count() >= 10"}, {id});
    PeerNode peer;
    peer.group = Field::kRank;
    peer.value = "busy";
    peer.z = 3.5;
    peer.floor = 20e6;
    peer.min_peers = 3;
    id = p.add(peer, {id});
    p.add(emit("rank_straggler", "straggler", {{nullptr, Severity::kHigh}},
               "rank {rank} spent {busy} in CUDA calls, {peer.z} MADs above the median of {peer.peers} ranks "
               "({peer.median})",
               "A straggling rank: its pre-collective work takes longer than its peers', so every all-reduce "
               "waits for it",
               "In this window rank {rank} spent {busy} in CUDA/driver calls against a median of {peer.median} "
               "across {peer.peers} ranks (modified z = {peer.z}).",
               {"Check that rank's host: CPU contention, thermal throttling, a slower GPU or PCIe link",
                "Compare its chains (cpu_contention, block_io) with the other ranks' in the same window"}),
          {id});
  }
  // unexplained_tail: a heavy tail that no host signal covers.
  {
    int id = tail_head(p, s.gpu_calls, o);
    id = join(p, id, s.offcpu_all, "offcpu", JoinKind::kOverlap, JoinKey::kTid);
    id = join(p, id, s.io, "io", JoinKind::kOverlap, JoinKey::kNone);
    id = join(p, id, s.tcp, "tcp", JoinKind::kWithin, JoinKey::kNone, kTcpReach);
    id = join(p, id, s.net, "sock", JoinKind::kOverlap, JoinKey::kPid);
    id = p.add(LetNode{{{"explained", bin(ExprOp::kMax, bin(ExprOp::kMax, ref("offcpu.share"), ref("io.share")),
                                          bin(ExprOp::kMax, ref("tcp.share"), ref("sock.share")))}}},
               {id});
    char label[64];
    std::snprintf(label, sizeof label, "explained < %g%%", o.min_share * 100);
    id = p.add(RequireNode{lt(ref("explained"), num(o.min_share, Unit::kPercent)), label}, {id});
    p.add(emit("unexplained_tail", "unexplained_tail",
               {{ge(ref("tail_ratio"), num(10)), Severity::kMedium}, {nullptr, Severity::kLow}},
               "{op} p99={p99} ({tail_ratio} p50) in {process}: no host signal explains the tail "
               "(off-CPU {offcpu.share}, block I/O {io.share}, TCP {tcp.share}, sockets {sock.share})",
               "Not host contention: the slow {op} calls ran on CPU with no I/O or network in the way, so "
               "the time is spent inside the CUDA library/driver or waiting on the GPU",
               tail_facts +
                   "Off-CPU time of the calling thread covers only {offcpu.share} of the slow-call time; block "
                   "I/O {io.share}; TCP retransmits {tcp.share}; socket I/O {sock.share}. Blaming CPU "
                   "contention here would be wrong.",
               {"Profile the slow calls' stacks (get_stacks) and a Nsight Systems timeline of the same step",
                "Look for implicit synchronisation: cudaMalloc/cudaFree in the loop, .item()/.cpu() calls, "
                "pageable-memory copies, a full launch queue"}),
          {id});
  }
  return p;
}

}  // namespace ingero
