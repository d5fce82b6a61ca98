// Tests of ip_stacks (no BPF): the libdw unwinder on stack windows captured from this process and
// from a child that has exited, the symbolizer (libc, demangled C++, dlopen after the snapshot,
// kernel symbols), and the CPython introspection against every interpreter on the machine.
//
// The captures imitate what the BPF programs hand over: ip/sp/bp plus a copy of the stack from sp
// upward. Tests that read another process's memory skip with the reason when /proc/PID/mem or
// ptrace is not allowed.
#include <dlfcn.h>
#include <fcntl.h>
#include <gelf.h>
#include <gtest/gtest.h>
#include <libelf.h>
#include <signal.h>
#include <spawn.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
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
#define UST_CAPTURE_REGS(c)                                                                               \
  do {                                                                                                    \
    uint64_t ip_, sp_, bp_;                                                                               \
    asm volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(ip_), "=r"(sp_), "=r"(bp_)); \
    (c)->regs = UserRegs{ip_, sp_, bp_};                                                                  \
  } while (0)

extern "C" {
// Copies raw stack memory above sp, as the kernel's stack copy does: it reads other frames'
// padding and, under AddressSanitizer, their redzones, so the copy is byte by byte through a
// volatile pointer in a function ASan does not instrument (memcpy would go through its
// interceptor, which checks the source).
__attribute__((noinline, no_sanitize_address)) void ust_copy_stack(Captured* c) {
  const uint64_t sp = c->regs.sp;
  const uint64_t top = mapping_end(sp);
  const size_t n = top > sp ? std::min<uint64_t>(16384, top - sp) : 0;
  c->stack.resize(n);
  const volatile auto* src = reinterpret_cast<const volatile uint8_t*>(sp);
  for (size_t i = 0; i < n; ++i) c->stack[i] = src[i];
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
    os << "  " << frame_kind_name(f.kind) << " " << (f.function.empty() ? "?" : f.function) << " [" << f.module << "]";
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

extern "C" __attribute__((noinline)) int ust_sqlite_cb(void* arg, int, char**, char**) {
  ust_capture(static_cast<Captured*>(arg));
  asm volatile("" ::: "memory");
  return 0;
}

TEST(Unwind, ThroughALibraryLoadedAfterTheSnapshot) {
  // libsqlite3 is not linked into this test: dlopen it after the snapshot and capture the stack
  // inside a callback that sqlite3_exec calls, so the walk needs the new library's CFI.
  const uint32_t pid = static_cast<uint32_t>(getpid());
  Symbolizer sym;
  ASSERT_TRUE(sym.note_process(pid));
  Unwinder uw(sym);
  void* h = dlopen("libsqlite3.so.0", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) GTEST_SKIP() << "libsqlite3.so.0 not loadable: " << dlerror();
  using open_fn = int (*)(const char*, void**);
  using exec_fn = int (*)(void*, const char*, int (*)(void*, int, char**, char**), void*, char**);
  using close_fn = int (*)(void*);
  auto sq_open = reinterpret_cast<open_fn>(dlsym(h, "sqlite3_open"));
  auto sq_exec = reinterpret_cast<exec_fn>(dlsym(h, "sqlite3_exec"));
  auto sq_close = reinterpret_cast<close_fn>(dlsym(h, "sqlite3_close"));
  ASSERT_TRUE(sq_open && sq_exec && sq_close);
  void* db = nullptr;
  ASSERT_EQ(sq_open(":memory:", &db), 0);
  Captured c;
  ASSERT_EQ(sq_exec(db, "select 1", ust_sqlite_cb, &c, nullptr), 0);
  sq_close(db);
  ASSERT_FALSE(c.stack.empty());
  bool truncated = false;
  const auto ips = uw.unwind(pid, c.regs, c.stack, 128, truncated);
  const auto fr = sym.symbolize_user(pid, ips);
  expect_chain(fr, {"ust_capture", "ust_sqlite_cb"});
  const long exec = find_frame(fr, "sqlite3_exec");
  ASSERT_GE(exec, 2) << dump(fr);
  EXPECT_EQ(fr[static_cast<size_t>(exec)].module.rfind("libsqlite3.so", 0), 0u) << dump(fr);
  // ...and on past it, back into this test and down to the end.
  EXPECT_GE(find_frame(fr, "Unwind_ThroughALibraryLoadedAfterTheSnapshot_Test::TestBody()"), exec) << dump(fr);
  EXPECT_FALSE(truncated) << dump(fr);
  EXPECT_GE(sym.stats().maps_rereads, 1u);
}

TEST(Symbolizer, LibcAndDemangledCpp) {
  Symbolizer sym;
  const uint32_t pid = static_cast<uint32_t>(getpid());
  ASSERT_TRUE(sym.note_process(pid));
  int (*frob)(ingero_stacktest::Widget*, int) = nullptr;
  auto pm = &ingero_stacktest::Widget::frob;
  std::memcpy(&frob, &pm, sizeof frob);
  const std::vector<uint64_t> ips = {reinterpret_cast<uint64_t>(&getpid), reinterpret_cast<uint64_t>(frob) + 1};
  const auto fr = sym.symbolize_user(pid, ips);
  ASSERT_EQ(fr.size(), 2u);
  EXPECT_TRUE(fr[0].function == "getpid" || fr[0].function == "__getpid") << dump(fr);
  EXPECT_EQ(fr[0].module, "libc.so.6");
  EXPECT_EQ(fr[0].offset, 0u);
  EXPECT_EQ(fr[1].function, "ingero_stacktest::Widget::frob(int)") << dump(fr);
  EXPECT_EQ(fr[1].offset, 1u);
  EXPECT_EQ(demangle("_ZN3foo3barEv"), "foo::bar()");
  EXPECT_EQ(demangle("plain_c"), "plain_c");
  const std::string bid = sym.build_id_at(pid, ips[0]);
  ASSERT_FALSE(bid.empty());
  // With Debian's libc6-dbg installed, the line comes from the separate debug file, found by
  // build-id locally (never through debuginfod).
  if (fs::exists("/usr/lib/debug/.build-id/" + bid.substr(0, 2) + "/" + bid.substr(2) + ".debug")) {
    EXPECT_FALSE(fr[0].file.empty()) << dump(fr);
    EXPECT_GT(fr[0].line, 0u);
  }
  // This binary has no DWARF in Release builds; with -g the test function's file is this file.
  if (!fr[1].file.empty()) {
    EXPECT_NE(fr[1].file.find("stacks_userspace_test.cpp"), std::string::npos) << dump(fr);
  }
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

TEST(Symbolizer, VdsoResolves) {
  const uint64_t base = getauxval(AT_SYSINFO_EHDR);
  if (base == 0) GTEST_SKIP() << "no vDSO in this process";
  const uint64_t end = mapping_end(base);
  ASSERT_GT(end, base);
  std::vector<char> image(reinterpret_cast<const char*>(base), reinterpret_cast<const char*>(end));
  elf_version(EV_CURRENT);
  Elf* e = elf_memory(image.data(), image.size());
  ASSERT_NE(e, nullptr);
  uint64_t value = 0;
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(e, scn)) != nullptr) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_DYNSYM) continue;
    Elf_Data* d = elf_getdata(scn, nullptr);
    for (size_t i = 0; d && i < sh.sh_size / sh.sh_entsize; ++i) {
      GElf_Sym sym;
      if (gelf_getsym(d, static_cast<int>(i), &sym) == nullptr) continue;
      const char* n = elf_strptr(e, sh.sh_link, sym.st_name);
      if (n && std::strcmp(n, "__vdso_clock_gettime") == 0) value = sym.st_value;
    }
  }
  elf_end(e);
  if (value == 0) GTEST_SKIP() << "no __vdso_clock_gettime in this kernel's vDSO";
  Symbolizer sym;
  const auto fr = sym.symbolize_user(static_cast<uint32_t>(getpid()), std::vector<uint64_t>{base + value + 2});
  EXPECT_EQ(fr[0].module, "[vdso]") << dump(fr);
  EXPECT_TRUE(fr[0].function == "__vdso_clock_gettime" || fr[0].function == "clock_gettime") << dump(fr);
  EXPECT_EQ(fr[0].offset, 2u);
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
  // Once forgotten, the gone process's addresses no longer resolve (nothing to re-read), and
  // nothing throws; the ELF stays cached for the next process of the same binary.
  const auto opened = sym.stats().elf_opened;
  sym.forget_process(static_cast<uint32_t>(child));
  const auto gone = sym.symbolize_user(static_cast<uint32_t>(child), ips);
  ASSERT_EQ(gone.size(), ips.size());
  EXPECT_TRUE(gone[0].function.empty());
  EXPECT_EQ(gone[0].ip, ips[0]);
  ASSERT_TRUE(sym.note_process(static_cast<uint32_t>(getpid())));
  EXPECT_GT(sym.stats().cache_hits, 0u);  // this binary, libc, libstdc++: already open
  EXPECT_GE(sym.stats().elf_opened, opened);
}

