#include "sinks/fleet/merge.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <queue>
#include <set>

#include <nlohmann/json.hpp>

#include "model/plan.h"
#include "model/trace.h"
#include "sinks/fleet/clock_align.h"
#include "sinks/fleet/process_identity.h"
#include "sinks/store/lmdb_store.h"
#include "sinks/store/sqlite_store.h"

namespace ingero {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<EventSource> open_input(const std::string& path, size_t batch, std::string& error) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    error = path + ": no such file";
    return nullptr;
  }
  if (is_lmdb_file(path)) {
    LmdbReadOptions o;
    o.batch_size = batch;
    return open_lmdb_trace(path, error, o);
  }
  if (!is_sqlite_file(path)) {
    error = path + ": neither a SQLite nor an LMDB trace";
    return nullptr;
  }
  return open_sqlite_trace(path, error, batch);
}

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Order-free fingerprint of one event (timestamps left out: a re-merge shifts them).
uint64_t event_hash(const Event& e) {
  uint64_t h = mix64(e.id);
  h = mix64(h ^ (uint64_t{static_cast<uint8_t>(e.source)} << 8 | e.op));
  h = mix64(h ^ (uint64_t{e.pid} << 32 | e.tid));
  return mix64(h ^ e.dur_ns);
}

struct Anchor {
  int64_t event_minus_wall = 0;
  int64_t bound_ns = 0;
};

// Anchors of one node, from ip_clock_anchors when the input is SQLite and has it.
struct AnchorSummary {
  bool have = false;
  int64_t offset_ns = 0;  // median(event clock - wall clock)
  int64_t bound_ns = 0;   // worst recorded error bound (adjtimex maxerror + bracket)
  bool unsync = false;
  bool step = false;  // consecutive anchors disagree by > 1 ms: the clock stepped
};

std::map<std::string, AnchorSummary> read_anchors(const std::string& path) {
  std::map<std::string, AnchorSummary> out;
  if (!is_sqlite_file(path)) return out;
  sqlite3* db = nullptr;
  const std::string uri = "file:" + path + "?immutable=1";
  if (sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return out;
  }
  sqlite3_stmt* st = nullptr;
  const char* sql =
      "SELECT node, event_ns, wall_ns, bracket_ns, maxerror_us, unsync FROM ip_clock_anchors "
      "ORDER BY node, wall_ns";
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK) {
    std::map<std::string, std::vector<int64_t>> diffs;
    while (sqlite3_step(st) == SQLITE_ROW) {
      const auto* n = sqlite3_column_text(st, 0);
      const std::string node = n ? reinterpret_cast<const char*>(n) : "";
      const int64_t d = sqlite3_column_int64(st, 1) - sqlite3_column_int64(st, 2);
      auto& a = out[node];
      auto& v = diffs[node];
      if (!v.empty() && std::llabs(d - v.back()) > 1'000'000) a.step = true;
      v.push_back(d);
      a.have = true;
      a.bound_ns = std::max<int64_t>(a.bound_ns, sqlite3_column_int64(st, 3) + sqlite3_column_int64(st, 4) * 1000);
      a.unsync = a.unsync || sqlite3_column_int64(st, 5) != 0;
    }
    for (auto& [node, v] : diffs) out[node].offset_ns = median_of(v);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

struct NodeScan {
  std::string name;
  size_t input = 0;
  uint64_t events = 0, hash = 0;
  SyncPointCollector sync;
  std::vector<SyncPoint> points;
  AnchorSummary anchors;
  bool from_start = false;  // ordinals count from the communicators' start (nothing dropped)
  bool duplicate = false;
  int64_t offset_ns = 0;
};

std::string stem_of(const std::string& path) { return fs::path(path).stem().string(); }

bool exec(sqlite3* db, const std::string& sql, std::string& error) {
  char* msg = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg) == SQLITE_OK) return true;
  error = msg ? msg : "sqlite error";
  sqlite3_free(msg);
  return false;
}

struct PerNodeMeta {
  std::map<uint32_t, std::string> process_names;
  std::vector<SessionInfo> sessions;
  std::vector<SystemSnapshot> snapshots;
};

