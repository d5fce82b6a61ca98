// Rolled SQLite files (RollingWriter) and a set of them read as one trace (open_trace_set).
// Contract in sinks/store/rollover.h; docs/storage.md "Rolled files".
#include "sinks/store/rollover.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "model/ops.h"
#include "sinks/store/sqlite_util.h"

namespace ingero {

namespace {

namespace fs = std::filesystem;

uint64_t mono_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

uint64_t file_size(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
}

// A database with its side files, as it takes disk.
uint64_t db_bytes(const std::string& p) {
  return file_size(p) + file_size(p + "-wal") + file_size(p + "-shm") + file_size(p + "-journal");
}

bool has_glob_chars(const std::string& p) { return p.find_first_of("*?[") != std::string::npos; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string utc_stamp() {
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%04d%02d%02dT%02d%02d%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}

// The files of `dir` that RollingWriter with `prefix` wrote, in name order.
std::vector<std::string> own_files(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix + "-", 0) == 0 && ends_with(name, ".db") && it->is_regular_file(ec))
      out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Replays the files of a set one after the other (rollover.h, reader contract).
class TraceSetSource final : public EventSource {
 public:
  TraceSetSource(std::vector<std::string> files, std::string set_path, SqliteReadOptions options)
      : files_(std::move(files)), options_(std::move(options)) {
    meta_.path = std::move(set_path);
    meta_.format = kSqliteStoreFormat;
  }

  // Opens the first file that opens; false with `error` when none does.
  bool open_first(std::string& error) {
    while (next_file_ < files_.size()) {
      if (open_next(error)) return true;
    }
    if (error.empty()) error = meta_.path + ": no readable trace file in the set";
    return false;
  }

  bool next(Batch& out) override {
    while (cur_) {
      Batch b;
      if (!cur_->next(b)) {
        advance();
        continue;
      }
      const bool last_of_file = b.final;
      out.events = std::move(b.events);
      if (b.lent) out.events = *b.lent;
      for (Event& e : out.events) {
        if (e.node < remap_.size()) e.node = remap_[e.node];
        if (e.ts_ns < watermark_ && !(e.flags & event_flags::kLate)) {
          e.flags |= event_flags::kLate;
          meta_.health.reasons["delivered late: started before the previous file of the set ended"]++;
        }
        file_last_ts_ = std::max(file_last_ts_, e.ts_ns);
      }
      // Late events first: a batch stays sorted by ts_ns (they are all behind the watermark).
      if (!std::is_sorted(out.events.begin(), out.events.end(),
                          [](const Event& x, const Event& y) { return x.ts_ns < y.ts_ns; }))
        std::stable_sort(out.events.begin(), out.events.end(),
                         [](const Event& x, const Event& y) { return x.ts_ns < y.ts_ns; });
      const uint64_t wm = last_of_file ? file_last_ts_ : b.watermark;
      watermark_ = std::max(watermark_, wm);
      out.seq = seq_++;
      out.final = false;
      out.lent = nullptr;
      if (last_of_file) advance();
      if (!cur_) {  // that was the set's last file
        out.final = true;
        out.watermark = UINT64_MAX;
        finished_ = true;
        return true;
      }
      out.watermark = watermark_;
      return true;
    }
    if (finished_) return false;
    finished_ = true;  // every file failed after the first batch: end with an empty final batch
    out = Batch{};
    out.watermark = UINT64_MAX;
    out.final = true;
    out.seq = seq_++;
    return true;
  }

  TraceMeta& meta() override { return meta_; }

 private:
  bool open_next(std::string& error) {
    const std::string& path = files_[next_file_++];
    std::string why;
    auto src = open_sqlite_trace(path, why, options_);
    if (!src) {
      meta_.health.damaged(path + ": skipped (" + why + ")");
      error = why;
      return false;
    }
    read_loss_spans(path, src->meta().health);
    merge_meta(src->meta(), /*at_open=*/true);
    cur_ = std::move(src);
    file_last_ts_ = 0;
    return true;
  }

  // The current file is done: its final meta merged, the next one opened.
  void advance() {
    if (cur_) merge_meta(cur_->meta(), /*at_open=*/false);
    cur_.reset();
    std::string ignored;
    while (!cur_ && next_file_ < files_.size()) open_next(ignored);
  }

