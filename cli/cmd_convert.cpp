// `ingero-pipeline convert`: copies a trace between the SQLite store (Ingero-compatible) and the
// LMDB event log, events, metadata and chains. The input format is read from the file's first
// bytes; the output format from --to-format or the output's extension (.lmdb/.mdb = LMDB).
#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/config.h"
#include "cli/pipeline_common.h"
#include "sinks/store/lmdb_store.h"
#include "sinks/store/sqlite_store.h"

namespace ingero::cli {
namespace {

struct ConvertArgs {
  std::string in, out, to_format, max_size;
  size_t chunk_events = 4096;
  bool durable = false;
  bool quiet = false;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int run_convert(const ConvertArgs& a) {
  std::string fmt = a.to_format;
  if (fmt.empty()) fmt = ends_with(a.out, ".lmdb") || ends_with(a.out, ".mdb") ? "lmdb" : "sqlite";
  uint64_t max_bytes = 0;
  if (!a.max_size.empty() && !parse_size(a.max_size, max_bytes)) {
    print_error("--max-size: expected a size such as 512MiB or 10GB, got '" + a.max_size + "'");
    return kExitUsage;
  }
  if (max_bytes && fmt != "lmdb") {
    print_error("--max-size applies to LMDB output only");
    return kExitUsage;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  const std::string in_fmt = trace_format_of(a.in);
  auto src = open_any_trace(a.in, error);
  if (!src) {
    print_error(error);
    return kExitInput;
  }
  // Chains stored with the input travel too (SQLite: with the time accounting and the steps).
  std::vector<Chain> chains;
  std::vector<ThreadAccounting> accounting;
  std::vector<ProcessSteps> steps;
  if (in_fmt == "lmdb") {
    if (!read_lmdb_chains(a.in, chains, error)) {
      print_error(error);
      return kExitInput;
    }
  } else {
    AnalysisResult stored;
    std::string ignored;  // a trace without chains is fine
    if (read_result(a.in, stored, ignored)) {
      chains = std::move(stored.chains);
      accounting = std::move(stored.accounting);
      steps = std::move(stored.steps);
    }
  }

  std::unique_ptr<LmdbSink> lmdb;
  std::unique_ptr<SqliteSink> sqlite;
  if (fmt == "lmdb") {
    LmdbSink::Options o;
    o.chunk_events = a.chunk_events;
    o.max_bytes = max_bytes;
    o.durable = a.durable;  // a failed conversion is simply run again; close() syncs anyway
    lmdb = LmdbSink::create(a.out, error, o);
    if (!lmdb) {
      print_error(error);
      return kExitInput;
    }
  } else {
    sqlite = SqliteSink::create(a.out, error);
    if (!sqlite) {
      print_error(error);
      return kExitInput;
    }
  }
  bool ok = lmdb ? lmdb->write_meta(src->meta()) : sqlite->write_meta(src->meta());
  Batch b;
  uint64_t events = 0;
  while (ok && src->next(b)) {
    ok = lmdb ? lmdb->write_events(b.events) : sqlite->write_events(b.events);
    events += b.events.size();
  }
  if (ok) ok = lmdb ? lmdb->write_meta(src->meta()) : sqlite->write_meta(src->meta());
  if (ok && (!chains.empty() || (!lmdb && (!accounting.empty() || !steps.empty())))) {
    if (lmdb) {
      ok = lmdb->write_chains(chains);
    } else {
      AnalysisResult r;
      r.chains = chains;
      r.accounting = std::move(accounting);
      r.steps = std::move(steps);
      r.meta = src->meta();
      ok = sqlite->write_result(r);
    }
  }
  if (ok) ok = lmdb ? lmdb->close(error) : sqlite->close(error);
  if (!ok) {
    print_error(error.empty() ? (lmdb ? lmdb->error() : sqlite->error()) : error);
    return kExitRuntime;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.quiet) {
    const auto& h = src->meta().health;
    std::printf("converted %s (%s) -> %s (%s): %llu events, %zu chains in %.2f s (%.0f events/s)\n", a.in.c_str(),
                in_fmt.c_str(), a.out.c_str(), fmt.c_str(), static_cast<unsigned long long>(events), chains.size(),
                secs, secs > 0 ? static_cast<double>(events) / secs : 0.0);
    if (h.rows_skipped)
      std::printf("skipped %llu unreadable input rows (see `ingero-pipeline stats`)\n",
                  static_cast<unsigned long long>(h.rows_skipped));
    if (lmdb && lmdb->events_dropped())
      std::printf("retention dropped the oldest %llu events to stay within %s\n",
                  static_cast<unsigned long long>(lmdb->events_dropped()), a.max_size.c_str());
  }
  return kExitOk;
}

Registrar reg{
    "convert", 60, [](CLI::App& app, int& rc) {
      auto args = std::make_shared<ConvertArgs>();
      auto* cmd = app.add_subcommand(
          "convert",
          "Copy a trace between the SQLite store (Ingero-compatible) and the LMDB event log:\n"
          "events, metadata and stored chains. The input format is detected from the file;\n"
          "the output format comes from --to-format or the extension (.lmdb/.mdb = LMDB).\n"
          "Examples:\n"
          "  ingero-pipeline convert trace.db trace.lmdb\n"
          "  ingero-pipeline convert trace.lmdb back.db\n"
          "  ingero-pipeline convert big.db big.lmdb --max-size 2GiB   # keep the newest data");
      cmd->add_option("input", args->in, "Trace to read (SQLite or LMDB)")->required();
      cmd->add_option("output", args->out, "File to write (replaced if it is a trace of that format)")->required();
      cmd->add_option("--to-format", args->to_format, "Output format")->check(CLI::IsMember({"sqlite", "lmdb"}));
      cmd->add_option("--max-size", args->max_size, "LMDB: size bound; the oldest events go first");
      cmd->add_option("--chunk-events", args->chunk_events, "LMDB: events per stored chunk")
          ->check(CLI::Range(size_t{64}, size_t{1} << 20));
      cmd->add_flag("--durable", args->durable, "LMDB: fsync every transaction (slower)");
      add_quiet_flag(cmd, &args->quiet, "No summary line and no progress on stderr");
      cmd->callback([args, &rc] { rc = run_convert(*args); });
    }};

}  // namespace
}  // namespace ingero::cli
