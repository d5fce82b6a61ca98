// Privileged tests of stacks captured in BPF at the event (LiveSource with StackOptions): a
// Python script (tests/workloads/cuda_stacks.py) calls the real libcudart through ctypes from
// known file:function:line sites, under every CPython 3.10-3.13 found in pyenv and Debian's
// python3; the stored stacks must hold exactly those Python frames and lines, and native frames
// with the probed libcudart function and libffi's call path. Also: a process that exits right
// after its calls still resolves; a 200-deep recursion is truncated and flagged; a fast call under
// the threshold stores no stack; an off-CPU span of a thread blocked in a futex carries the
// kernel stack. Each test skips with the reason when not root, BPF cannot be loaded, or the
// toolkit's libcudart / an interpreter is missing.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "bpf/live_source.h"
#include "model/ops.h"
#include "model/stack.h"
#include "tests/util/child_process.h"
#include "tests/util/run_command.h"
#include "tests/util/tracer.h"

extern char** environ;

using namespace ingero;
using namespace ingero::bpf;

namespace {

const char* kCudart = "/usr/local/cuda/lib64/libcudart.so.13";

std::string script_path() { return std::string(IP_SOURCE_DIR) + "/tests/workloads/cuda_stacks.py"; }

// SITE:name -> line number in the script.
std::map<std::string, uint32_t> sites() {
  std::map<std::string, uint32_t> m;
  std::ifstream in(script_path());
  std::string line;
  for (uint32_t n = 1; std::getline(in, line); ++n) {
    const size_t p = line.find("# SITE:");
    if (p != std::string::npos) m[line.substr(p + 7, line.find_first_of(" \t", p + 7) - p - 7)] = n;
  }
  return m;
}

std::vector<std::string> interpreters() {
  std::vector<std::string> out;
  for (const char* v : {"3.10", "3.11", "3.12", "3.13"}) {
    std::error_code ec;
    for (const auto& d : std::filesystem::directory_iterator("/root/.pyenv/versions", ec)) {
      const std::string name = d.path().filename().string();
      if (name.rfind(std::string(v) + ".", 0) == 0 && name.find('t') == std::string::npos) {
        const std::string exe = d.path().string() + "/bin/python" + v;
        if (::access(exe.c_str(), X_OK) == 0) {
          out.push_back(exe);
          break;
        }
      }
    }
  }
  if (::access("/usr/bin/python3", X_OK) == 0) out.push_back("/usr/bin/python3");
  return out;
}

using ingero::test::Child;

struct ScriptRun {
  std::vector<Event> events;
  TraceMeta meta;
  LiveStats stats;
  std::vector<std::string> warnings;
  std::string output;
  uint64_t held_after = 0;    // BpfProbes::held_offcpu_spans() once the script's threads are gone
  std::string sys_exit_kind;  // how held off-CPU spans are sent: "classic", "tp_btf" or ""
  size_t exit_syscalls = 0;   // classic syscall exit tracepoints attached for them
  uint32_t pid = 0;
};

LiveOptions options(uint32_t pid, uint64_t stack_min_ns, bool sched, uint32_t sample_hz) {
  LiveOptions o;
  o.probes.filter = FilterMode::kPids;
  o.probes.pids = {pid};
  auto& f = o.probes.families;
  f.driver = f.nccl = f.graph = f.block = f.tcp = f.net = f.memory = f.wakeup = false;
  f.sched = sched;
  o.probes.stacks.call_min_ns = stack_min_ns;
  o.probes.stacks.offcpu_min_ns = sched ? 100'000'000 : UINT64_MAX;
  o.probes.stacks.sample_hz = sample_hz;
  o.discovery.explicit_paths = {kCudart};
  o.discovery.use_maps = o.discovery.use_ldcache = false;
  o.discovery.use_toolkit = o.discovery.use_wheels = false;
  return o;
}

// Runs the script under `python` in `mode` with the live source attached; false + why to skip.
// `script`: another script with the same protocol (empty: cuda_stacks.py).
bool run_script(const std::string& python, const std::string& mode, uint64_t stack_min_ns, bool sched, ScriptRun& r,
                std::string& why, uint32_t sample_hz = 0, const std::string& script = "") {
  if (::geteuid() != 0) {
    why = "needs root (BPF uprobes)";
    return false;
  }
  if (::access(kCudart, R_OK) != 0) {
    why = std::string("no CUDA toolkit runtime at ") + kCudart;
    return false;
  }
  Child child;
  if (!child.spawn({python, script.empty() ? script_path() : script, kCudart, mode})) {
    why = "cannot start " + python;
    return false;
  }
  r.pid = static_cast<uint32_t>(child.pid);
  std::string err;
  auto src = LiveSource::start(options(r.pid, stack_min_ns, sched, sample_hz), err);
  if (!src) {
    why = "BPF unavailable: " + err;
    return false;
  }
  if (src->stats().uprobes == 0) {
    why = std::string("no uprobe attached to ") + kCudart;
    return false;
  }
  std::thread collector([&] {
    Batch b;
    while (src->next(b)) {
      r.events.insert(r.events.end(), b.events.begin(), b.events.end());
      if (b.final) break;
    }
  });
  child.go();
  EXPECT_EQ(child.finish(), 0) << child.output;
  r.output = child.output;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  src->stop();
  collector.join();
  r.meta = src->meta();
  r.stats = src->stats();
  r.warnings = src->take_warnings();
  r.held_after = src->probes().held_offcpu_spans();
  for (const auto& [name, kind] : src->probes().tracepoints())
    if (name == "sys_exit") r.sys_exit_kind = kind;
  r.exit_syscalls = src->probes().offcpu_exit_syscalls();
  return true;
}

std::vector<const Event*> calls(const ScriptRun& r, uint8_t op) {
  std::vector<const Event*> v;
  for (const Event& e : r.events)
    if (e.source == Source::kCuda && e.op == op && e.pid == r.pid) v.push_back(&e);
  return v;
}

ParsedStack stack_of(const ScriptRun& r, const Event& e) {
  auto it = r.meta.stacks.find(e.stack_id);
  if (it == r.meta.stacks.end()) return {};
  return parse_stack(it->second);
}

std::vector<StackFrame> python_frames(const ParsedStack& st) {
  std::vector<StackFrame> v;
  for (const auto& f : st.frames)
    if (f.kind == FrameKind::kPython) v.push_back(f);
  return v;
}

std::string describe(const ParsedStack& st) {
  std::string s;
  for (const auto& f : st.frames)
    s += std::string("  ") + frame_kind_name(f.kind) + " " + f.module + " " + f.function + " " + f.file + ":" +
         std::to_string(f.line) + "\n";
  return s;
}

bool has_native(const ParsedStack& st, const std::string& fn_prefix, const std::string& module) {
  for (const auto& f : st.frames)
    if (f.kind == FrameKind::kNative && f.function.rfind(fn_prefix, 0) == 0 &&
        (module.empty() || f.module.find(module) != std::string::npos))
      return true;
  return false;
}

std::string base(const std::string& p) { return p.substr(p.find_last_of('/') + 1); }

}  // namespace

