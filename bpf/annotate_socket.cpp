#include "bpf/annotate_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <thread>

#include "model/format.h"

namespace ingero {
namespace {

constexpr size_t kMaxReasons = 32;
constexpr size_t kReadChunk = 65536;  // bytes read from one connection per wake-up at most

uint64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t steady_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

std::string errno_text(int e) { return std::strerror(e); }

// mkdir that is fine with an existing directory.
bool make_dir(const std::string& dir, mode_t mode, std::string& error) {
  if (::mkdir(dir.c_str(), mode) == 0 || errno == EEXIST) return true;
  error = dir + ": cannot create the socket directory (" + errno_text(errno) + ")";
  return false;
}

// The default directory must be ours and writable by nobody else: a directory another user could
// write to would let them replace the socket before a client dials it.
bool check_own_dir(const std::string& dir, std::vector<std::string>& warnings, std::string& error) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return error = dir + ": " + errno_text(errno), false;
  if (S_ISLNK(st.st_mode)) return error = dir + ": is a symlink; refusing to put the annotation socket there", false;
  if (!S_ISDIR(st.st_mode)) return error = dir + ": exists and is not a directory", false;
  if (st.st_uid != ::geteuid())
    return error = dir + ": owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " +
                   std::to_string(::geteuid()) + "; refusing to put the annotation socket there",
           false;
  if (st.st_mode & 022)
    return error = dir + ": writable by group or others (mode " + std::to_string((st.st_mode >> 6) & 7) +
                   std::to_string((st.st_mode >> 3) & 7) + std::to_string(st.st_mode & 7) +
                   "); refusing to put the annotation socket there",
           false;
  if (!(st.st_mode & S_IXOTH) && ::geteuid() == 0)
    warnings.push_back("annotate: " + dir +
                       " is not searchable by other users (mode 0700, as Ingero's agent creates it): only root can "
                       "connect; chmod 755 it to let a training job of another user send its steps");
  return true;
}

std::string join_uids(const std::set<uint32_t>& uids) {
  std::string s = "root";
  for (uint32_t u : uids)
    if (u != 0) s += ", " + std::to_string(u);
  return s;
}

}  // namespace

std::string default_annotate_socket_path() {
  if (::access("/run", W_OK) == 0) return std::string(kAnnotateSocketDir) + "/" + kAnnotateSocketName;
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.ingero/annotate/" + kAnnotateSocketName;
  return std::string(kAnnotateSocketDir) + "-" + std::to_string(::geteuid()) + "/" + kAnnotateSocketName;
}

std::optional<uint32_t> proc_real_uid(uint32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Uid:", 0) == 0) {
      std::istringstream f(line.substr(4));
      uint64_t uid = 0;
      if (f >> uid && uid <= UINT32_MAX) return static_cast<uint32_t>(uid);
      return std::nullopt;
    }
  return std::nullopt;
}

std::optional<uint64_t> proc_start_time(uint32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // comm may hold spaces and parentheses
  if (close == std::string::npos) return std::nullopt;
  std::istringstream f(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (f >> field); ++i)
    if (i == 22) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(field.c_str(), &end, 10);
      if (end && *end == '\0') return static_cast<uint64_t>(v);
    }
  return std::nullopt;
}

std::string check_peer(const PeerCred& peer, const PeerPolicy& policy) {
  if (peer.uid == 0 || policy.uids.count(peer.uid)) return "";
  return "uid " + std::to_string(peer.uid) + " may not annotate this trace (allowed: " + join_uids(policy.uids) +
         "; `trace --annotate-uid " + std::to_string(peer.uid) + "` or `--pid` of its process allows it)";
}

