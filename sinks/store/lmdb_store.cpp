#include "sinks/store/lmdb_store.h"

#include <lmdb.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/predicate_json.h"
#include "model/result_json.h"

namespace ingero {
namespace {

using nlohmann::json;

constexpr uint32_t kChunkMagic = 0x31435049;  // "IPC1" little-endian
constexpr uint16_t kChunkVersion = 1;
constexpr uint32_t kChunkSorted = 1;
constexpr uint64_t kPage = 4096;
constexpr uint32_t kLmdbMagic = 0xBEEFC0DE;  // mm_magic of an LMDB meta page

struct ChunkHeader {
  uint32_t magic = kChunkMagic;
  uint16_t version = kChunkVersion;
  uint16_t event_size = sizeof(Event);
  uint32_t count = 0;
  uint32_t flags = kChunkSorted;
  uint64_t first_ts = 0;
  uint64_t last_ts = 0;  // largest start
  uint64_t max_end = 0;
  uint64_t checksum = 0;
};
static_assert(sizeof(ChunkHeader) == 48);

// A cheap 4-lane multiplicative hash over 64-bit words: catches torn or foreign values at a few
// percent of the replay cost (LMDB itself does not checksum pages).
uint64_t checksum(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    for (size_t l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      h[l] = (h[l] ^ w) * 0x9E3779B97F4A7C15ull;
      h[l] ^= h[l] >> 29;
    }
  }
  uint64_t r = h[0] ^ (h[1] << 1) ^ (h[2] << 2) ^ (h[3] << 3) ^ bytes;
  for (; i < bytes; ++i) r = (r ^ p[i]) * 0x100000001B3ull;
  return r;
}

void put_be64(unsigned char* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<unsigned char>(v & 0xff);
    v >>= 8;
  }
}
uint64_t get_be64(const unsigned char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | in[i];
  return v;
}

uint64_t chunk_cost(size_t events) {
  // An LMDB value this large lives on overflow pages: a page header plus the value, in pages.
  return (16 + sizeof(ChunkHeader) + events * sizeof(Event) + kPage - 1) / kPage * kPage;
}

std::string lmdb_error(int rc) { return mdb_strerror(rc); }

bool file_exists(const std::string& path, uint64_t* size = nullptr, bool* is_dir = nullptr) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  if (size) *size = static_cast<uint64_t>(st.st_size);
  if (is_dir) *is_dir = S_ISDIR(st.st_mode);
  return true;
}

// Counters kept in `meta`, written in the same transaction as the chunks they describe.
struct Counters {
  uint64_t events = 0, chunks = 0, next_seq = 0, dropped_events = 0, dropped_chunks = 0, stored_bytes = 0, first_ts = 0,
           last_ts = 0, chains = 0;
};

constexpr const char* kCounterNames[] = {"events",       "chunks",   "next_seq", "dropped_events", "dropped_chunks",
                                         "stored_bytes", "first_ts", "last_ts",  "chains"};
uint64_t* counter_fields(Counters& c, size_t i) {
  uint64_t* f[] = {&c.events,       &c.chunks,   &c.next_seq, &c.dropped_events, &c.dropped_chunks,
                   &c.stored_bytes, &c.first_ts, &c.last_ts,  &c.chains};
  return f[i];
}

int put_counters(MDB_txn* txn, MDB_dbi meta, Counters& c) {
  for (size_t i = 0; i < std::size(kCounterNames); ++i) {
    MDB_val k{std::strlen(kCounterNames[i]), const_cast<char*>(kCounterNames[i])};
    MDB_val v{sizeof(uint64_t), counter_fields(c, i)};
    if (int rc = mdb_put(txn, meta, &k, &v, 0)) return rc;
  }
  return 0;
}

void get_counters(MDB_txn* txn, MDB_dbi meta, Counters& c) {
  for (size_t i = 0; i < std::size(kCounterNames); ++i) {
    MDB_val k{std::strlen(kCounterNames[i]), const_cast<char*>(kCounterNames[i])};
    MDB_val v{};
    if (mdb_get(txn, meta, &k, &v) == 0 && v.mv_size == sizeof(uint64_t))
      std::memcpy(counter_fields(c, i), v.mv_data, sizeof(uint64_t));
  }
}

bool get_string(MDB_txn* txn, MDB_dbi dbi, const char* key, std::string& out) {
  MDB_val k{std::strlen(key), const_cast<char*>(key)};
  MDB_val v{};
  if (mdb_get(txn, dbi, &k, &v) != 0) return false;
  out.assign(static_cast<const char*>(v.mv_data), v.mv_size);
  return true;
}

int put_string(MDB_txn* txn, MDB_dbi dbi, const std::string& key, const std::string& value) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{value.size(), const_cast<char*>(value.data())};
  return mdb_put(txn, dbi, &k, &v, 0);
}

// --- JSON forms of the metadata and chains ---------------------------------------------------