// ---------------------------------------------------------------------------------------------
// CPython: every interpreter of 3.10-3.13 on the machine (pyenv) and Debian's python3.

#include <nlohmann/json.hpp>

struct PyInterp {
  std::string label;  // test name suffix
  std::string path;
  int minor;
};

static std::vector<PyInterp> interpreters() {
  std::vector<PyInterp> out;
  for (int minor = 10; minor <= 13; ++minor) {
    std::string found;
    std::error_code ec;
    const fs::path root = "/root/.pyenv/versions";
    if (fs::is_directory(root, ec))
      for (const auto& d : fs::directory_iterator(root, ec)) {
        const std::string v = d.path().filename().string();
        if (v.rfind("3." + std::to_string(minor) + ".", 0) != 0) continue;
        const fs::path exe = d.path() / "bin" / ("python3." + std::to_string(minor));
        if (fs::exists(exe, ec)) found = exe.string();
      }
    out.push_back({"pyenv3" + std::to_string(minor), found, minor});
  }
  out.push_back({"debian_python3", fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "", 0});
  return out;
}

static std::string workload(const char* name) { return std::string(INGERO_SOURCE_DIR) + "/tests/workloads/" + name; }

// Line numbers of the "@marker" comments of a script.
static std::map<std::string, uint32_t> markers(const std::string& path) {
  std::map<std::string, uint32_t> out;
  std::ifstream in(path);
  std::string line;
  uint32_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    const size_t at = line.find("# @");
    if (at != std::string::npos) out[line.substr(at + 3)] = n;
  }
  return out;
}

