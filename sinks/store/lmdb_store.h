// The LMDB store: an append-only event log (a sink) that replays at full speed (a source).
//
// Layout (docs/pipeline.md has the full picture). One LMDB environment in ONE file (MDB_NOSUBDIR;
// LMDB keeps its reader table in "<file>-lock"), three named databases:
//   events  key = first_ts (8 bytes, big-endian) ++ seq (8 bytes, big-endian), so a cursor walks
//           chunks in time order; value = a 48-byte chunk header (magic, version, count, first/last
//           ts, max end, checksum) followed by `count` raw 80-byte Events sorted by ts_ns
//           (little-endian hosts; the header's event size and magic reject anything else).
//   chains  key = Chain::id, value = the chain as JSON.
//   meta    "format" = "ingero-pipeline-lmdb-1"; "trace" = TraceMeta as JSON; binary u64 counters
//           (events, chunks, next_seq, dropped_events, dropped_chunks, stored_bytes, first_ts,
//           last_ts), updated in the same transaction as the chunks they count.
//
// Writer contract (LmdbSink):
// - Append-only: events are buffered into chunks of `chunk_events`, each chunk sorted by ts_ns;
//   `chunks_per_txn` chunks are written per write transaction. Input need not be globally
//   sorted (live batches overlap up to their watermark): the reader merges chunks by time.
// - Crash safety is LMDB's: a transaction is all or nothing, so kill -9 (or a crash) at any point
//   leaves a readable log holding every committed transaction and losing only the events that
//   were buffered or in the uncommitted transaction. `durable` = false skips fsync per commit
//   (safe against process crashes, not against power loss); close() syncs either way.
// - Map size: starts at `initial_map_bytes` and doubles on MDB_MAP_FULL (the pending transaction
//   is kept in memory and retried, nothing is lost). With `max_bytes` > 0 the file never grows past
//   it: before each transaction the oldest chunks are deleted (in that same transaction) until the
//   stored chunks fit in `retain_fraction` of the bound; the counts of dropped chunks and events
//   are kept in meta and reported by the reader.
// - Single writer, single thread. Methods return false with error() set; they never throw.
//
// Reader contract (open_lmdb_trace): an EventSource that streams chunks in key order inside one
// read transaction, merging overlapping chunks so batches are sorted by ts_ns with a watermark
// (the first ts of the next chunk: no later chunk can hold an earlier event), the last batch
// final. Memory is bounded by a few chunks whatever the trace length: decoded pages of the map
// are released (madvise) as the cursor moves on. A chunk with a bad header, size or checksum is
// skipped and counted in meta().health; open fails (null, one-line `error` naming the file) for a
// missing file, a file that is not an LMDB environment, or an LMDB environment without our
// databases. Never throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/result.h"
#include "model/trace.h"

namespace ingero {

inline constexpr const char* kLmdbStoreFormat = "ingero-pipeline-lmdb-1";

// What is stored, without reading the events (convert, bench, demo, tests).
struct LmdbTraceInfo {
  uint64_t events = 0, chunks = 0;                  // currently stored
  uint64_t dropped_events = 0, dropped_chunks = 0;  // removed by retention
  uint64_t stored_bytes = 0;                        // chunk values (headers + events)
  uint64_t first_ts = 0, last_ts = 0;               // of what is stored
  uint64_t chains = 0;
  uint64_t file_bytes = 0, map_bytes = 0;
};

// True when the file at `path` starts like an LMDB data file (meta page magic); false for a
// missing file, SQLite databases and anything else. Used to pick a reader by content.
bool is_lmdb_file(const std::string& path);

bool lmdb_trace_info(const std::string& path, LmdbTraceInfo& info, std::string& error);

struct LmdbReadOptions {
  size_t batch_size = 4096;
  bool verify_checksums = true;
  bool release_pages = true;  // madvise decoded pages away: RSS independent of trace length
};

std::unique_ptr<EventSource> open_lmdb_trace(const std::string& path, std::string& error,
                                             const LmdbReadOptions& options = {});

// Chains stored by LmdbSink::write_chains / write_result, sorted by id.
bool read_lmdb_chains(const std::string& path, std::vector<Chain>& chains, std::string& error);

class LmdbSink {
 public:
  struct Options {
    size_t chunk_events = 4096;               // events per chunk (one LMDB value)
    size_t chunks_per_txn = 16;               // chunks per write transaction
    uint64_t initial_map_bytes = 1ull << 30;  // virtual; the file grows as pages are used
    uint64_t max_bytes = 0;                   // size bound of the file (0 = unbounded)
    double retain_fraction = 0.6;             // chunks kept within this share of max_bytes
    bool durable = true;                      // fsync at every commit
    bool overwrite = true;                    // replace an existing LMDB trace (never another file)
    bool append = false;                      // keep an existing LMDB trace and append to it
  };

  static std::unique_ptr<LmdbSink> create(const std::string& path, std::string& error);
  static std::unique_ptr<LmdbSink> create(const std::string& path, std::string& error, const Options& options);
  ~LmdbSink();
  LmdbSink(const LmdbSink&) = delete;
  LmdbSink& operator=(const LmdbSink&) = delete;

  // Node names, process names, stacks, sessions, health: replaced on every call.
  bool write_meta(const TraceMeta& meta);
  // Buffers events; writes a transaction each time `chunks_per_txn` chunks are full.
  bool write_events(std::span<const Event> events);
  // Chains by id (a chain with an id already stored replaces it). Commits buffered events first.
  bool write_chains(std::span<const Chain> chains);
  bool write_result(const AnalysisResult& result);
  // Writes every buffered event (a partial chunk included) in one transaction.
  bool commit();
  // Commits, syncs and closes; idempotent.
  bool close(std::string& error);

  const std::string& error() const { return error_; }
  uint64_t events_written() const { return events_written_; }      // accepted so far
  uint64_t events_committed() const { return events_committed_; }  // in committed transactions
  uint64_t chunks_dropped() const { return chunks_dropped_; }      // retention, this session
  uint64_t events_dropped() const { return events_dropped_; }
  uint64_t map_resizes() const { return map_resizes_; }

 private:
  struct Impl;
  LmdbSink(std::string path, Options options);
  bool fail(const std::string& what);
  bool seal_chunk();
  bool write_pending();

  std::string path_;
  Options options_;
  std::unique_ptr<Impl> impl_;
  std::string error_;
  uint64_t events_written_ = 0, events_committed_ = 0, chunks_dropped_ = 0, events_dropped_ = 0, map_resizes_ = 0;
  bool closed_ = false;
};

// LMDB side values (the store owns its layout; the fleet's identity and merge keep values here): a string
// under `key` in the meta database of an existing, closed store.
bool lmdb_put_meta_value(const std::string& path, const std::string& key, const std::string& value, std::string& error);
bool lmdb_get_meta_value(const std::string& path, const std::string& key, std::string& value);

}  // namespace ingero