bool write_node_tables(const std::string& path, const MergeReport& report,
                       const std::map<std::string, PerNodeMeta>& per_node, std::string& error) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    error = path + ": " + sqlite3_errmsg(db);
    sqlite3_close(db);
    return false;
  }
  bool ok = exec(db,
                 "BEGIN;"
                 "CREATE TABLE IF NOT EXISTS ip_merge_nodes (node TEXT PRIMARY KEY, input TEXT, events INTEGER,"
                 " offset_ns INTEGER, uncertainty_ns INTEGER, method TEXT, pairs INTEGER, note TEXT,"
                 " sessions TEXT, arrivals_compared INTEGER, last_arrivals INTEGER,"
                 " last_arrivals_unresolved INTEGER, max_lead_ns INTEGER);"
                 "CREATE TABLE IF NOT EXISTS ip_node_process_names (node TEXT, pid INTEGER, name TEXT,"
                 " PRIMARY KEY(node, pid));"
                 "CREATE TABLE IF NOT EXISTS ip_node_snapshots (node TEXT, ts INTEGER, cpu_pct REAL,"
                 " mem_pct REAL, load_avg REAL, PRIMARY KEY(node, ts));"
                 "CREATE TABLE IF NOT EXISTS ip_stragglers (node TEXT, rank INTEGER, method TEXT,"
                 " collectives INTEGER, last_share REAL, median_lag_ns INTEGER, step_ns INTEGER,"
                 " cost_share REAL, cross_check TEXT, severity TEXT, summary TEXT);",
                 error);
  auto run = [&](const char* sql, const std::function<void(sqlite3_stmt*)>& bind) {
    if (!ok) return;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) {
      ok = false;
      error = sqlite3_errmsg(db);
      return;
    }
    bind(st);
    sqlite3_finalize(st);
  };
  auto step = [&](sqlite3_stmt* st) {
    if (sqlite3_step(st) != SQLITE_DONE) {
      ok = false;
      error = sqlite3_errmsg(db);
    }
    sqlite3_reset(st);
  };
  auto text = [](sqlite3_stmt* st, int i, const std::string& s) {
    sqlite3_bind_text(st, i, s.c_str(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  };
  const char* node_sql = "INSERT OR REPLACE INTO ip_merge_nodes VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)";
  run(node_sql, [&](sqlite3_stmt* st) {
    for (const auto& n : report.nodes) {
      if (n.method == "duplicate") continue;
      nlohmann::json sessions = nlohmann::json::array();
      if (auto it = per_node.find(n.node); it != per_node.end())
        for (const auto& s : it->second.sessions)
          sessions.push_back({{"started_at", s.started_at},
                              {"stopped_at", s.stopped_at},
                              {"gpu_model", s.gpu_model},
                              {"kernel", s.kernel},
                              {"tool_ver", s.tool_ver},
                              {"flags", s.flags}});
      text(st, 1, n.node);
      text(st, 2, n.input);
      sqlite3_bind_int64(st, 3, static_cast<int64_t>(n.events));
      sqlite3_bind_int64(st, 4, n.offset_ns);
      sqlite3_bind_int64(st, 5, n.uncertainty_ns);
      text(st, 6, n.method);
      sqlite3_bind_int64(st, 7, static_cast<int64_t>(n.pairs));
      text(st, 8, n.note);
      text(st, 9, sessions.dump());
      sqlite3_bind_int64(st, 10, static_cast<int64_t>(n.arrivals_compared));
      sqlite3_bind_int64(st, 11, static_cast<int64_t>(n.last_arrivals));
      sqlite3_bind_int64(st, 12, static_cast<int64_t>(n.last_arrivals_unresolved));
      sqlite3_bind_int64(st, 13, n.max_lead_ns);
      step(st);
    }
  });
  run("INSERT OR REPLACE INTO ip_node_process_names VALUES(?1,?2,?3)", [&](sqlite3_stmt* st) {
    for (const auto& [node, m] : per_node)
      for (const auto& [pid, name] : m.process_names) {
        text(st, 1, node);
        sqlite3_bind_int64(st, 2, pid);
        text(st, 3, name);
        step(st);
      }
  });
  run("INSERT OR REPLACE INTO ip_node_snapshots VALUES(?1,?2,?3,?4,?5)", [&](sqlite3_stmt* st) {
    for (const auto& [node, m] : per_node)
      for (const auto& s : m.snapshots) {
        text(st, 1, node);
        sqlite3_bind_int64(st, 2, static_cast<int64_t>(s.ts_ns));
        sqlite3_bind_double(st, 3, s.cpu_pct);
        sqlite3_bind_double(st, 4, s.mem_pct);
        sqlite3_bind_double(st, 5, s.load_avg);
        step(st);
      }
  });
  run("INSERT INTO ip_stragglers VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)", [&](sqlite3_stmt* st) {
    const auto chains = straggler_chains(report.stragglers);
    for (size_t k = 0; k < report.stragglers.stragglers.size(); ++k) {
      const auto& g = report.stragglers.stragglers[k];
      text(st, 1, g.node);
      if (g.rank >= 0) sqlite3_bind_int64(st, 2, g.rank);
      else sqlite3_bind_null(st, 2);
      text(st, 3, g.method);
      sqlite3_bind_int64(st, 4, static_cast<int64_t>(g.collectives));
      if (g.last_share >= 0) sqlite3_bind_double(st, 5, g.last_share);
      else sqlite3_bind_null(st, 5);  // wait_least: no "last in X %" claimed
      sqlite3_bind_int64(st, 6, g.median_lag_ns);
      sqlite3_bind_int64(st, 7, g.step_ns);
      sqlite3_bind_double(st, 8, g.cost_share);
      text(st, 9, g.cross_check);
      text(st, 10, severity_name(g.severity));
      text(st, 11, k < chains.size() ? chains[k].summary : "");
      step(st);
    }
  });
  if (ok) ok = exec(db, "COMMIT", error);
  if (!ok) error = path + ": writing per-node tables: " + error;
  sqlite3_close(db);
  return ok;
}

// Arrival nodes from per-node sync points on one clock: ordinals matched against the first node
// that has enough of them (estimate_offset with prior 0: the clocks already agree).
std::vector<ArrivalNode> arrival_nodes(const std::vector<std::string>& names,
                                       const std::vector<std::vector<SyncPoint>>& points,
                                       const std::vector<int64_t>& uncertainty) {
  std::vector<ArrivalNode> out(names.size());
  size_t ref = SIZE_MAX;
  for (size_t i = 0; i < names.size(); ++i) {
    out[i].node = names[i];
    out[i].points = points[i];
    out[i].uncertainty_ns = uncertainty[i];
    if (ref == SIZE_MAX && points[i].size() >= 3) ref = i;
  }
  if (ref == SIZE_MAX) return out;
  out[ref].matched = true;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i == ref) continue;
    const OffsetEstimate est = estimate_offset(points[ref], points[i], 0);
    out[i].matched = est.ok;
    out[i].ordinal_shift = est.ordinal_shift;
  }
  return out;
}

