// Tests of ip_stacks (no BPF): the libdw unwinder on stack windows captured from this process and
// from a child that has exited, the symbolizer (libc, demangled C++, dlopen after the snapshot,
// kernel symbols), and the CPython introspection against every interpreter on the machine.
//
// The captures imitate what the BPF programs hand over: ip/sp/bp plus a copy of the stack from sp
// upward. Tests that read another process's memory skip with the reason when /proc/PID/mem or
// ptrace is not allowed.
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bpf/pyintrospect.h"
#include "bpf/symbolizer.h"
#include "bpf/unwind.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace ingero;
using namespace ingero::bpf;

// ---------------------------------------------------------------------------------------------
// Capturing our own stack, as a uprobe would.

struct Captured {
  UserRegs regs;
  std::vector<uint8_t> stack;
};

// The end of the mapping that holds `addr` in this process (the top of the stack), 0 if unknown.
static uint64_t mapping_end(uint64_t addr) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long s = 0, e = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &s, &e) == 2 && addr >= s && addr < e) return e;
  }
  return 0;
}

// Registers at the capture point, then the copy (made by a callee: it only writes below sp).
#define UST_CAPTURE_REGS(c)                                                                       \
  do {                                                                                            \
    uint64_t ip_, sp_, bp_;                                                                       \
    asm volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(ip_), "=r"(sp_), "=r"(bp_)); \
    (c)->regs = UserRegs{ip_, sp_, bp_};                                                          \
  } while (0)

extern "C" {
__attribute__((noinline)) void ust_copy_stack(Captured* c) {
  const uint64_t sp = c->regs.sp;
  const uint64_t top = mapping_end(sp);
  const size_t n = top > sp ? std::min<uint64_t>(16384, top - sp) : 0;
  c->stack.resize(n);
  std::memcpy(c->stack.data(), reinterpret_cast<const void*>(sp), n);
}

__attribute__((noinline, optimize("omit-frame-pointer"))) void ust_capture(Captured* c) {
  UST_CAPTURE_REGS(c);
  ust_copy_stack(c);
  asm volatile("" ::: "memory");
}

// Three levels without frame pointers (the -O2 default on x86-64) and three with them. Each
// does work after the call so the compiler cannot turn it into a tail call.
__attribute__((noinline, optimize("omit-frame-pointer"))) int ust_nofp_level3(Captured* c) {
  ust_capture(c);
  asm volatile("" ::: "memory");
  return static_cast<int>(c->stack.size() & 1) + 3;
}
__attribute__((noinline, optimize("omit-frame-pointer"))) int ust_nofp_level2(Captured* c) {
  int r = ust_nofp_level3(c);
  asm volatile("" ::: "memory");
  return r + 2;
}
__attribute__((noinline, optimize("omit-frame-pointer"))) int ust_nofp_level1(Captured* c) {
  int r = ust_nofp_level2(c);
  asm volatile("" ::: "memory");
  return r + 1;
}

__attribute__((noinline, optimize("no-omit-frame-pointer"))) void ust_capture_fp(Captured* c) {
  UST_CAPTURE_REGS(c);
  ust_copy_stack(c);
  asm volatile("" ::: "memory");
}
__attribute__((noinline, optimize("no-omit-frame-pointer"))) int ust_fp_level3(Captured* c) {
  ust_capture_fp(c);
  asm volatile("" ::: "memory");
  return static_cast<int>(c->stack.size() & 1) + 3;
}
__attribute__((noinline, optimize("no-omit-frame-pointer"))) int ust_fp_level2(Captured* c) {
  int r = ust_fp_level3(c);
  asm volatile("" ::: "memory");
  return r + 2;
}
__attribute__((noinline, optimize("no-omit-frame-pointer"))) int ust_fp_level1(Captured* c) {
  int r = ust_fp_level2(c);
  asm volatile("" ::: "memory");
  return r + 1;
}
}

namespace ingero_stacktest {
struct Widget {
  __attribute__((noinline)) int frob(int x);
};
int Widget::frob(int x) {
  asm volatile("" ::: "memory");
  return x * 3;
}
}  // namespace ingero_stacktest