// Python frames with exact lines, main thread and a threading.Thread, every interpreter.
TEST(LiveStacks, PythonAndNativeFramesEveryInterpreter) {
  const auto lines = sites();
  ASSERT_TRUE(lines.count("launch") && lines.count("main1") && lines.count("worker"));
  const auto pythons = interpreters();
  if (pythons.empty()) GTEST_SKIP() << "no CPython 3.10-3.13 found (pyenv or /usr/bin/python3)";
  int ran = 0;
  for (const std::string& py : pythons) {
    SCOPED_TRACE(py);
    ScriptRun r;
    std::string why;
    if (!run_script(py, "main", 0, false, r, why)) {
      if (ran == 0) GTEST_SKIP() << why;
      FAIL() << why;
    }
    ++ran;
    unsigned main_tid = 0, worker_tid = 0;
    std::istringstream(r.output.substr(r.output.find("tid ") + 4)) >> main_tid >> worker_tid;
    ASSERT_NE(main_tid, 0u) << r.output;
    const auto evs = calls(r, op::kCudaDeviceSync);
    ASSERT_GE(evs.size(), 4u) << "cudaDeviceSynchronize calls seen";
    int main_seen = 0, worker_seen = 0;
    for (const Event* e : evs) {
      ASSERT_NE(e->stack_id, 0u) << "a call without a stack (--stack-min 0)";
      const ParsedStack st = stack_of(r, *e);
      ASSERT_FALSE(st.frames.empty());
      // The probed function first, then the caller's native frames through libffi.
      EXPECT_EQ(st.frames[0].function, "cudaDeviceSynchronize") << describe(st);
      EXPECT_EQ(st.frames[0].module, "libcudart.so.13") << describe(st);
      EXPECT_TRUE(has_native(st, "ffi_call", "libffi")) << describe(st);
      const auto pf = python_frames(st);
      ASSERT_GE(pf.size(), 3u) << describe(st);
      for (const auto& f : pf) EXPECT_FALSE(f.file.empty()) << describe(st);
      EXPECT_EQ(base(pf[0].file), "cuda_stacks.py");
      EXPECT_EQ(pf[0].function, "launch");
      EXPECT_EQ(pf[0].line, lines.at("launch")) << describe(st);
      EXPECT_EQ(pf[1].function, "step");
      EXPECT_EQ(pf[1].line, lines.at("step")) << describe(st);
      if (e->tid == main_tid) {
        ++main_seen;
        ASSERT_EQ(pf.size(), 4u) << describe(st);
        EXPECT_EQ(pf[2].function, "run");
        EXPECT_TRUE(pf[2].line == lines.at("main1") || pf[2].line == lines.at("main2")) << describe(st);
        EXPECT_EQ(pf[3].function, "<module>");
        EXPECT_EQ(pf[3].line, lines.at("module")) << describe(st);
      } else {
        ++worker_seen;
        EXPECT_EQ(pf[2].function, "worker_body");
        EXPECT_TRUE(pf[2].line == lines.at("worker") || pf[2].line == lines.at("worker2")) << describe(st);
        EXPECT_EQ(base(pf[3].file), "threading.py") << describe(st);
      }
    }
    EXPECT_EQ(main_seen, 2);
    EXPECT_EQ(worker_seen, 2);
    std::string names;
    for (const auto& [t, n] : r.meta.thread_names) names += std::to_string(t) + "=" + n + " ";
    EXPECT_TRUE(r.meta.thread_names.count(main_tid)) << "thread names: " << names;
  }
}

