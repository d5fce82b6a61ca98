// The SQLite store: replay of recorded traces (a source) and the SQLite sink (a writer).
//
// Reader contract (open_sqlite_trace):
// - Reads Ingero trace databases, schema 0.8 (integer `events.id`) and 0.9 (TEXT id
//   "{node}:{seq}", node/rank columns), and databases written by SqliteSink ("ingero-pipeline-1").
// - Hands out Batches of `batch_size` events ordered as a stable sort by ts_ns of the table
//   (ties keep rowid order): sorted, watermark = last ts of the batch, the final batch has
//   watermark UINT64_MAX and final = true. It streams in bounded memory (SqliteReadOptions below).
// - Hostile files: `events` must be a real table (a view or virtual table is refused: it could
//   be an endless query); side tables that are views or virtual tables are ignored with a
//   warning; strings are capped (kMaxNameBytes...) with counted warnings.
// - HOST sched_switch rows are stored by Ingero at the END of the off-CPU interval; they become
//   spans with ts_ns = timestamp - duration. prev_state is kUnknown for Ingero rows.
// - Fatal problems (no file, not SQLite, truncated, corrupt schema, no `events` table, missing
//   required columns) make open return null with a one-line `error` naming the file. Odd rows
//   (unknown op ids, negative or absurd durations, bad timestamps, NULLs, out-of-range values,
//   corruption part-way through the table) are skipped and counted in meta().health.
// - Never throws.
//
// Writer contract (SqliteSink):
// - Creates a database with Ingero 0.9's tables and columns (so Ingero's readers and users' SQL
//   work) plus our own `ip_*` tables and two extra `events` columns (prev_state, flags).
// - WAL mode, synchronous=NORMAL; events are inserted in transactions of `commit_every` events,
//   so a killed process leaves a readable database holding every committed transaction.
// - The `events` table's four secondary indexes are built by close() after the last commit
//   (Options::defer_indexes, the default): inserting into an unindexed table costs about a third
//   of keeping four B-trees up to date per row. A database whose writer died before close() has
//   no indexes and is still fully readable (open_sqlite_trace, read_result, `query`).
// - Memory: SQLite's page cache stays at its default (about 2 MB); pages are `page_size` bytes.
// - Single writer, one thread at a time (it may be handed between threads with a happens-before,
//   as SpoolingWriter does). Methods return false on failure and keep the message in error();
//   they never throw.
// - Writing events and reading them back with open_sqlite_trace gives identical Events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/annotation.h"
#include "model/result.h"
#include "model/trace.h"

struct sqlite3;

