// Unit tests of the live-capture pieces that need no privileges: library discovery (against a
// fake /proc and fake toolkit/wheel trees), the reorder buffer and record conversion.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "bpf/discovery.h"
#include "model/ops.h"
#ifdef INGERO_HAVE_BPF
#include "bpf/records.h"
#endif

namespace fs = std::filesystem;
using namespace ingero;
using namespace ingero::bpf;

TEST(Discovery, ClassifiesLibraryNames) {
  EXPECT_EQ(classify_library("/x/libcudart.so.13"), LibKind::kCudart);
  EXPECT_EQ(classify_library("libcudart.so"), LibKind::kCudart);
  EXPECT_EQ(classify_library("/usr/lib/libcuda.so.1"), LibKind::kCuda);
  EXPECT_EQ(classify_library("/usr/lib/libcuda.so.575.57.08"), LibKind::kCuda);
  EXPECT_EQ(classify_library("libnccl.so.2"), LibKind::kNccl);
  EXPECT_FALSE(classify_library("libcudart_static.a"));
  EXPECT_FALSE(classify_library("libcudart.so.13.bak"));
  EXPECT_FALSE(classify_library("libcudadevrt.a"));
  EXPECT_FALSE(classify_library("libcudnn.so.9"));
  EXPECT_FALSE(classify_library("libcuda.so."));
}

TEST(Discovery, ParsesMapsAndLdconfigLines) {
  auto m = parse_maps_line("7f1c2a000000-7f1c2a0a0000 r-xp 00010000 fd:01 1234567    /usr/lib/libcudart.so.13");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first, "/usr/lib/libcudart.so.13");
  EXPECT_EQ(m->second, 1234567u);
  EXPECT_FALSE(parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0          [stack]"));
  EXPECT_FALSE(parse_maps_line("7f00-7f10 r-xp 0 fd:01 99 /tmp/libcuda.so.1 (deleted)"));
  EXPECT_FALSE(parse_maps_line("garbage"));
  auto l = parse_ldconfig_line("\tlibcudart.so.13 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.13\n");
  ASSERT_TRUE(l);
  EXPECT_EQ(*l, "/usr/local/cuda/lib64/libcudart.so.13");
  EXPECT_FALSE(parse_ldconfig_line("1234 libs found in cache `/etc/ld.so.cache'"));
}

namespace {
struct TempTree {
  fs::path root;
  TempTree() {
    char tmpl[] = "/tmp/ip_disc_XXXXXX";
    root = ::mkdtemp(tmpl);
  }
  ~TempTree() { fs::remove_all(root); }
  fs::path file(const std::string& rel, const std::string& text = "x") {
    fs::path p = root / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
  static uint64_t inode(const fs::path& p) {
    struct stat st {};
    ::stat(p.c_str(), &st);
    return st.st_ino;
  }
  void maps(uint32_t pid, const fs::path& lib) {
    file("proc/" + std::to_string(pid) + "/maps", "7f00-7f10 r-xp 00000000 fd:01 " + std::to_string(inode(lib)) + " " +
                                                      lib.string() + "\n7f20-7f30 rw-p 00000000 00:00 0 \n");
  }
};

DiscoveryOptions isolated(const TempTree& t) {
  DiscoveryOptions o;
  o.proc_root = (t.root / "proc").string();
  o.use_ldcache = false;
  o.toolkit_roots = {(t.root / "cuda").string()};
  o.python_roots = {(t.root / "py").string()};
  return o;
}
}  // namespace

TEST(Discovery, FindsEverySourceAndDeduplicatesByInode) {
  TempTree t;
  const auto rt = t.file("cuda/lib64/libcudart.so.13");
  fs::create_symlink(rt, t.root / "cuda/lib64/libcudart.so");  // same inode: reported once
  t.file("cuda/lib64/stubs/libcuda.so");                       // stubs are never traced
  t.file("cuda/lib64/libcudart_static.a");
  const auto nccl = t.file("py/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2");
  const auto drv = t.file("drv/libcuda.so.1");
  t.maps(42, drv);
  const auto extra = t.file("mine/libcudart.so.12");

  DiscoveryOptions o = isolated(t);
  o.explicit_paths = {extra.string()};
  LibraryDiscovery d(o);
  auto libs = d.initial_scan();
  ASSERT_EQ(libs.size(), 4u);
  EXPECT_EQ(libs[0].path, extra.string());
  EXPECT_EQ(libs[0].found_by, "--cuda-lib");
  EXPECT_EQ(libs[1].kind, LibKind::kCuda);
  EXPECT_EQ(libs[1].found_by, "maps of pid 42");
  EXPECT_EQ(libs[2].kind, LibKind::kCudart);
  EXPECT_EQ(libs[3].kind, LibKind::kNccl);
  EXPECT_EQ(libs[3].path, nccl.string());
  EXPECT_EQ(libs[3].found_by, "wheel");
  EXPECT_TRUE(d.poll().empty());  // nothing new
}

TEST(Discovery, PollFindsLaterLibrariesWithinItsBudget) {
  TempTree t;
  fs::create_directories(t.root / "proc/1");
  DiscoveryOptions o = isolated(t);
  o.max_pids_per_poll = 1;
  LibraryDiscovery d(o);
  EXPECT_TRUE(d.initial_scan().empty());
  // Three processes appear, each mapping its own copy; one pid is read per poll.
  for (uint32_t pid : {10u, 11u, 12u}) t.maps(pid, t.file("l" + std::to_string(pid) + "/libcudart.so.13"));
  size_t found = 0;
  int polls = 0;
  while (found < 3 && polls < 10) {
    const auto got = d.poll();
    EXPECT_LE(got.size(), 1u);
    found += got.size();
    ++polls;
  }
  EXPECT_EQ(found, 3u);
  EXPECT_EQ(polls, 3);
  // A library dlopen()ed later by an already-seen process is found by the round-robin rescan.
  t.maps(1, t.file("late/libnccl.so.2"));
  size_t late = 0;
  for (int i = 0; i < 5 && late == 0; ++i) late = d.poll().size();
  EXPECT_EQ(late, 1u);
}

#ifdef INGERO_HAVE_BPF
TEST(Reorder, ReleasesInTimestampOrderAndRefusesLateEvents) {
  std::vector<Event> evs(1000);
  for (size_t i = 0; i < evs.size(); ++i) evs[i].ts_ns = 1000 + i * 10;
  std::mt19937 rng(7);
  std::shuffle(evs.begin(), evs.end(), rng);
  ReorderBuffer rb;
  for (const auto& e : evs) ASSERT_TRUE(rb.push(e));
  std::vector<Event> out;
  rb.release(5000, out);
  ASSERT_EQ(out.size(), 400u);  // ts 1000..4990
  EXPECT_TRUE(std::is_sorted(out.begin(), out.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; }));
  EXPECT_LT(out.back().ts_ns, 5000u);
  Event late;
  late.ts_ns = 4999;
  EXPECT_FALSE(rb.push(late));
  Event ok;
  ok.ts_ns = 5000;
  EXPECT_TRUE(rb.push(ok));
  rb.release(UINT64_MAX, out);
  EXPECT_EQ(out.size(), 1001u);
  EXPECT_EQ(rb.size(), 0u);
}