// The process exits right after its calls: still symbolized (maps + ELFs noted at start, strings
// and line tables read in BPF at the event).
TEST(LiveStacks, ExitedProcessStillResolves) {
  ScriptRun r;
  std::string why;
  if (!run_script("/usr/bin/python3", "exit", 0, false, r, why)) GTEST_SKIP() << why;
  const auto lines = sites();
  const auto evs = calls(r, op::kCudaDeviceSync);
  ASSERT_EQ(evs.size(), 2u);
  for (const Event* e : evs) {
    const ParsedStack st = stack_of(r, *e);
    EXPECT_TRUE(has_native(st, "ffi_call", "libffi")) << describe(st);
    const auto pf = python_frames(st);
    ASSERT_EQ(pf.size(), 4u) << describe(st);
    EXPECT_EQ(pf[0].line, lines.at("launch"));
    EXPECT_TRUE(pf[2].line == lines.at("exit1") || pf[2].line == lines.at("exit2"));
  }
}

// A 200-deep recursion: cut at the walk's bound and flagged.
TEST(LiveStacks, DeepRecursionTruncatedAndFlagged) {
  ScriptRun r;
  std::string why;
  if (!run_script("/usr/bin/python3", "recurse", 0, false, r, why)) GTEST_SKIP() << why;
  const auto lines = sites();
  const auto evs = calls(r, op::kCudaDeviceSync);
  ASSERT_EQ(evs.size(), 1u);
  const ParsedStack st = stack_of(r, *evs[0]);
  EXPECT_TRUE(st.truncated);
  const auto pf = python_frames(st);
  ASSERT_EQ(pf.size(), static_cast<size_t>(IP_PY_MAX));
  EXPECT_EQ(pf[0].function, "launch");
  EXPECT_EQ(pf[1].function, "recurse");
  EXPECT_EQ(pf[1].line, lines.at("bottom"));
  EXPECT_EQ(pf[2].line, lines.at("recurse"));
}