json meta_to_json(const TraceMeta& m) {
  json j;
  j["path"] = m.path;
  j["format"] = m.format;
  j["nodes"] = m.nodes;
  json names = json::object();
  for (const auto& [pid, name] : m.process_names) names[std::to_string(pid)] = name;
  j["process_names"] = names;
  json threads = json::object();
  for (const auto& [tid, name] : m.thread_names) threads[std::to_string(tid)] = name;
  j["thread_names"] = threads;
  json stacks = json::object();
  for (const auto& [id, st] : m.stacks) stacks[std::to_string(id)] = {{"ips", st.ips}, {"frames", st.frames}};
  j["stacks"] = stacks;
  json sessions = json::array();
  for (const auto& s : m.sessions)
    sessions.push_back({{"started_at", s.started_at},
                        {"stopped_at", s.stopped_at},
                        {"gpu_model", s.gpu_model},
                        {"gpu_driver", s.gpu_driver},
                        {"cpu_model", s.cpu_model},
                        {"kernel", s.kernel},
                        {"os_release", s.os_release},
                        {"cuda_ver", s.cuda_ver},
                        {"python_ver", s.python_ver},
                        {"tool_ver", s.tool_ver},
                        {"pid_filter", s.pid_filter},
                        {"flags", s.flags},
                        {"cpu_cores", s.cpu_cores},
                        {"mem_total_mb", s.mem_total_mb}});
  j["sessions"] = sessions;
  json snaps = json::array();
  for (const auto& s : m.snapshots)
    snaps.push_back({s.ts_ns, s.cpu_pct, s.mem_pct, s.load_avg, s.mem_avail_mb, s.swap_mb});
  j["snapshots"] = snaps;
  j["health"] = {{"rows_read", m.health.rows_read},
                 {"rows_skipped", m.health.rows_skipped},
                 {"reasons", m.health.reasons},
                 {"dropped_events", m.health.dropped_events}};
  return j;
}

template <class T>
T jget(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}

// Metadata from our own file: tolerant (a field of the wrong type is left at its default).
void meta_from_json(const json& j, TraceMeta& m) {
  m.nodes = jget<std::vector<std::string>>(j, "nodes", {""});
  if (m.nodes.empty()) m.nodes.emplace_back("");
  if (auto it = j.find("process_names"); it != j.end() && it->is_object())
    for (const auto& [k, v] : it->items())
      if (v.is_string())
        m.process_names[static_cast<uint32_t>(std::strtoul(k.c_str(), nullptr, 10))] = v.get<std::string>();
  if (auto it = j.find("thread_names"); it != j.end() && it->is_object())
    for (const auto& [k, v] : it->items())
      if (v.is_string())
        m.thread_names[static_cast<uint32_t>(std::strtoul(k.c_str(), nullptr, 10))] = v.get<std::string>();
  if (auto it = j.find("stacks"); it != j.end() && it->is_object())
    for (const auto& [k, v] : it->items())
      m.stacks[std::strtoull(k.c_str(), nullptr, 10)] = StackTrace{jget<std::string>(v, "ips", ""),
                                                                   jget<std::string>(v, "frames", "")};
  if (auto it = j.find("sessions"); it != j.end() && it->is_array())
    for (const auto& s : *it) {
      SessionInfo si;
      si.started_at = jget<uint64_t>(s, "started_at", 0);
      si.stopped_at = jget<uint64_t>(s, "stopped_at", 0);
      si.gpu_model = jget<std::string>(s, "gpu_model", "");
      si.gpu_driver = jget<std::string>(s, "gpu_driver", "");
      si.cpu_model = jget<std::string>(s, "cpu_model", "");
      si.kernel = jget<std::string>(s, "kernel", "");
      si.os_release = jget<std::string>(s, "os_release", "");
      si.cuda_ver = jget<std::string>(s, "cuda_ver", "");
      si.python_ver = jget<std::string>(s, "python_ver", "");
      si.tool_ver = jget<std::string>(s, "tool_ver", "");
      si.pid_filter = jget<std::string>(s, "pid_filter", "");
      si.flags = jget<std::string>(s, "flags", "");
      si.cpu_cores = jget<uint32_t>(s, "cpu_cores", 0);
      si.mem_total_mb = jget<uint64_t>(s, "mem_total_mb", 0);
      m.sessions.push_back(std::move(si));
    }
  if (auto it = j.find("snapshots"); it != j.end() && it->is_array())
    for (const auto& s : *it) {
      if (!s.is_array() || s.size() != 6) continue;
      try {
        m.snapshots.push_back(SystemSnapshot{s[0].get<uint64_t>(), s[1].get<double>(), s[2].get<double>(),
                                             s[3].get<double>(), s[4].get<uint64_t>(), s[5].get<uint64_t>()});
      } catch (const json::exception&) {
      }
    }
  if (auto it = j.find("health"); it != j.end() && it->is_object()) {
    m.health.rows_skipped = jget<uint64_t>(*it, "rows_skipped", 0);
    m.health.reasons = jget<std::map<std::string, uint64_t>>(*it, "reasons", {});
    m.health.dropped_events = jget<uint64_t>(*it, "dropped_events", 0);
  }
}

json chain_to_json(const Chain& c) {
  json ev = json::array();
  for (const auto& e : c.evidence)
    ev.push_back(
        {{"kind", e.kind}, {"detail", e.detail}, {"value", e.value}, {"unit", e.unit}, {"event_ids", e.event_ids}});
  json preds = json::array();
  for (const auto& p : c.predicates) preds.push_back(predicate_to_json(p));
  json values = json::array();
  for (const auto& [k, v] : c.values) values.push_back({k, v});
  json stacks = json::array();
  for (const auto& st : c.stacks) stacks.push_back(chain_stack_json(st));
  return {{"id", c.id},
          {"rule", c.rule},
          {"rule_hash", c.rule_hash},
          {"severity", static_cast<int>(c.severity)},
          {"category", c.category},
          {"source", static_cast<int>(c.source)},
          {"op", c.op},
          {"pid", c.pid},
          {"tid", c.tid},
          {"node", c.node},
          {"rank", c.rank},
          {"window_start", c.window_start},
          {"window_end", c.window_end},
          {"summary", c.summary},
          {"root_cause", c.root_cause},
          {"explanation", c.explanation},
          {"recommendations", c.recommendations},
          {"evidence", ev},
          {"predicates", preds},
          {"values", values},
          {"p50_ns", c.p50_ns},
          {"p99_ns", c.p99_ns},
          {"tail_ratio", c.tail_ratio},
          {"dropped_events", c.dropped_events},
          {"threads", threads_json(c.threads)},
          {"stacks", stacks},
          {"time_split", time_split_json(c.time_split)},
          // The chain's thread over its window; its node is named by index here (the chain's).
          {"accounting", c.accounting ? thread_accounting_json(*c.accounting, TraceMeta{}) : json(nullptr)},
          {"over_time", c.over_time}};
}