std::string check_scope(const PeerCred& peer, Annotation& a, const PeerPolicy& policy) {
  const auto& uid_of = policy.pid_uid ? policy.pid_uid
                                      : std::function<std::optional<uint32_t>(uint32_t)>(proc_real_uid);
  const auto& start_of = policy.pid_start_time ? policy.pid_start_time
                                               : std::function<std::optional<uint64_t>(uint32_t)>(proc_start_time);
  if (a.pid != peer.pid) {
    const auto owner = uid_of(a.pid);
    if (!owner) return "pid " + std::to_string(a.pid) + ": no such process (who owns it cannot be checked)";
    if (peer.uid != 0 && *owner != peer.uid)
      return "pid " + std::to_string(a.pid) + " belongs to uid " + std::to_string(*owner) +
             ", not to the sender's uid " + std::to_string(peer.uid);
  }
  const auto started = start_of(a.pid);
  if (a.start_time && started && *started != a.start_time)
    return "start_time " + std::to_string(a.start_time) + " is not pid " + std::to_string(a.pid) + "'s (" +
           std::to_string(*started) + "): the pid was reused?";
  if (!a.start_time && started) a.start_time = *started;
  return "";
}

void LineFramer::feed(std::string_view bytes, const LineFn& line, const OverlongFn& overlong) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const std::string_view part = bytes.substr(0, nl);
    if (discarding_) {
      discarded_ += part.size();
    } else if (buf_.size() + part.size() > annotation_limits::kMaxLineBytes + 1) {  // + a '\r'
      discarding_ = true;
      discarded_ = buf_.size() + part.size();
      buf_.clear();
      buf_.shrink_to_fit();
    } else {
      buf_.append(part);
    }
    if (nl == std::string_view::npos) return;
    if (discarding_) {
      overlong(discarded_);
      discarding_ = false;
      discarded_ = 0;
    } else {
      line(buf_);
      buf_.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
}

void LineFramer::finish(const LineFn& line, const OverlongFn& overlong) {
  if (discarding_) overlong(discarded_);
  else if (!buf_.empty()) line(buf_);
  buf_.clear();
  discarding_ = false;
  discarded_ = 0;
}

struct AnnotateServer::Impl {
  Options o;
  std::string path;
  int listen_fd = -1, stop_fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
  std::thread thread;
  bool stopped = false;

  struct Conn {
    int fd = -1;
    PeerCred peer;
    LineFramer framer;
    uint64_t window_ms = 0;
    uint32_t window_lines = 0;
    bool window_started = false;
  };
  std::vector<Conn> conns;  // the server thread's only

  mutable std::mutex mu;  // guards what follows
  AnnotateStats stats;
  std::vector<Annotation> kept;
  std::vector<std::string> warnings;

  uint64_t now() const { return o.now_ns ? o.now_ns() : realtime_ns(); }

  // Counts a refused connection or a rejected line under `why`; the first of each reason becomes
  // a warning. Called with `mu` held.
  void count_reason(const std::string& what, const PeerCred& peer, const std::string& why) {
    auto it = stats.reasons.find(why);
    if (it == stats.reasons.end() && stats.reasons.size() >= kMaxReasons) {
      ++stats.reasons["other reasons"];
      return;
    }
    if (it == stats.reasons.end())
      warnings.push_back("annotate: " + what + " from pid " + std::to_string(peer.pid) + " (uid " +
                         std::to_string(peer.uid) + "): " + why);
    ++stats.reasons[why];
  }

  void refuse(int fd, const PeerCred& peer, const std::string& why) {
    ::close(fd);
    std::lock_guard<std::mutex> lk(mu);
    ++stats.refused;
    count_reason("connection refused", peer, why);
  }

  void reject(const Conn& c, const std::string& why) {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.rejected;
    count_reason("line rejected", c.peer, why);
  }