  void merge_meta(const TraceMeta& m, bool at_open) {
    remap_.assign(m.nodes.size(), 0);
    for (size_t i = 0; i < m.nodes.size(); ++i) {
      if (i == 0 && meta_.nodes.size() == 1 && meta_.nodes[0].empty()) meta_.nodes[0] = m.nodes[0];
      remap_[i] = meta_.node_index(m.nodes[i]);
    }
    for (const auto& [k, v] : m.process_names) meta_.process_names[k] = v;
    for (const auto& [k, v] : m.thread_names) meta_.thread_names[k] = v;
    for (const auto& [k, v] : m.captures) meta_.captures.emplace(k, v);
    for (const auto& [k, v] : m.stacks) meta_.stacks.emplace(k, v);
    if (at_open) {
      if (meta_.format == kSqliteStoreFormat && !m.format.empty()) meta_.format = m.format;
      meta_.sessions.insert(meta_.sessions.end(), m.sessions.begin(), m.sessions.end());
      meta_.snapshots.insert(meta_.snapshots.end(), m.snapshots.begin(), m.snapshots.end());
      merge_capture_losses(m.health);
      return;
    }
    // Health is final once a file's last batch is out.
    InputHealth& h = meta_.health;
    h.rows_read += m.health.rows_read;
    h.rows_skipped += m.health.rows_skipped;
    for (const auto& [k, v] : m.health.reasons) h.reasons[k] += v;
    for (const auto& d : m.health.damage) h.damaged(d);
    h.rows_unreadable += m.health.rows_unreadable;
    h.recovered.insert(h.recovered.end(), m.health.recovered.begin(), m.health.recovered.end());
    if (m.first_ts && (meta_.first_ts == 0 || m.first_ts < meta_.first_ts)) meta_.first_ts = m.first_ts;
    meta_.last_ts = std::max(meta_.last_ts, m.last_ts);
  }

  // What the capture lost (dropped events, the self-check's misses, loss spans) is cumulative:
  // each rolled file carries the capture's totals as of its close. So the files of one capture
  // supersede each other, and a total that goes down starts another capture (an agent restart),
  // whose losses add to those of the captures before it.
  void merge_capture_losses(const InputHealth& file) {
    if (file.dropped_events < run_.dropped_events) {  // a new capture: the previous one is done
      done_.dropped_events += run_.dropped_events;
      for (const auto& [k, v] : run_.missed) done_.missed[k] += v;
      for (const LossSpan& s : run_.loss_spans) done_.add_loss(s);
    }
    run_.dropped_events = file.dropped_events;
    run_.missed = file.missed;
    run_.loss_spans = file.loss_spans;
    InputHealth& h = meta_.health;
    h.dropped_events = done_.dropped_events + run_.dropped_events;
    h.missed = done_.missed;
    for (const auto& [k, v] : run_.missed) h.missed[k] += v;
    h.loss_spans = done_.loss_spans;
    for (const LossSpan& s : run_.loss_spans) h.add_loss(s);
  }

  InputHealth done_, run_;
  std::vector<std::string> files_;
  size_t next_file_ = 0;
  SqliteReadOptions options_;
  std::unique_ptr<EventSource> cur_;
  std::vector<uint16_t> remap_;
  TraceMeta meta_;
  uint64_t watermark_ = 0, file_last_ts_ = 0, seq_ = 0;
  bool finished_ = false;
};

}  // namespace

bool is_trace_set_path(const std::string& path) {
  if (path.empty()) return false;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  return has_glob_chars(path);
}

bool list_trace_set(const std::string& path, std::vector<std::string>& files, std::string& error) {
  files.clear();
  std::vector<std::string> candidates;
  struct stat st {};
  const bool is_dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (is_dir) {
    std::error_code ec;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
      if (ends_with(it->path().filename().string(), ".db")) candidates.push_back(it->path().string());
    if (ec) {
      error = path + ": cannot list the directory (" + ec.message() + ")";
      return false;
    }
  } else {
    glob_t g{};
    const int rc = ::glob(path.c_str(), 0, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) candidates.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
  }
  for (const auto& c : candidates)
    if (is_sqlite_file(c)) files.push_back(c);
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    const std::string others = candidates.empty()
                                   ? ""
                                   : " (" + std::to_string(candidates.size()) + " *.db files that are not SQLite)";
    error = is_dir ? path + ": is a directory with no trace files in it" + others +
                         "; a directory of rolled *.db files reads as one trace"
                   : path + ": no trace files match this pattern" + others;
    return false;
  }
  return true;
}

