// `trace --annotate`: the Unix stream socket on which traced programs report their own steps, in
// Ingero's annotation protocol (model/annotation.h; docs/steps.md "Explicit step markers"), so
// the PyTorch Lightning callback and the Ray helpers written for Ingero's agent work unchanged.
// No BPF here (ip_annotate links no libbpf): it builds and is tested everywhere.
//
// Contract:
// - AnnotateServer::start() binds the socket (default: default_annotate_socket_path(), the path
//   Ingero's agent binds and its Python writer dials) and serves it on one thread of its own
//   (poll: every connection, no thread per client) until stop() or destruction. The socket is
//   mode 0666 and its default directory 0755, owned by us and writable by nobody else: anyone may
//   connect, and each connection's SO_PEERCRED decides (check_peer): root and the uids in
//   PeerPolicy::uids may send; any other connection is closed at once, counted and reported
//   with the reason. An existing socket at the path is replaced only when nobody listens on it
//   (a live one, e.g. an Ingero agent's, is an error); a path that is not a socket (a file, a
//   symlink) is never removed. stop() removes the socket file if it is still ours.
// - Lines: at most annotation_limits::kMaxLineBytes; a longer one is discarded up to its newline
//   and reported (the connection goes on); blank lines are ignored; the last line of a
//   connection may lack its newline. At most `rate_limit` lines per second per connection (a
//   fixed window, as Ingero's): the rest are rejected and counted.
// - Each line: parse_annotation_line(); a "ts" more than 24 h from the receive time is refused
//   (not unix ns: seconds or ms by mistake); no "ts": the receive time (CLOCK_REALTIME). No
//   "pid": the sender's. check_scope(): a pid other than the sender's must belong to the sender's
//   uid (any, for root) and still exist; a "start_time" must match /proc's (pid reuse). The
//   annotation keeps the sender's credentials (peer_*) and `node`.
// - Nothing on the data path throws or stops the server: every refused connection and rejected
//   line is counted in stats().reasons under what was wrong, and the first occurrence of each
//   reason is queued for take_warnings() with the sender's pid and uid.
// - Memory: per connection one line buffer (<= kMaxLineBytes); at most max_connections at once
//   (more are closed, counted); at most max_kept annotations kept (more are counted, not kept);
//   at most 32 distinct reasons (the rest under "other reasons").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "model/annotation.h"

namespace ingero {

inline constexpr const char* kAnnotateSocketDir = "/run/ingero";
inline constexpr const char* kAnnotateSocketName = "annotate.sock";

// Ingero's choice, which its Python writer mirrors: /run/ingero/annotate.sock when /run is
// writable (a root trace), else $HOME/.ingero/annotate/annotate.sock, else
// /run/ingero-<euid>/annotate.sock.
std::string default_annotate_socket_path();

struct PeerCred {
  uint32_t pid = 0, uid = 0, gid = 0;
};

struct PeerPolicy {
  std::set<uint32_t> uids;  // allowed besides root (uid 0)
  // The real uid and the start time (/proc/<pid>/stat field 22) of a process; nullopt when it
  // does not exist. Empty: read /proc (proc_real_uid, proc_start_time). Tests replace them.
  std::function<std::optional<uint32_t>(uint32_t pid)> pid_uid;
  std::function<std::optional<uint64_t>(uint32_t pid)> pid_start_time;
};

// "" when a connection with these credentials may send annotations; else why not (one line).
std::string check_peer(const PeerCred& peer, const PeerPolicy& policy);
// "" when `peer` may annotate process a.pid (see the contract); fills a.start_time from /proc when
// the line gave none. Else why not.
std::string check_scope(const PeerCred& peer, Annotation& a, const PeerPolicy& policy);
std::optional<uint32_t> proc_real_uid(uint32_t pid);
std::optional<uint64_t> proc_start_time(uint32_t pid);

// Splits a byte stream into lines of at most annotation_limits::kMaxLineBytes bytes (without the
// newline), holding at most that many bytes.
class LineFramer {
 public:
  using LineFn = std::function<void(std::string_view line)>;
  using OverlongFn = std::function<void(size_t bytes)>;  // a discarded line and its length
  void feed(std::string_view bytes, const LineFn& line, const OverlongFn& overlong);
  // End of stream: a last line without a newline is a line.
  void finish(const LineFn& line, const OverlongFn& overlong);
  size_t pending() const { return buf_.size() + discarded_; }

 private:
  std::string buf_;
  bool discarding_ = false;
  size_t discarded_ = 0;
};

struct AnnotateStats {
  uint64_t connections = 0;                 // accepted
  uint64_t refused = 0;                     // closed at once (peer not allowed, credentials unreadable, too many)
  uint64_t lines = 0;                       // non-blank lines received
  uint64_t annotations = 0;                 // lines accepted
  uint64_t step_markers = 0;                // accepted annotations with a "step" label
  uint64_t epoch_only = 0;                  // accepted annotations with "epoch" but no "step"
  uint64_t rejected = 0;                    // lines refused (each under its reason)
  uint64_t not_kept = 0;                    // accepted beyond max_kept: counted, not kept
  std::map<std::string, uint64_t> reasons;  // what was wrong -> count (connections and lines)
};

class AnnotateServer {
 public:
  struct Options {
    std::string path;  // "" = default_annotate_socket_path()
    PeerPolicy policy;
    uint16_t node = 0;  // Annotation::node of everything received
    size_t max_connections = 256;
    size_t max_kept = 1'000'000;
    uint32_t rate_limit = 1000;        // lines per second per connection (Ingero's)
    std::function<uint64_t()> now_ns;  // CLOCK_REALTIME unless set (tests)
    uint64_t max_ts_skew_ns = 24ull * 3600 * 1'000'000'000;
  };

  // Null with `error` (one line, naming the path) when the socket cannot be set up.
  static std::unique_ptr<AnnotateServer> start(Options options, std::string& error);
  ~AnnotateServer();
  AnnotateServer(const AnnotateServer&) = delete;
  AnnotateServer& operator=(const AnnotateServer&) = delete;

  // Reads what is already waiting on every connection, closes them and the socket, removes the
  // socket file if it is still ours, joins the thread. Idempotent.
  void stop();
  const std::string& path() const;
  // The accepted annotations so far, in arrival order; later ones keep coming after the call.
  std::vector<Annotation> take_annotations();
  AnnotateStats stats() const;
  std::vector<std::string> take_warnings();

  struct Impl;

 private:
  explicit AnnotateServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "3 connections (1 refused), 120 lines: 118 annotations (100 step markers), 2 rejected" and,
// when some were refused or rejected, "; why: <reason> x N; ..." (the CLI's summary line).
std::string annotate_summary(const AnnotateStats& s);

}  // namespace ingero
