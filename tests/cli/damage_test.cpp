// Damaged trace files (issue 43, item 1): corrupt pages planted in each table and index of the
// shared Ingero traces, on copies in a temporary directory. Every command that reads the trace
// (stats, explain, query over `events`, export) must give exactly the undamaged file's answer
// with exit status 0, or exit non-zero with an error naming the file; never a different answer
// with exit 0. Pages are found with SQLite's dbstat table on the copy (the shared files are
// never opened but to be copied).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/util/run_command.h"
#include "tests/util/scratch_db.h"

namespace {

namespace fs = std::filesystem;
using Run = ingero::test::CommandRun;

const std::string kShared = INGERO_SHARED_DATA;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The commands compared, each one shell line over `db` (a path without spaces); the answer is
// stdout, or the file export writes.
struct Command {
  std::string name;
  std::string args;  // with DB and OUT placeholders
  bool writes_file = false;
};
const std::vector<Command>& commands() {
  static const std::vector<Command> c = {
      {"stats", "stats --json --db DB", false},
      {"explain", "explain --json --db DB", false},
      {"query",
       "query --json --db DB \"SELECT source, op, count(*), sum(duration), max(timestamp) FROM events GROUP BY 1, 2\"",
       false},
      {"export", "export --db DB --output OUT -q", true},
  };
  return c;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

struct Answer {
  int status = -1;
  std::string out, err;
};

Answer run_command(const Command& c, const std::string& db, const std::string& out) {
  const std::string line = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline " +
                           replace_all(replace_all(c.args, "DB", db), "OUT", out);
  fs::remove(out);
  const Run r = ingero::test::run_command("INGERO_QUIET=1 " + line);
  Answer a{r.status, r.out, r.err};
  if (c.writes_file) a.out = fs::exists(out) ? slurp(out) : std::string();
  // The one field that differs between runs of the same answer: the time a query took.
  std::string kept;
  std::istringstream lines(a.out);
  for (std::string l; std::getline(lines, l);)
    if (l.find("\"elapsed_ms\"") == std::string::npos) kept += l + "\n";
  a.out = kept;
  return a;
}

// The pages of each b-tree (table or index) of `db`, by name, from dbstat (SQLite's page
// statistics table): empty when this SQLite lacks it.
std::map<std::string, std::vector<int64_t>> btree_pages(const std::string& db, int& page_size) {
  std::map<std::string, std::vector<int64_t>> pages;
  sqlite3* h = nullptr;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(h);
    return pages;
  }
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(h, "SELECT name, pageno FROM dbstat ORDER BY name, pageno", -1, &s, nullptr) == SQLITE_OK) {
    while (sqlite3_step(s) == SQLITE_ROW)
      pages[reinterpret_cast<const char*>(sqlite3_column_text(s, 0))].push_back(sqlite3_column_int64(s, 1));
  }
  sqlite3_finalize(s);
  if (sqlite3_prepare_v2(h, "PRAGMA page_size", -1, &s, nullptr) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
    page_size = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(h);
  pages.erase("sqlite_schema");  // damage there fails every open: checked by the open tests
  pages.erase("sqlite_master");
  return pages;
}

enum class Damage { kRandom, kZero, kCopy };
const char* damage_name(Damage d) { return d == Damage::kRandom ? "random" : d == Damage::kZero ? "zero" : "copy"; }

// Overwrites page `page` of `db`: random bytes, zeros, or a copy of page `other`.
void plant(const std::string& db, int page_size, int64_t page, Damage d, int64_t other, uint32_t seed) {
  std::fstream f(db, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes(static_cast<size_t>(page_size), '\0');
  if (d == Damage::kRandom) {
    std::mt19937 rng(seed);
    for (auto& b : bytes) b = static_cast<char>(rng() & 0xff);
  } else if (d == Damage::kCopy) {
    f.seekg((other - 1) * page_size);
    f.read(bytes.data(), page_size);
  }
  f.seekp((page - 1) * page_size);
  f.write(bytes.data(), page_size);
}

// A scratch directory with a pristine copy of one shared trace (`base`; the shared file is only
// ever read, by the copy), the path each case damages (`db`, reset from `base` by fresh()) and the
// b-tree pages of the copy's tables and indexes. `skip` says why a case cannot run: the sample is
// absent, or this SQLite has no dbstat table to find the pages with.
struct DamageBench {
  explicit DamageBench(const std::string& sample) : dir("ip-damage") {
    const std::string src = kShared + "/" + sample;
    if (!fs::exists(src)) {
      skip = "shared Ingero sample not found: " + src;
      return;
    }
    fs::copy_file(src, base, fs::copy_options::overwrite_existing);
    pages = btree_pages(base, page_size);
    if (pages.empty() || page_size <= 0) skip = "this SQLite has no dbstat table: pages cannot be found";
    fresh();
  }
  void fresh() const { fs::copy_file(base, db, fs::copy_options::overwrite_existing); }

  ingero::test::ScratchDir dir;
  const std::string base = dir("base.db"), db = dir("trace.db");
  std::string skip;
  int page_size = 0;
  std::map<std::string, std::vector<int64_t>> pages;
};

class DamagedTrace : public ::testing::TestWithParam<std::string> {};

TEST_P(DamagedTrace, EveryCommandGivesTheUndamagedAnswerOrFails) {
  const DamageBench bench(GetParam());
  if (!bench.skip.empty()) GTEST_SKIP() << bench.skip;
  const std::string& db = bench.db;
  const std::string out = bench.dir("out.json");
  const int page_size = bench.page_size;

  // The undamaged answers, from the same path the damaged copies take.
  std::map<std::string, Answer> want;
  for (const auto& c : commands()) {
    want[c.name] = run_command(c, db, out);
    ASSERT_EQ(want[c.name].status, 0) << c.name << ": " << want[c.name].err;
  }

  int cases = 0, exact = 0, refused = 0, different = 0;
  std::map<std::string, int> exact_by_tree;
  for (const auto& [tree, list] : bench.pages) {
    // The root and, for a multi-page tree, its first and last other pages.
    std::vector<int64_t> targets = {list.front()};
    if (list.size() > 1) targets.push_back(list[1]);
    if (list.size() > 2) targets.push_back(list.back());
    for (const int64_t page : targets) {
      for (const Damage d : {Damage::kRandom, Damage::kZero, Damage::kCopy}) {
        if (d == Damage::kCopy && list.size() < 2) continue;
        const int64_t other = page == list.back() ? list.front() : list.back();
        bench.fresh();
        plant(db, page_size, page, d, other, static_cast<uint32_t>(page * 31 + 7));
        for (const auto& c : commands()) {
          const Answer got = run_command(c, db, out);
          ++cases;
          const std::string where = GetParam() + ": " + tree + " page " + std::to_string(page) + " (" + damage_name(d) +
                                    "), " + c.name;
          if (got.status == 0) {
            EXPECT_EQ(got.out, want[c.name].out) << where << ": exit 0 with a different answer\n" << got.err;
            if (got.out != want[c.name].out) ++different;
            if (got.out == want[c.name].out) {
              ++exact;
              ++exact_by_tree[tree];
            }
          } else {
            ++refused;
            // A clear error: it names the file.
            EXPECT_NE(got.err.find(db), std::string::npos) << where << ": status " << got.status << "\n" << got.err;
            EXPECT_TRUE(got.status == 3 || got.status == 5) << where << ": status " << got.status << "\n" << got.err;
          }
        }
      }
    }
  }
  std::printf(
      "%s: %d command runs on damaged copies: %d exact (exit 0), %d refused or partial (exit 3/5), %d different "
      "answers with exit 0\n",
      GetParam().c_str(), cases, exact, refused, different);
}

INSTANTIATE_TEST_SUITE_P(SharedTraces, DamagedTrace,
                         ::testing::Values("pytorch-dataloader-starvation.db", "sample-gpu-node-01.db",
                                           "sample-cluster.db"),
                         [](const auto& info) {
                           std::string n = info.param.substr(0, info.param.find('.'));
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The case: pages of the timestamp index overwritten. The table is read instead and
// every figure is the undamaged file's, with a note on stderr and exit 0; a damaged `events`
// table gives exit 5 and counts the rows lost.
TEST(DamagedTraceCases, TimestampIndexWorkedAroundTableDamageCounted) {
  const DamageBench bench("pytorch-dataloader-starvation.db");
  if (!bench.skip.empty()) GTEST_SKIP() << bench.skip;
  const std::string& db = bench.db;
  const int page_size = bench.page_size;
  const auto& pages = bench.pages;
  const Command stats{"stats", "stats --db DB", false};
  bench.fresh();
  const Answer want = run_command(stats, db, "");

  const auto& idx = pages.at("idx_events_timestamp");
  ASSERT_GE(idx.size(), 4u);
  bench.fresh();
  plant(db, page_size, idx[1], Damage::kCopy, idx.back(), 1);  // two leaves overwritten by another's
  plant(db, page_size, idx[2], Damage::kCopy, idx.back(), 2);
  const Answer got = run_command(stats, db, "");
  EXPECT_EQ(got.status, 0) << got.err;
  EXPECT_EQ(got.out, want.out);
  EXPECT_NE(got.err.find("note: " + db + ": damaged file: index `idx_events_timestamp`"), std::string::npos) << got.err;

  const auto& events = pages.at("events");
  ASSERT_GE(events.size(), 3u);
  bench.fresh();
  plant(db, page_size, events[1], Damage::kRandom, 0, 3);
  const Answer part = run_command({"stats", "stats --json --db DB", false}, db, "");
  EXPECT_EQ(part.status, 5) << part.err;
  EXPECT_NE(part.err.find(db + ": damaged file: table `events`: rowids"), std::string::npos) << part.err;
  EXPECT_NE(part.err.find("the results are partial"), std::string::npos) << part.err;
  // The lost rows are counted: the index (intact) lists them, so the count is exact and the
  // events read plus the rows lost are the table's 3,807.
  const auto j = nlohmann::json::parse(part.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  const auto& health = j["health"];
  ASSERT_TRUE(health.contains("rows_unreadable")) << part.out.substr(0, 2000);
  EXPECT_GT(health["rows_unreadable"].get<uint64_t>(), 0u);
  EXPECT_EQ(health["rows_read"].get<uint64_t>() + health["rows_unreadable"].get<uint64_t>(), 3807u);
}

// stack_traces has no index to check it against: a leaf overwritten by a sound copy of another
// leaf shows as rowids out of order (the table is read in rowid order), and a stored stack whose
// text is no longer JSON (an overflow page overwritten) as a row that cannot be read: both exit 5
// naming the table, never the undamaged answer's stacks silently changed.
TEST(DamagedTraceCases, StackTracesOutOfOrderOrNotJsonArePartial) {
  const DamageBench bench("pytorch-dataloader-starvation.db");
  if (!bench.skip.empty()) GTEST_SKIP() << bench.skip;
  const std::string& db = bench.db;
  const int page_size = bench.page_size;
  const auto& pages = bench.pages;
  const auto& st = pages.at("stack_traces");
  ASSERT_GE(st.size(), 3u);
  plant(db, page_size, st[1], Damage::kCopy, st.back(), 1);  // the first leaf now holds the last's rows
  const Command explain{"explain", "explain --json --db DB", false};
  const Answer order = run_command(explain, db, "");
  EXPECT_EQ(order.status, 5) << order.err;
  EXPECT_NE(order.err.find("table `stack_traces`: rows out of key order"), std::string::npos) << order.err;

  bench.fresh();
  {
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(h,
                           "UPDATE stack_traces SET frames = substr(frames, 1, length(frames) / 2) "
                           "WHERE rowid = (SELECT min(rowid) FROM stack_traces WHERE length(frames) > 2)",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(h);
  }
  const Answer text = run_command(explain, db, "");
  EXPECT_EQ(text.status, 5) << text.err;
  EXPECT_NE(text.err.find("is not JSON"), std::string::npos) << text.err;
}

// The root page of stack_traces overwritten by a copy of one of its leaves: the table reads as
// that leaf alone, a sound but smaller table. The events refer to stacks it lacks and the pages
// below the old root belong to nothing: exit 5 naming the table, never the stacks silently gone.
TEST(DamagedTraceCases, StackTracesRootOverwrittenByItsLeafIsPartial) {
  const DamageBench bench("pytorch-dataloader-starvation.db");
  if (!bench.skip.empty()) GTEST_SKIP() << bench.skip;
  const std::string& db = bench.db;
  const int page_size = bench.page_size;
  const auto& pages = bench.pages;
  const auto& st = pages.at("stack_traces");
  ASSERT_GE(st.size(), 2u);
  const Command explain{"explain", "explain --json --db DB", false};
  const Answer want = run_command(explain, db, "");
  ASSERT_EQ(want.status, 0) << want.err;
  for (const Command& c : {explain, Command{"export", "export --db DB --output OUT -q", true}}) {
    for (size_t leaf = 1; leaf < st.size(); ++leaf) {
      bench.fresh();
      plant(db, page_size, st.front(), Damage::kCopy, st[leaf], 1);
      const Answer got = run_command(c, db, bench.dir("out.json"));
      const std::string where = c.name + ", root <- page " + std::to_string(st[leaf]);
      EXPECT_EQ(got.status, 5) << where << "\n" << got.err;
      EXPECT_NE(got.err.find(db + ": damaged file: table `stack_traces`: events refer to"), std::string::npos)
          << where << "\n"
          << got.err;
    }
  }
}

// `query` planned through an index of `events` whose page was overwritten by a copy of another
// of its pages: the index reads soundly but lists other rows. Each index a statement reads is
// checked against its table first: exit 5 naming the index, never a different answer; the same
// query on the undamaged file is unchanged, and one that reads no damaged index still answers.
TEST(DamagedTraceCases, QueryThroughACopiedIndexPageFails) {
  const DamageBench bench("pytorch-dataloader-starvation.db");
  if (!bench.skip.empty()) GTEST_SKIP() << bench.skip;
  const std::string& db = bench.db;
  const int page_size = bench.page_size;
  const auto& pages = bench.pages;
  const Command grouped = commands()[2];  // through idx_events_source_op_stack (SQLite's plan)
  const Command by_pid{"query", "query --json --db DB \"SELECT pid, count(*) FROM events GROUP BY pid\"", false};
  const Answer want = run_command(grouped, db, "");
  ASSERT_EQ(want.status, 0) << want.err;
  const Answer want_pid = run_command(by_pid, db, "");
  ASSERT_EQ(want_pid.status, 0) << want_pid.err;
  const auto& idx = pages.at("idx_events_source_op_stack");
  ASSERT_GE(idx.size(), 3u);
  // A leaf by another leaf, and the root by a leaf (the index then reads as that leaf alone).
  for (const auto& [page, other] : {std::pair{idx[1], idx.back()}, std::pair{idx.front(), idx[1]}}) {
    bench.fresh();
    plant(db, page_size, page, Damage::kCopy, other, 1);
    const Answer got = run_command(grouped, db, "");
    const std::string where = "page " + std::to_string(page) + " <- " + std::to_string(other);
    EXPECT_EQ(got.status, 5) << where << "\n" << got.err;
    EXPECT_NE(got.err.find(db + ": damaged file: index `idx_events_source_op_stack` of table `events`"),
              std::string::npos)
        << where << "\n"
        << got.err;
    // GROUP BY pid reads idx_events_pid, which is sound: the undamaged answer, exit 0.
    const Answer pid = run_command(by_pid, db, "");
    EXPECT_EQ(pid.status, 0) << where << "\n" << pid.err;
    EXPECT_EQ(pid.out, want_pid.out) << where;
  }
}

}  // namespace
