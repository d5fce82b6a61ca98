// Loss spans in our SQLite databases: ip_health rows of kind 'loss' (sqlite_store.h).
#include <charconv>
#include <cstdio>

#include "sinks/store/sqlite_store.h"
#include "sinks/store/sqlite_util.h"

namespace ingero {

std::string loss_span_text(const LossSpan& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%llu %llu gpu=%llu host=%llu queue=%llu", static_cast<unsigned long long>(s.start_ns),
                static_cast<unsigned long long>(s.end_ns), static_cast<unsigned long long>(s.gpu),
                static_cast<unsigned long long>(s.host), static_cast<unsigned long long>(s.queue));
  return buf;
}

bool parse_loss_span(std::string_view text, LossSpan& out) {
  LossSpan s;
  auto number = [&text](uint64_t& v) {
    const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr == text.data()) return false;
    text.remove_prefix(static_cast<size_t>(r.ptr - text.data()));
    return true;
  };
  auto literal = [&text](std::string_view w) {
    if (!text.starts_with(w)) return false;
    text.remove_prefix(w.size());
    return true;
  };
  if (!number(s.start_ns) || !literal(" ") || !number(s.end_ns) || !literal(" gpu=") || !number(s.gpu) ||
      !literal(" host=") || !number(s.host) || !literal(" queue=") || !number(s.queue) || !text.empty())
    return false;
  if (s.end_ns < s.start_ns) return false;
  out = s;
  return true;
}

size_t read_loss_spans(const std::string& path, InputHealth& health) {
  using namespace sqlite_detail;
  const ProbeResult probe = probe_sqlite_file(path);
  if (!probe.problem.empty()) return 0;
  std::string error;
  Db db = open_readonly(path, probe, error);
  if (!db || !table_exists(db.get(), "ip_health")) return 0;
  Stmt s(db.get(), "SELECT reason FROM ip_health WHERE kind = 'loss'");
  if (!s.ok()) return 0;
  size_t n = 0;
  // Bounded like the spans themselves: a database written by us holds at most kMaxLossSpans.
  for (size_t rows = 0; rows < 4 * InputHealth::kMaxLossSpans && s.step() == SQLITE_ROW; ++rows) {
    const unsigned char* t = sqlite3_column_text(s.get(), 0);
    const int len = sqlite3_column_bytes(s.get(), 0);
    LossSpan l;
    if (t && parse_loss_span(std::string_view(reinterpret_cast<const char*>(t), static_cast<size_t>(len)), l)) {
      health.add_loss(l);
      ++n;
    }
  }
  return n;
}

}  // namespace ingero
