#include "sinks/fleet/process_identity.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "model/ops.h"
#include "sinks/store/lmdb_store.h"
#include "sinks/store/sqlite_schema.h"
#include "sinks/store/sqlite_store.h"

namespace ingero {
namespace {

namespace fs = std::filesystem;

// A plain decimal in [lo, hi]; anything else (sign, spaces, hex, overflow) is rejected.
bool parse_int(std::string_view s, int64_t lo, int64_t hi, int32_t& out) {
  if (s.empty() || s.size() > 10) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  out = static_cast<int32_t>(v);
  return true;
}

struct EnvField {
  const char* var;
  const char* launcher;
};
// Precedence per field: the first variable present and valid wins.
constexpr EnvField kRank[] = {{"RANK", "torchrun"}, {"OMPI_COMM_WORLD_RANK", "openmpi"}, {"SLURM_PROCID", "slurm"}};
constexpr EnvField kLocal[] = {{"LOCAL_RANK", "torchrun"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "openmpi"},
                               {"SLURM_LOCALID", "slurm"}};
constexpr EnvField kWorld[] = {{"WORLD_SIZE", "torchrun"},
                               {"OMPI_COMM_WORLD_SIZE", "openmpi"},
                               {"SLURM_NTASKS", "slurm"}};
constexpr EnvField kJob[] = {{"TORCHELASTIC_RUN_ID", "torchrun"}, {"SLURM_JOB_ID", "slurm"}};

constexpr int64_t kMaxRank = 32767;  // Event::rank is int16
constexpr int64_t kMaxWorld = 1 << 24;
constexpr size_t kMaxJobId = 128;
constexpr size_t kMaxEnviron = 1 << 20;  // read at most 1 MiB of environment

}  // namespace

ProcessIdentity parse_environ(std::string_view text) {
  std::map<std::string_view, std::string_view> vars;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\0', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view entry = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    vars.emplace(entry.substr(0, eq), entry.substr(eq + 1));  // the first definition wins, as getenv
  }
  ProcessIdentity id;
  auto number = [&](const auto& fields, int64_t lo, int64_t hi, int32_t& out, bool sets_launcher) {
    for (const EnvField& f : fields) {
      auto it = vars.find(f.var);
      if (it == vars.end()) continue;
      if (!parse_int(it->second, lo, hi, out)) {
        ++id.bad_values;
        continue;
      }
      if (sets_launcher) id.launcher = f.launcher;
      return;
    }
  };
  number(kRank, 0, kMaxRank, id.rank, true);
  number(kLocal, 0, kMaxRank, id.local_rank, false);
  number(kWorld, 1, kMaxWorld, id.world_size, false);
  for (const EnvField& f : kJob) {
    auto it = vars.find(f.var);
    if (it == vars.end()) continue;
    const std::string_view v = it->second;
    const bool printable = std::all_of(v.begin(), v.end(), [](char c) { return c > ' ' && c < 127; });
    if (v.empty() || v.size() > kMaxJobId || !printable) {
      ++id.bad_values;
      continue;
    }
    id.job_id.assign(v);
    if (id.launcher.empty()) id.launcher = f.launcher;
    break;
  }
  return id;
}

bool read_process_identity(uint32_t pid, ProcessIdentity& out, const std::string& proc_root) {
  const std::string path = proc_root + "/" + std::to_string(pid) + "/environ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string buf;
  char chunk[8192];
  bool ok = true;
  while (buf.size() < kMaxEnviron) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      ok = false;  // e.g. EACCES on a process of another user without ptrace rights
      break;
    }
    if (n == 0) break;
    buf.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  if (!ok) return false;
  out = parse_environ(buf);
  return true;
}

const ProcessIdentity* ProcessIdentityCache::lookup(uint32_t pid, uint64_t ts_ns) {
  if (pid == 0) return nullptr;
  if (auto it = live_.find(pid); it != live_.end()) return &it->second.id;
  if (live_.size() >= max_pids_) {
    ++stats_.overflow;
    return nullptr;
  }
  ProcessIdentityRow row;
  row.pid = pid;
  row.first_seen_ns = ts_ns;
  ++stats_.reads;
  if (!read_process_identity(pid, row.id, proc_root_)) ++stats_.unreadable;
  if (row.id.rank >= 0) ++stats_.with_rank;
  stats_.bad_values += row.id.bad_values;
  return &live_.emplace(pid, std::move(row)).first->second.id;
}