static std::string dump(const std::vector<StackFrame>& fr) {
  std::ostringstream os;
  for (const StackFrame& f : fr) {
    os << "  " << frame_kind_name(f.kind) << " " << (f.function.empty() ? "?" : f.function) << " ["
       << f.module << "]";
    if (!f.file.empty()) os << " " << f.file << ":" << f.line;
    if (f.ip) os << " ip=0x" << std::hex << f.ip << std::dec;
    os << "\n";
  }
  return os.str();
}

// Index of the first frame named `fn`, or -1.
static long find_frame(const std::vector<StackFrame>& fr, const std::string& fn, size_t from = 0) {
  for (size_t i = from; i < fr.size(); ++i)
    if (fr[i].function == fn) return static_cast<long>(i);
  return -1;
}

static void expect_chain(const std::vector<StackFrame>& fr, const std::vector<std::string>& chain) {
  long at = -1;
  for (const std::string& fn : chain) {
    const long i = find_frame(fr, fn, static_cast<size_t>(at + 1));
    ASSERT_GE(i, 0) << fn << " missing (or out of order) in:\n" << dump(fr);
    if (at >= 0) {
      EXPECT_EQ(i, at + 1) << fn << " not directly after the previous frame:\n" << dump(fr);
    }
    at = i;
  }
}

TEST(Unwind, OwnStackWithoutFramePointers) {
  Captured c;
  ASSERT_GT(ust_nofp_level1(&c), 0);
  ASSERT_GE(c.stack.size(), 1024u);
  Symbolizer sym;
  ASSERT_TRUE(sym.note_process(static_cast<uint32_t>(getpid())));
  Unwinder uw(sym);
  bool truncated = false;
  const auto ips = uw.unwind(static_cast<uint32_t>(getpid()), c.regs, c.stack, 128, truncated);
  ASSERT_FALSE(ips.empty());
  EXPECT_EQ(ips[0], c.regs.ip);
  const auto fr = sym.symbolize_user(static_cast<uint32_t>(getpid()), ips);
  expect_chain(fr, {"ust_capture", "ust_nofp_level3", "ust_nofp_level2", "ust_nofp_level1"});
  // The walk goes on into gtest and ends at the test binary's main or libc's start.
  EXPECT_GE(ips.size(), 8u) << dump(fr);
  EXPECT_EQ(fr[0].module, fs::path(fs::read_symlink("/proc/self/exe")).filename().string());
}

TEST(Unwind, OwnStackWithFramePointersAndFpCrossCheck) {
  Captured c;
  ASSERT_GT(ust_fp_level1(&c), 0);
  Symbolizer sym;
  ASSERT_TRUE(sym.note_process(static_cast<uint32_t>(getpid())));
  Unwinder uw(sym);
  bool truncated = false;
  const auto ips = uw.unwind(static_cast<uint32_t>(getpid()), c.regs, c.stack, 128, truncated);
  const auto fr = sym.symbolize_user(static_cast<uint32_t>(getpid()), ips);
  expect_chain(fr, {"ust_capture_fp", "ust_fp_level3", "ust_fp_level2", "ust_fp_level1"});
  // The frame-pointer walk over the same copy finds the same return addresses, in the same order,
  // as long as the chain of saved rbp lasts (it ends in the test body, built without them).
  const auto fp = Unwinder::unwind_fp(c.regs, c.stack, 64);
  ASSERT_GE(fp.size(), 4u);
  ASSERT_GE(ips.size(), 4u);
  const auto fpfr = sym.symbolize_user(static_cast<uint32_t>(getpid()), fp);
  expect_chain(fpfr, {"ust_capture_fp", "ust_fp_level3", "ust_fp_level2", "ust_fp_level1"});
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(fp[i], ips[i]) << "frame " << i;
}