// With the default threshold (1 ms), fast calls store no stack.
TEST(LiveStacks, FastCallUnderThresholdHasNoStack) {
  ScriptRun r;
  std::string why;
  if (!run_script("/usr/bin/python3", "main", 1'000'000, false, r, why)) GTEST_SKIP() << why;
  int fast = 0;
  for (const Event* e : calls(r, op::kCudaDeviceSync)) {
    if (e->dur_ns < 1'000'000) {
      ++fast;
      EXPECT_EQ(e->stack_id, 0u) << "dur " << e->dur_ns;
    } else {
      EXPECT_NE(e->stack_id, 0u) << "a slow call without its stack";
    }
  }
  EXPECT_GE(fast, 1);
}

// A thread blocked in a futex (threading.Event().wait(0.3)): its off-CPU span carries the kernel
// stack it slept in.
TEST(LiveStacks, OffCpuSpanInFutexHasKernelStack) {
  ScriptRun r;
  std::string why;
  if (!run_script("/usr/bin/python3", "block", UINT64_MAX, true, r, why)) GTEST_SKIP() << why;
  bool found = false;
  std::string seen;
  for (const Event& e : r.events) {
    if (e.source != Source::kHost || e.op != op::kSchedSwitch || e.pid != r.pid) continue;
    if (e.dur_ns < 250'000'000) continue;
    ASSERT_NE(e.stack_id, 0u) << "a long off-CPU span without its stack";
    const ParsedStack st = stack_of(r, e);
    seen += describe(st) + "--\n";
    ASSERT_FALSE(st.frames.empty());
    EXPECT_EQ(st.frames[0].kind, FrameKind::kKernel);
    EXPECT_EQ(st.frames[0].function.rfind("bpf_", 0), std::string::npos) << "the capture's own frames are dropped\n"
                                                                         << describe(st);
    for (const auto& f : st.frames)
      if (f.kind == FrameKind::kKernel && f.function.find("futex") != std::string::npos) found = true;
  }
  EXPECT_TRUE(found) << seen;
  // Every held span was released (sent or flushed when its thread exited): the counter that lets
  // the sys_exit program skip its map lookup is back to 0, neither leaked nor wrapped below it.
  EXPECT_EQ(r.held_after, 0u);
  // Sent from the futex's return: by the classic sys_exit_futex tracepoint where tracefs has it
  // (not the raw sys_exit, which would run on every uretprobe return too). The user side is the
  // full unwind with the Python frames of the waiting line.
  if (::access("/sys/kernel/tracing/events/syscalls/sys_exit_futex", R_OK) == 0) {
    EXPECT_EQ(r.sys_exit_kind, "classic");
    EXPECT_GT(r.exit_syscalls, 10u);
  }
  EXPECT_NE(seen.find("threading.py:"), std::string::npos) << seen;
  EXPECT_NE(seen.find("cuda_stacks.py:" + std::to_string(sites().at("wait"))), std::string::npos) << seen;
}