// A node's rank from its NCCL events: the one rank seen, else -1 (several or none known).
constexpr int kRankUnseen = -2;
void note_rank(int& node_rank, int16_t rank) {
  if (node_rank == kRankUnseen) node_rank = rank;
  else if (node_rank != rank) node_rank = -1;
}
void name_ranks(StragglerReport& r, const std::vector<int>& node_rank) {
  for (size_t k = 0; k < r.nodes.size() && k < node_rank.size(); ++k) r.nodes[k].rank = std::max(node_rank[k], -1);
  for (auto& g : r.stragglers)
    for (const auto& n : r.nodes)
      if (n.node == g.node) g.rank = n.rank;
}

// One input in pass 2: its current batch and position.
struct Cursor {
  std::unique_ptr<EventSource> src;
  Batch batch;
  size_t pos = 0;
  bool done = false;
  std::vector<int> node_map;     // input node index -> output index (-1 = skip)
  std::vector<int64_t> offsets;  // by input node index
  bool advance() {               // makes batch[pos] valid, or done
    while (!done && pos >= batch.events.size()) {
      batch.events.clear();
      pos = 0;
      if (!src->next(batch)) done = true;
    }
    return !done;
  }
  uint64_t key() const {
    const Event& e = batch.events[pos];
    const int64_t off = e.node < offsets.size() ? offsets[e.node] : 0;
    return static_cast<uint64_t>(static_cast<int64_t>(e.ts_ns) - off);
  }
};

}  // namespace

nlohmann::json merge_node_json(const MergeNodeReport& n) {
  return {{"node", n.node},
          {"input", n.input},
          {"events", n.events},
          {"offset_ns", n.offset_ns},
          {"uncertainty_ns", n.uncertainty_ns},
          {"method", n.method},
          {"pairs", n.pairs},
          {"note", n.note},
          {"arrivals_compared", n.arrivals_compared},
          {"last_arrivals", n.last_arrivals},
          {"last_arrivals_unresolved", n.last_arrivals_unresolved},
          {"max_lead_ns", n.max_lead_ns},
          {"period_ns", n.period_ns},
          {"fitting_shifts", n.fitting_shifts}};
}