std::unique_ptr<EventSource> open_trace_set(const std::string& path, std::string& error,
                                            const SqliteReadOptions& options) {
  std::vector<std::string> files;
  if (!list_trace_set(path, files, error)) return nullptr;
  auto src = std::make_unique<TraceSetSource>(std::move(files), path, options);
  std::string why;
  if (!src->open_first(why)) {
    error = path + ": " + why;
    return nullptr;
  }
  return src;
}

size_t recover_trace_set(const std::string& dir, const std::string& prefix, std::vector<std::string>& warnings) {
  size_t n = 0;
  for (const std::string& p : own_files(dir, prefix)) {
    std::error_code ec;
    // A -journal left beside a file: killed while its indexes were built (SqliteSink::close);
    // the read-write open below rolls the journal back (the data stays, without indexes).
    if (!fs::exists(p + "-wal", ec) && !fs::exists(p + "-journal", ec)) {
      // Killed before SQLite wrote its first page: nothing was committed.
      if (file_size(p) == 0) {
        fs::remove(p, ec);
        fs::remove(p + "-shm", ec);
        ++n;
      }
      continue;
    }
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(p.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
      warnings.push_back(p + ": cannot open to recover its write-ahead log: " +
                         (db ? sqlite3_errmsg(db) : std::string("out of memory")));
      sqlite3_close_v2(db);
      continue;
    }
    sqlite3_busy_timeout(db, 2000);
    std::string err;
    // A writer killed while creating the file committed nothing: no tables, no data. Removed.
    {
      sqlite_detail::Stmt q(db, "SELECT count(*) FROM sqlite_schema");
      if (q.ok() && q.step() == SQLITE_ROW && q.i64(0) == 0) {
        q = sqlite_detail::Stmt();
        sqlite3_close_v2(db);
        for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(p + suffix, ec);
        ++n;
        continue;
      }
    }
    // Reading the schema replays the WAL; the checkpoint folds it into the file, and leaving WAL
    // mode deletes -wal and -shm so the file stands alone (and opens immutable) again.
    if (!sqlite_detail::exec(db, "SELECT count(*) FROM sqlite_schema; PRAGMA wal_checkpoint(TRUNCATE);", err) ||
        !sqlite_detail::exec(db, "PRAGMA journal_mode=DELETE;", err))
      warnings.push_back(p + std::string(": write-ahead log not recovered: ").append(err));
    else ++n;
    sqlite3_close_v2(db);
    // The read above rolled back a hot journal (and deleted it); one still there is not hot (killed
    // before its header was written): nothing to roll back, so it goes.
    if (fs::exists(p + "-journal", ec) && is_sqlite_file(p)) fs::remove(p + "-journal", ec);
  }
  return n;
}

// ---------------------------------------------------------------------------------------------

struct RollingWriter::Closing {
  std::unique_ptr<SpoolingWriter> writer;
  std::string path;
  std::unique_ptr<TraceMeta> meta;  // written before closing
  AnalysisResult result;
  const AnalysisResult* full = nullptr;  // finish(): the run's result instead of `result`
  std::function<void(const std::string&)> after;
  ProgressFn progress;
  bool ok = true;
  std::string error;
};

RollingWriter::RollingWriter(RolloverOptions options) : options_(std::move(options)) {}