// A long block in a syscall with no exit program (openat of a FIFO, not on the loader's list):
// the span is held like any other, then flushed at the thread's next switch-out or exit with the
// stacks taken at switch-out, never leaked (the held counter is back to 0).
TEST(LiveStacks, OffCpuSpanInUnlistedSyscallIsFlushed) {
  char dir[] = "/tmp/ip_fifo_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string script = std::string(dir) + "/fifo_block.py";
  {
    std::ofstream out(script);
    out << "import os, sys, threading, time\n"
           "fifo = os.path.join(os.path.dirname(sys.argv[0]), 'fifo')\n"
           "os.mkfifo(fifo)\n"
           "def writer():\n"
           "    time.sleep(0.3)\n"
           "    os.close(os.open(fifo, os.O_WRONLY))\n"
           "print('ready', flush=True)\n"
           "sys.stdin.readline()\n"
           "t = threading.Thread(target=writer)\n"
           "t.start()\n"
           "os.close(os.open(fifo, os.O_RDONLY))  # blocks in openat until the writer opens\n"
           "t.join()\n"
           "print('tid %d 0' % threading.get_native_id(), flush=True)\n";
  }
  ScriptRun r;
  std::string why;
  const bool ran = run_script("/usr/bin/python3", "fifo", UINT64_MAX, true, r, why, 0, script);
  std::filesystem::remove_all(dir);
  if (!ran) GTEST_SKIP() << why;
  bool in_fifo_open = false;
  std::string seen;
  for (const Event& e : r.events) {
    if (e.source != Source::kHost || e.op != op::kSchedSwitch || e.pid != r.pid) continue;
    if (e.dur_ns < 250'000'000) continue;
    ASSERT_NE(e.stack_id, 0u) << "a long off-CPU span without its stack";
    const ParsedStack st = stack_of(r, e);
    seen += describe(st) + "--\n";
    bool fifo = false, open = false;
    for (const auto& f : st.frames) {
      if (f.kind != FrameKind::kKernel) continue;
      fifo |= f.function.find("fifo") != std::string::npos;
      open |= f.function.find("openat") != std::string::npos;
    }
    in_fifo_open |= fifo && open;
  }
  EXPECT_TRUE(in_fifo_open) << "no long span blocked in openat of the FIFO\n" << seen;
  EXPECT_EQ(r.held_after, 0u);
}

// The CPU-clock sampler: a thread busy in pure Python (spin()) is sampled with its Python frames,
// and nothing outside the traced process is.
TEST(LiveStacks, CpuSamplesNameTheBusyPythonFunction) {
  ScriptRun r;
  std::string why;
  if (!run_script("/usr/bin/python3", "busy", UINT64_MAX, false, r, why, 99)) GTEST_SKIP() << why;
  const auto lines = sites();
  int samples = 0, in_spin = 0;
  for (const Event& e : r.events) {
    if (e.source != Source::kHost || e.op != op::kCpuSample) continue;
    EXPECT_EQ(e.pid, r.pid) << "a sample of an untraced process";
    ++samples;
    if (!e.stack_id) continue;
    const auto pf = python_frames(stack_of(r, e));
    if (!pf.empty() && pf[0].function == "spin") {
      ++in_spin;
      // Inside spin(): nearly always on the loop's line; rarely on one of the two lines before it
      // (each call runs them once: `end = time.perf_counter() + ...`, `x = 0`), or on the `def spin`
      // line, which CPython reports for a frame being entered, before its first instruction ran.
      // (A sample on `x = 0`, line 55, failed one clean-clone run of the suite on 2026-11-23.)
      const uint32_t def_line = lines.at("spin") - 3;
      EXPECT_TRUE(pf[0].line >= def_line && pf[0].line <= lines.at("spin"))
          << "line " << pf[0].line << ", expected " << def_line << "-" << lines.at("spin") << " (spin's lines)";
      ASSERT_GE(pf.size(), 2u);
      EXPECT_EQ(pf[1].function, "run");
      EXPECT_EQ(pf[1].line, lines.at("busy"));
    }
  }
  // 20 rounds x 30 ms of spin at 99 Hz: ~59 samples when the thread has a CPU to itself; fewer
  // on a loaded machine (spin() measures wall time, samples count CPU time).
  EXPECT_GE(samples, 10);
  EXPECT_GE(in_spin, samples / 2) << in_spin << " of " << samples << " samples in spin()";
}