bool merge_traces(const std::vector<MergeInput>& inputs, const MergeOptions& options, MergeReport& report,
                  std::string& error) {
  const auto t0 = std::chrono::steady_clock::now();
  report = MergeReport{};
  if (inputs.empty()) {
    error = "merge: no input traces";
    return false;
  }
  if (options.out.empty()) {
    error = "merge: no output path (-o)";
    return false;
  }
  std::error_code ec;
  for (const auto& in : inputs)
    if (fs::exists(options.out, ec) && fs::equivalent(in.path, options.out, ec)) {
      error = "merge: the output " + options.out + " is also an input";
      return false;
    }

  if (fs::exists(options.out, ec) && !is_sqlite_file(options.out) && !is_lmdb_file(options.out)) {
    error = "merge: refusing to replace " + options.out + ": it exists and is not a trace";
    return false;
  }

  // ---- Pass 1: open every input, name its nodes, fingerprint them, collect sync points.
  std::vector<NodeScan> nodes;  // unique by name, in first-seen order
  std::map<std::string, size_t> node_by_name;
  std::vector<std::vector<size_t>> input_nodes(inputs.size());  // input node idx -> scan idx
  std::vector<TraceMeta> metas(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string why;
    auto src = open_input(inputs[i].path, options.batch_size, why);
    if (!src) {
      error = "merge: " + why + " (nothing was written)";
      return false;
    }
    const auto anchors = read_anchors(inputs[i].path);
    std::vector<NodeScan> local;
    auto name_of = [&](size_t j) {
      const auto& ns = src->meta().nodes;
      std::string n = j < ns.size() ? ns[j] : "node#" + std::to_string(j);
      if (n.empty()) n = inputs[i].name.empty() ? stem_of(inputs[i].path) : inputs[i].name;
      return n;
    };
    Batch b;
    while (src->next(b)) {
      for (const Event& e : b.events) {
        if (e.node >= local.size()) local.resize(e.node + 1u);
        auto& s = local[e.node];
        ++s.events;
        s.hash += event_hash(e);
        s.sync.add(e);
      }
      b.events.clear();
    }
    metas[i] = src->meta();
    report.rows_skipped += metas[i].health.rows_skipped;
    if (metas[i].health.rows_skipped)
      report.warnings.push_back(inputs[i].path + ": " + std::to_string(metas[i].health.rows_skipped) +
                                " unreadable rows skipped by the reader");
    if (local.empty()) local.resize(1);
    input_nodes[i].assign(local.size(), SIZE_MAX);
    for (size_t j = 0; j < local.size(); ++j) {
      if (local[j].events == 0 && j != 0) continue;
      local[j].name = name_of(j);
      local[j].input = i;
      local[j].points = local[j].sync.points();
      local[j].from_start = local[j].sync.covers_start() && metas[i].health.dropped_events == 0;
      const auto& raw_name = j < metas[i].nodes.size() ? metas[i].nodes[j] : std::string{};
      if (auto a = anchors.find(raw_name); a != anchors.end()) local[j].anchors = a->second;
      else if (auto b2 = anchors.find(local[j].name); b2 != anchors.end()) local[j].anchors = b2->second;
      if (local[j].events == 0 && local.size() > 1) continue;  // the unused unnamed slot
      auto it = node_by_name.find(local[j].name);
      if (it != node_by_name.end()) {
        const auto& prev = nodes[it->second];
        if (prev.events == local[j].events && prev.hash == local[j].hash) {
          local[j].duplicate = true;
          report.warnings.push_back("node '" + local[j].name + "' of " + inputs[i].path + " is already in " +
                                    inputs[prev.input].path + " with the same events: written once");
          MergeNodeReport r;
          r.node = local[j].name;
          r.input = inputs[i].path;
          r.events = local[j].events;
          r.method = "duplicate";
          r.note = "same events as " + inputs[prev.input].path;
          report.nodes.push_back(r);
          continue;
        }
        error = "merge: node '" + local[j].name + "' is in both " + inputs[prev.input].path + " (" +
                std::to_string(prev.events) + " events) and " + inputs[i].path + " (" +
                std::to_string(local[j].events) +
                " events) with different events; name one input explicitly with NAME=PATH "
                "(nothing was written)";
        return false;
      }
      node_by_name.emplace(local[j].name, nodes.size());
      input_nodes[i][j] = nodes.size();
      nodes.push_back(std::move(local[j]));
    }
  }

  // ---- Fleet identity (hostname, per-process rank/job, sinks/fleet/process_identity.h): each input's
  // rows under their output node names; rows of duplicate or unknown nodes are not carried.
  IdentityTables identity;
  for (size_t i = 0; i < inputs.size(); ++i) {
    IdentityTables t = read_identity(inputs[i].path);
    if (t.empty()) continue;
    for (size_t j = 0; j < input_nodes[i].size(); ++j) {
      if (input_nodes[i][j] == SIZE_MAX) continue;
      const std::string& out_name = nodes[input_nodes[i][j]].name;
      const std::string raw = j < metas[i].nodes.size() ? metas[i].nodes[j] : std::string{};
      for (const std::string& key : {raw, out_name}) {
        if (auto a = t.attributes.find(key); a != t.attributes.end()) {
          identity.attributes[out_name].insert(a->second.begin(), a->second.end());
          t.attributes.erase(a);
        }
        if (auto p = t.processes.find(key); p != t.processes.end()) {
          auto& dst = identity.processes[out_name];
          dst.insert(dst.end(), p->second.begin(), p->second.end());
          t.processes.erase(p);
        }
      }
    }
  }

  // ---- Alignment.
  // The reference: the first node with sync points whose capture covers its communicators' start
  // (its ordinals then match other such nodes' directly), else the first node with sync points.
  const NodeScan* ref = nullptr;
  if (options.align) {
    for (const auto& n : nodes)
      if (n.points.size() >= 3 && n.from_start) {
        ref = &n;
        break;
      }
    if (!ref)
      for (const auto& n : nodes)
        if (n.points.size() >= 3) {
          ref = &n;
          break;
        }
  }
  std::vector<MergeNodeReport> node_reports;
  for (auto& n : nodes) {
    MergeNodeReport r;
    r.node = n.name;
    r.input = inputs[n.input].path;
    r.events = n.events;
    r.collectives = n.sync.collectives();
    if (n.anchors.step) r.note = "clock step seen in the anchors; ";
    if (n.anchors.unsync) r.note += "the kernel reported the clock unsynchronised; ";
    if (!options.align) {
      r.method = "none";
      r.note += "--no-align: raw clock";
    } else if (&n == ref) {
      r.method = "reference";
      r.uncertainty_ns = 0;
      r.pairs = n.points.size();
    } else {
      // Anchors on both nodes bound the offset (each node's wall clock is within its recorded
      // error of true time), unless one of them stepped during the capture.
      const bool both_anchored = ref ? (n.anchors.have && ref->anchors.have) : false;
      AlignHints hints;
      if (both_anchored) {
        hints.prior_ns = n.anchors.offset_ns - ref->anchors.offset_ns;
        if (!n.anchors.step && !ref->anchors.step) hints.prior_bound_ns = n.anchors.bound_ns + ref->anchors.bound_ns;
      }
      hints.start_aligned = ref && ref->from_start && n.from_start;
      OffsetEstimate est;
      if (ref) est = estimate_offset(ref->points, n.points, hints);
      else est.why = "no node has blocking waits after collectives";
      if (est.ok) {
        r.method = est.method;
        r.offset_ns = est.offset_ns;
        r.uncertainty_ns = est.uncertainty_ns;
        r.pairs = est.pairs;
        r.period_ns = est.period_ns;
        r.fitting_shifts = est.fitting;
        r.note += est.note;
      } else {
        // Anchors: relative to the reference when it has them, else to true wall time.
        const AnchorSummary none;
        const AnchorSummary& ra = ref ? ref->anchors : none;
        if (n.anchors.have) {
          r.method = "wall_clock_anchors";
          r.offset_ns = n.anchors.offset_ns - (ra.have ? ra.offset_ns : 0);
          r.uncertainty_ns = n.anchors.bound_ns + (ra.have ? ra.bound_ns : 0);
          r.note += est.why + ": fell back to the recorded clock anchors";
          if (ref && !ra.have) r.note += " (the reference node has none: its wall clock is assumed right)";
        } else {
          r.method = "none";
          r.uncertainty_ns = -1;
          r.note += est.why + "; no clock anchors recorded: raw clock kept, skew unknown";
        }
      }
    }
    n.offset_ns = r.offset_ns;
    node_reports.push_back(r);
  }
  for (auto& r : report.nodes) node_reports.push_back(r);  // duplicates after real nodes
  report.nodes = std::move(node_reports);

  // ---- Merged metadata: node names, stacks, process names (agreeing ones), per-node tables.
  TraceMeta merged;
  merged.path = options.out;
  merged.format = "ingero-pipeline-merged";
  merged.nodes.clear();
  for (const auto& n : nodes) merged.nodes.push_back(n.name);
  std::map<std::string, PerNodeMeta> per_node;
  std::map<uint32_t, std::string> pname;
  std::set<uint32_t> pname_conflict;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& m = metas[i];
    // Process names, sessions and snapshots of a single-node input belong to that node; a
    // multi-node input's (already merged) node tables are not reachable through TraceMeta.
    std::string owner;
    size_t owned = 0;
    for (const size_t node_index : input_nodes[i])
      if (node_index != SIZE_MAX) {
        owner = nodes[node_index].name;
        ++owned;
      }
    for (const auto& [id, st] : m.stacks) merged.stacks.emplace(id, st);
    if (owned != 1) continue;
    auto& pn = per_node[owner];
    pn.process_names = m.process_names;
    pn.sessions = m.sessions;
    pn.snapshots = m.snapshots;
    for (const auto& [pid, name] : m.process_names) {
      auto [it, fresh] = pname.emplace(pid, name);
      if (!fresh && it->second != name) pname_conflict.insert(pid);
    }
    merged.sessions.insert(merged.sessions.end(), m.sessions.begin(), m.sessions.end());
    merged.health.dropped_events += m.health.dropped_events;
  }
  for (auto p : pname_conflict) pname.erase(p);
  merged.process_names = std::move(pname);
  if (!pname_conflict.empty())
    report.warnings.push_back(std::to_string(pname_conflict.size()) +
                              " pid(s) name different processes on different nodes: their names are "
                              "kept per node only (ip_node_process_names)");

  // ---- Pass 2: stream every input, shifted, by corrected time, into the sink.
  std::string fmt = options.format;
  const auto ext = fs::path(options.out).extension().string();
  if (fmt.empty()) fmt = (ext == ".lmdb" || ext == ".mdb") ? "lmdb" : "sqlite";
  const std::string tmp = options.out + ".merge-tmp";
  fs::remove(tmp, ec);
  fs::remove(tmp + "-lock", ec);
  std::unique_ptr<SqliteSink> sq;
  std::unique_ptr<LmdbSink> lm;
  std::string why;
  if (fmt == "lmdb") {
    LmdbSink::Options o;
    o.durable = false;
    lm = LmdbSink::create(tmp, why, o);
  } else {
    sq = SqliteSink::create(tmp, why);
  }
  if (!sq && !lm) {
    error = "merge: cannot create " + options.out + ": " + why;
    return false;
  }
  bool ok = sq ? sq->write_meta(merged) : lm->write_meta(merged);

  std::vector<Cursor> cursors(inputs.size());
  for (size_t i = 0; i < inputs.size() && ok; ++i) {
    cursors[i].src = open_input(inputs[i].path, options.batch_size, why);
    if (!cursors[i].src) {
      error = "merge: " + why + " (the input changed between passes)";
      ok = false;
      break;
    }
    for (size_t j = 0; j < input_nodes[i].size(); ++j) {
      const size_t s = input_nodes[i][j];
      cursors[i].node_map.push_back(s == SIZE_MAX ? -1 : static_cast<int>(s));
      cursors[i].offsets.push_back(s == SIZE_MAX ? 0 : nodes[s].offset_ns);
    }
  }
  std::vector<SyncPointCollector> corrected(nodes.size(), SyncPointCollector(options.min_block_ns));
  std::vector<int> node_rank(nodes.size(), kRankUnseen);
  using HeapItem = std::pair<uint64_t, size_t>;
  std::priority_queue<HeapItem, std::vector<HeapItem>, std::greater<>> heap;
  if (ok)
    for (size_t i = 0; i < cursors.size(); ++i)
      if (cursors[i].advance()) heap.push({cursors[i].key(), i});
  std::vector<Event> out;
  out.reserve(options.batch_size);
  auto flush = [&] {
    if (out.empty() || !ok) return;
    ok = sq ? sq->write_events(out) : lm->write_events(out);
    report.events_out += out.size();
    out.clear();
  };
  while (ok && !heap.empty()) {
    const auto [key, i] = heap.top();
    heap.pop();
    auto& c = cursors[i];
    // Take every event of this input up to the next input's head: one heap operation per run.
    const uint64_t limit = heap.empty() ? UINT64_MAX : heap.top().first;
    while (ok && c.advance() && c.key() <= limit) {
      Event e = c.batch.events[c.pos++];
      const int dst = e.node < c.node_map.size() ? c.node_map[e.node] : -1;
      if (dst < 0) continue;  // a duplicate node
      e.ts_ns = static_cast<uint64_t>(static_cast<int64_t>(e.ts_ns) - c.offsets[e.node]);
      e.node = static_cast<uint16_t>(dst);
      corrected[static_cast<size_t>(dst)].add(e);
      if (e.source == Source::kNccl) note_rank(node_rank[static_cast<size_t>(dst)], e.rank);
      out.push_back(e);
      if (out.size() >= options.batch_size) flush();
    }
    if (!c.done && c.advance()) heap.push({c.key(), i});
  }
  flush();
  // Who entered each collective last, on the corrected clock, claimed only beyond the clock
  // uncertainties (sinks/fleet/clock_align.h).
  {
    std::vector<std::string> names;
    std::vector<std::vector<SyncPoint>> pts;
    std::vector<int64_t> unc;
    for (size_t k = 0; k < nodes.size(); ++k) {
      names.push_back(nodes[k].name);
      pts.push_back(corrected[k].points());
      unc.push_back(report.nodes[k].uncertainty_ns);  // report.nodes[k] is nodes[k]
    }
    const auto counts = count_last_arrivals(arrival_nodes(names, pts, unc));
    for (size_t k = 0; k < counts.size(); ++k) {
      report.nodes[k].arrivals_compared = counts[k].compared;
      report.nodes[k].last_arrivals = counts[k].last;
      report.nodes[k].last_arrivals_unresolved = counts[k].last_unresolved;
      report.nodes[k].max_lead_ns = counts[k].max_lead_ns;
    }
    report.stragglers = find_stragglers(arrival_nodes(names, pts, unc));
    name_ranks(report.stragglers, node_rank);
  }
  if (!ok && why.empty()) why = sq ? sq->error() : lm->error();
  if (ok) ok = sq ? sq->close(why) : lm->close(why);
  else if (sq) sq->close(why);
  else lm->close(why);
  if (ok && sq) ok = write_node_tables(tmp, report, per_node, why);
  if (ok && !identity.empty()) ok = write_identity(tmp, identity, why);
  if (ok && lm) {  // LMDB has no ip_merge_nodes: the same rows as one meta value
    nlohmann::json j = nlohmann::json::array();
    for (const auto& n : report.nodes)
      if (n.method != "duplicate") j.push_back(merge_node_json(n));
    ok = lmdb_put_meta_value(tmp, "fleet_merge_nodes", j.dump(), why);
    if (ok) ok = lmdb_put_meta_value(tmp, "fleet_stragglers", stragglers_json(report.stragglers).dump(), why);
  }
  if (ok) {
    fs::rename(tmp, options.out, ec);
    if (ec) {
      ok = false;
      why = ec.message();
    }
    if (fmt == "lmdb") {
      fs::remove(options.out + "-lock", ec);
      fs::remove(tmp + "-lock", ec);
    }
  }
  if (!ok) {
    if (error.empty()) error = "merge: writing " + options.out + ": " + (why.empty() ? "failed" : why);
    fs::remove(tmp, ec);
    fs::remove(tmp + "-lock", ec);
    return false;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

namespace {

// A merged trace's nodes for count_last_arrivals/find_stragglers, with the recorded uncertainties.
bool merged_arrival_nodes(const std::string& path, uint64_t min_block_ns, std::vector<ArrivalNode>& out,
                          std::vector<int>& node_rank, std::string& error) {
  auto src = open_input(path, 4096, error);
  if (!src) return false;
  std::vector<SyncPointCollector> collectors;
  Batch b;
  while (src->next(b)) {
    for (const Event& e : b.events) {
      if (e.node >= collectors.size()) collectors.resize(e.node + 1u, SyncPointCollector(min_block_ns));
      collectors[e.node].add(e);
      if (e.node >= node_rank.size()) node_rank.resize(e.node + 1u, kRankUnseen);
      if (e.source == Source::kNccl) note_rank(node_rank[e.node], e.rank);
    }
    b.events.clear();
  }
  const auto& meta_nodes = src->meta().nodes;
  // Recorded uncertainties by node name; -1 (no claim) where none was recorded.
  std::map<std::string, int64_t> recorded;
  if (is_lmdb_file(path)) {
    std::string text;
    if (lmdb_get_meta_value(path, "fleet_merge_nodes", text)) {
      const auto j = nlohmann::json::parse(text, nullptr, false);
      if (j.is_array())
        for (const auto& n : j)
          if (n.is_object() && n.contains("node") && n["node"].is_string() && n.contains("uncertainty_ns") &&
              n["uncertainty_ns"].is_number_integer())
            recorded[n["node"].get<std::string>()] = n["uncertainty_ns"].get<int64_t>();
    }
  } else {
    sqlite3* db = nullptr;
    const std::string uri = "file:" + path + "?immutable=1";
    if (sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) == SQLITE_OK) {
      sqlite3_stmt* st = nullptr;
      if (sqlite3_prepare_v2(db, "SELECT node, uncertainty_ns FROM ip_merge_nodes", -1, &st, nullptr) == SQLITE_OK)
        while (sqlite3_step(st) == SQLITE_ROW) {
          const auto* n = sqlite3_column_text(st, 0);
          if (n && sqlite3_column_type(st, 1) == SQLITE_INTEGER)
            recorded[reinterpret_cast<const char*>(n)] = sqlite3_column_int64(st, 1);
        }
      sqlite3_finalize(st);
    }
    sqlite3_close(db);
  }
  std::vector<std::string> names;
  std::vector<std::vector<SyncPoint>> pts;
  std::vector<int64_t> unc;
  for (size_t k = 0; k < collectors.size(); ++k) {
    const std::string name = k < meta_nodes.size() ? meta_nodes[k] : "node#" + std::to_string(k);
    names.push_back(name);
    pts.push_back(collectors[k].points());
    auto it = recorded.find(name);
    unc.push_back(it == recorded.end() ? -1 : it->second);
  }
  out = arrival_nodes(names, pts, unc);
  return true;
}

}  // namespace