Chain chain_from_json(const json& j) {
  Chain c;
  c.id = jget<std::string>(j, "id", "");
  c.rule = jget<std::string>(j, "rule", "");
  c.rule_hash = jget<std::string>(j, "rule_hash", "");
  c.severity = static_cast<Severity>(std::clamp(jget<int>(j, "severity", 1), 0, 2));
  c.category = jget<std::string>(j, "category", "");
  c.source = static_cast<Source>(jget<int>(j, "source", 0));
  c.op = jget<uint8_t>(j, "op", 0);
  c.pid = jget<uint32_t>(j, "pid", 0);
  c.tid = jget<uint32_t>(j, "tid", 0);
  c.node = jget<uint16_t>(j, "node", 0);
  c.rank = jget<int16_t>(j, "rank", -1);
  c.window_start = jget<uint64_t>(j, "window_start", 0);
  c.window_end = jget<uint64_t>(j, "window_end", 0);
  c.summary = jget<std::string>(j, "summary", "");
  c.root_cause = jget<std::string>(j, "root_cause", "");
  c.explanation = jget<std::string>(j, "explanation", "");
  c.recommendations = jget<std::vector<std::string>>(j, "recommendations", {});
  if (auto it = j.find("evidence"); it != j.end() && it->is_array())
    for (const auto& e : *it)
      c.evidence.push_back(EvidenceItem{jget<std::string>(e, "kind", ""), jget<std::string>(e, "detail", ""),
                                        jget<double>(e, "value", 0), jget<std::string>(e, "unit", ""),
                                        jget<std::vector<uint64_t>>(e, "event_ids", {})});
  if (auto it = j.find("predicates"); it != j.end() && it->is_array())
    for (const auto& p : *it) c.predicates.push_back(predicate_from_json(p));
  if (auto it = j.find("values"); it != j.end() && it->is_array())
    for (const auto& v : *it)
      if (v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_number())
        c.values.emplace_back(v[0].get<std::string>(), v[1].get<double>());
  c.p50_ns = jget<uint64_t>(j, "p50_ns", 0);
  c.p99_ns = jget<uint64_t>(j, "p99_ns", 0);
  c.tail_ratio = jget<double>(j, "tail_ratio", 0);
  c.dropped_events = jget<uint64_t>(j, "dropped_events", 0);
  auto field = [&j](const char* k, const json& fallback) {
    auto it = j.find(k);
    return it != j.end() ? *it : fallback;
  };
  chain_where_from_json(field("threads", json::array()), field("stacks", json::array()),
                        field("time_split", json(nullptr)), c);
  if (const json a = field("accounting", json(nullptr)); a.is_object())
    c.accounting = thread_accounting_from_json(a, TraceMeta{}, c.node);
  c.over_time = jget<bool>(j, "over_time", false);
  return c;
}

// --- read side -------------------------------------------------------------------------------

// An open read-only environment with our three databases, inside one read transaction.
struct ReadEnv {
  MDB_env* env = nullptr;
  MDB_txn* txn = nullptr;
  MDB_dbi events = 0, chains = 0, meta = 0;

  ~ReadEnv() {
    if (txn) mdb_txn_abort(txn);
    if (env) mdb_env_close(env);
  }

  bool open(const std::string& path, std::string& error) {
    uint64_t size = 0;
    bool dir = false;
    if (!file_exists(path, &size, &dir)) {
      error = path + ": no such file";
      return false;
    }
    if (dir) {
      error = path + ": is a directory; an LMDB trace is one file (written with MDB_NOSUBDIR)";
      return false;
    }
    if (!is_lmdb_file(path)) {
      std::string head(16, '\0');
      std::ifstream(path, std::ios::binary).read(head.data(), 16);
      error = path + ": not an LMDB trace" +
              (head.rfind("SQLite format 3", 0) == 0
                   ? std::string(" (it is a SQLite database; convert it with `ingero-pipeline "
                                 "convert`, or give it to a command that reads SQLite)")
                   : std::string(" (no LMDB meta page at the start of the file)"));
      return false;
    }
    if (int rc = mdb_env_create(&env)) return fail(path, rc, error);
    mdb_env_set_maxdbs(env, 4);
    int rc = mdb_env_open(env, path.c_str(), MDB_RDONLY | MDB_NOSUBDIR, 0644);
    if (rc == EACCES || rc == EROFS) {
      // No write access for the lock file (a read-only copy): read without LMDB's reader table.
      mdb_env_close(env);
      env = nullptr;
      if ((rc = mdb_env_create(&env))) return fail(path, rc, error);
      mdb_env_set_maxdbs(env, 4);
      rc = mdb_env_open(env, path.c_str(), MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK, 0644);
    }
    if (rc) return fail(path, rc, error);
    if ((rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn))) return fail(path, rc, error);
    if (mdb_dbi_open(txn, "events", 0, &events) || mdb_dbi_open(txn, "meta", 0, &meta)) {
      error = path +
              ": an LMDB environment, but not an ingero-pipeline trace (no 'events'/'meta' "
              "databases)";
      return false;
    }
    std::string format;
    if (!get_string(txn, meta, "format", format) || format != kLmdbStoreFormat) {
      error = path + ": unsupported LMDB trace format '" + format + "' (expected " + kLmdbStoreFormat + ")";
      return false;
    }
    if (mdb_dbi_open(txn, "chains", 0, &chains)) chains = 0;
    return true;
  }

  static bool fail(const std::string& path, int rc, std::string& error) {
    error = path + ": cannot open the LMDB environment: " + lmdb_error(rc);
    return false;
  }
};

