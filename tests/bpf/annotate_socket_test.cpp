// The annotation socket of `trace --annotate` (bpf/annotate_socket.h): the peer-credential and
// scope checks, the line framer, and the server end to end over a real Unix socket (clients in
// threads of this process, and, as root, a forked client of another uid that must be refused).
#include "bpf/annotate_socket.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/scratch_db.h"

namespace ingero {
namespace {

using test::ScratchDir;

PeerPolicy fake_policy() {
  PeerPolicy p;
  p.uids = {1000};
  p.pid_uid = [](uint32_t pid) -> std::optional<uint32_t> {
    if (pid == 10 || pid == 11) return 1000;
    if (pid == 20) return 2000;
    if (pid == 1) return 0;
    return std::nullopt;
  };
  p.pid_start_time = [](uint32_t pid) -> std::optional<uint64_t> {
    if (pid == 10) return 5000;
    return std::nullopt;
  };
  return p;
}

TEST(AnnotatePeer, RootAndAllowedUidsOnly) {
  const PeerPolicy p = fake_policy();
  EXPECT_EQ(check_peer({10, 0, 0}, p), "");
  EXPECT_EQ(check_peer({10, 1000, 1000}, p), "");
  EXPECT_EQ(check_peer({30, 1001, 1001}, p),
            "uid 1001 may not annotate this trace (allowed: root, 1000; `trace --annotate-uid 1001` or `--pid` of its "
            "process allows it)");
  EXPECT_NE(check_peer({30, 1001, 1001}, PeerPolicy{}).find("(allowed: root;"), std::string::npos);
}

TEST(AnnotatePeer, ScopeOwnProcessOthersOfItsUidOrAnyForRoot) {
  const PeerPolicy p = fake_policy();
  Annotation a;
  a.pid = 10;  // the sender itself: its start time is filled in
  EXPECT_EQ(check_scope({10, 1000, 1000}, a, p), "");
  EXPECT_EQ(a.start_time, 5000u);
  a = Annotation{};
  a.pid = 11;  // another process of the same uid
  EXPECT_EQ(check_scope({10, 1000, 1000}, a, p), "");
  a.pid = 20;
  EXPECT_EQ(check_scope({10, 1000, 1000}, a, p), "pid 20 belongs to uid 2000, not to the sender's uid 1000");
  EXPECT_EQ(check_scope({10, 0, 0}, a, p), "");  // root may annotate anyone
  a.pid = 1;
  EXPECT_EQ(check_scope({10, 1000, 1000}, a, p), "pid 1 belongs to uid 0, not to the sender's uid 1000");
  a.pid = 99;
  EXPECT_EQ(check_scope({10, 0, 0}, a, p), "pid 99: no such process (who owns it cannot be checked)");
  a = Annotation{};
  a.pid = 10;
  a.start_time = 4999;  // the pid was reused since the sender read it
  EXPECT_EQ(check_scope({10, 1000, 1000}, a, p), "start_time 4999 is not pid 10's (5000): the pid was reused?");
  a.start_time = 5000;
  EXPECT_EQ(check_scope({10, 1000, 1000}, a, p), "");
}

TEST(AnnotatePeer, ProcLookups) {
  EXPECT_EQ(proc_real_uid(static_cast<uint32_t>(getpid())), getuid());
  const auto st = proc_start_time(static_cast<uint32_t>(getpid()));
  ASSERT_TRUE(st.has_value());
  EXPECT_GT(*st, 0u);
  EXPECT_FALSE(proc_real_uid(0x7ffffff0u).has_value());
  EXPECT_FALSE(proc_start_time(0x7ffffff0u).has_value());
}

TEST(AnnotateFramer, LinesAcrossChunksOverlongAndTheLastLine) {
  LineFramer f;
  std::vector<std::string> lines;
  std::vector<size_t> over;
  const auto line = [&](std::string_view l) { lines.emplace_back(l); };
  const auto overlong = [&](size_t n) { over.push_back(n); };
  f.feed("{\"a\":", line, overlong);
  f.feed("1}\n{\"b\":2}\r\n\n{\"c\"", line, overlong);
  EXPECT_EQ(lines, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}\r", ""}));
  const std::string huge(annotation_limits::kMaxLineBytes + 10, 'x');
  f.feed(":3}" + huge.substr(0, 1000), line, overlong);
  f.feed(huge, line, overlong);
  EXPECT_EQ(f.pending(), 7 + 1000 + huge.size());  // a count: the discarded bytes are not held
  f.feed("tail\nnext", line, overlong);
  ASSERT_EQ(over.size(), 1u);
  EXPECT_EQ(over[0], 7 + 1000 + huge.size() + 4);  // {"c" :3} xxx... tail
  EXPECT_EQ(lines.size(), 3u);
  f.finish(line, overlong);  // the last line needs no newline
  EXPECT_EQ(lines.back(), "next");
  f.finish(line, overlong);  // nothing left
  EXPECT_EQ(lines.size(), 4u);
}

// A client connection of this process.
int dial(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

template <class Pred>
bool wait_for(Pred pred) {
  for (int i = 0; i < 500; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::unique_ptr<AnnotateServer> start(const std::string& path, AnnotateServer::Options o = {}) {
  o.path = path;
  std::string error;
  auto s = AnnotateServer::start(std::move(o), error);
  EXPECT_TRUE(s) << error;
  return s;
}

TEST(AnnotateServer, ClientThreadStepsBecomeMarkersWithItsPid) {
  ScratchDir dir("ip_annotate");
  AnnotateServer::Options o;
  o.node = 2;
  auto server = start(dir("a.sock"), o);
  ASSERT_TRUE(server);
  struct stat st {};
  ASSERT_EQ(::stat(dir("a.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u);  // anyone may connect; SO_PEERCRED decides
  const uint64_t t0 = now_ns();
  std::thread client([&] {
    const int fd = dial(dir("a.sock"));
    ASSERT_GE(fd, 0);
    // What Ingero's Lightning callback sends, written in odd pieces (lines split across sends).
    std::string all;
    for (int i = 0; i < 20; ++i)
      all += "{\"labels\":{\"epoch\":\"" + std::to_string(i / 10) + "\",\"step\":\"" + std::to_string(i) + "\"}}\n";
    all += "\n{\"labels\":{\"step\":\"1\"}\n";                                   // blank, then a partial object
    all += "{\"labels\":{\"step\":\"21\"},\"ts\":1700000000}\n";                 // seconds, not ns
    all += "{\"labels\":{\"epoch\":\"1\",\"phase\":\"epoch_end\"},\"tid\":77}";  // last, no newline
    for (size_t off = 0; off < all.size(); off += 7) send_all(fd, all.substr(off, 7));
    ::close(fd);
  });
  client.join();
  ASSERT_TRUE(wait_for([&] { return server->stats().lines >= 23; })) << annotate_summary(server->stats());
  server->stop();
  EXPECT_FALSE(std::filesystem::exists(dir("a.sock")));  // removed: it was ours
  const AnnotateStats s = server->stats();
  EXPECT_EQ(s.connections, 1u);
  EXPECT_EQ(s.lines, 23u);
  EXPECT_EQ(s.annotations, 21u);
  EXPECT_EQ(s.step_markers, 20u);
  EXPECT_EQ(s.epoch_only, 1u);
  EXPECT_EQ(s.rejected, 2u);
  ASSERT_EQ(s.reasons.size(), 2u) << annotate_summary(s);
  for (const auto& [why, n] : s.reasons) {
    EXPECT_EQ(n, 1u);
    EXPECT_TRUE(why.rfind("not JSON: ", 0) == 0 || why.find("before the receive time") != std::string::npos) << why;
  }
  const auto warnings = server->take_warnings();
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("line rejected from pid " + std::to_string(getpid())), std::string::npos) << warnings[0];
  const auto got = server->take_annotations();
  ASSERT_EQ(got.size(), 21u);
  const uint64_t t1 = now_ns();
  for (size_t i = 0; i < got.size(); ++i) {
    const Annotation& a = got[i];
    EXPECT_EQ(a.pid, static_cast<uint32_t>(getpid())) << i;  // the sender's, from SO_PEERCRED
    EXPECT_EQ(a.peer_pid, static_cast<uint32_t>(getpid()));
    EXPECT_EQ(a.peer_uid, getuid());
    EXPECT_EQ(a.peer_gid, getgid());
    EXPECT_EQ(a.node, 2);
    EXPECT_FALSE(a.ts_given);
    EXPECT_GE(a.ts_ns, t0);  // the receive time, CLOCK_REALTIME
    EXPECT_LE(a.ts_ns, t1);
    EXPECT_GT(a.start_time, 0u);  // resolved from /proc
    if (i < 20) {
      StepMarker m;
      ASSERT_TRUE(step_marker_of(a, m));
      EXPECT_EQ(m.step, static_cast<int64_t>(i));
      EXPECT_EQ(m.epoch, static_cast<int64_t>(i / 10));
      if (i) {
        EXPECT_GE(a.ts_ns, got[i - 1].ts_ns);
      }
    }
  }
  EXPECT_EQ(got[20].tid, 77u);
  EXPECT_EQ(*got[20].label("phase"), "epoch_end");
  EXPECT_NE(annotate_summary(s).find(
                "1 connection(s), 23 line(s): 21 annotation(s) (20 step marker(s), 1 epoch-only), 2 "
                "rejected; why: "),
            std::string::npos)
      << annotate_summary(s);
}

TEST(AnnotateServer, RateLimitOverlongLinesAndMessageTimes) {
  ScratchDir dir("ip_annotate");
  AnnotateServer::Options o;
  o.rate_limit = 10;
  auto server = start(dir("b.sock"), o);
  ASSERT_TRUE(server);
  const uint64_t ts = now_ns() - 5'000'000'000ull;  // given by the program: kept as given
  const int fd = dial(dir("b.sock"));
  ASSERT_GE(fd, 0);
  std::string all = std::string(annotation_limits::kMaxLineBytes + 100, 'x') + "\n";  // discarded, counted
  for (int i = 0; i < 24; ++i)
    all += "{\"labels\":{\"step\":\"" + std::to_string(i) + "\"},\"ts\":" + std::to_string(ts + i) + "}\n";
  send_all(fd, all);
  ::close(fd);
  ASSERT_TRUE(wait_for([&] { return server->stats().lines >= 25; }));
  const AnnotateStats s = server->stats();
  EXPECT_EQ(s.annotations, 10u);  // 10 lines a second
  EXPECT_EQ(s.rejected, 15u);
  EXPECT_EQ(s.reasons.at("over the rate limit of 10 lines/s on one connection"), 14u);
  EXPECT_EQ(s.reasons.at("line over the 16384-byte limit: discarded up to its newline (16484 bytes)"), 1u);
  const auto got = server->take_annotations();
  ASSERT_EQ(got.size(), 10u);
  EXPECT_TRUE(got[0].ts_given);
  EXPECT_EQ(got[0].ts_ns, ts);
}

TEST(AnnotateServer, StopReadsWhatIsWaitingAndTooManyConnectionsAreRefused) {
  ScratchDir dir("ip_annotate");
  AnnotateServer::Options o;
  o.max_connections = 2;
  auto server = start(dir("c.sock"), o);
  ASSERT_TRUE(server);
  const int a = dial(dir("c.sock")), b = dial(dir("c.sock"));
  ASSERT_TRUE(a >= 0 && b >= 0);
  ASSERT_TRUE(wait_for([&] { return server->stats().connections == 2; }));
  const int c = dial(dir("c.sock"));  // the kernel accepts it; the server closes it
  ASSERT_GE(c, 0);
  ASSERT_TRUE(wait_for([&] { return server->stats().refused == 1; }));
  EXPECT_EQ(server->stats().reasons.count("too many connections (2 open)"), 1u);
  send_all(a, "{\"labels\":{\"step\":\"1\"}}\n{\"labels\":{\"step\":\"2\"}}\n");
  send_all(b, "{\"labels\":{\"step\":\"3\"}}\n{\"labels\":{\"st");  // still being written at stop
  server->stop();                                                   // at once: what was sent is still read
  const AnnotateStats s = server->stats();
  EXPECT_EQ(s.annotations, 3u);
  EXPECT_EQ(s.reasons.count("line cut off when the trace stopped"), 1u) << annotate_summary(s);
  ::close(a);
  ::close(b);
  ::close(c);
}

TEST(AnnotateServer, LeftoverSocketsAreReplacedLiveOnesAndOtherFilesAreNot) {
  ScratchDir dir("ip_annotate");
  std::string error;
  // A leftover: a socket nobody listens on (a killed trace).
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, dir("d.sock").c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
    ::close(fd);
  }
  auto first = start(dir("d.sock"));
  ASSERT_TRUE(first);
  // A live one (ours now, or an Ingero agent's): refused, and left alone.
  AnnotateServer::Options o;
  o.path = dir("d.sock");
  EXPECT_FALSE(AnnotateServer::start(o, error));
  EXPECT_NE(error.find("another process is listening there"), std::string::npos) << error;
  const int fd = dial(dir("d.sock"));
  EXPECT_GE(fd, 0);
  if (fd >= 0) ::close(fd);
  first->stop();
  // Not a socket: never removed.
  std::ofstream(dir("e.sock")) << "data";
  o.path = dir("e.sock");
  EXPECT_FALSE(AnnotateServer::start(o, error));
  EXPECT_NE(error.find("exists and is not a socket"), std::string::npos) << error;
  EXPECT_TRUE(std::filesystem::exists(dir("e.sock")));
  std::filesystem::create_symlink(dir("e.sock"), dir("f.sock"));
  o.path = dir("f.sock");
  EXPECT_FALSE(AnnotateServer::start(o, error));
  EXPECT_NE(error.find("is a symlink"), std::string::npos) << error;
  o.path = dir("no/such/dir/g.sock");
  EXPECT_FALSE(AnnotateServer::start(o, error));
  EXPECT_NE(error.find("cannot bind the annotation socket"), std::string::npos) << error;
  o.path = "/" + std::string(120, 'p');
  EXPECT_FALSE(AnnotateServer::start(o, error));
  EXPECT_NE(error.find("too long for a Unix socket path"), std::string::npos) << error;
}

TEST(AnnotateServer, DefaultPathIsIngeros) {
  const std::string p = default_annotate_socket_path();
  if (::access("/run", W_OK) == 0) EXPECT_EQ(p, "/run/ingero/annotate.sock");
  else EXPECT_TRUE(p.ends_with("/.ingero/annotate/annotate.sock") || p.ends_with("/annotate.sock")) << p;
}

// As root: a client running as another uid (nobody) is refused unless allowed, and may not speak
// for a process of another uid.
TEST(AnnotateServer, OtherUidsAreRefusedUnlessAllowedAndCannotSpeakForOthers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a client of another uid: setuid)";
  constexpr uint32_t kNobody = 65534;
  ScratchDir dir("ip_annotate");
  ::chmod(dir.path().c_str(), 0755);  // nobody must reach the socket in it
  // The child: as nobody, connects and sends its own step, then one for pid 1 (root's init).
  const auto run_child = [&](const std::string& path) {
    const pid_t child = fork();
    if (child == 0) {
      if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) _exit(3);
      const int fd = dial(path);
      if (fd < 0) _exit(4);
      send_all(fd, "{\"labels\":{\"step\":\"1\"}}\n{\"labels\":{\"step\":\"2\"},\"pid\":1}\n");
      char c;
      (void)::recv(fd, &c, 1, 0);  // until the server closes or the parent kills us
      _exit(0);
    }
    return child;
  };
  {
    auto server = start(dir("r.sock"));  // root and this process's uid (0) only
    ASSERT_TRUE(server);
    const pid_t child = run_child(dir("r.sock"));
    ASSERT_TRUE(wait_for([&] { return server->stats().refused == 1; })) << annotate_summary(server->stats());
    int st = 0;
    waitpid(child, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    const AnnotateStats s = server->stats();
    EXPECT_EQ(s.annotations, 0u);
    ASSERT_EQ(s.reasons.size(), 1u);
    EXPECT_EQ(s.reasons.begin()->first.rfind("uid 65534 may not annotate this trace (allowed: root;", 0), 0u)
        << s.reasons.begin()->first;
    const auto w = server->take_warnings();
    ASSERT_EQ(w.size(), 1u);
    EXPECT_NE(w[0].find("connection refused from pid " + std::to_string(child) + " (uid 65534)"), std::string::npos)
        << w[0];
  }
  AnnotateServer::Options o;
  o.policy.uids = {kNobody};  // --annotate-uid 65534
  auto server = start(dir("s.sock"), o);
  ASSERT_TRUE(server);
  const pid_t child = run_child(dir("s.sock"));
  ASSERT_TRUE(wait_for([&] { return server->stats().lines == 2; })) << annotate_summary(server->stats());
  server->stop();
  int st = 0;
  waitpid(child, &st, 0);
  const AnnotateStats s = server->stats();
  EXPECT_EQ(s.annotations, 1u);
  EXPECT_EQ(s.reasons.count("pid 1 belongs to uid 0, not to the sender's uid 65534"), 1u) << annotate_summary(s);
  const auto got = server->take_annotations();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].pid, static_cast<uint32_t>(child));
  EXPECT_EQ(got[0].peer_uid, kNobody);
}

}  // namespace
}  // namespace ingero