#ifdef IP_PIPELINE_BIN
// End to end through the binary: a Python thread alternates 1 s of launches with 1 s of pure-Python
// work in spin(). `trace` (default stacks and samples) stores the trace; `explain --json` has a
// launch_gap chain whose launching thread was on CPU most of the window and whose top sampled
// stack is in spin().
TEST(LiveStacks, TraceCommandLaunchGapIsOnCpuInTheBusyFunction) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (BPF uprobes)";
  if (::access(kCudart, R_OK) != 0) GTEST_SKIP() << "no CUDA toolkit runtime at " << kCudart;
  Child child;
  if (!child.spawn({"/usr/bin/python3", script_path(), kCudart, "phases", "2"}))
    GTEST_SKIP() << "cannot start /usr/bin/python3";
  // The claim under test is "the busy thread's gaps are spent on CPU". On a loaded machine (CI
  // beside other builds) the scheduler would preempt it and the split would rightly say so; the
  // highest priority keeps it on a CPU, so what the test sees is the workload, not the neighbours.
  // The tracer runs at the same priority, or the workload would starve it of the other CPU.
  const std::string pid = std::to_string(child.pid);
  ingero::test::Tracer tracer(IP_PIPELINE_BIN, "trace_stacks");
  const std::string& db = tracer.db;
  tracer.start({"--pid", pid, "--cuda-lib", kCudart}, -20);
  ASSERT_GT(tracer.pid, 0);
  if (!tracer.wait_attached()) GTEST_SKIP() << "trace did not attach: " << tracer.log();
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(child.pid), -20);
  child.go();
  EXPECT_EQ(child.finish(), 0) << child.output;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int rc = tracer.interrupt();
  const std::string log = tracer.log();
  EXPECT_EQ(rc, 0) << log;

  const std::string cmd = std::string(IP_PIPELINE_BIN) + " explain --json --db " + db + " 2>/dev/null";
  const std::string out = ingero::test::capture(cmd);
  const auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out.substr(0, 500);
  // Every gap: the thread wanted the CPU the whole time (on CPU, or preempted when this shared
  // machine is loaded); at least one gap is on-CPU dominant.
  int gaps = 0, on_cpu = 0;
  for (const auto& c : j["chains"]) {
    if (c.value("category", "") != "launch_gap" || c.value("pid", 0u) != static_cast<unsigned>(std::stoul(pid)))
      continue;
    ++gaps;
    ASSERT_TRUE(c.contains("time_split")) << c.dump();
    const auto& ts = c["time_split"];
    EXPECT_GT(ts.value("on_cpu", 0.0) + ts.value("off_cpu_preempted", 0.0), 0.9) << ts.dump();
    if (ts.value("dominant", "") == "on_cpu") ++on_cpu;
    std::string top_sample_fn;
    for (const auto& st : c["stacks"]) {
      if (st.value("role", "") != "sample") continue;
      for (const auto& f : st["frames"])
        if (f.value("kind", "") == "python") {
          top_sample_fn = f.value("function", "");
          break;
        }
      break;  // the top one
    }
    EXPECT_EQ(top_sample_fn, "spin") << c["stacks"].dump().substr(0, 2000);
  }
  EXPECT_GE(gaps, 1) << out.substr(0, 3000);
  EXPECT_GE(on_cpu, 1) << "no launch_gap chain with on_cpu dominant";
}
#endif

// Unprivileged: compact CPython str data of each kind -> UTF-8 (what BPF copies for file names and
// qualified names).
TEST(StackResolverUnit, PyStrKindsToUtf8) {
  EXPECT_EQ(py_str_utf8("train.py", 8, 1), "train.py");
  const char latin1[] = {'c', static_cast<char>(0xe9)};  // "cé"
  EXPECT_EQ(py_str_utf8(latin1, 2, 1), "c\xc3\xa9");
  const char16_t ucs2[] = {u'\u4e2d', u'x'};  // "中x"
  EXPECT_EQ(py_str_utf8(reinterpret_cast<const char*>(ucs2), 4, 2), "\xe4\xb8\xadx");
  const char32_t ucs4[] = {U'\U0001F600'};
  EXPECT_EQ(py_str_utf8(reinterpret_cast<const char*>(ucs4), 4, 4), "\xf0\x9f\x98\x80");
  EXPECT_EQ(py_str_utf8(reinterpret_cast<const char*>(ucs2), 3, 2), "\xe4\xb8\xad");  // odd tail cut
  EXPECT_EQ(py_str_utf8("abc", 3, 3), "");                                            // not a kind
}