void ProcessIdentityCache::stamp(Batch& batch) {
  for (Event& e : batch.events) {
    if (e.pid == 0) continue;
    if (e.source == Source::kHost && (e.op == op::kProcessExec || e.op == op::kProcessExit)) {
      // A new image (exec) has a new environment; an exited pid may be reused.
      if (auto it = live_.find(e.pid); it != live_.end()) {
        if (it->second.id.known()) retired_.push_back(std::move(it->second));
        live_.erase(it);
      }
      continue;
    }
    const ProcessIdentity* id = lookup(e.pid, e.ts_ns);
    if (id && e.rank < 0 && id->rank >= 0) {
      e.rank = static_cast<int16_t>(id->rank);
      ++stats_.stamped;
    }
  }
}

std::vector<ProcessIdentityRow> ProcessIdentityCache::rows() const {
  std::vector<ProcessIdentityRow> out = retired_;
  for (const auto& [pid, row] : live_)
    if (row.id.known()) out.push_back(row);
  std::sort(out.begin(), out.end(), [](const ProcessIdentityRow& a, const ProcessIdentityRow& b) {
    return a.pid != b.pid ? a.pid < b.pid : a.first_seen_ns < b.first_seen_ns;
  });
  return out;
}

// --- node id -----------------------------------------------------------------------------------

std::string default_state_dir() {
  const char* env = std::getenv("INGERO_STATE_DIR");
  return env && *env ? env : "/var/lib/ingero-pipeline";
}

bool valid_node_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

namespace {

// The stored id, trimmed of surrounding whitespace; false when the file does not exist.
bool read_id_file(const std::string& path, std::string& id, bool& exists) {
  std::ifstream in(path);
  exists = static_cast<bool>(in);
  if (!in) return false;
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto b = s.find_first_not_of(" \t\r\n");
  const auto e = s.find_last_not_of(" \t\r\n");
  id = b == std::string::npos ? "" : s.substr(b, e - b + 1);
  return true;
}

std::string random_node_id() {
  uint64_t r = 0;
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(reinterpret_cast<char*>(&r), sizeof(r)))
    r = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "node-%012llx", static_cast<unsigned long long>(r & 0xffffffffffffULL));
  return buf;
}

}  // namespace

bool load_or_create_node_id(const std::string& state_dir, std::string& id, bool& created, std::string& error) {
  created = false;
  const std::string path = (fs::path(state_dir) / "node-id").string();
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool exists = false;
    if (read_id_file(path, id, exists)) {
      if (valid_node_name(id)) return true;
      error = path + ": not a valid node id ('" + id.substr(0, 80) +
              "'; expected 1-64 of A-Z a-z 0-9 . _ -); fix or remove the file";
      return false;
    }
    std::error_code ec;
    fs::create_directories(state_dir, ec);
    if (ec) {
      error = state_dir + ": cannot create the state directory: " + ec.message() +
              " (set INGERO_STATE_DIR, or name the node with --node)";
      return false;
    }
    // Write a temporary file completely, then link(2) it into place: link never replaces an
    // existing file, so of two first runs racing, one wins and the other reads its id.
    const std::string fresh = random_node_id();
    // Unique per process and attempt (threads share a pid): never another writer's file.
    std::string tmp = path;
    tmp.append(".tmp.").append(std::to_string(::getpid())).append(".").append(fresh);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      error = tmp + ": " + std::strerror(errno) + " (set INGERO_STATE_DIR, or name the node with --node)";
      return false;
    }
    const std::string line = fresh + "\n";
    const bool wrote = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
    ::close(fd);
    if (!wrote) {
      error = tmp + ": write failed: " + std::strerror(errno);
      ::unlink(tmp.c_str());
      return false;
    }
    const int rc = ::link(tmp.c_str(), path.c_str());
    const int link_errno = errno;
    ::unlink(tmp.c_str());
    if (rc == 0) {
      const int dfd = ::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
      }
      id = fresh;
      created = true;
      return true;
    }
    if (link_errno != EEXIST) {
      error = path + ": " + std::strerror(link_errno);
      return false;
    }
    // Lost the race: read the winner's id on the next attempt.
  }
  error = path + ": could not be read after it was created";
  return false;
}