TEST(Unwind, MaxFramesAndShortWindowSetTruncated) {
  Captured c;
  ust_nofp_level1(&c);
  Symbolizer sym;
  sym.note_process(static_cast<uint32_t>(getpid()));
  Unwinder uw(sym);
  bool truncated = false;
  auto ips = uw.unwind(static_cast<uint32_t>(getpid()), c.regs, c.stack, 3, truncated);
  EXPECT_EQ(ips.size(), 3u);
  EXPECT_TRUE(truncated);
  // A window that ends inside level2's frame: the walk stops there, flagged.
  const std::vector<uint8_t> small(c.stack.begin(), c.stack.begin() + 64);
  truncated = false;
  ips = uw.unwind(static_cast<uint32_t>(getpid()), c.regs, small, 128, truncated);
  EXPECT_TRUE(truncated);
  EXPECT_LT(ips.size(), 6u);
  // Full window, generous limit: reaches the outermost frame, not truncated.
  truncated = true;
  ips = uw.unwind(static_cast<uint32_t>(getpid()), c.regs, c.stack, 256, truncated);
  const auto fr = sym.symbolize_user(static_cast<uint32_t>(getpid()), ips);
  EXPECT_FALSE(truncated) << dump(fr);
}

TEST(Unwind, GarbageNeverThrows) {
  Symbolizer sym;
  sym.note_process(static_cast<uint32_t>(getpid()));
  Unwinder uw(sym);
  std::vector<uint8_t> junk(4096, 0xab);
  bool truncated = false;
  auto ips = uw.unwind(static_cast<uint32_t>(getpid()), UserRegs{0x1234, 0x7000, 0}, junk, 64, truncated);
  EXPECT_LE(ips.size(), 2u);
  ips = uw.unwind(999999999u, UserRegs{0x1234, 0x7000, 0}, junk, 64, truncated);  // no such pid
  EXPECT_LE(ips.size(), 1u);
  const auto fr = sym.symbolize_user(999999999u, std::vector<uint64_t>{0x1234, 0});
  ASSERT_EQ(fr.size(), 2u);
  EXPECT_TRUE(fr[0].function.empty());
  EXPECT_EQ(fr[0].ip, 0x1234u);
}

TEST(Symbolizer, LibcAndDemangledCpp) {
  Symbolizer sym;
  const uint32_t pid = static_cast<uint32_t>(getpid());
  ASSERT_TRUE(sym.note_process(pid));
  int (*frob)(ingero_stacktest::Widget*, int) = nullptr;
  auto pm = &ingero_stacktest::Widget::frob;
  std::memcpy(&frob, &pm, sizeof frob);
  const std::vector<uint64_t> ips = {reinterpret_cast<uint64_t>(&getpid),
                                     reinterpret_cast<uint64_t>(frob) + 1};
  const auto fr = sym.symbolize_user(pid, ips);
  ASSERT_EQ(fr.size(), 2u);
  EXPECT_TRUE(fr[0].function == "getpid" || fr[0].function == "__getpid") << dump(fr);
  EXPECT_EQ(fr[0].module, "libc.so.6");
  EXPECT_EQ(fr[0].offset, 0u);
  EXPECT_EQ(fr[1].function, "ingero_stacktest::Widget::frob(int)") << dump(fr);
  EXPECT_EQ(fr[1].offset, 1u);
  EXPECT_EQ(demangle("_ZN3foo3barEv"), "foo::bar()");
  EXPECT_EQ(demangle("plain_c"), "plain_c");
  EXPECT_FALSE(sym.build_id_at(pid, ips[0]).empty());
}