std::unique_ptr<RollingWriter> RollingWriter::start(const RolloverOptions& options, std::string& error) {
  if (options.dir.empty()) {
    error = "rollover: no directory given";
    return nullptr;
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec || !fs::is_directory(options.dir, ec)) {
    error = options.dir + ": cannot create the trace directory (" + (ec ? ec.message() : "not a directory") + ")";
    return nullptr;
  }
  std::unique_ptr<RollingWriter> w(new RollingWriter(options));
  std::vector<std::string> warnings;
  recover_trace_set(options.dir, options.prefix, warnings);
  for (const auto& m : warnings)
    if (w->stats_.error.empty()) w->stats_.error = m;
  if (!w->open_next(nullptr, error)) return nullptr;
  try {
    w->closer_ = std::thread([raw = w.get()] { raw->closer_loop(); });
  } catch (const std::exception& e) {
    error = std::string("rollover: cannot start the closer thread (") + e.what() + ")";
    std::string ignored;
    w->writer_->finish(nullptr, ignored);
    w->finished_ = true;
    return nullptr;
  }
  w->enforce_retention();
  return w;
}

RollingWriter::~RollingWriter() {
  if (!finished_) {
    std::string ignored;
    finish(nullptr, ignored);
  }
}

bool RollingWriter::open_next(const TraceMeta* meta, std::string& error) {
  std::string path;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    char seq[16];
    std::snprintf(seq, sizeof(seq), "%06llu", static_cast<unsigned long long>(seq_++ % 1000000));
    path = (fs::path(options_.dir) / (options_.prefix + "-" + utc_stamp() + "-" + seq + ".db")).string();
    if (!fs::exists(path)) break;
  }
  SqliteSink::Options so;
  so.overwrite = false;
  // A write-ahead log of at most an eighth of a file (64..1000 pages): it is disk too.
  so.wal_pages = options_.file_bytes
                     ? static_cast<int>(
                           std::clamp<uint64_t>(options_.file_bytes / static_cast<uint64_t>(so.page_size) / 8, 64,
                                                1000))
                     : 1000;
  auto sink = SqliteSink::create(path, error, so);
  if (!sink) return false;
  auto writer = SpoolingWriter::start(std::move(sink), options_.writer, error);
  if (!writer) return false;
  if (meta) writer->write_meta(*meta);
  opened_ns_ = mono_ns();
  next_check_ns_ = opened_ns_ + options_.check_every_ns;
  last_open_bytes_ = 0;
  std::lock_guard lk(mu_);
  writer_ = std::move(writer);
  path_ = path;
  stats_.current = path;
  ++stats_.files_opened;
  return true;
}

void RollingWriter::write_meta(const TraceMeta& meta) {
  if (writer_) writer_->write_meta(meta);
}

void RollingWriter::write_events(std::span<const Event> events, const TraceMeta& meta) {
  if (finished_) return;
  if (!writer_) {
    std::lock_guard lk(mu_);
    lost_no_file_ += events.size();
    return;
  }
  if (shedding_) {
    std::lock_guard lk(mu_);
    shed_ += events.size();
  } else {
    writer_->write_events(events);
  }
  const uint64_t now = mono_ns();
  if (now < next_check_ns_) return;
  next_check_ns_ = now + options_.check_every_ns;
  const uint64_t open_bytes = db_bytes(path_);
  if (open_bytes > last_open_bytes_) check_step_.store(open_bytes - last_open_bytes_, std::memory_order_relaxed);
  last_open_bytes_ = open_bytes;
  // The bound (rollover.h): the oldest closed files go until what is on disk plus what the files
  // in use may still grow to fits; when nothing closed is left to delete, events are shed.
  if (options_.max_bytes) shedding_ = enforce_retention() > options_.max_bytes;
  const bool too_old = options_.file_age_ns && now - opened_ns_ >= options_.file_age_ns;
  const bool too_big = options_.file_bytes && open_bytes >= options_.file_bytes;
  if (!too_old && !too_big) return;
  // One file closing at a time while the open file is under twice its size: a writer outrunning
  // the closer (a busy machine) grows the open file rather than piling up files being closed,
  // which retention must keep, each with its own writer thread. Past twice its size it rolls
  // anyway, so retention can act on the file once it is closed.
  {
    std::lock_guard lk(mu_);
    if ((closer_busy_ || !queue_.empty()) && !(options_.file_bytes && open_bytes >= 2 * options_.file_bytes)) {
      ++rolls_deferred_;
      return;
    }
  }
  roll(meta);
}

void RollingWriter::add_chain(const Chain& chain) {
  std::lock_guard lk(mu_);
  if (chains_.size() < 100000) chains_.push_back(chain);
}