enum class DecodeResult { kOk, kCorrupt };

DecodeResult decode_chunk(const MDB_val& v, std::vector<Event>& out, bool verify, std::string& why) {
  if (v.mv_size < sizeof(ChunkHeader)) {
    why = "corrupt chunk (shorter than its header)";
    return DecodeResult::kCorrupt;
  }
  ChunkHeader h;
  std::memcpy(&h, v.mv_data, sizeof h);
  if (h.magic != kChunkMagic || h.version != kChunkVersion || h.event_size != sizeof(Event)) {
    why = "corrupt chunk (bad magic, version or event size)";
    return DecodeResult::kCorrupt;
  }
  const size_t bytes = static_cast<size_t>(h.count) * sizeof(Event);
  if (v.mv_size != sizeof(ChunkHeader) + bytes) {
    why = "corrupt chunk (size does not match its event count)";
    return DecodeResult::kCorrupt;
  }
  const auto* payload = static_cast<const unsigned char*>(v.mv_data) + sizeof(ChunkHeader);
  if (verify && checksum(payload, bytes) != h.checksum) {
    why = "corrupt chunk (checksum mismatch)";
    return DecodeResult::kCorrupt;
  }
  const size_t old = out.size();
  out.resize(old + h.count);
  std::memcpy(static_cast<void*>(out.data() + old), payload, bytes);
  if (!(h.flags & kChunkSorted))
    std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(old), out.end(),
                     [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return DecodeResult::kOk;
}

class LmdbSource final : public EventSource {
 public:
  LmdbSource(std::unique_ptr<ReadEnv> env, LmdbReadOptions opts, TraceMeta meta, Counters c)
      : env_(std::move(env)), opts_(opts), meta_(std::move(meta)), counters_(c) {
    if (opts_.batch_size == 0) opts_.batch_size = 4096;
    if (mdb_cursor_open(env_->txn, env_->events, &cur_) == 0) advance(MDB_FIRST);
    page_size_ = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  }
  ~LmdbSource() override {
    if (cur_) mdb_cursor_close(cur_);
  }

  bool next(Batch& out) override {
    if (done_) return false;
    out.events.clear();
    for (;;) {
      const uint64_t safe = has_next_ ? next_first_ts_ : std::numeric_limits<uint64_t>::max();
      // Events at or before `safe` can go: every chunk still to come starts at or after it.
      const auto begin = buf_.begin() + static_cast<std::ptrdiff_t>(pos_);
      const size_t avail = has_next_ ? static_cast<size_t>(
                                           std::upper_bound(begin, buf_.end(), safe,
                                                            [](uint64_t t, const Event& e) { return t < e.ts_ns; }) -
                                           begin)
                                     : buf_.size() - pos_;
      if (avail >= opts_.batch_size || !has_next_ || (avail > 0 && avail == buf_.size() - pos_)) {
        const size_t n = std::min(avail, opts_.batch_size);
        if (pos_ == 0 && n == buf_.size()) {
          out.events.swap(buf_);  // the common case: a whole, already ordered chunk
          buf_.clear();
        } else {
          out.events.assign(begin, begin + static_cast<std::ptrdiff_t>(n));
          pos_ += n;
        }
        if (pos_ == buf_.size()) {
          buf_.clear();
          pos_ = 0;
        }
        out.seq = seq_++;
        out.final = !has_next_ && buf_.empty();
        if (out.final) {
          out.watermark = std::numeric_limits<uint64_t>::max();
          done_ = true;
          meta_.health.rows_read = events_read_;
        } else {
          out.watermark = buf_.empty() ? safe : std::min(safe, buf_[pos_].ts_ns);
        }
        return true;
      }
      load_next_chunk();
    }
  }

  TraceMeta& meta() override { return meta_; }

 private:
  void advance(MDB_cursor_op op) {
    MDB_val k{}, v{};
    has_next_ = mdb_cursor_get(cur_, &k, &v, op) == 0;
    if (has_next_) {
      next_first_ts_ = k.mv_size == 16 ? get_be64(static_cast<const unsigned char*>(k.mv_data)) : 0;
      next_val_ = v;
    }
  }

  void load_next_chunk() {
    if (pos_ > 0) {
      buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
      pos_ = 0;
    }
    const size_t old = buf_.size();
    std::string why;
    if (decode_chunk(next_val_, buf_, opts_.verify_checksums, why) == DecodeResult::kOk) {
      events_read_ += buf_.size() - old;
      if (old > 0 && buf_[old - 1].ts_ns > buf_[old].ts_ns)
        std::inplace_merge(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(old), buf_.end(),
                           [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
    } else {
      meta_.health.skip(why);
    }
    release(next_val_);
    advance(MDB_NEXT);
  }

  // Drops decoded pages of the read-only map from this process (they stay in the page cache), so
  // RSS stays at a few chunks however long the trace is.
  void release(const MDB_val& v) {
    if (!opts_.release_pages || v.mv_size < 64UL * 1024) return;
    const auto a = reinterpret_cast<uintptr_t>(v.mv_data);
    lo_ = std::min(lo_, a & ~(page_size_ - 1));
    hi_ = std::max(hi_, (a + v.mv_size) & ~(page_size_ - 1));
    if (++pending_release_ >= 16 && hi_ > lo_) {
      madvise(reinterpret_cast<void*>(lo_), hi_ - lo_, MADV_DONTNEED);
      pending_release_ = 0;
      lo_ = std::numeric_limits<uintptr_t>::max();
      hi_ = 0;
    }
  }

  std::unique_ptr<ReadEnv> env_;
  LmdbReadOptions opts_;
  TraceMeta meta_;
  Counters counters_;
  MDB_cursor* cur_ = nullptr;
  bool has_next_ = false;
  uint64_t next_first_ts_ = 0;
  MDB_val next_val_{};
  std::vector<Event> buf_;
  size_t pos_ = 0;
  uint64_t seq_ = 0, events_read_ = 0;
  bool done_ = false;
  uintptr_t page_size_ = 4096, lo_ = std::numeric_limits<uintptr_t>::max(), hi_ = 0;
  int pending_release_ = 0;
};

}  // namespace

bool is_lmdb_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  unsigned char head[20] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  if (in.gcount() != sizeof head) return false;
  uint32_t magic;
  std::memcpy(&magic, head + 16, 4);  // after the 16-byte page header of meta page 0
  return magic == kLmdbMagic;
}

bool lmdb_trace_info(const std::string& path, LmdbTraceInfo& info, std::string& error) {
  ReadEnv env;
  if (!env.open(path, error)) return false;
  Counters c;
  get_counters(env.txn, env.meta, c);
  info = {};
  info.events = c.events;
  info.chunks = c.chunks;
  info.dropped_events = c.dropped_events;
  info.dropped_chunks = c.dropped_chunks;
  info.stored_bytes = c.stored_bytes;
  info.first_ts = c.first_ts;
  info.last_ts = c.last_ts;
  info.chains = c.chains;
  file_exists(path, &info.file_bytes);
  MDB_envinfo ei{};
  if (mdb_env_info(env.env, &ei) == 0) info.map_bytes = ei.me_mapsize;
  return true;
}

std::unique_ptr<EventSource> open_lmdb_trace(const std::string& path, std::string& error,
                                             const LmdbReadOptions& options) {
  auto env = std::make_unique<ReadEnv>();
  if (!env->open(path, error)) return nullptr;
  TraceMeta meta;
  std::string text;
  if (get_string(env->txn, env->meta, "trace", text)) {
    json j = json::parse(text, nullptr, false);
    if (j.is_object()) meta_from_json(j, meta);
    else meta.health.skip("unreadable trace metadata (not JSON)");
  }
  Counters c;
  get_counters(env->txn, env->meta, c);
  meta.path = path;
  meta.format = kLmdbStoreFormat;
  meta.first_ts = c.first_ts;
  meta.last_ts = c.last_ts;
  meta.health.dropped_events += c.dropped_events;
  return std::make_unique<LmdbSource>(std::move(env), options, std::move(meta), c);
}

bool read_lmdb_chains(const std::string& path, std::vector<Chain>& chains, std::string& error) {
  ReadEnv env;
  if (!env.open(path, error)) return false;
  chains.clear();
  if (!env.chains) return true;
  MDB_cursor* cur = nullptr;
  if (int rc = mdb_cursor_open(env.txn, env.chains, &cur)) {
    error = path + ": " + lmdb_error(rc);
    return false;
  }
  MDB_val k{}, v{};
  for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    json j = json::parse(static_cast<const char*>(v.mv_data), static_cast<const char*>(v.mv_data) + v.mv_size, nullptr,
                         false);
    if (j.is_object()) chains.push_back(chain_from_json(j));
  }
  mdb_cursor_close(cur);
  return true;
}