namespace ingero {

inline constexpr const char* kSqliteStoreFormat = "ingero-pipeline-1";
#ifdef INGERO_PIPELINE_VERSION
inline constexpr const char* kSqliteToolVersion = INGERO_PIPELINE_VERSION;
#else
inline constexpr const char* kSqliteToolVersion = "0.1.0";
#endif

// Durations above this are treated as corrupt rows, not data: a CUDA call or an off-CPU span
// inside one recorded session never lasts a day, while a missing entry timestamp (return time
// minus 0) yields a "duration" of decades that would stretch every window it touches.
inline constexpr int64_t kMaxPlausibleDurationNs = int64_t{24} * 3600 * 1'000'000'000;

std::unique_ptr<EventSource> open_sqlite_trace(const std::string& path, std::string& error, size_t batch_size = 4096);

// Loss spans (InputHealth::loss_spans) as our databases store them: rows of ip_health with kind
// 'loss', reason "<start unix ns> <end unix ns> gpu=<n> host=<n> queue=<n>", count = the total.
std::string loss_span_text(const LossSpan& s);
bool parse_loss_span(std::string_view text, LossSpan& out);
// Adds the loss spans a database recorded to `health` (read-only, as open_sqlite_trace opens it).
// Returns how many; 0 for a database without any (Ingero's, or a capture that lost nothing) or a
// file that is not one of ours. Never throws.
size_t read_loss_spans(const std::string& path, InputHealth& health);

// How open_sqlite_trace reads `events`.
//
// Streaming (the default) keeps memory independent of the trace's length and gives the same
// batches as loading every row and stable-sorting by ts_ns (same events, same order, same batch
// boundaries and watermarks):
// - With an ascending index whose first column is `timestamp` (Ingero's idx_events_timestamp,
//   ours), rows are read in (timestamp, rowid) order. Only HOST sched_switch rows move (they are
//   stored at their END); the reorder slack S is the largest valid sched_switch duration, found by
//   one aggregate query at open. A row is released once every row still to come must start at or
//   after it: ts < (last stored timestamp read) - S.
// - Without such an index (a writer killed before close()), rows are read in rowid order; one
//   pre-scan of (timestamp, duration, source, op) measures the largest backwards step of the
//   derived start times, which becomes S (exact, so the output still equals the sorted load).
// - The reorder buffer holds at most `max_reorder_events` rows. Past that the smallest row is
//   released early; a row that then arrives before the released watermark goes out flagged
//   event_flags::kLate at the front of the next batch (the Batch contract allows it) and is
//   counted in meta().health.reasons ("delivered late: ..."). Results then differ from the
//   sorted load only for those rows.
// - meta().first_ts / last_ts / health are final once the final batch has been returned.
// The batch_size overload reads INGERO_SQLITE_STREAM=0 / INGERO_SQLITE_READER_THREAD=0 /
// INGERO_SQLITE_FETCH_THREADS=<n> from the environment (A/B benchmarks only).
// `stream = false` is the old load-and-sort path (80 bytes per event), kept as the reference the
// equality tests compare against.
struct SqliteReadOptions {
  size_t batch_size = 4096;
  bool stream = true;
  size_t max_reorder_events = size_t{1} << 20;  // ~96 MB of held rows at most
  // Read and decode on a thread of its own, up to 4 batches ahead of the consumer (streaming
  // only). meta() is then safe to read after open and after the final batch, not in between.
  bool reader_thread = true;
  // Fetch threads: over a timestamp index (plain, ascending) of a file opened immutable (no
  // -wal/-journal beside it) with at least `fetch_min_rows` rows (by max(rowid)), that many
  // threads fetch rows from SQLite in parallel, each on its own connection, each taking the next
  // range of about `fetch_chunk_rows` index entries in turn; rows are then decoded and ordered
  // exactly as one walk of the index would give them (same batches). Fetching is most of a
  // replay's cost. Below 2, or when the conditions fail, one walk on the reading thread. Memory:
  // at most (fetch_threads + 1) chunks of fetched rows (~240 bytes each) are held, in blocks
  // allocated once and reused. 2048 rows a chunk: ~1.5 MB in all (8192 took ~6 MB) for 0.06 %
  // more instructions (docs/storage.md).
  size_t fetch_threads = 2;
  size_t fetch_chunk_rows = 2048;
  size_t fetch_min_rows = 262144;
  // Test-only fault injection: when set, fetch threads call it before planning each chunk
  // (where = "plan") and before taking each block of rows (where = "block"), from their own
  // threads (it must be thread-safe). It may throw (std::bad_alloc...) to simulate an allocation
  // failure there: the reader must then neither abort nor lose or reorder a row (it continues
  // with one walk of the index from where the fetched rows end). The reading thread calls it
  // once more (where = "resume") as that walk starts: a throw there ends the replay with the
  // rows delivered so far, reported in meta().health. Leave empty outside tests.
  std::function<void(const char* where)> fetch_fault_hook;
  // Long replays show progress on stderr when it is a terminal (nothing otherwise): rows read of
  // the table's rows, rows/s and time left, refreshed twice a second from the second second on,
  // the line erased at the end. The batch_size overload turns it on unless INGERO_QUIET is set.
  bool progress = false;
};
std::unique_ptr<EventSource> open_sqlite_trace(const std::string& path, std::string& error,
                                               const SqliteReadOptions& options);

// Bounds on strings read from a trace (it may be hostile: a 200 MB process name must not reach a
// report whole). Longer values are cut to the bound and counted in meta().health.reasons.
// Values larger than kSqliteMaxValueBytes are not even loaded: the reader's connection refuses
// them (SQLITE_LIMIT_LENGTH), the row or side table is reported unreadable instead.
inline constexpr size_t kMaxNameBytes = 256;                      // process/thread/node names (kernel: 16)
inline constexpr size_t kMaxStackJsonBytes = size_t{256} * 1024;  // stack_traces.ips / frames
inline constexpr size_t kMaxTextBytes = 4096;                     // other text columns (sessions, ids)
inline constexpr int kSqliteMaxValueBytes = 16 * 1024 * 1024;

// True when `path` is a regular file starting with the 16-byte SQLite magic: lets the CLI pick a
// reader by content instead of by file extension. Reads 16 bytes; never throws.
bool is_sqlite_file(const std::string& path);

// Progress lines for long steps (e.g. "indexing 12,021,147 events"), for the CLI to print.
using ProgressFn = std::function<void(const std::string&)>;

class SqliteSink {
 public:
  struct Options {
    size_t commit_every = 4096;  // events per transaction (0 = only on commit()/close())
    bool overwrite = true;       // replace an existing SQLite file at `path`; never a non-SQLite one
    bool defer_indexes = true;   // build the events indexes in close(), not per insert
    int page_size = 16384;       // bytes per database page (a power of two, 512..65536)
    // Write-ahead log pages before an automatic checkpoint (0 = SQLite's 1000); the log is also
    // truncated back to this size after each checkpoint, so the file's disk footprint is its data
    // plus at most about this many pages (rolled files: a tight disk bound).
    int wal_pages = 0;
  };