std::string local_hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// --- storage -------------------------------------------------------------------------------------

namespace {

nlohmann::json to_json(const IdentityTables& t) {
  nlohmann::json j = {{"attributes", t.attributes}, {"processes", nlohmann::json::object()}};
  for (const auto& [node, rows] : t.processes) {
    auto& arr = j["processes"][node];
    arr = nlohmann::json::array();
    for (const auto& r : rows)
      arr.push_back({{"pid", r.pid},
                     {"rank", r.id.rank},
                     {"local_rank", r.id.local_rank},
                     {"world_size", r.id.world_size},
                     {"job_id", r.id.job_id},
                     {"launcher", r.id.launcher},
                     {"first_seen", r.first_seen_ns}});
  }
  return j;
}

// Tolerant: fields of the wrong type are left at their defaults.
IdentityTables from_json(const nlohmann::json& j) {
  IdentityTables t;
  auto num = [](const nlohmann::json& o, const char* k, int64_t fb) -> int64_t {
    auto it = o.find(k);
    return it != o.end() && it->is_number_integer() ? it->get<int64_t>() : fb;
  };
  auto str = [](const nlohmann::json& o, const char* k) -> std::string {
    auto it = o.find(k);
    return it != o.end() && it->is_string() ? it->get<std::string>() : "";
  };
  if (!j.is_object()) return t;
  if (auto a = j.find("attributes"); a != j.end() && a->is_object())
    for (const auto& [node, kv] : a->items())
      if (kv.is_object())
        for (const auto& [k, v] : kv.items())
          if (v.is_string()) t.attributes[node][k] = v.get<std::string>();
  if (auto p = j.find("processes"); p != j.end() && p->is_object())
    for (const auto& [node, arr] : p->items()) {
      if (!arr.is_array()) continue;
      for (const auto& o : arr) {
        if (!o.is_object()) continue;
        ProcessIdentityRow r;
        r.pid = static_cast<uint32_t>(num(o, "pid", 0));
        r.id.rank = static_cast<int32_t>(num(o, "rank", -1));
        r.id.local_rank = static_cast<int32_t>(num(o, "local_rank", -1));
        r.id.world_size = static_cast<int32_t>(num(o, "world_size", -1));
        r.id.job_id = str(o, "job_id");
        r.id.launcher = str(o, "launcher");
        r.first_seen_ns = static_cast<uint64_t>(num(o, "first_seen", 0));
        t.processes[node].push_back(r);
      }
    }
  return t;
}

constexpr const char* kLmdbKey = "fleet_identity";

void merge_into(IdentityTables& into, const IdentityTables& from) {
  for (const auto& [node, kv] : from.attributes)
    for (const auto& [k, v] : kv) into.attributes[node][k] = v;
  for (const auto& [node, rows] : from.processes) {
    auto& dst = into.processes[node];
    for (const auto& r : rows) {
      auto same = [&](const ProcessIdentityRow& x) { return x.pid == r.pid && x.first_seen_ns == r.first_seen_ns; };
      auto it = std::find_if(dst.begin(), dst.end(), same);
      if (it != dst.end()) *it = r;
      else dst.push_back(r);
    }
  }
}

}  // namespace

