// Node and process identity (sinks/fleet/process_identity.h): the environ parser on fixture files, a
// real child process's /proc/PID/environ (no privileges needed: it is our own child), the lazy
// pid cache that stamps Event::rank, the persisted node id, and the identity tables carried by
// `merge` into SQLite and LMDB (and absent, harmlessly, from older traces).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "model/ops.h"
#include "sinks/fleet/merge.h"
#include "sinks/fleet/process_identity.h"
#include "sinks/store/lmdb_store.h"
#include "sinks/store/sqlite_store.h"
#include "tests/sinks/fleet/fleet_synth.h"
#include "tests/util/scratch_db.h"

namespace fs = std::filesystem;
using namespace ingero;

namespace {

struct TempDir : ingero::test::ScratchDir {
  TempDir() : ScratchDir("fleet_identity") {}
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

ProcessIdentity fixture(const std::string& name) {
  const std::string text = slurp(std::string(FLEET_FIXTURES) + "/" + name);
  EXPECT_FALSE(text.empty()) << name;
  return parse_environ(text);
}

using ingero::test::query_int;

Event ev(uint32_t pid, uint64_t ts, int16_t rank = -1, Source src = Source::kCuda, uint8_t op = op::kCudaLaunchKernel) {
  Event e;
  e.pid = pid;
  e.tid = pid;
  e.ts_ns = ts;
  e.rank = rank;
  e.source = src;
  e.op = op;
  return e;
}

void write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

// ---- parser --------------------------------------------------------------------------------------

TEST(Environ, Torchrun) {
  const auto id = fixture("environ_torchrun");
  EXPECT_EQ(id.rank, 3);
  EXPECT_EQ(id.local_rank, 1);
  EXPECT_EQ(id.world_size, 8);
  EXPECT_EQ(id.job_id, "job-42");
  EXPECT_EQ(id.launcher, "torchrun");
  EXPECT_EQ(id.bad_values, 0u);
}

TEST(Environ, Slurm) {
  const auto id = fixture("environ_slurm");
  EXPECT_EQ(id.rank, 5);
  EXPECT_EQ(id.local_rank, 1);
  EXPECT_EQ(id.world_size, 16);
  EXPECT_EQ(id.job_id, "998877");
  EXPECT_EQ(id.launcher, "slurm");
}

TEST(Environ, OpenMpi) {
  const auto id = fixture("environ_openmpi");
  EXPECT_EQ(id.rank, 2);
  EXPECT_EQ(id.local_rank, 0);
  EXPECT_EQ(id.world_size, 4);
  EXPECT_EQ(id.job_id, "");
  EXPECT_EQ(id.launcher, "openmpi");
}

TEST(Environ, TorchrunInsideSlurmUsesTheWorkersOwnVariables) {
  // srun launches torchrun once per node; the worker's RANK is job-global, SLURM_PROCID is the
  // torchrun agent's task number.
  const auto id = fixture("environ_torchrun_in_slurm");
  EXPECT_EQ(id.rank, 6);
  EXPECT_EQ(id.local_rank, 2);
  EXPECT_EQ(id.world_size, 16);
  EXPECT_EQ(id.job_id, "elastic-7");
  EXPECT_EQ(id.launcher, "torchrun");
}

TEST(Environ, MalformedValuesAreCountedAndSkipped) {
  // RANK=abc, LOCAL_RANK=-1, WORLD_SIZE=0, SLURM_NTASKS=99999999999 and an empty SLURM_JOB_ID are
  // rejected; the next valid variable of each field is used; the last entry has no trailing NUL.
  const auto id = fixture("environ_malformed");
  EXPECT_EQ(id.rank, 4);
  EXPECT_EQ(id.launcher, "slurm");
  EXPECT_EQ(id.local_rank, 1);
  EXPECT_EQ(id.world_size, -1);
  EXPECT_EQ(id.job_id, "");
  EXPECT_EQ(id.bad_values, 5u);
}

TEST(Environ, PlainEnvironmentHasNoIdentity) {
  const auto id = fixture("environ_plain");
  EXPECT_FALSE(id.known());
  EXPECT_EQ(id.rank, -1);
  EXPECT_EQ(id.launcher, "");
  EXPECT_FALSE(parse_environ("").known());
  EXPECT_FALSE(parse_environ(std::string("\0\0=\0RANK", 9)).known());
  // The first definition wins, as getenv() would see it.
  EXPECT_EQ(parse_environ(std::string("RANK=1\0RANK=2\0", 14)).rank, 1);
  // Event::rank is 16-bit: a rank beyond it is not silently truncated.
  EXPECT_EQ(parse_environ(std::string("RANK=40000\0", 11)).rank, -1);
}

TEST(Environ, ReadsARealChildProcessEnvironment) {
  // A child exec'd with torchrun-style variables; a CLOEXEC pipe tells when exec has happened (before
  // it, /proc/PID/environ would still show our own environment).
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    const char* argv[] = {"sleep", "30", nullptr};
    const char* envp[] = {
        "PATH=/usr/bin:/bin", "RANK=7", "LOCAL_RANK=3", "WORLD_SIZE=32", "TORCHELASTIC_RUN_ID=fleet-test", nullptr};
    ::execve("/bin/sleep", const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    ::execve("/usr/bin/sleep", const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    ::_exit(127);
  }
  ::close(fds[1]);
  char c;
  while (::read(fds[0], &c, 1) > 0) {
  }
  ::close(fds[0]);

  ProcessIdentity id;
  const bool read = read_process_identity(static_cast<uint32_t>(child), id);
  ProcessIdentityCache cache;
  Batch b;
  b.events = {ev(static_cast<uint32_t>(child), 100), ev(static_cast<uint32_t>(child), 200)};
  cache.stamp(b);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);

  ASSERT_TRUE(read) << "cannot read /proc/" << child << "/environ";
  EXPECT_EQ(id.rank, 7);
  EXPECT_EQ(id.local_rank, 3);
  EXPECT_EQ(id.world_size, 32);
  EXPECT_EQ(id.job_id, "fleet-test");
  EXPECT_EQ(b.events[0].rank, 7);
  EXPECT_EQ(b.events[1].rank, 7);
  EXPECT_EQ(cache.stats().reads, 1u);  // read once, at first sight
  // A pid that does not exist: unreadable, not an error.
  ProcessIdentity none;
  EXPECT_FALSE(read_process_identity(0x7ffffff0u, none));
}

// ---- cache ---------------------------------------------------------------------------------------

TEST(IdentityCache, StampsLazilyKeepsProbeRanksAndRereadsAfterExec) {
  TempDir t;
  const std::string proc = t("proc");
  write_file(proc + "/100/environ", std::string("RANK=1\0WORLD_SIZE=2\0", 20));
  write_file(proc + "/200/environ", std::string("PATH=/bin\0", 10));
  ProcessIdentityCache cache(proc);
  Batch b;
  b.events = {ev(100, 10), ev(100, 11, /*rank from the NCCL probe*/ 4), ev(200, 12), ev(300, 13), ev(0, 14)};
  cache.stamp(b);
  EXPECT_EQ(b.events[0].rank, 1);
  EXPECT_EQ(b.events[1].rank, 4);
  EXPECT_EQ(b.events[2].rank, -1);
  EXPECT_EQ(b.events[3].rank, -1);
  EXPECT_EQ(b.events[4].rank, -1);
  EXPECT_EQ(cache.stats().reads, 3u);       // 100, 200, 300; pid 0 never
  EXPECT_EQ(cache.stats().unreadable, 1u);  // 300
  EXPECT_EQ(cache.stats().with_rank, 1u);
  EXPECT_EQ(cache.stats().stamped, 1u);

  // pid 100 execs a new image with another environment: read again after the exec event.
  write_file(proc + "/100/environ", std::string("RANK=9\0", 7));
  Batch b2;
  b2.events = {ev(100, 20), ev(100, 21, -1, Source::kHost, op::kProcessExec), ev(100, 22)};
  cache.stamp(b2);
  EXPECT_EQ(b2.events[0].rank, 1);
  EXPECT_EQ(b2.events[2].rank, 9);
  const auto rows = cache.rows();
  ASSERT_EQ(rows.size(), 2u);  // pid 100 before and after exec; 200 and 300 have no identity
  EXPECT_EQ(rows[0].pid, 100u);
  EXPECT_EQ(rows[0].id.rank, 1);
  EXPECT_EQ(rows[0].first_seen_ns, 10u);
  EXPECT_EQ(rows[1].id.rank, 9);
  EXPECT_EQ(rows[1].first_seen_ns, 22u);
}

TEST(IdentityCache, BoundedNumberOfPids) {
  TempDir t;
  ProcessIdentityCache cache(t("proc"), 2);
  Batch b;
  b.events = {ev(1, 1), ev(2, 2), ev(3, 3), ev(3, 4)};
  cache.stamp(b);
  EXPECT_EQ(cache.stats().reads, 2u);
  EXPECT_EQ(cache.stats().overflow, 2u);
}

TEST(IdentityCache, StampSourceStampsEveryBatch) {
  TempDir t;
  write_file(t("proc") + "/42/environ", std::string("OMPI_COMM_WORLD_RANK=12\0", 24));
  std::vector<Event> events;
  for (uint64_t i = 0; i < 10000; ++i) events.push_back(ev(i % 2 ? 42 : 43, i));
  VectorSource inner(events, 1000);
  ProcessIdentityCache cache(t("proc"));
  IdentityStampSource src(inner, cache);
  Batch b;
  uint64_t ranked = 0, total = 0;
  while (src.next(b)) {
    for (const Event& e : b.events) {
      ++total;
      if (e.pid == 42) EXPECT_EQ(e.rank, 12);
      else EXPECT_EQ(e.rank, -1);
      ranked += e.rank == 12;
    }
    b.events.clear();
  }
  EXPECT_EQ(total, 10000u);
  EXPECT_EQ(ranked, 5000u);
}

// ---- node id -------------------------------------------------------------------------------------

TEST(NodeId, CreatedOnceThenPersisted) {
  TempDir t;
  const std::string dir = t("state/nested");
  std::string id, error, again;
  bool created = false;
  ASSERT_TRUE(load_or_create_node_id(dir, id, created, error)) << error;
  EXPECT_TRUE(created);
  EXPECT_TRUE(valid_node_name(id)) << id;
  EXPECT_EQ(id.rfind("node-", 0), 0u);
  EXPECT_EQ(slurp(dir + "/node-id"), id + "\n");
  ASSERT_TRUE(load_or_create_node_id(dir, again, created, error)) << error;
  EXPECT_FALSE(created);
  EXPECT_EQ(again, id);
  // No temporary files are left behind.
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  // Another machine's state directory gets another id.
  std::string other;
  ASSERT_TRUE(load_or_create_node_id(t("other"), other, created, error)) << error;
  EXPECT_NE(other, id);
}

TEST(NodeId, HandWrittenIdIsUsedAndABadOneIsAnErrorNotOverwritten) {
  TempDir t;
  write_file(t("s1/node-id"), "  gpu-07.rack3\n");
  std::string id, error;
  bool created = true;
  ASSERT_TRUE(load_or_create_node_id(t("s1"), id, created, error)) << error;
  EXPECT_EQ(id, "gpu-07.rack3");
  EXPECT_FALSE(created);

  write_file(t("s2/node-id"), "bad:id\n");
  EXPECT_FALSE(load_or_create_node_id(t("s2"), id, created, error));
  EXPECT_NE(error.find("not a valid node id"), std::string::npos) << error;
  EXPECT_EQ(slurp(t("s2/node-id")), "bad:id\n");

  // A state "directory" that is a file: a clear error.
  write_file(t("plainfile"), "x");
  error.clear();
  EXPECT_FALSE(load_or_create_node_id(t("plainfile"), id, created, error));
  EXPECT_FALSE(error.empty());
}

TEST(NodeId, ConcurrentFirstRunsAgree) {
  TempDir t;
  const std::string dir = t("race");
  std::vector<std::string> ids(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ids.size(); ++i)
    threads.emplace_back([&, i] {
      std::string error;
      bool created = false;
      if (!load_or_create_node_id(dir, ids[i], created, error)) ids[i] = "error: " + error;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u) << ids[0] << " " << ids[1];
  EXPECT_TRUE(valid_node_name(ids[0])) << ids[0];
}

TEST(NodeId, StateDirFromTheEnvironment) {
  const char* old = std::getenv("INGERO_STATE_DIR");
  const std::string saved = old ? old : "";
  ::setenv("INGERO_STATE_DIR", "/tmp/somewhere", 1);
  EXPECT_EQ(default_state_dir(), "/tmp/somewhere");
  ::unsetenv("INGERO_STATE_DIR");
  EXPECT_EQ(default_state_dir(), "/var/lib/ingero-pipeline");
  if (old) ::setenv("INGERO_STATE_DIR", saved.c_str(), 1);
}

// ---- storage and merge ---------------------------------------------------------------------------

namespace {

IdentityTables node_identity(const std::string& node, int rank, const std::string& host) {
  IdentityTables t;
  t.attributes[node]["hostname"] = host;
  ProcessIdentityRow r;
  r.pid = 1000 + static_cast<uint32_t>(rank);
  r.id.rank = rank;
  r.id.local_rank = 0;
  r.id.world_size = 4;
  r.id.job_id = "job-1";
  r.id.launcher = "torchrun";
  r.first_seen_ns = 123;
  t.processes[node].push_back(r);
  return t;
}

}  // namespace

TEST(IdentityStore, MergeCarriesIdentityIntoSqliteAndLmdb) {
  TempDir t;
  test::FleetSpec spec;
  spec.steps = 20;
  std::vector<MergeInput> in;
  std::string error;
  for (int r = 0; r < 4; ++r) {
    const std::string node = "node-" + std::to_string(r);
    const std::string path = t(node + ".db");
    ASSERT_EQ(test::write_fleet_node(spec, r, node, path), "");
    ASSERT_TRUE(write_identity(path, node_identity(node, r, "host" + std::to_string(r)), error)) << error;
    in.push_back({path, ""});
  }
  // Written and read back from one capture.
  const IdentityTables one = read_identity(in[2].path);
  ASSERT_EQ(one.processes.count("node-2"), 1u);
  EXPECT_EQ(one.processes.at("node-2")[0].id.rank, 2);
  EXPECT_EQ(one.processes.at("node-2")[0].id.job_id, "job-1");
  EXPECT_EQ(one.attributes.at("node-2").at("hostname"), "host2");

  MergeOptions o;
  o.out = t("fleet.db");
  MergeReport rep;
  ASSERT_TRUE(merge_traces(in, o, rep, error)) << error;
  EXPECT_EQ(query_int(o.out, "SELECT count(*) FROM ip_process_identity"), 4);
  EXPECT_EQ(query_int(o.out,
                      "SELECT count(*) FROM ip_process_identity p JOIN ip_node_attributes a "
                      "ON a.node = p.node AND a.key = 'hostname' AND a.value = 'host' || p.rank "
                      "WHERE p.node = 'node-' || p.rank AND p.pid = 1000 + p.rank"),
            4);
  // Every event keeps its rank through the merge.
  EXPECT_EQ(query_int(o.out, "SELECT count(*) FROM events WHERE rank IS NULL OR node <> 'node-' || rank"), 0);

  // LMDB out, then LMDB in -> SQLite out: still there.
  MergeOptions ol;
  ol.out = t("fleet.lmdb");
  ASSERT_TRUE(merge_traces(in, ol, rep, error)) << error;
  const IdentityTables lm = read_identity(ol.out);
  ASSERT_EQ(lm.processes.size(), 4u);
  EXPECT_EQ(lm.processes.at("node-3")[0].id.rank, 3);
  EXPECT_EQ(lm.processes.at("node-3")[0].id.world_size, 4);
  EXPECT_EQ(lm.attributes.at("node-1").at("hostname"), "host1");
  EXPECT_FALSE(fs::exists(ol.out + "-lock"));
  std::string lm_error;
  EXPECT_NE(open_lmdb_trace(ol.out, lm_error), nullptr) << lm_error;  // the store still reads

  MergeOptions o2;
  o2.out = t("again.db");
  ASSERT_TRUE(merge_traces({{ol.out, ""}}, o2, rep, error)) << error;
  EXPECT_EQ(query_int(o2.out, "SELECT count(*) FROM ip_process_identity WHERE node = 'node-' || rank"), 4);
}

TEST(IdentityStore, UnnamedCaptureTakesTheMergeName) {
  TempDir t;
  test::FleetSpec spec;
  spec.steps = 10;
  std::string error;
  const std::string path = t("old.db");
  ASSERT_EQ(test::write_fleet_node(spec, 1, "", path), "");
  ASSERT_TRUE(write_identity(path, node_identity("", 1, "h1"), error)) << error;
  MergeOptions o;
  o.out = t("named.db");
  MergeReport rep;
  ASSERT_TRUE(merge_traces({{path, "alpha"}}, o, rep, error)) << error;
  EXPECT_EQ(query_int(o.out, "SELECT count(*) FROM ip_process_identity WHERE node = 'alpha' AND rank = 1"), 1);
  EXPECT_EQ(query_int(o.out, "SELECT count(*) FROM ip_node_attributes WHERE node = 'alpha'"), 1);
}

TEST(IdentityStore, TracesWithoutIdentityStillMergeAndReadEmpty) {
  TempDir t;
  test::FleetSpec spec;
  spec.steps = 10;
  std::string error;
  const std::string a = t("a.db"), b = t("b.db");
  ASSERT_EQ(test::write_fleet_node(spec, 0, "a", a), "");
  ASSERT_EQ(test::write_fleet_node(spec, 1, "b", b), "");
  EXPECT_TRUE(read_identity(a).empty());
  EXPECT_TRUE(read_identity(t("missing.db")).empty());
  MergeOptions o;
  o.out = t("m.db");
  MergeReport rep;
  ASSERT_TRUE(merge_traces({{a, ""}, {b, ""}}, o, rep, error)) << error;
  EXPECT_EQ(query_int(o.out, "SELECT count(*) FROM sqlite_master WHERE name = 'ip_process_identity'"), 0);
  EXPECT_TRUE(read_identity(o.out).empty());
  // Ingero's shipped sample (read-only, immutable): no identity tables, no error.
  const std::string sample = std::string(FLEET_SOURCE_DIR) + "/samples/pytorch-dataloader-starvation.db";
  if (fs::exists(sample)) {
    EXPECT_TRUE(read_identity(sample).empty());
  }
}