// A child process with pipes to its stdin/stdout, killed and reaped by the destructor.
struct Child {
  pid_t pid = -1;
  int in = -1, out = -1;
  bool start(const std::vector<std::string>& args) {
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, a[0], 0);
    posix_spawn_file_actions_adddup2(&fa, b[1], 1);
    posix_spawn_file_actions_addclose(&fa, a[1]);
    posix_spawn_file_actions_addclose(&fa, b[0]);
    std::vector<char*> argv;
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid, args[0].c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(a[0]);
    close(b[1]);
    in = a[1];
    out = b[0];
    return rc == 0;
  }
  std::string read_line() {
    std::string s;
    char c;
    while (read(out, &c, 1) == 1 && c != '\n') s.push_back(c);
    return s;
  }
  std::string read_all() {
    std::string s;
    char buf[65536];
    ssize_t r;
    while ((r = read(out, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(r));
    return s;
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (in >= 0) close(in);
    if (out >= 0) close(out);
  }
};

// gtest prints the parameter in test listings: the label, not the bytes.
void PrintTo(const PyInterp& p, std::ostream* os) { *os << p.label; }

class PyStacks : public ::testing::TestWithParam<PyInterp> {};

static std::string fdump(const std::vector<StackFrame>& fr) {
  std::ostringstream os;
  for (const auto& f : fr) os << "  " << f.file << ":" << f.line << " in " << f.function << "\n";
  return os.str();
}

TEST_P(PyStacks, WalksMainThreadAndThreadWithExactLines) {
  const PyInterp& py = GetParam();
  if (py.path.empty()) GTEST_SKIP() << py.label << ": interpreter not installed on this machine";
  const std::string script = workload("py_stack_target.py");
  const auto mk = markers(script);
  Child c;
  ASSERT_TRUE(c.start({py.path, script}));
  std::istringstream ready(c.read_line());
  std::string word;
  uint32_t pid = 0, thread_tid = 0;
  ready >> word >> pid >> thread_tid;
  ASSERT_EQ(word, "ready");
  ASSERT_EQ(pid, static_cast<uint32_t>(c.pid));
  {
    std::ifstream mem("/proc/" + std::to_string(pid) + "/mem");
    if (!mem) GTEST_SKIP() << "cannot read /proc/" << pid << "/mem (needs root or ptrace rights)";
  }
  std::string why;
  auto p = inspect_python(pid, why);
  ASSERT_TRUE(p) << py.path << ": " << why;
  if (py.minor) {
    EXPECT_EQ(p->minor, py.minor);
  }
  EXPECT_LT(p->tss_key, 32u);
  EXPECT_NE(p->code_type_addr, 0u);

  const std::vector<StackFrame> want_main = {
      {FrameKind::kPython, "grüße_inner", script, mk.at("main_block"), "", 0, 0},
      {FrameKind::kPython, "outer", script, mk.at("main_call"), "", 0, 0},
      {FrameKind::kPython, "<module>", script, mk.at("module_call"), "", 0, 0},
  };
  const std::string body = p->minor >= 11 ? "Worker.body" : "body";
  const std::vector<StackFrame> want_thread = {
      {FrameKind::kPython, "wait_в_потоке", script, mk.at("thread_block"), "", 0, 0},
      {FrameKind::kPython, body, script, mk.at("thread_call"), "", 0, 0},
  };
  auto same = [](const std::vector<StackFrame>& got, const std::vector<StackFrame>& want, bool exact_size) {
    if (exact_size ? got.size() != want.size() : got.size() < want.size()) return false;
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i].function != want[i].function || got[i].file != want[i].file || got[i].line != want[i].line ||
          got[i].kind != FrameKind::kPython)
        return false;
    return true;
  };
  // The process printed "ready" just before entering the blocking calls: retry briefly until both
  // threads stand still at their blocking lines.
  std::vector<StackFrame> main_fr, thr_fr;
  for (int i = 0; i < 60; ++i) {
    main_fr = py_walk_thread(*p, pid, why);
    thr_fr = py_walk_thread(*p, thread_tid, why);
    if (same(main_fr, want_main, true) && same(thr_fr, want_thread, false)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(same(main_fr, want_main, true)) << py.path << " main thread:\n" << fdump(main_fr) << why;
  EXPECT_TRUE(same(thr_fr, want_thread, false)) << py.path << " thread:\n" << fdump(thr_fr) << why;
  ASSERT_GE(thr_fr.size(), 3u);
  EXPECT_TRUE(thr_fr[2].file.size() > 12 && thr_fr[2].file.ends_with("threading.py")) << fdump(thr_fr);
  EXPECT_EQ(thr_fr[2].function, p->minor >= 11 ? "Thread.run" : "run");

  // The TSS path (what BPF does: fsbase + 0x310 + 16*key + 8) finds the same thread states as the
  // interpreter's own thread list matched by native_thread_id (3.11+).
  for (uint32_t tid : {pid, thread_tid}) {
    std::string w;
    const auto fs_base = thread_fsbase(pid, tid, w);
    ASSERT_TRUE(fs_base) << w;
    const uint64_t via_tss = py_tstate_via_tss(*p, *fs_base);
    EXPECT_NE(via_tss, 0u) << "tid " << tid;
    const auto all = py_thread_states(*p, 64, w);
    EXPECT_NE(std::find(all.begin(), all.end(), via_tss), all.end()) << "tid " << tid;
    bool trunc = false;
    const auto fr = py_walk_tstate(*p, via_tss, 256, trunc, w);
    EXPECT_TRUE(same(fr, tid == pid ? want_main : want_thread, tid == pid)) << fdump(fr);
    if (p->minor >= 11) {
      uint64_t ntid = 0;
      std::ifstream mem("/proc/" + std::to_string(pid) + "/mem", std::ios::binary);
      mem.seekg(static_cast<std::streamoff>(via_tss + p->off.tstate_native_thread_id));
      mem.read(reinterpret_cast<char*>(&ntid), 8);
      EXPECT_EQ(ntid, tid);
    }
  }
  // A walk limited to 2 frames is flagged truncated.
  bool trunc = false;
  const auto all = py_thread_states(*p, 64, why);
  ASSERT_FALSE(all.empty());
  std::string w;
  const auto fs_base = thread_fsbase(pid, pid, w);
  ASSERT_TRUE(fs_base);
  const auto two = py_walk_tstate(*p, py_tstate_via_tss(*p, *fs_base), 2, trunc, w);
  EXPECT_EQ(two.size(), 2u);
  EXPECT_TRUE(trunc);
}

// Issue 43 item 2: what BPF uses to register a process of an interpreter by itself at its first
// stack (inspect_python_binary, read from the files alone), applied the way stack.bpf.h applies it
// (load bias from the kernel's start_code, /proc/PID/stat field 26; the GOT slot of Py_BytesMain
// for a shared libpython), finds the same _PyRuntime inspect_python validates in the live process.
TEST_P(PyStacks, BinaryRecipeFindsTheRuntimeOfALiveProcess) {
  const PyInterp& py = GetParam();
  if (py.path.empty()) GTEST_SKIP() << py.label << ": interpreter not installed on this machine";
  std::string why;
  const auto b = inspect_python_binary(py.path, "", why);
  ASSERT_TRUE(b) << py.path << ": " << why;
  if (py.minor) {
    EXPECT_EQ(b->minor, py.minor);
  }
  struct stat st {};
  ASSERT_EQ(stat(py.path.c_str(), &st), 0);
  EXPECT_EQ(b->ino, static_cast<uint64_t>(st.st_ino));
  EXPECT_EQ(b->size, static_cast<uint64_t>(st.st_size));
  // Every candidate list holds each interpreter the tests use (resolved through its links).
  const auto cands = python_interpreter_candidates();
  EXPECT_NE(std::find(cands.begin(), cands.end(), fs::canonical(py.path).string()), cands.end()) << py.path;

  Child c;
  ASSERT_TRUE(c.start({py.path, workload("py_stack_target.py")}));
  std::istringstream ready(c.read_line());
  std::string word;
  uint32_t pid = 0;
  ready >> word >> pid;
  ASSERT_EQ(word, "ready");
  std::ifstream mem("/proc/" + std::to_string(pid) + "/mem", std::ios::binary);
  if (!mem) GTEST_SKIP() << "cannot read /proc/" << pid << "/mem (needs root or ptrace rights)";
  const auto p = inspect_python(pid, why);
  ASSERT_TRUE(p) << why;
  EXPECT_EQ(p->minor, b->minor);
  EXPECT_EQ(fs::canonical(p->module), fs::canonical(b->module));
  std::ifstream stat_file("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat_file, line);
  std::istringstream fields(line.substr(line.rfind(')') + 2));  // field 3 on
  std::string f;
  uint64_t start_code = 0;
  for (int i = 3; fields >> f; ++i)
    if (i == 26) {
      start_code = std::stoull(f);
      break;
    }
  ASSERT_NE(start_code, 0u) << line;
  const uint64_t bias = start_code - b->text_vaddr;
  uint64_t base = bias;
  if (b->got_vaddr != 0) {
    mem.seekg(static_cast<std::streamoff>(bias + b->got_vaddr));
    mem.read(reinterpret_cast<char*>(&base), 8);
    ASSERT_TRUE(mem.good());
  }
  EXPECT_EQ(base + static_cast<uint64_t>(b->runtime_off), p->runtime_addr)
      << py.path << " module " << b->module << " got " << b->got_vaddr;
}

TEST(PyIntrospect, BinaryRecipeRefusesWhatIsNotCPython) {
  std::string why;
  EXPECT_FALSE(inspect_python_binary("/proc/self/exe", "", why));
  EXPECT_FALSE(why.empty());
  why.clear();
  EXPECT_FALSE(inspect_python_binary("/nonexistent/python3.12", "", why));
  EXPECT_NE(why.find("cannot stat"), std::string::npos) << why;
}

TEST_P(PyStacks, LineTableDecoderMatchesTheInterpreter) {
  const PyInterp& py = GetParam();
  if (py.path.empty()) GTEST_SKIP() << py.label << ": interpreter not installed on this machine";
  Child c;
  ASSERT_TRUE(c.start({py.path, workload("py_linetable_dump.py")}));
  close(c.in);
  c.in = -1;
  std::istringstream all(c.read_all());
  int minor = py.minor;
  if (minor == 0) {  // Debian's python3: ask it
    Child v;
    ASSERT_TRUE(v.start({py.path, "-c", "import sys; print(sys.version_info[1])"}));
    minor = std::stoi(v.read_line());
  }
  std::string line;
  size_t codes = 0, checked = 0, wrong = 0;
  while (std::getline(all, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    const std::string hexs = j["table"];
    std::vector<uint8_t> table;
    for (size_t i = 0; i + 1 < hexs.size(); i += 2)
      table.push_back(static_cast<uint8_t>(std::stoul(hexs.substr(i, 2), nullptr, 16)));
    const auto& lines = j["lines"];
    ++codes;
    for (size_t u = 0; u < lines.size(); ++u) {
      const uint32_t want = lines[u].get<uint32_t>();
      const uint32_t got = python_line(minor, table, j["first"].get<int>(), static_cast<uint32_t>(2 * u));
      ++checked;
      if (got != want && ++wrong <= 5)
        ADD_FAILURE() << j["name"] << " unit " << u << ": decoded " << got << ", CPython says " << want;
    }
  }
  EXPECT_GT(codes, 50u);
  EXPECT_GT(checked, 2000u);
  EXPECT_EQ(wrong, 0u);
}

INSTANTIATE_TEST_SUITE_P(Interpreters, PyStacks, ::testing::ValuesIn(interpreters()),
                         [](const ::testing::TestParamInfo<PyInterp>& i) { return i.param.label; });

TEST(PyIntrospect, StringKinds) {
  const PyOffsets* o12 = py_offsets_for(12);
  const PyOffsets* o10 = py_offsets_for(10);
  ASSERT_TRUE(o12 && o10);
  EXPECT_EQ(py_offsets_for(9), nullptr);
  EXPECT_EQ(py_offsets_for(14), nullptr);
  auto make = [](const PyOffsets& o, uint32_t kind, bool ascii, const std::vector<uint32_t>& cps) {
    std::vector<uint8_t> b(ascii ? o.str_ascii_data : o.str_compact_data, 0);
    const int64_t len = static_cast<int64_t>(cps.size());
    std::memcpy(b.data() + 16, &len, 8);
    const uint32_t state = (kind << 2) | (1u << 5) | (ascii ? 1u << 6 : 0);
    std::memcpy(b.data() + o.str_state, &state, 4);
    for (uint32_t cp : cps)
      for (uint32_t k = 0; k < kind; ++k) b.push_back(static_cast<uint8_t>(cp >> (8 * k)));
    return b;
  };
  EXPECT_EQ(py_string(*o12, make(*o12, 1, true, {'a', 'b', 'c'})), "abc");
  EXPECT_EQ(py_string(*o10, make(*o10, 1, true, {'x', '.', 'p', 'y'})), "x.py");
  EXPECT_EQ(py_string(*o12, make(*o12, 1, false, {0xfc, 'b'})), "üb");
  EXPECT_EQ(py_string(*o10, make(*o10, 2, false, {0x0432})), "в");
  EXPECT_EQ(py_string(*o12, make(*o12, 4, false, {0x1F600})), "\xF0\x9F\x98\x80");
  // Truncated read: decodes what is there; garbage state: empty.
  auto t = make(*o12, 1, true, {'a', 'b', 'c', 'd'});
  t.resize(t.size() - 2);
  EXPECT_EQ(py_string(*o12, t), "ab");
  std::vector<uint8_t> junk(64, 0xff);
  EXPECT_EQ(py_string(*o12, junk), "");
  EXPECT_EQ(py_string(*o12, std::vector<uint8_t>(8, 0)), "");
}

TEST(PyIntrospect, RefusesNonPythonProcess) {
  std::string why;
  EXPECT_FALSE(inspect_python(static_cast<uint32_t>(getpid()), why));
  EXPECT_NE(why.find("not a CPython process"), std::string::npos) << why;
  EXPECT_FALSE(inspect_python(999999999u, why));
  EXPECT_FALSE(why.empty());
}

// ---------------------------------------------------------------------------------------------
// Native unwinding of a real interpreter (no frame pointers anywhere): stop the thread blocked in
// libc read() called through ctypes, copy its registers and 16 KiB of stack as the BPF side does,
// and unwind from .eh_frame through libffi, _ctypes and the eval loop to _start.

#include <sys/ptrace.h>
#include <sys/user.h>

static bool capture_thread(uint32_t tid, UserRegs& regs, std::vector<uint8_t>& stack, std::string& why) {
  const pid_t t = static_cast<pid_t>(tid);
  if (ptrace(PTRACE_SEIZE, t, nullptr, nullptr) != 0) {
    why = std::string("PTRACE_SEIZE: ") + std::strerror(errno);
    return false;
  }
  bool ok = false;
  int st = 0;
  if (ptrace(PTRACE_INTERRUPT, t, nullptr, nullptr) == 0 && waitpid(t, &st, __WALL) == t) {
    user_regs_struct r;
    if (ptrace(PTRACE_GETREGS, t, nullptr, &r) == 0) {
      regs = UserRegs{r.rip, r.rsp, r.rbp};
      std::ifstream mem("/proc/" + std::to_string(tid) + "/mem", std::ios::binary);
      stack.assign(16384, 0);
      size_t got = 0;
      // Read page by page up to the first unreadable one (above the top of the stack).
      while (got < stack.size()) {
        const uint64_t a = regs.sp + got;
        const size_t chunk = std::min<size_t>(4096 - (a & 4095), stack.size() - got);
        mem.clear();
        mem.seekg(static_cast<std::streamoff>(a));
        if (!mem.read(reinterpret_cast<char*>(stack.data() + got), static_cast<std::streamsize>(chunk))) break;
        got += chunk;
      }
      stack.resize(std::min(got, stack.size()));
      ok = !stack.empty();
      if (!ok) why = "cannot read the thread's stack";
    } else {
      why = std::string("PTRACE_GETREGS: ") + std::strerror(errno);
    }
  } else {
    why = "the thread did not stop";
  }
  ptrace(PTRACE_DETACH, t, nullptr, nullptr);
  return ok;
}

TEST_P(PyStacks, NativeUnwindThroughCtypesAndTheEvalLoop) {
  const PyInterp& py = GetParam();
  if (py.path.empty()) GTEST_SKIP() << py.label << ": interpreter not installed on this machine";
  const std::string script = workload("py_ctypes_block.py");
  const auto mk = markers(script);
  Child c;
  ASSERT_TRUE(c.start({py.path, script}));
  std::istringstream ready(c.read_line());
  std::string word;
  uint32_t pid = 0;
  ready >> word >> pid;
  ASSERT_EQ(word, "ready");
  std::string why;
  auto p = inspect_python(pid, why);
  if (!p && why.find("/mem") != std::string::npos) GTEST_SKIP() << why;
  ASSERT_TRUE(p) << why;
  Symbolizer sym;
  ASSERT_TRUE(sym.note_process(pid));
  Unwinder uw(sym);
  std::vector<StackFrame> fr, pyfr;
  bool truncated = true;
  for (int i = 0; i < 60; ++i) {  // until the thread sits in read()
    UserRegs regs;
    std::vector<uint8_t> stack;
    if (!capture_thread(pid, regs, stack, why)) GTEST_SKIP() << "cannot stop the thread: " << why;
    const auto ips = uw.unwind(pid, regs, stack, 256, truncated);
    fr = sym.symbolize_user(pid, ips);
    pyfr = py_walk_thread(*p, pid, why);
    if (find_frame(fr, "ffi_call") >= 0 && !pyfr.empty() && pyfr[0].line == mk.at("ctypes_block")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // libc read -> libffi (ffi_call_unix64, ffi_call_int, ffi_call) -> _ctypes -> the eval loop -> _start.
  const long ffi = find_frame(fr, "ffi_call");
  ASSERT_GE(ffi, 0) << dump(fr);
  EXPECT_EQ(fr[static_cast<size_t>(ffi)].module.rfind("libffi.so", 0), 0u) << dump(fr);
  // ffi_call_unix64 / ffi_call_int are local symbols of a stripped libffi (.dynsym only): they
  // stay unresolved, but the unwind passes through them (CFI) and keeps the module.
  ASSERT_GE(ffi, 1);
  const StackFrame& inner = fr[static_cast<size_t>(ffi) - 1];
  EXPECT_EQ(inner.module, fr[static_cast<size_t>(ffi)].module) << dump(fr);
  if (inner.function.empty()) {  // module-relative, not the ASLR'd address
    EXPECT_GT(inner.ip, 0u);
    EXPECT_LT(inner.ip, 1u << 24) << dump(fr);
  }
  EXPECT_EQ(fr[0].function.find("read"), fr[0].function.size() - 4) << dump(fr);
  bool ctypes_mod = false;
  for (const auto& f : fr) ctypes_mod |= f.module.rfind("_ctypes", 0) == 0;
  EXPECT_TRUE(ctypes_mod) << "no frame in the _ctypes extension:\n" << dump(fr);
  EXPECT_GE(find_frame(fr, "_PyEval_EvalFrameDefault"), 0) << dump(fr);
  EXPECT_EQ(fr.back().function, "_start") << dump(fr);
  EXPECT_FALSE(truncated);
  // And the Python frames of the same moment, GIL released inside the ctypes call.
  ASSERT_EQ(pyfr.size(), 3u) << fdump(pyfr);
  EXPECT_EQ(pyfr[0].function, "call_read");
  EXPECT_EQ(pyfr[0].line, mk.at("ctypes_block"));
  EXPECT_EQ(pyfr[1].function, "level2");
  EXPECT_EQ(pyfr[1].line, mk.at("ctypes_call"));
  EXPECT_EQ(pyfr[2].function, "<module>");
  EXPECT_EQ(pyfr[2].line, mk.at("ctypes_module"));
}

TEST(PyIntrospect, DecodersSurviveRandomInput) {
  // The tables and strings come from another process's memory: any bytes must decode to something
  // bounded (or nothing), never crash or loop.
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int round = 0; round < 2000; ++round) {
    std::vector<uint8_t> b(next() % 300);
    for (auto& v : b) v = static_cast<uint8_t>(next());
    for (int minor = 10; minor <= 13; ++minor) {
      const uint32_t line = python_line(minor, b, static_cast<int>(next() % 1000), static_cast<uint32_t>(next() % 600));
      EXPECT_LT(line, 1000u + 300u * 128u * 64u);
      EXPECT_LE(py_string(*py_offsets_for(minor), b).size(), b.size() * 4);
    }
  }
}

TEST_P(PyStacks, NativeUnwindOfAThreadEndsAtItsStart) {
  // The threading.Thread of py_stack_target.py, asleep in time.sleep: its native stack runs from
  // the libc sleep through the eval loop to the thread start (start_thread, clone3), complete.
  const PyInterp& py = GetParam();
  if (py.path.empty()) GTEST_SKIP() << py.label << ": interpreter not installed on this machine";
  Child c;
  ASSERT_TRUE(c.start({py.path, workload("py_stack_target.py")}));
  std::istringstream ready(c.read_line());
  std::string word;
  uint32_t pid = 0, tid = 0;
  ready >> word >> pid >> tid;
  ASSERT_EQ(word, "ready");
  Symbolizer sym;
  ASSERT_TRUE(sym.note_process(pid));
  Unwinder uw(sym);
  std::vector<StackFrame> fr;
  bool truncated = true;
  std::string why;
  for (int i = 0; i < 60; ++i) {
    UserRegs regs;
    std::vector<uint8_t> stack;
    if (!capture_thread(tid, regs, stack, why)) GTEST_SKIP() << "cannot stop the thread: " << why;
    fr = sym.symbolize_user(pid, uw.unwind(pid, regs, stack, 256, truncated));
    if (find_frame(fr, "start_thread") >= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(find_frame(fr, "_PyEval_EvalFrameDefault"), 0) << dump(fr);
  EXPECT_GE(find_frame(fr, "start_thread"), 0) << dump(fr);
  EXPECT_TRUE(fr.back().function.find("clone") != std::string::npos) << dump(fr);
  EXPECT_FALSE(truncated) << dump(fr);
}