TEST(Symbolizer, LibraryLoadedAfterSnapshotRereadsMaps) {
  const char* cudart = "/usr/local/cuda/lib64/libcudart.so.13";
  if (!fs::exists(cudart)) GTEST_SKIP() << cudart << " not present";
  Symbolizer sym;
  const uint32_t pid = static_cast<uint32_t>(getpid());
  ASSERT_TRUE(sym.note_process(pid));
  void* h = dlopen(cudart, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  void* fn = dlsym(h, "cudaGetDeviceCount");
  ASSERT_NE(fn, nullptr);
  const auto before = sym.stats().maps_rereads;
  const auto fr = sym.symbolize_user(pid, std::vector<uint64_t>{reinterpret_cast<uint64_t>(fn)});
  EXPECT_EQ(fr[0].function, "cudaGetDeviceCount") << dump(fr);
  EXPECT_EQ(fr[0].module, "libcudart.so.13");
  EXPECT_GE(sym.stats().maps_rereads, before + 1);  // the dlopen is caught on demand (when not already mapped)
}

TEST(Symbolizer, KernelSymbols) {
  std::ifstream in("/proc/kallsyms");
  std::string addr, type, name;
  uint64_t sched = 0;
  while (in >> addr >> type >> name) {
    if (name == "schedule" && (type == "T" || type == "t")) {
      sched = std::strtoull(addr.c_str(), nullptr, 16);
      break;
    }
    in.ignore(1 << 20, '\n');
  }
  if (sched == 0) GTEST_SKIP() << "kernel addresses hidden in /proc/kallsyms (needs CAP_SYSLOG)";
  Symbolizer sym;
  const auto fr = sym.symbolize_kernel(std::vector<uint64_t>{sched + 4});
  ASSERT_EQ(fr.size(), 1u);
  EXPECT_EQ(fr[0].kind, FrameKind::kKernel);
  EXPECT_EQ(fr[0].function, "schedule");
  EXPECT_EQ(fr[0].offset, 4u);
}

// ---------------------------------------------------------------------------------------------
// A child (this binary, re-executed with IP_STACKS_CHILD=1) captures its own stack, writes it to
// stdout and exits; the parent resolves it after the child is gone, from the snapshot.

__attribute__((noinline)) static void child_main() {
  char go = 0;
  std::printf("ready\n");
  std::fflush(stdout);
  if (read(0, &go, 1) != 1) _exit(2);
  Captured c;
  ust_nofp_level1(&c);
  const uint64_t hdr[4] = {c.regs.ip, c.regs.sp, c.regs.bp, c.stack.size()};
  if (write(1, hdr, sizeof hdr) != sizeof hdr) _exit(3);
  if (write(1, c.stack.data(), c.stack.size()) != static_cast<ssize_t>(c.stack.size())) _exit(4);
  _exit(0);
}

static const int kChildHook = [] {
  if (std::getenv("IP_STACKS_CHILD") != nullptr) child_main();
  return 0;
}();

static bool read_full(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

TEST(Symbolizer, ExitedChildResolvesFromSnapshot) {
  (void)kChildHook;
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  posix_spawn_file_actions_addclose(&fa, to_child[1]);
  posix_spawn_file_actions_addclose(&fa, from_child[0]);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.push_back(*e);
  env_s.push_back("IP_STACKS_CHILD=1");
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  char* argv[] = {const_cast<char*>(self.c_str()), nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, self.c_str(), &fa, nullptr, argv, envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(to_child[0]);
  close(from_child[1]);
  char ready[6] = {0};
  ASSERT_TRUE(read_full(from_child[0], ready, 6));
  Symbolizer sym;
  ASSERT_TRUE(sym.note_process(static_cast<uint32_t>(child)));  // while it is alive
  ASSERT_EQ(write(to_child[1], "g", 1), 1);
  uint64_t hdr[4];
  ASSERT_TRUE(read_full(from_child[0], hdr, sizeof hdr));
  ASSERT_LE(hdr[3], 16384u);
  std::vector<uint8_t> stack(hdr[3]);
  ASSERT_TRUE(read_full(from_child[0], stack.data(), stack.size()));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(to_child[1]);
  close(from_child[0]);
  ASSERT_FALSE(fs::exists("/proc/" + std::to_string(child)));  // gone (reaped)

  Unwinder uw(sym);
  bool truncated = false;
  const auto ips = uw.unwind(static_cast<uint32_t>(child), UserRegs{hdr[0], hdr[1], hdr[2]}, stack, 128, truncated);
  const auto fr = sym.symbolize_user(static_cast<uint32_t>(child), ips);
  expect_chain(fr, {"ust_capture", "ust_nofp_level3", "ust_nofp_level2", "ust_nofp_level1", "child_main()"});
  EXPECT_GE(find_frame(fr, "_start"), 0) << dump(fr);  // the outermost frame (the hook runs before main)
  EXPECT_FALSE(truncated);
}
