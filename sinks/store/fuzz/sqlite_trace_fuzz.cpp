// libFuzzer target for the SQLite trace reader (sinks/store/sqlite_reader.cpp): trace files are passed
// around and opened by agents, so the reader treats them as hostile (docs/storage.md). Mutating
// the bytes of a database mostly yields "not a database"; this target mutates the SQL that builds
// one instead: each input is a script run on a fresh scratch database (bounded: no ATTACH, no
// VACUUM INTO, a budget of VDBE steps, values of at most 1 MiB), which then goes through both
// replay paths. Checks, beyond ASan and UBSan:
// - open_sqlite_trace never throws and never both fails and returns a source;
// - every batch but the last is non-final, the last one final, and events come out in time order
//   (a late event, event_flags::kLate, only first in its batch);
// - the streaming replay and the load-and-sort replay hand out the same events in the same order
//   whenever they report the same skipped rows and the stream delivered nothing late;
// - the streaming replay with fetch threads (chunks of 3 entries) hands out the one walk's events
//   whenever both report the same skipped rows.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target sqlite_trace_fuzz
//   mkdir -p /tmp/sqlite-corpus
//   ./build-fuzz/sinks/store/sqlite_trace_fuzz -max_total_time=900 -max_len=4096 -rss_limit_mb=4096 \
//       /tmp/sqlite-corpus sinks/store/fuzz/corpus
#include <sqlite3.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/trace.h"
#include "sinks/store/sqlite_store.h"

namespace {

// Where the scratch database lives: one per fuzzing process, recreated for every input.
const std::string& scratch_path() {
  static const std::string p = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/ip-sqlite-fuzz-" + std::to_string(getpid()) + ".db";
  }();
  return p;
}

void remove_scratch() {
  for (const char* suffix : {"", "-journal", "-wal", "-shm"}) std::remove((scratch_path() + suffix).c_str());
}

// The script may build any schema and rows, but touch no other file.
int authorize(void*, int action, const char* a, const char*, const char*, const char*) {
  if (action == SQLITE_ATTACH || action == SQLITE_DETACH) return SQLITE_DENY;
  if (action == SQLITE_PRAGMA && a != nullptr) {
    const std::string p(a);
    // writable_schema lets a script forge what a hostile file would hold; the rest are harmless
    // for a scratch file, except those that change where or whether it is written.
    if (p == "journal_mode" || p == "temp_store_directory" || p == "data_store_directory" || p == "mmap_size")
      return SQLITE_DENY;
  }
  return SQLITE_OK;
}

int stop_after_budget(void* left) {
  auto& n = *static_cast<int*>(left);
  return --n < 0 ? 1 : 0;
}

// Builds the scratch database from `sql`. False when nothing usable was made.
bool build(const std::string& sql) {
  remove_scratch();
  // libFuzzer ends a timed run with exit(): remove the last input's scratch file then too.
  // Registered after scratch_path()'s string exists, so it runs before that string is destroyed.
  static const bool at_exit = std::atexit(remove_scratch) == 0;
  (void)at_exit;
  sqlite3* db = nullptr;
  if (sqlite3_open(scratch_path().c_str(), &db) != SQLITE_OK) {
    sqlite3_close(db);
    return false;
  }
  sqlite3_limit(db, SQLITE_LIMIT_LENGTH, 1 << 20);
  sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
  sqlite3_set_authorizer(db, authorize, nullptr);
  int budget = 2000;  // x 1000 VDBE steps: recursive CTEs stop here
  sqlite3_progress_handler(db, 1000, stop_after_budget, &budget);
  // VACUUM INTO writes a file of the script's choosing: refused before it runs (keywords in any
  // case; SQLITE_LIMIT_ATTACHED = 0 and the authorizer stop it too, as it attaches its target).
  std::string upper = sql;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (upper.find("VACUUM") != std::string::npos && upper.find("INTO") != std::string::npos) {
    sqlite3_close(db);
    return false;
  }
  sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  sqlite3_close(db);
  return true;
}

struct Replay {
  bool opened = false;
  std::vector<ingero::Event> events;
  ingero::InputHealth health;
  bool late = false;
};