IdentityTables read_identity(const std::string& path) {
  IdentityTables t;
  if (is_lmdb_file(path)) {
    std::string text;
    if (lmdb_get_meta_value(path, kLmdbKey, text)) {
      auto j = nlohmann::json::parse(text, nullptr, false);
      if (!j.is_discarded()) t = from_json(j);
    }
    return t;
  }
  if (!is_sqlite_file(path)) return t;
  sqlite3* db = nullptr;
  const std::string uri = "file:" + path + "?immutable=1";
  if (sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return t;
  }
  auto text = [](sqlite3_stmt* st, int i) {
    const auto* p = sqlite3_column_text(st, i);
    return p ? std::string(reinterpret_cast<const char*>(p)) : std::string();
  };
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT node, key, value FROM ip_node_attributes", -1, &st, nullptr) == SQLITE_OK)
    while (sqlite3_step(st) == SQLITE_ROW) t.attributes[text(st, 0)][text(st, 1)] = text(st, 2);
  sqlite3_finalize(st);
  st = nullptr;
  if (sqlite3_prepare_v2(db,
                         "SELECT node, pid, rank, local_rank, world_size, job_id, launcher, first_seen "
                         "FROM ip_process_identity ORDER BY node, pid, first_seen",
                         -1, &st, nullptr) == SQLITE_OK)
    while (sqlite3_step(st) == SQLITE_ROW) {
      ProcessIdentityRow r;
      auto opt = [&](int i) {
        return sqlite3_column_type(st, i) == SQLITE_NULL ? -1 : static_cast<int32_t>(sqlite3_column_int64(st, i));
      };
      r.pid = static_cast<uint32_t>(sqlite3_column_int64(st, 1));
      r.id.rank = opt(2);
      r.id.local_rank = opt(3);
      r.id.world_size = opt(4);
      r.id.job_id = text(st, 5);
      r.id.launcher = text(st, 6);
      r.first_seen_ns = static_cast<uint64_t>(sqlite3_column_int64(st, 7));
      t.processes[text(st, 0)].push_back(r);
    }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return t;
}

bool write_identity(const std::string& path, const IdentityTables& tables, std::string& error) {
  if (is_lmdb_file(path)) {
    IdentityTables all = read_identity(path);
    merge_into(all, tables);
    return lmdb_put_meta_value(path, kLmdbKey, to_json(all).dump(), error);
  }
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    error = path + ": " + sqlite3_errmsg(db);
    sqlite3_close(db);
    return false;
  }
  sqlite3_busy_timeout(db, 5000);
  bool ok = true;
  auto exec = [&](const char* sql) {
    char* msg = nullptr;
    if (!ok || sqlite3_exec(db, sql, nullptr, nullptr, &msg) == SQLITE_OK) return;
    ok = false;
    error = path + ": " + (msg ? msg : "sqlite error");
    sqlite3_free(msg);
  };
  exec("BEGIN");
  exec(sqlite_detail::kIdentitySql);
  auto bind_text = [](sqlite3_stmt* st, int i, const std::string& s) {
    sqlite3_bind_text(st, i, s.c_str(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  };
  auto run = [&](const char* sql, auto&& each) {
    if (!ok) return;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) {
      ok = false;
      error = path + ": " + sqlite3_errmsg(db);
      return;
    }
    each(st, [&] {
      if (ok && sqlite3_step(st) != SQLITE_DONE) {
        ok = false;
        error = path + ": " + sqlite3_errmsg(db);
      }
      sqlite3_reset(st);
    });
    sqlite3_finalize(st);
  };
  run("INSERT OR REPLACE INTO ip_node_attributes(node, key, value) VALUES(?1, ?2, ?3)",
      [&](sqlite3_stmt* st, auto&& step) {
        for (const auto& [node, kv] : tables.attributes)
          for (const auto& [k, v] : kv) {
            bind_text(st, 1, node);
            bind_text(st, 2, k);
            bind_text(st, 3, v);
            step();
          }
      });
  run("INSERT OR REPLACE INTO ip_process_identity(node, pid, rank, local_rank, world_size, job_id, "
      "launcher, first_seen) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
      [&](sqlite3_stmt* st, auto&& step) {
        auto opt = [&](int i, int32_t v) {
          if (v < 0) sqlite3_bind_null(st, i);
          else sqlite3_bind_int64(st, i, v);
        };
        for (const auto& [node, rows] : tables.processes)
          for (const auto& r : rows) {
            bind_text(st, 1, node);
            sqlite3_bind_int64(st, 2, r.pid);
            opt(3, r.id.rank);
            opt(4, r.id.local_rank);
            opt(5, r.id.world_size);
            bind_text(st, 6, r.id.job_id);
            bind_text(st, 7, r.id.launcher);
            sqlite3_bind_int64(st, 8, static_cast<int64_t>(r.first_seen_ns));
            step();
          }
      });
  if (ok) exec("COMMIT");
  else sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  return ok;
}

}  // namespace ingero