void RollingWriter::roll(const TraceMeta& meta) {
  if (finished_ || !writer_) return;
  auto c = std::make_unique<Closing>();
  c->meta = std::make_unique<TraceMeta>(meta);
  if (options_.on_rotate) c->after = options_.on_rotate();
  {
    std::lock_guard lk(mu_);
    c->writer = std::move(writer_);
    c->path = path_;
    in_flight_.emplace_back(path_, rolled_bytes(*c->writer, path_));
    c->result.chains = std::move(chains_);
    chains_.clear();
    queue_.push_back(std::move(c));
    cv_.notify_all();
  }
  std::string error;
  if (!open_next(&meta, error)) {
    // The capture goes on: events from now on are counted lost (write_events has no writer).
    std::lock_guard lk(mu_);
    if (stats_.error.empty()) stats_.error = "rollover: " + error;
  }
}

void RollingWriter::closer_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    std::unique_ptr<Closing> c = std::move(queue_.front());
    queue_.erase(queue_.begin());
    closer_busy_ = true;
    closing_ = c->writer.get();
    lk.unlock();
    if (c->meta) c->writer->write_meta(*c->meta);
    const AnalysisResult* r = c->full ? c->full : &c->result;
    c->ok = c->writer->finish(r, c->error, c->progress);
    const SpoolingWriter::Stats ws = c->writer->stats();
    lk.lock();
    closing_ = nullptr;
    lk.unlock();
    c->writer.reset();
    if (c->after) c->after(c->path);
    lk.lock();
    done_in_ += ws.events_in;
    done_written_ += ws.events_written;
    done_lost_ += ws.lost;
    ++stats_.files_closed;
    if (!c->ok && stats_.error.empty()) stats_.error = c->path + ": " + c->error;
    for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it) {
      if (it->first != c->path) continue;
      // What closing added (indexes, metadata), measured: the reserve of the next files in use.
      const uint64_t closed_bytes = db_bytes(c->path);
      if (c->ok && it->second >= (uint64_t{1} << 20) && closed_bytes)
        growth_ = std::clamp(1.1 * static_cast<double>(closed_bytes) / static_cast<double>(it->second), 1.1, 4.0);
      in_flight_.erase(it);
      break;
    }
    lk.unlock();
    enforce_retention();
    lk.lock();
    closer_busy_ = false;
    idle_cv_.notify_all();
  }
}

uint64_t RollingWriter::set_bytes(std::vector<std::pair<std::string, uint64_t>>* files) const {
  uint64_t total = 0;
  for (const std::string& p : own_files(options_.dir, options_.prefix)) {
    const uint64_t b = db_bytes(p);
    total += b;
    if (files) files->emplace_back(p, b);
  }
  return total;
}

// A file rolled out: its size now plus its writer's backlog (still to reach it), in bytes.
uint64_t RollingWriter::rolled_bytes(const SpoolingWriter& w, const std::string& path) {
  const uint64_t now = db_bytes(path);
  const auto ws = w.stats();
  const uint64_t per_event = ws.events_written ? std::max<uint64_t>(now / ws.events_written, 64) : 128;
  return now + ws.backlog * per_event;
}