// --- write side ------------------------------------------------------------------------------

struct LmdbSink::Impl {
  MDB_env* env = nullptr;
  MDB_dbi events = 0, chains = 0, meta = 0;
  Counters counters;  // as committed
  uint64_t map_size = 0;
  std::vector<Event> current;              // the chunk being filled
  std::vector<std::vector<Event>> sealed;  // full chunks waiting for the next transaction
  unsigned char last_key[16] = {};
  bool have_last_key = false;

  ~Impl() {
    if (env) mdb_env_close(env);
  }
};

LmdbSink::LmdbSink(std::string path, Options options)
    : path_(std::move(path)), options_(options), impl_(std::make_unique<Impl>()) {}

LmdbSink::~LmdbSink() {
  std::string ignored;
  close(ignored);
}

std::unique_ptr<LmdbSink> LmdbSink::create(const std::string& path, std::string& error) {
  return create(path, error, Options{});
}

std::unique_ptr<LmdbSink> LmdbSink::create(const std::string& path, std::string& error, const Options& options) {
  if (options.chunk_events == 0 || options.chunk_events > (1u << 20) || options.chunks_per_txn == 0) {
    error = path + ": chunk_events must be in 1..1048576 and chunks_per_txn at least 1";
    return nullptr;
  }
  const uint64_t txn_bytes = chunk_cost(options.chunk_events) * options.chunks_per_txn;
  if (options.max_bytes) {
    const double frac = options.retain_fraction;
    if (!(frac > 0.05 && frac <= 0.9)) {
      error = path + ": retain_fraction must be in (0.05, 0.9]";
      return nullptr;
    }
    // Room for what is kept, one transaction being written and the pages LMDB's copy-on-write
    // still holds for the previous one.
    const uint64_t min_bytes = static_cast<uint64_t>(4.0 * static_cast<double>(txn_bytes) / frac);
    if (options.max_bytes < min_bytes) {
      error = path + ": max_bytes " + std::to_string(options.max_bytes) + " is too small; with " +
              std::to_string(options.chunk_events) + "-event chunks and " + std::to_string(options.chunks_per_txn) +
              " chunks per transaction it must be at least " + std::to_string(min_bytes);
      return nullptr;
    }
  }
  uint64_t size = 0;
  bool dir = false;
  const bool exists = file_exists(path, &size, &dir);
  if (dir) {
    error = path + ": is a directory";
    return nullptr;
  }
  const bool lmdb = exists && is_lmdb_file(path);
  if (exists && size > 0 && !lmdb) {
    error = path + ": exists and is not an LMDB trace; refusing to overwrite it";
    return nullptr;
  }
  const bool append = options.append && lmdb;
  if (exists && !append) {
    if (!options.overwrite && size > 0) {
      error = path + ": exists (pass overwrite to replace it)";
      return nullptr;
    }
    if (::unlink(path.c_str()) != 0) {
      error = path + ": cannot replace: " + std::strerror(errno);
      return nullptr;
    }
    ::unlink((path + "-lock").c_str());
  }

  std::unique_ptr<LmdbSink> sink(new LmdbSink(path, options));
  Impl& m = *sink->impl_;
  int rc = mdb_env_create(&m.env);
  if (rc == 0) rc = mdb_env_set_maxdbs(m.env, 4);
  m.map_size = options.max_bytes ? options.max_bytes / kPage * kPage
                                 : std::max<uint64_t>(options.initial_map_bytes, 4 * txn_bytes);
  if (rc == 0) rc = mdb_env_set_mapsize(m.env, m.map_size);
  if (rc == 0) rc = mdb_env_open(m.env, path.c_str(), MDB_NOSUBDIR | (options.durable ? 0 : MDB_NOSYNC), 0644);
  if (rc) {
    error = path + ": cannot create the LMDB environment: " + lmdb_error(rc);
    return nullptr;
  }
  if (append) {
    // An existing file may have been written with a larger map; never shrink it.
    MDB_envinfo ei{};
    if (mdb_env_info(m.env, &ei) == 0 && ei.me_mapsize > m.map_size && !options.max_bytes) m.map_size = ei.me_mapsize;
  }
  MDB_txn* txn = nullptr;
  if ((rc = mdb_txn_begin(m.env, nullptr, 0, &txn)) || (rc = mdb_dbi_open(txn, "events", MDB_CREATE, &m.events)) ||
      (rc = mdb_dbi_open(txn, "chains", MDB_CREATE, &m.chains)) ||
      (rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &m.meta))) {
    if (txn) mdb_txn_abort(txn);
    error = path + ": cannot create the databases: " + lmdb_error(rc);
    return nullptr;
  }
  std::string format;
  if (get_string(txn, m.meta, "format", format)) {
    if (format != kLmdbStoreFormat) {
      mdb_txn_abort(txn);
      error = path + ": cannot append: format '" + format + "', expected " + kLmdbStoreFormat;
      return nullptr;
    }
    get_counters(txn, m.meta, m.counters);
    MDB_cursor* cur = nullptr;
    MDB_val k{}, v{};
    if (mdb_cursor_open(txn, m.events, &cur) == 0) {
      if (mdb_cursor_get(cur, &k, &v, MDB_LAST) == 0 && k.mv_size == 16) {
        std::memcpy(m.last_key, k.mv_data, 16);
        m.have_last_key = true;
      }
      mdb_cursor_close(cur);
    }
  } else if ((rc = put_string(txn, m.meta, "format", kLmdbStoreFormat)) ||
             (rc = put_counters(txn, m.meta, m.counters))) {
    mdb_txn_abort(txn);
    error = path + ": cannot initialise: " + lmdb_error(rc);
    return nullptr;
  }
  if ((rc = mdb_txn_commit(txn))) {
    error = path + ": cannot initialise: " + lmdb_error(rc);
    return nullptr;
  }
  m.current.reserve(options.chunk_events);
  return sink;
}

