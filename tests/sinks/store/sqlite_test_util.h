// Helpers for the SQLite store tests: temp dirs, raw SQL on scratch databases, draining sources.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/trace.h"

namespace ingero::test {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Path of a shared Ingero sample, or "" when INGERO_SHARED_DATA does not hold it.
std::string shared_sample(const std::string& name);

void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);

// Runs SQL on `path` (created if absent); returns SQLite's error message or "".
std::string run_sql(const std::string& path, const std::string& sql);
// First column of the first row of `sql` as int64 (or -1 on error).
int64_t query_int(const std::string& path, const std::string& sql);
std::string query_text(const std::string& path, const std::string& sql);

struct Drained {
  std::vector<Event> events;
  std::vector<Batch> batches;  // events included, for contract checks
};
Drained drain(EventSource& source);

bool same_event(const Event& a, const Event& b);
// gtest expectations that two replays of one trace delivered the same events, batches (sizes,
// watermarks, final) and trace health. `everything` also compares batch seq, dropped events,
// format, nodes, process names and the stack count. Wrap in ASSERT_NO_FATAL_FAILURE to stop there.
void expect_same_replay(const Drained& a, const TraceMeta& ma, const Drained& b, const TraceMeta& mb, bool everything);
std::string describe(const Event& e);

}  // namespace ingero::test