uint64_t RollingWriter::enforce_retention() {
  // Files in use (open, being closed) are never deleted, nor anything newer than the oldest of
  // them: names sort in time order, so only data older than everything in use goes. The list of
  // files in use is read before the directory: a file created after it is newer, hence kept.
  std::lock_guard rlk(retention_mu_);
  std::string oldest_in_use, open_path;
  std::vector<std::pair<std::string, uint64_t>> in_use;
  double growth = 2;
  uint64_t spill = 0;
  {
    std::lock_guard lk(mu_);
    oldest_in_use = path_;
    if (writer_) open_path = path_;  // after finish() nothing is open: the last file is closed
    in_use = in_flight_;
    for (const auto& f : in_flight_) oldest_in_use = std::min(oldest_in_use, f.first);
    growth = growth_;
    // The spill files of the writers (anonymous, in the same directory): disk too.
    for (const auto& c : queue_)
      if (c->writer) spill += c->writer->stats().spill_bytes_now;
    if (closing_) spill += closing_->stats().spill_bytes_now;
    if (writer_) spill += writer_->stats().spill_bytes_now;
  }
  std::vector<std::pair<std::string, uint64_t>> files;
  uint64_t total = set_bytes(&files) + spill;
  // What the files in use may still add before they are closed: the open one up to its roll size
  // (plus one check's growth) and each closing one up to its size at roll, times the measured
  // growth at close (indexes); never less than they take now.
  uint64_t reserve = 0;
  for (const auto& [p, bytes] : files) {
    uint64_t cap = 0;
    if (p == open_path) {
      const uint64_t at_roll = std::max(bytes, options_.file_bytes) + 2 * check_step_.load(std::memory_order_relaxed);
      cap = static_cast<uint64_t>(static_cast<double>(at_roll) * growth);
    } else {
      for (const auto& f : in_use)
        if (f.first == p) cap = static_cast<uint64_t>(static_cast<double>(f.second) * growth);
    }
    if (cap > bytes) reserve += cap - bytes;
  }
  {
    std::lock_guard lk(mu_);
    stats_.bytes_on_disk_peak = std::max(stats_.bytes_on_disk_peak, total);
  }
  const auto now = fs::file_time_type::clock::now();
  uint64_t deleted = 0, deleted_bytes = 0;
  for (const auto& [p, bytes] : files) {  // oldest first
    if (oldest_in_use.empty() || p >= oldest_in_use) break;
    bool expired = false;
    if (options_.max_age_ns) {
      std::error_code ec;
      const auto mtime = fs::last_write_time(p, ec);
      expired = !ec && now - mtime > std::chrono::nanoseconds(options_.max_age_ns);
    }
    const bool over = options_.max_bytes && total + reserve > options_.max_bytes;
    if (!over && !expired) continue;
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(p + suffix, ec);
    total -= std::min(total, bytes);
    ++deleted;
    deleted_bytes += bytes;
  }
  std::lock_guard lk(mu_);
  stats_.files_deleted += deleted;
  stats_.bytes_deleted += deleted_bytes;
  stats_.bytes_on_disk = total;
  stats_.bytes_reserved = reserve;
  return total + reserve;
}

bool RollingWriter::finish(const AnalysisResult* result, std::string& error, const ProgressFn& progress) {
  if (finished_) {
    error = finish_error_;
    return finish_ok_;
  }
  if (writer_) {
    auto c = std::make_unique<Closing>();
    c->full = result;
    c->progress = progress;
    if (options_.on_rotate) c->after = options_.on_rotate();
    std::lock_guard lk(mu_);
    c->writer = std::move(writer_);
    c->path = path_;
    in_flight_.emplace_back(path_, rolled_bytes(*c->writer, path_));
    if (!result) c->result.chains = std::move(chains_);
    chains_.clear();
    queue_.push_back(std::move(c));
    cv_.notify_all();
  }
  {
    std::unique_lock lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (closer_.joinable()) closer_.join();
  finished_ = true;
  const Stats s = stats();
  finish_ok_ = s.error.empty() && s.lost == 0;
  finish_error_ = s.error.empty() ? (s.lost ? std::to_string(s.lost) + " events lost" : "") : s.error;
  error = finish_error_;
  return finish_ok_;
}

RollingWriter::Stats RollingWriter::stats() const {
  std::lock_guard lk(mu_);
  Stats s = stats_;
  s.rolls_deferred = rolls_deferred_;
  s.events_in = done_in_;
  s.events_written = done_written_;
  s.lost = done_lost_ + lost_no_file_ + shed_;
  s.shed = shed_;
  std::vector<const SpoolingWriter*> live;
  for (const auto& c : queue_)
    if (c->writer) live.push_back(c->writer.get());
  if (closing_) live.push_back(closing_);
  if (writer_) live.push_back(writer_.get());
  for (const SpoolingWriter* w : live) {
    const auto ws = w->stats();
    s.events_in += ws.events_in;
    s.events_written += ws.events_written;
    s.lost += ws.lost;
    s.backlog += ws.backlog;
    s.spilled += ws.events_spilled;
  }
  return s;
}

std::string RollingWriter::current_path() const {
  std::lock_guard lk(mu_);
  return path_;
}

}  // namespace ingero