bool LmdbSink::fail(const std::string& what) {
  error_ = path_ + ": " + what;
  return false;
}

bool LmdbSink::write_meta(const TraceMeta& meta) {
  if (closed_) return fail("write after close");
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(impl_->env, nullptr, 0, &txn);
  if (rc == 0) rc = put_string(txn, impl_->meta, "trace", meta_to_json(meta).dump());
  if (rc == 0) return (rc = mdb_txn_commit(txn)) == 0 ? true : fail(lmdb_error(rc));
  if (txn) mdb_txn_abort(txn);
  return fail("cannot write metadata: " + lmdb_error(rc));
}

bool LmdbSink::write_events(std::span<const Event> events) {
  if (closed_) return fail("write after close");
  Impl& m = *impl_;
  size_t i = 0;
  while (i < events.size()) {
    const size_t n = std::min(options_.chunk_events - m.current.size(), events.size() - i);
    m.current.insert(m.current.end(), events.begin() + static_cast<std::ptrdiff_t>(i),
                     events.begin() + static_cast<std::ptrdiff_t>(i + n));
    i += n;
    events_written_ += n;
    if (m.current.size() == options_.chunk_events) {
      if (!seal_chunk()) return false;
      if (m.sealed.size() >= options_.chunks_per_txn && !write_pending()) return false;
    }
  }
  return true;
}