TEST(Records, ConvertsEveryFamily) {
  RecordConverter c(1'000'000'000);
  std::string why;
  Event e;
  ip_record r{};
  r.ts = 5;
  r.dur = 7;
  r.pid = 10;
  r.tid = 11;
  r.source = IP_SRC_HOST;
  r.op = op::kSchedSwitch;
  r.state = IP_STATE_PREEMPTED;
  r.arg1 = 99;
  ASSERT_TRUE(c.convert(r, e, why));
  EXPECT_EQ(e.ts_ns, 1'000'000'005u);
  EXPECT_EQ(e.dur_ns, 7u);
  EXPECT_EQ(e.prev_state, OffCpuState::kPreempted);
  EXPECT_EQ(e.arg1, 99u);
  EXPECT_EQ(e.source, Source::kHost);

  r = {};
  r.source = IP_SRC_DRIVER;
  r.op = op::kCuMemcpyDtoHAsync;
  r.arg0 = 4096;
  ASSERT_TRUE(c.convert(r, e, why));
  EXPECT_EQ(e.arg0, 4096u);
  EXPECT_EQ(e.arg1, 2u);  // cudaMemcpyDeviceToHost

  // NCCL: the rank comes from ncclCommInitRank (rank 3 of 8, communicator 0xabc) and follows the
  // communicator and the process; bytes = count x datatype size.
  r = {};
  r.source = IP_SRC_NCCL;
  r.op = op::kNcclCommInitRank;
  r.pid = 50;
  r.arg0 = 3;
  r.arg1 = 8;
  r.arg2 = 0xabc;
  ASSERT_TRUE(c.convert(r, e, why));
  EXPECT_EQ(e.rank, 3);
  r.op = op::kNcclAllReduce;
  r.arg0 = 1000;
  r.arg1 = 7;  // ncclFloat32
  ASSERT_TRUE(c.convert(r, e, why));
  EXPECT_EQ(e.arg0, 4000u);
  EXPECT_EQ(e.arg1, 0xabcu);
  EXPECT_EQ(e.rank, 3);
  r = {};
  r.source = IP_SRC_CUDA;
  r.op = op::kCudaLaunchKernel;
  r.pid = 50;
  ASSERT_TRUE(c.convert(r, e, why));
  EXPECT_EQ(e.rank, 3);
  r.pid = 51;
  ASSERT_TRUE(c.convert(r, e, why));
  EXPECT_EQ(e.rank, -1);

  r.source = IP_SRC_CUDA;
  r.op = 200;
  EXPECT_FALSE(c.convert(r, e, why));
  EXPECT_NE(why.find("unknown BPF record"), std::string::npos);
}
#endif