  static std::unique_ptr<SqliteSink> create(const std::string& path, std::string& error);
  static std::unique_ptr<SqliteSink> create(const std::string& path, std::string& error, const Options& options);
  ~SqliteSink();
  SqliteSink(const SqliteSink&) = delete;
  SqliteSink& operator=(const SqliteSink&) = delete;

  // Trace metadata: node names (needed to name events' nodes: call it before write_events),
  // process names, stacks, sessions, snapshots, input health. May be called again later (live
  // capture learns process names as it goes); each call replaces what the previous one wrote.
  bool write_meta(const TraceMeta& meta);
  // Appends events; commits whenever `commit_every` events are pending.
  bool write_events(std::span<const Event> events);
  // Op stats into ip_op_stats (replaced), chains into causal_chains and ip_chains (by id), the
  // time accounting into ip_accounting and the steps into ip_steps (replaced), engine counters
  // into ip_meta. Commits.
  bool write_result(const AnalysisResult& result);
  // Commits pending events now.
  bool commit();
  // Records `count` events lost on the way to this database (kind 'drop' in ip_health, which
  // readers add to meta().health.dropped_events). A later write_meta() replaces 'drop' rows, so
  // call it after the last write_meta(). Commits.
  bool record_drops(const std::string& reason, uint64_t count);
  // Commits, builds the deferred indexes (telling `progress` first: it may take seconds on a
  // long capture) and closes; the sink is unusable afterwards. Idempotent. Returns false with
  // `error` set when the last commit or the index build failed (the committed events stay
  // readable either way).
  bool close(std::string& error);
  bool close(std::string& error, const ProgressFn& progress);

  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }
  uint64_t events_written() const { return events_written_; }  // committed or pending
  uint64_t events_committed() const { return events_committed_; }
  uint64_t events_rejected() const { return events_rejected_; }  // unrepresentable (see .cpp)
  bool failed() const { return !error_.empty(); }

 private:
  struct Impl;
  SqliteSink(std::string path, Options options);
  bool fail(const std::string& what);
  bool begin_if_needed();
  bool commit_pending();
  bool write_health(const InputHealth& health);

  std::string path_;
  Options options_;
  std::unique_ptr<Impl> impl_;
  std::string error_;
  uint64_t events_written_ = 0, events_committed_ = 0, events_rejected_ = 0;
  size_t pending_ = 0;
  bool in_txn_ = false;
  bool closed_ = false;
};

// Loads a result written by SqliteSink::write_result (ip_op_stats, ip_chains with each chain's
// accounting, ip_rule_outcomes, ip_accounting, ip_steps, ip_meta) for tools that read stored
// results (`convert`); tables and columns that older databases lack read as empty. For an Ingero database (no
// ip_chains) it converts Ingero's causal_chains rows into Chains (rule "ingero", no predicates) and leaves `ops` empty.
// Returns false with a one-line `error` naming the file when neither is present.
bool read_result(const std::string& path, AnalysisResult& result, std::string& error);

// Explicit annotations (model/annotation.h, `trace --annotate`) in table ip_annotations.
// write_annotations appends `rows` to an existing database (creating the table), naming each
// row's node by nodes[row.node] ("node#N" when out of range); one transaction. False with a
// one-line `error` naming the file.
bool write_annotations(const std::string& path, const std::vector<Annotation>& rows,
                       const std::vector<std::string>& nodes, std::string& error);

struct AnnotationReadStats {
  std::string table;                        // "ip_annotations", "annotations" (Ingero's, agent v0.17+) or "" (neither)
  uint64_t rows = 0;                        // rows returned
  uint64_t skipped = 0;                     // rows not returned, each under its reason
  std::map<std::string, uint64_t> reasons;  // "labels not a JSON object of strings" -> count
};
// Reads ip_annotations, else Ingero's own `annotations` table (timestamp, labels, pid,
// start_time, span_start, span_end, peer_uid/gid/pid; node "" and tid 0), in time order (ties in
// row order). Each row's node name is looked up in `nodes` (a row of another node is skipped). A
// database with neither table gives no rows and true. Hostile files: at most
// kMaxAnnotationRows rows are read; labels that are not a JSON object of strings, a time <= 0 or
// a pid out of range skip the row (counted). Never throws; false with `error` only when the file
// cannot be opened or the table cannot be read.
inline constexpr uint64_t kMaxAnnotationRows = uint64_t{4} << 20;
bool read_annotations(const std::string& path, const std::vector<std::string>& nodes, std::vector<Annotation>& out,
                      AnnotationReadStats& stats, std::string& error);

}  // namespace ingero