// `fetch`: the streaming replay with two fetch threads over chunks of 3 index entries (forced
// on whatever the table's size), so chunk planning, both of its bound searches and the hand-over
// between threads get exercised too; without it, one walk (the inputs are far below the size
// where fetch threads start).
Replay replay(bool stream, bool fetch = false) {
  Replay r;
  ingero::SqliteReadOptions o;
  o.stream = stream;
  o.batch_size = 7;  // many batches from few rows: batch boundaries get exercised
  o.max_reorder_events = 64;
  if (fetch) {
    o.fetch_threads = 2;
    o.fetch_min_rows = 0;
    o.fetch_chunk_rows = 3;
  }
  std::string error;
  std::unique_ptr<ingero::EventSource> src = ingero::open_sqlite_trace(scratch_path(), error, o);
  if (!src) {
    if (error.empty()) std::abort();  // a failure must say why
    return r;
  }
  r.opened = true;
  ingero::Batch b;
  bool final_seen = false;
  while (src->next(b)) {
    if (final_seen) std::abort();  // nothing after the final batch
    final_seen = b.final;
    for (size_t i = 0; i < b.events.size(); ++i) {
      const ingero::Event& e = b.events[i];
      if (e.flags & ingero::event_flags::kLate) {
        r.late = true;
      } else if (!r.events.empty() && !(r.events.back().flags & ingero::event_flags::kLate) &&
                 e.ts_ns < r.events.back().ts_ns) {
        std::abort();  // out of time order without the late flag
      }
      r.events.push_back(e);
    }
    b.events.clear();
    if (r.events.size() > (size_t{1} << 22)) std::abort();  // far more than any input can make
  }
  if (!final_seen) std::abort();
  r.health = src->meta().health;
  return r;
}

bool same_event(const ingero::Event& a, const ingero::Event& b) {
  return a.ts_ns == b.ts_ns && a.dur_ns == b.dur_ns && a.id == b.id && a.arg0 == b.arg0 && a.arg1 == b.arg1 &&
         a.stack_id == b.stack_id && a.cgroup_id == b.cgroup_id && a.pid == b.pid && a.tid == b.tid && a.ret == b.ret &&
         a.node == b.node && a.rank == b.rank && a.source == b.source && a.op == b.op && a.prev_state == b.prev_state &&
         a.gpu_id == b.gpu_id && a.flags == b.flags;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;
  if (!build(std::string(reinterpret_cast<const char*>(data), size))) return 0;
  const Replay streamed = replay(true);
  const Replay loaded = replay(false);
  const Replay fetched = replay(true, true);
  // Fetch threads hand out exactly the one walk's rows: same events, flags and health.
  if (streamed.opened && fetched.opened && streamed.health.reasons == fetched.health.reasons) {
    if (streamed.events.size() != fetched.events.size()) {
      std::fprintf(stderr, "streamed %zu events, fetched %zu\n", streamed.events.size(), fetched.events.size());
      std::abort();
    }
    for (size_t i = 0; i < streamed.events.size(); ++i)
      if (!same_event(streamed.events[i], fetched.events[i])) {
        std::fprintf(stderr, "event %zu differs between one walk and fetch threads\n", i);
        std::abort();
      }
  }
  if (streamed.opened && loaded.opened && !streamed.late && streamed.health.reasons == loaded.health.reasons) {
    if (streamed.events.size() != loaded.events.size()) {
      std::fprintf(stderr, "streamed %zu events, loaded %zu\n", streamed.events.size(), loaded.events.size());
      std::abort();
    }
    for (size_t i = 0; i < streamed.events.size(); ++i) {
      if (same_event(streamed.events[i], loaded.events[i])) continue;
      const ingero::Event& a = streamed.events[i];
      const ingero::Event& b = loaded.events[i];
      std::fprintf(
          stderr, "event %zu differs: streamed ts %llu id %llu node %u pid %u, loaded ts %llu id %llu node %u pid %u\n",
          i, static_cast<unsigned long long>(a.ts_ns), static_cast<unsigned long long>(a.id), a.node, a.pid,
          static_cast<unsigned long long>(b.ts_ns), static_cast<unsigned long long>(b.id), b.node, b.pid);
      std::abort();
    }
  }
  remove_scratch();
  return 0;
}