bool LmdbSink::seal_chunk() {
  Impl& m = *impl_;
  if (m.current.empty()) return true;
  auto by_ts = [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; };
  if (!std::is_sorted(m.current.begin(), m.current.end(), by_ts))
    std::stable_sort(m.current.begin(), m.current.end(), by_ts);
  m.sealed.push_back(std::move(m.current));
  m.current = {};
  m.current.reserve(options_.chunk_events);
  return true;
}

// Writes every sealed chunk in one transaction. The chunks stay in memory until the commit
// succeeds, so a full map is grown (or, under a size bound, more old chunks are dropped) and the
// same transaction retried without losing anything.
bool LmdbSink::write_pending() {
  Impl& m = *impl_;
  if (m.sealed.empty()) return true;
  uint64_t need = 0;
  for (const auto& c : m.sealed) need += chunk_cost(c.size());
  uint64_t extra_drop = 0;
  for (int attempt = 0; attempt < 12; ++attempt) {
    Counters c = m.counters;
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(m.env, nullptr, 0, &txn);
    if (rc) return fail("cannot begin a write transaction: " + lmdb_error(rc));
    uint64_t dropped_chunks = 0, dropped_events = 0;
    // Retention: delete the oldest chunks, in this transaction, until the new ones fit.
    if (options_.max_bytes) {
      const auto budget = static_cast<uint64_t>(static_cast<double>(options_.max_bytes) * options_.retain_fraction);
      MDB_cursor* cur = nullptr;
      rc = mdb_cursor_open(txn, m.events, &cur);
      while (rc == 0 && c.chunks > 0 && c.stored_bytes + need + extra_drop > budget) {
        MDB_val k{}, v{};
        if ((rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST))) break;
        ChunkHeader h;
        uint64_t n = 0;
        if (v.mv_size >= sizeof h) {
          std::memcpy(&h, v.mv_data, sizeof h);
          if (h.magic == kChunkMagic) n = h.count;
        }
        const uint64_t cost = chunk_cost(n);
        if ((rc = mdb_cursor_del(cur, 0))) break;
        c.chunks -= 1;
        c.events -= std::min(c.events, n);
        c.stored_bytes -= std::min(c.stored_bytes, cost);
        c.dropped_chunks += 1;
        c.dropped_events += n;
        dropped_chunks += 1;
        dropped_events += n;
        if (extra_drop) extra_drop -= std::min(extra_drop, cost);
      }
      if (rc == 0 && c.chunks > 0) {
        MDB_val k{}, v{};
        if (mdb_cursor_get(cur, &k, &v, MDB_FIRST) == 0 && k.mv_size == 16)
          c.first_ts = get_be64(static_cast<const unsigned char*>(k.mv_data));
      }
      if (cur) mdb_cursor_close(cur);
      if (rc == MDB_NOTFOUND) rc = 0;
    }
    unsigned char last_key[16];
    std::memcpy(last_key, m.last_key, 16);
    bool have_last = m.have_last_key;
    for (size_t i = 0; rc == 0 && i < m.sealed.size(); ++i) {
      const auto& ev = m.sealed[i];
      ChunkHeader h;
      h.count = static_cast<uint32_t>(ev.size());
      h.first_ts = ev.front().ts_ns;
      for (const auto& e : ev) {
        h.last_ts = std::max(h.last_ts, e.ts_ns);
        h.max_end = std::max(h.max_end, e.end_ns());
      }
      const size_t bytes = ev.size() * sizeof(Event);
      h.checksum = checksum(ev.data(), bytes);
      unsigned char key[16];
      put_be64(key, h.first_ts);
      put_be64(key + 8, c.next_seq);
      MDB_val k{16, key};
      MDB_val v{sizeof h + bytes, nullptr};
      const bool in_order = !have_last || std::memcmp(key, last_key, 16) > 0;
      rc = mdb_put(txn, m.events, &k, &v, MDB_RESERVE | (in_order ? MDB_APPEND : 0));
      if (rc) break;
      std::memcpy(v.mv_data, &h, sizeof h);
      std::memcpy(static_cast<unsigned char*>(v.mv_data) + sizeof h, ev.data(), bytes);
      if (in_order) {
        std::memcpy(last_key, key, 16);
        have_last = true;
      }
      if (c.chunks == 0 || h.first_ts < c.first_ts) c.first_ts = h.first_ts;
      c.last_ts = std::max(c.last_ts, h.max_end);
      c.next_seq += 1;
      c.chunks += 1;
      c.events += ev.size();
      c.stored_bytes += chunk_cost(ev.size());
    }
    if (rc == 0) rc = put_counters(txn, m.meta, c);
    if (rc == 0) {
      rc = mdb_txn_commit(txn);
      txn = nullptr;
    }
    if (rc == 0) {
      uint64_t committed = 0;
      for (const auto& ch : m.sealed) committed += ch.size();
      events_committed_ += committed;
      chunks_dropped_ += dropped_chunks;
      events_dropped_ += dropped_events;
      m.counters = c;
      std::memcpy(m.last_key, last_key, 16);
      m.have_last_key = have_last;
      m.sealed.clear();
      return true;
    }
    if (txn) mdb_txn_abort(txn);
    if (rc != MDB_MAP_FULL) return fail("write transaction failed: " + lmdb_error(rc));
    if (options_.max_bytes) {
      if (m.counters.chunks == 0)
        return fail("the size bound of " + std::to_string(options_.max_bytes) +
                    " bytes cannot hold one transaction of " + std::to_string(need) + " bytes");
      extra_drop += need + extra_drop;  // free more room, doubling each time
    } else {
      const uint64_t grown = m.map_size * 2;
      if ((rc = mdb_env_set_mapsize(m.env, grown)))
        return fail("cannot grow the map to " + std::to_string(grown) + " bytes: " + lmdb_error(rc));
      m.map_size = grown;
      ++map_resizes_;
    }
  }
  return fail("no room for a transaction after repeated retries (map full)");
}