bool arrivals_of_merged_trace(const std::string& path, std::vector<ArrivalCount>& out, std::string& error,
                              uint64_t min_block_ns) {
  out.clear();
  std::vector<ArrivalNode> nodes;
  std::vector<int> ranks;
  if (!merged_arrival_nodes(path, min_block_ns, nodes, ranks, error)) return false;
  out = count_last_arrivals(nodes);
  return true;
}

bool stragglers_of_merged_trace(const std::string& path, StragglerReport& out, std::string& error,
                                uint64_t min_block_ns, const StragglerOptions& options) {
  out = {};
  std::vector<ArrivalNode> nodes;
  std::vector<int> ranks;
  if (!merged_arrival_nodes(path, min_block_ns, nodes, ranks, error)) return false;
  out = find_stragglers(nodes, options);
  name_ranks(out, ranks);
  return true;
}

nlohmann::json stragglers_json(const StragglerReport& r) {
  nlohmann::json list = nlohmann::json::array();
  const auto chains = straggler_chains(r);
  for (size_t k = 0; k < r.stragglers.size(); ++k) {
    const auto& g = r.stragglers[k];
    list.push_back({{"node", g.node},
                    {"rank", g.rank},
                    {"method", g.method},
                    {"collectives", g.collectives},
                    {"last_share", g.last_share},
                    {"median_lag_ns", g.median_lag_ns},
                    {"step_ns", g.step_ns},
                    {"cost_share", g.cost_share},
                    {"cross_check", g.cross_check},
                    {"category", "straggler"},
                    {"severity", severity_name(g.severity)},
                    {"summary", k < chains.size() ? chains[k].summary : ""}});
  }
  return {{"step_ns", r.step_ns},
          {"compared", r.compared},
          {"order_usable", r.order_usable},
          {"note", r.note},
          {"stragglers", list}};
}

}  // namespace ingero