  void on_line(Conn& c, std::string_view line) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;  // blank
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.lines;
    }
    const uint64_t ms = steady_ms();
    if (!c.window_started || ms - c.window_ms >= 1000) {
      c.window_started = true;
      c.window_ms = ms;
      c.window_lines = 0;
    }
    if (++c.window_lines > o.rate_limit)
      return reject(c, "over the rate limit of " + std::to_string(o.rate_limit) + " lines/s on one connection");
    Annotation a;
    std::string error;
    if (!parse_annotation_line(line, a, error)) return reject(c, error);
    const uint64_t now_ns = now();
    if (a.ts_given) {
      const uint64_t skew = a.ts_ns > now_ns ? a.ts_ns - now_ns : now_ns - a.ts_ns;
      if (skew > o.max_ts_skew_ns)
        return reject(c, "ts " + std::to_string(a.ts_ns) + " is " + format_ns(static_cast<double>(skew)) +
                             (a.ts_ns > now_ns ? " after" : " before") +
                             " the receive time (expected unix nanoseconds, CLOCK_REALTIME)");
    } else {
      a.ts_ns = now_ns;
    }
    if (a.pid == 0) a.pid = c.peer.pid;
    if (const std::string why = check_scope(c.peer, a, o.policy); !why.empty()) return reject(c, why);
    a.peer_pid = c.peer.pid;
    a.peer_uid = c.peer.uid;
    a.peer_gid = c.peer.gid;
    a.node = o.node;
    std::lock_guard<std::mutex> lk(mu);
    ++stats.annotations;
    if (a.label("step")) ++stats.step_markers;
    else if (a.label("epoch")) ++stats.epoch_only;
    if (kept.size() < o.max_kept) kept.push_back(std::move(a));
    else ++stats.not_kept;
  }

  void on_overlong(Conn& c, size_t bytes) {
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.lines;
    }
    reject(c, "line over the " + std::to_string(annotation_limits::kMaxLineBytes) +
                  "-byte limit: discarded up to its newline (" + std::to_string(bytes) + " bytes)");
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or an error the next poll reports again
      PeerCred peer;
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) {
        refuse(fd, peer, "cannot read the peer's credentials (SO_PEERCRED: " + errno_text(errno) + ")");
        continue;
      }
      peer.pid = static_cast<uint32_t>(cred.pid);
      peer.uid = cred.uid;
      peer.gid = cred.gid;
      if (const std::string why = check_peer(peer, o.policy); !why.empty()) {
        refuse(fd, peer, why);
        continue;
      }
      if (conns.size() >= o.max_connections) {
        refuse(fd, peer, "too many connections (" + std::to_string(o.max_connections) + " open)");
        continue;
      }
      Conn c;
      c.fd = fd;
      c.peer = peer;
      conns.push_back(std::move(c));
      std::lock_guard<std::mutex> lk(mu);
      ++stats.connections;
    }
  }

  // Reads what is waiting; false when the connection ended (EOF or error).
  bool read_conn(Conn& c, bool drain) {
    char buf[16384];
    size_t got = 0;
    const auto line = [&](std::string_view l) { on_line(c, l); };
    const auto overlong = [&](size_t n) { on_overlong(c, n); };
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.framer.feed(std::string_view(buf, static_cast<size_t>(n)), line, overlong);
        got += static_cast<size_t>(n);
        if (!drain && got >= kReadChunk) return true;  // fairness: others get their turn
        continue;
      }
      if (n == 0) {
        c.framer.finish(line, overlong);
        return false;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      c.framer.finish(line, overlong);  // ECONNRESET...: what arrived before counts
      return false;
    }
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({stop_fd, POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (const Conn& c : conns) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (fds[0].revents) break;
      // Connections first (their indexes match fds), then new ones.
      size_t keep = 0;
      for (size_t i = 0; i < conns.size(); ++i) {
        bool alive = true;
        if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) alive = read_conn(conns[i], false);
        if (alive) {
          if (keep != i) conns[keep] = std::move(conns[i]);
          ++keep;
        } else {
          ::close(conns[i].fd);
        }
      }
      conns.resize(keep);
      if (fds[1].revents & POLLIN) accept_all();
    }
    // Stopping: what is already waiting is read; a line still without its newline is cut.
    for (Conn& c : conns) {
      if (read_conn(c, true) && c.framer.pending()) reject(c, "line cut off when the trace stopped");
      ::close(c.fd);
    }
    conns.clear();
  }
};

AnnotateServer::AnnotateServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AnnotateServer::~AnnotateServer() { stop(); }