bool LmdbSink::commit() {
  if (closed_) return fail("commit after close");
  return seal_chunk() && write_pending();
}

bool LmdbSink::write_chains(std::span<const Chain> chains) {
  if (!commit()) return false;
  Impl& m = *impl_;
  for (int attempt = 0; attempt < 8; ++attempt) {
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(m.env, nullptr, 0, &txn);
    if (rc) return fail("cannot begin a write transaction: " + lmdb_error(rc));
    Counters c = m.counters;
    for (const auto& ch : chains) {
      const std::string key = ch.id.empty() ? ch.rule + ":" + std::to_string(ch.window_start) : ch.id;
      MDB_val k{key.size(), const_cast<char*>(key.data())}, old{};
      const bool existed = mdb_get(txn, m.chains, &k, &old) == 0;
      if ((rc = put_string(txn, m.chains, key, chain_to_json(ch).dump()))) break;
      if (!existed) ++c.chains;
    }
    if (rc == 0) rc = put_counters(txn, m.meta, c);
    if (rc == 0) {
      rc = mdb_txn_commit(txn);
      txn = nullptr;
    }
    if (rc == 0) {
      m.counters = c;
      return true;
    }
    if (txn) mdb_txn_abort(txn);
    if (rc != MDB_MAP_FULL || options_.max_bytes) return fail("cannot write chains: " + lmdb_error(rc));
    if ((rc = mdb_env_set_mapsize(m.env, m.map_size * 2))) return fail("cannot grow the map: " + lmdb_error(rc));
    m.map_size *= 2;
    ++map_resizes_;
  }
  return fail("cannot write chains: map full");
}

bool LmdbSink::write_result(const AnalysisResult& result) { return write_chains(result.chains); }

bool LmdbSink::close(std::string& error) {
  if (closed_) return error_.empty();
  bool ok = commit();
  if (impl_->env) {
    if (int rc = mdb_env_sync(impl_->env, 1); rc && ok) ok = fail("sync failed: " + lmdb_error(rc));
    mdb_env_close(impl_->env);
    impl_->env = nullptr;
  }
  closed_ = true;
  if (!ok) error = error_;
  return ok;
}

// --- side values (sinks/store/lmdb_store.h): one string under a key of the meta database ---------
// Used for the fleet identity tables, which the event log has no place for. Readers of older
// stores simply find no such key.

bool lmdb_put_meta_value(const std::string& path, const std::string& key, const std::string& value,
                         std::string& error) {
  if (!is_lmdb_file(path)) {
    error = path + ": not an LMDB trace";
    return false;
  }
  const bool had_lock = ::access((path + "-lock").c_str(), F_OK) == 0;
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  if (rc == 0) rc = mdb_env_set_maxdbs(env, 4);
  if (rc == 0) rc = mdb_env_open(env, path.c_str(), MDB_NOSUBDIR, 0644);
  auto put = [&] {
    MDB_txn* txn = nullptr;
    MDB_dbi meta = 0;
    int r = mdb_txn_begin(env, nullptr, 0, &txn);
    if (r == 0) r = mdb_dbi_open(txn, "meta", 0, &meta);
    if (r == 0) r = put_string(txn, meta, key, value);
    if (r == 0) return mdb_txn_commit(txn);
    if (txn) mdb_txn_abort(txn);
    return r;
  };
  if (rc == 0) rc = put();
  if (rc == MDB_MAP_FULL) {
    // The writer sized the map to its data: grow it by what this value needs and retry once.
    MDB_envinfo ei{};
    mdb_env_info(env, &ei);
    rc = mdb_env_set_mapsize(env, ei.me_mapsize + (value.size() / kPage + 16) * kPage);
    if (rc == 0) rc = put();
  }
  if (env) mdb_env_close(env);
  if (!had_lock) ::unlink((path + "-lock").c_str());  // leave no lock file we created
  if (rc) error = path + ": writing '" + key + "': " + lmdb_error(rc);
  return rc == 0;
}

bool lmdb_get_meta_value(const std::string& path, const std::string& key, std::string& value) {
  if (!is_lmdb_file(path)) return false;
  MDB_env* env = nullptr;
  if (mdb_env_create(&env)) return false;
  mdb_env_set_maxdbs(env, 4);
  bool ok = false;
  if (mdb_env_open(env, path.c_str(), MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK, 0644) == 0) {
    MDB_txn* txn = nullptr;
    MDB_dbi meta = 0;
    if (mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn) == 0) {
      if (mdb_dbi_open(txn, "meta", 0, &meta) == 0) ok = get_string(txn, meta, key.c_str(), value);
      mdb_txn_abort(txn);
    }
  }
  mdb_env_close(env);
  return ok;
}

}  // namespace ingero
