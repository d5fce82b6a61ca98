// `ingero-pipeline query`: one read-only SQL statement over a trace database, through the same
// hardened runner as the MCP run_sql tool (sinks/store/sql_query.h).
#include <iostream>

#include "cli/command.h"
#include "cli/common.h"
#include "sinks/store/sql_query.h"

namespace ingero::cli {
namespace {

struct QueryArgs {
  std::string db;
  std::string sql;
  bool json = false;
  size_t max_rows = 1000;
  uint64_t timeout_ms = 30'000;
  uint64_t max_memory_mb = 1024;
  int max_value_bytes = 16 << 20;
  size_t width = 48;
};

int run_query(const QueryArgs& a) {
  const std::string path = a.db.empty() ? embedded_sample_path() : a.db;
  if (path.empty()) {
    print_error("no --db given and this build has no embedded sample trace");
    return kExitUsage;
  }
  std::string error;
  auto runner = SqlQueryRunner::open(path, error);
  if (!runner) {
    print_error(error);
    return kExitInput;
  }
  SqlLimits limits;
  limits.max_rows = a.max_rows;
  limits.max_ms = a.timeout_ms;
  limits.max_reply_bytes = 64u << 20;  // a terminal user asked for it; rows are the cap here
  limits.max_memory_bytes = a.max_memory_mb << 20;
  limits.max_value_bytes = a.max_value_bytes;
  const SqlResult r = runner->run(a.sql, limits);
  if (!r.ok) {
    if (a.json) std::cout << sql_result_to_json(r).dump(2) << "\n";
    print_error("query refused or failed (" + r.error_kind + "): " + r.error);
    return r.error_kind == "damaged" ? kExitDamaged : kExitUsage;
  }
  if (a.json) std::cout << sql_result_to_json(r).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else std::cout << render_sql_table(r, a.width);
  if (r.truncated)
    std::cerr << "note: output truncated at " << r.truncated_reason << " (raise --max-rows or add LIMIT)\n";
  return kExitOk;
}

Registrar reg{"query", 40, [](CLI::App& app, int& rc) {
                auto args = std::make_shared<QueryArgs>();
                auto* cmd = app.add_subcommand(
                    "query",
                    "Run one read-only SQL statement over a trace database.\n"
                    "Writes, ATTACH, PRAGMA changes, extensions and file access are refused by SQLite itself\n"
                    "(read-only connection + authorizer), not by keyword matching. Rows, time, SQLite's memory\n"
                    "and the size of any one string/blob are capped; a statement over a limit stops with an\n"
                    "error naming the file and the limit (exit status 2).\n"
                    "Examples:\n"
                    "  ingero-pipeline query --db trace.db \"SELECT op, count(*) FROM events GROUP BY op\"\n"
                    "  ingero-pipeline query --db trace.db --json \"PRAGMA table_info(events)\"");
                cmd->add_option("--db", args->db, "Trace database; default: the embedded sample");
                cmd->add_option("sql", args->sql, "One SQL statement")->required();
                cmd->add_flag("--json", args->json, "JSON output: {columns, rows, row_count, truncated}");
                cmd->add_option("--max-rows", args->max_rows, "Row cap (default 1000)")
                    ->check(CLI::Range(size_t{1}, size_t{10'000'000}));
                cmd->add_option("--timeout-ms", args->timeout_ms, "Time budget of the statement (default 30000)")
                    ->check(CLI::Range(uint64_t{1}, uint64_t{3'600'000}));
                cmd->add_option("--max-memory-mb", args->max_memory_mb,
                                "Memory SQLite may add while the statement runs, MiB (default 1024)")
                    ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
                cmd->add_option("--max-value-bytes", args->max_value_bytes,
                                "Longest string or blob the statement may build (default 16 MiB)")
                    ->check(CLI::Range(1024, 1'000'000'000));
                cmd->add_option("--width", args->width, "Widest cell in the text table (default 48)")
                    ->check(CLI::Range(size_t{4}, size_t{100000}));
                cmd->callback([args, &rc] { rc = run_query(*args); });
              }};

}  // namespace
}  // namespace ingero::cli