std::unique_ptr<AnnotateServer> AnnotateServer::start(Options options, std::string& error) {
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  const bool default_path = impl->o.path.empty();
  std::string path = default_path ? default_annotate_socket_path() : impl->o.path;
  impl->path = path;
  std::vector<std::string> warnings;
  if (default_path) {
    const std::string dir = path.substr(0, path.rfind('/'));
    // $HOME/.ingero/annotate: make its parent too (ours, private).
    if (const size_t up = dir.rfind('/'); dir.ends_with("/.ingero/annotate") && up != std::string::npos)
      if (!make_dir(dir.substr(0, up), 0700, error)) return nullptr;
    if (!make_dir(dir, dir.ends_with("/.ingero/annotate") ? 0700 : 0755, error)) return nullptr;
    if (!check_own_dir(dir, warnings, error)) return nullptr;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    error = path + ": too long for a Unix socket path (at most " + std::to_string(sizeof addr.sun_path - 1) + " bytes)";
    return nullptr;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // Something already at the path: a socket nobody listens on is a leftover and goes; a live one,
  // or anything that is not a socket, stays and is an error.
  if (struct stat st{}; ::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) return error = path + ": is a symlink; refusing to replace it", nullptr;
    if (!S_ISSOCK(st.st_mode)) return error = path + ": exists and is not a socket; refusing to replace it", nullptr;
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = probe >= 0 && ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) ::close(probe);
    if (live)
      return error = path +
                     ": another process is listening there (an Ingero agent run with --annotate?); stop it, or give "
                     "trace --annotate=OTHER_PATH",
             nullptr;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return error = path + ": cannot remove the stale socket (" + errno_text(errno) + ")", nullptr;
  }
  impl->listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (impl->listen_fd < 0) return error = path + ": socket: " + errno_text(errno), nullptr;
  const auto fail = [&](const std::string& what) {
    error = path + ": " + what + " (" + errno_text(errno) + ")";
    ::close(impl->listen_fd);
    impl->listen_fd = -1;
    return nullptr;
  };
  if (::bind(impl->listen_fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    return fail("cannot bind the annotation socket");
  struct stat st {};
  // Anyone may connect; SO_PEERCRED decides who may send (check_peer).
  if (::chmod(path.c_str(), 0666) != 0 || ::lstat(path.c_str(), &st) != 0) {
    ::unlink(path.c_str());
    return fail("cannot set the socket's mode");
  }
  impl->dev = st.st_dev;
  impl->ino = st.st_ino;
  if (::listen(impl->listen_fd, 128) != 0) {
    ::unlink(path.c_str());
    return fail("listen");
  }
  impl->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->stop_fd < 0) {
    ::unlink(path.c_str());
    return fail("eventfd");
  }
  impl->warnings = std::move(warnings);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<AnnotateServer>(new AnnotateServer(std::move(impl)));
}

void AnnotateServer::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  const uint64_t one = 1;
  if (::write(impl_->stop_fd, &one, sizeof one) < 0) {
  }  // an eventfd write of 1 cannot fail short of EAGAIN at 2^64 - 1
  if (impl_->thread.joinable()) impl_->thread.join();
  ::close(impl_->listen_fd);
  ::close(impl_->stop_fd);
  // Remove the socket file only if it is still the one we bound (not someone else's since).
  if (struct stat st{}; ::lstat(impl_->path.c_str(), &st) == 0 && st.st_dev == impl_->dev && st.st_ino == impl_->ino)
    ::unlink(impl_->path.c_str());
}

const std::string& AnnotateServer::path() const { return impl_->path; }

std::vector<Annotation> AnnotateServer::take_annotations() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<Annotation> out;
  out.swap(impl_->kept);
  return out;
}

AnnotateStats AnnotateServer::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->stats;
}

std::vector<std::string> AnnotateServer::take_warnings() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<std::string> out;
  out.swap(impl_->warnings);
  return out;
}

std::string annotate_summary(const AnnotateStats& s) {
  std::string t = std::to_string(s.connections + s.refused) + " connection(s)";
  if (s.refused) t += " (" + std::to_string(s.refused) + " refused)";
  t += ", " + std::to_string(s.lines) + " line(s): " + std::to_string(s.annotations) + " annotation(s) (" +
       std::to_string(s.step_markers) + " step marker(s)";
  if (s.epoch_only) t += ", " + std::to_string(s.epoch_only) + " epoch-only";
  t += ")";
  if (s.rejected) t += ", " + std::to_string(s.rejected) + " rejected";
  if (s.not_kept) t += ", " + std::to_string(s.not_kept) + " over the cap, not kept";
  if (!s.reasons.empty()) {
    t += "; why:";
    bool first = true;
    for (const auto& [why, n] : s.reasons) {
      t += (first ? " " : "; ") + why + " x" + std::to_string(n);
      first = false;
    }
  }
  return t;
}

}  // namespace ingero
