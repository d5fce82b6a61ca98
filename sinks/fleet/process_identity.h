// Node and process identity for live capture (docs/fleet.md "Node identity").
//
// Contract:
// - parse_environ(text) reads a NUL-separated environment block (/proc/PID/environ) and returns
//   the distributed-job identity it names: rank, local rank, world size and job id from torchrun
//   (RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID), OpenMPI (OMPI_COMM_WORLD_RANK,
//   OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_SIZE) or Slurm (SLURM_PROCID, SLURM_LOCALID,
//   SLURM_NTASKS, SLURM_JOB_ID), in that order of precedence per field (torchrun runs inside
//   Slurm allocations and then its variables are the worker's own). A value that is not a plain
//   decimal in [0, 32767] (ranks) / [1, 1 << 24] (world size) is ignored and counted in
//   `bad_values`; the parser never throws and accepts a block without a trailing NUL.
// - read_process_identity(pid) reads <proc_root>/<pid>/environ (the environment the process was
//   exec'd with; later setenv() calls are invisible). False when unreadable (gone, not ours).
// - ProcessIdentityCache fills pid -> identity lazily, at the first event of each pid; exec and
//   exit events (HOST kProcessExec/kProcessExit) forget the pid so a new image or a reused pid is
//   read again. stamp(batch) sets Event::rank on events whose rank is unknown (-1) and whose
//   process has a rank; a rank the source already set (the NCCL probe) is kept. At most
//   `max_pids` processes are remembered; later ones are counted in `overflow`, never an error.
//   Single-threaded: call it from the thread that pulls batches.
// - IdentityStampSource wraps an EventSource and stamps every batch it passes on.
// - Node id: load_or_create_node_id(dir) returns the id stored in <dir>/node-id, creating it on
//   first use with a random "node-<12 hex>" written atomically (temporary file, fsync, link(2) so
//   two concurrent first runs agree on one id). A file written by hand is used as it is if it is
//   a valid node name (1-64 of [A-Za-z0-9._-]); anything else is an error, never overwritten.
//   default_state_dir() = $INGERO_STATE_DIR, else /var/lib/ingero-pipeline.
// - Storage: per node, `ip_node_attributes(node, key, value)` (hostname, node_id_source) and
//   `ip_process_identity(node, pid, rank, local_rank, world_size, job_id, launcher, first_seen)`
//   in SQLite (sinks/store/sqlite_schema.h kIdentitySql), or one JSON value under the key
//   "fleet_identity" of an LMDB store's meta database. read_identity() of a trace without them
//   (older captures, Ingero's) returns empty tables. write_identity() adds rows (INSERT OR
//   REPLACE by (node, pid, first_seen) / (node, key)). Neither throws; errors come back in `error`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/trace.h"

namespace ingero {

struct ProcessIdentity {
  int32_t rank = -1, local_rank = -1, world_size = -1;  // -1 = not in the environment
  std::string job_id;                                   // "" = none
  std::string launcher;     // where the rank came from: "torchrun", "openmpi", "slurm", "" = none
  uint32_t bad_values = 0;  // identity variables present but malformed (ignored)
  bool known() const { return rank >= 0 || local_rank >= 0 || world_size > 0 || !job_id.empty(); }
};

ProcessIdentity parse_environ(std::string_view nul_separated);

bool read_process_identity(uint32_t pid, ProcessIdentity& out, const std::string& proc_root = "/proc");

struct ProcessIdentityRow {
  uint32_t pid = 0;
  ProcessIdentity id;
  uint64_t first_seen_ns = 0;  // ts of the first event of the pid that triggered the read
};

class ProcessIdentityCache {
 public:
  struct Stats {
    uint64_t reads = 0;       // environ files read
    uint64_t unreadable = 0;  // pid gone or not readable: no identity
    uint64_t with_rank = 0;   // processes whose environment named a rank
    uint64_t stamped = 0;     // events given a rank
    uint64_t overflow = 0;    // pids not remembered (max_pids reached)
    uint64_t bad_values = 0;  // malformed identity variables seen
  };

  explicit ProcessIdentityCache(std::string proc_root = "/proc", size_t max_pids = 65536)
      : proc_root_(std::move(proc_root)), max_pids_(max_pids) {}

  // The identity of `pid`, read on first sight; nullptr for pid 0 or past max_pids.
  const ProcessIdentity* lookup(uint32_t pid, uint64_t ts_ns);
  void stamp(Batch& batch);

  // Every process seen with a known identity (including ones since forgotten by exec/exit),
  // ordered by pid then first sight.
  std::vector<ProcessIdentityRow> rows() const;
  const Stats& stats() const { return stats_; }

 private:
  std::string proc_root_;
  size_t max_pids_;
  std::unordered_map<uint32_t, ProcessIdentityRow> live_;
  std::vector<ProcessIdentityRow> retired_;
  Stats stats_;
};

// Stamps each batch of `inner` with its processes' ranks (see ProcessIdentityCache).
class IdentityStampSource final : public EventSource {
 public:
  IdentityStampSource(EventSource& inner, ProcessIdentityCache& cache) : inner_(inner), cache_(cache) {}
  bool next(Batch& out) override {
    const bool more = inner_.next(out);
    cache_.stamp(out);
    return more;
  }
  TraceMeta& meta() override { return inner_.meta(); }
  PrefetchHint upcoming() override { return inner_.upcoming(); }
  unsigned busy_threads() const override { return inner_.busy_threads(); }

 private:
  EventSource& inner_;
  ProcessIdentityCache& cache_;
};

// --- node id -----------------------------------------------------------------------------------

std::string default_state_dir();
bool valid_node_name(std::string_view name);
// `created` tells whether this call wrote the file.
bool load_or_create_node_id(const std::string& state_dir, std::string& id, bool& created, std::string& error);
std::string local_hostname();  // "" when gethostname fails

// --- storage -------------------------------------------------------------------------------------

struct IdentityTables {
  std::map<std::string, std::map<std::string, std::string>> attributes;  // node -> key -> value
  std::map<std::string, std::vector<ProcessIdentityRow>> processes;      // node -> rows
  bool empty() const { return attributes.empty() && processes.empty(); }
};

// SQLite (opened read-only, immutable) or LMDB; empty tables when the trace has none.
IdentityTables read_identity(const std::string& path);
// SQLite (tables created if missing) or LMDB (the meta key replaced by the union of what was
// there and `tables`).
bool write_identity(const std::string& path, const IdentityTables& tables, std::string& error);

}  // namespace ingero
