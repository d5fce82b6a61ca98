#include "sinks/fleet/clock_anchors.h"

#include <ctime>
#include <sqlite3.h>
#include <sys/timex.h>

namespace ingero {
namespace {

int64_t read_ns(clockid_t c) {
  timespec ts{};
  clock_gettime(c, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

ClockAnchor sample_clock_anchor(int64_t offset) {
  ClockAnchor best;
  best.bracket_ns = INT64_MAX;
  for (int i = 0; i < 5; ++i) {
    const int64_t m1 = read_ns(CLOCK_MONOTONIC);
    const int64_t w = read_ns(CLOCK_REALTIME);
    const int64_t m2 = read_ns(CLOCK_MONOTONIC);
    if (m2 - m1 < best.bracket_ns) {
      best.bracket_ns = m2 - m1;
      best.event_ns = m1 + (m2 - m1) / 2 + offset;
      best.wall_ns = w;
    }
  }
  timex tx{};
  const int state = adjtimex(&tx);
  best.maxerror_us = tx.maxerror;
  best.esterror_us = tx.esterror;
  best.unsync = state == TIME_ERROR || (tx.status & STA_UNSYNC) != 0;
  return best;
}

bool write_clock_anchors(const std::string& db_path, const std::string& node, const std::vector<ClockAnchor>& anchors,
                         std::string& error) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    error = db_path + ": " + (db ? sqlite3_errmsg(db) : "cannot open");
    sqlite3_close(db);
    return false;
  }
  bool ok = sqlite3_exec(db,
                         "BEGIN; CREATE TABLE IF NOT EXISTS ip_clock_anchors (node TEXT NOT NULL DEFAULT '',"
                         " event_ns INTEGER, wall_ns INTEGER, bracket_ns INTEGER, maxerror_us INTEGER,"
                         " esterror_us INTEGER, unsync INTEGER)",
                         nullptr, nullptr, nullptr) == SQLITE_OK;
  sqlite3_stmt* st = nullptr;
  ok = ok && sqlite3_prepare_v2(db, "INSERT INTO ip_clock_anchors VALUES(?1,?2,?3,?4,?5,?6,?7)", -1, &st, nullptr) ==
                 SQLITE_OK;
  for (const auto& a : anchors) {
    if (!ok) break;
    sqlite3_bind_text(st, 1, node.c_str(), static_cast<int>(node.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, a.event_ns);
    sqlite3_bind_int64(st, 3, a.wall_ns);
    sqlite3_bind_int64(st, 4, a.bracket_ns);
    sqlite3_bind_int64(st, 5, a.maxerror_us);
    sqlite3_bind_int64(st, 6, a.esterror_us);
    sqlite3_bind_int(st, 7, a.unsync ? 1 : 0);
    ok = sqlite3_step(st) == SQLITE_DONE;
    sqlite3_reset(st);
  }
  sqlite3_finalize(st);
  ok = ok && sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK;
  if (!ok) error = db_path + ": writing clock anchors: " + sqlite3_errmsg(db);
  sqlite3_close(db);
  return ok;
}

}  // namespace ingero
