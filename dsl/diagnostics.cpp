#include "dsl/diagnostics.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

namespace ingero::dsl {

SourceText::SourceText(std::string path, std::string text) : path_(std::move(path)), text_(std::move(text)) {
  line_starts_.push_back(0);
  for (size_t i = 0; i < text_.size(); ++i)
    if (text_[i] == '\n') line_starts_.push_back(i + 1);
}

std::pair<int, int> SourceText::line_col(size_t pos) const {
  pos = std::min(pos, text_.size());
  const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
  const size_t line = static_cast<size_t>(it - line_starts_.begin());  // 1-based
  return {static_cast<int>(line), static_cast<int>(pos - line_starts_[line - 1] + 1)};
}

std::string_view SourceText::line_text(int line) const {
  if (line < 1 || static_cast<size_t>(line) > line_starts_.size()) return {};
  const size_t start = line_starts_[static_cast<size_t>(line) - 1];
  size_t end = static_cast<size_t>(line) < line_starts_.size() ? line_starts_[static_cast<size_t>(line)] - 1
                                                               : text_.size();
  if (end > start && text_[end - 1] == '\r') --end;
  return std::string_view(text_).substr(start, end - start);
}

Diagnostic SourceText::make(DiagLevel level, std::string code, size_t pos, size_t end, std::string message,
                            std::string hint) const {
  Diagnostic d;
  d.level = level;
  d.code = std::move(code);
  d.message = std::move(message);
  d.hint = std::move(hint);
  d.file = path_;
  std::tie(d.line, d.col) = line_col(pos);
  std::tie(d.end_line, d.end_col) = line_col(std::max(end, pos));
  d.source_line = std::string(line_text(d.line));
  return d;
}

std::string render_diagnostics(const std::vector<Diagnostic>& diags) {
  std::string out;
  for (const auto& d : diags) {
    out += d.file + ":" + std::to_string(d.line) + ":" + std::to_string(d.col) + ": ";
    out += d.level == DiagLevel::kError ? "error[" : "warning[";
    out += d.code + "]: " + d.message + "\n";
    const std::string num = std::to_string(d.line);
    const std::string pad(num.size() + 1, ' ');
    std::string line = d.source_line;
    std::replace(line.begin(), line.end(), '\t', ' ');
    out.append(" ").append(num).append(" | ").append(line).append("\n");
    // Underline the span on this line; a span running past the line is underlined to its end.
    const size_t start = static_cast<size_t>(std::max(d.col, 1) - 1);
    size_t stop = d.end_line == d.line ? static_cast<size_t>(std::max(d.end_col, 1) - 1) : line.size();
    if (stop <= start) stop = start + 1;
    out += pad + " | " + std::string(std::min(start, line.size()), ' ');
    if (start > line.size()) out += std::string(start - line.size(), ' ');
    out += std::string(stop - start, '^') + "\n";
    if (!d.hint.empty()) out += pad + " = hint: " + d.hint + "\n";
  }
  return out;
}

namespace {
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}
}  // namespace

std::string render_diagnostics_json(const std::vector<Diagnostic>& diags) {
  std::string out = "[";
  for (size_t i = 0; i < diags.size(); ++i) {
    const auto& d = diags[i];
    out += i ? ",\n " : "\n ";
    out += "{\"file\": " + json_string(d.file) + ", \"line\": " + std::to_string(d.line) +
           ", \"col\": " + std::to_string(d.col) + ", \"end_line\": " + std::to_string(d.end_line) +
           ", \"end_col\": " + std::to_string(d.end_col) +
           ", \"severity\": " + (d.level == DiagLevel::kError ? "\"error\"" : "\"warning\"") +
           ", \"code\": " + json_string(d.code) + ", \"message\": " + json_string(d.message) +
           ", \"hint\": " + json_string(d.hint) + "}";
  }
  return out + (diags.empty() ? "]\n" : "\n]\n");
}

size_t count_errors(const std::vector<Diagnostic>& diags) {
  return static_cast<size_t>(
      std::count_if(diags.begin(), diags.end(), [](const Diagnostic& d) { return d.level == DiagLevel::kError; }));
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  if (word.empty() || word.size() > 64) return {};
  size_t best = SIZE_MAX;
  std::string best_name;
  // Optimal string alignment distance: an adjacent transposition (p05 -> p50) costs 1.
  std::vector<size_t> prev2, prev, cur;
  for (const auto& c : candidates) {
    if (c.size() > 64 || c == word) continue;
    prev2.assign(c.size() + 1, 0);
    prev.assign(c.size() + 1, 0);
    cur.assign(c.size() + 1, 0);
    for (size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= c.size(); ++j) {
        const size_t sub = prev[j - 1] + (word[i - 1] == c[j - 1] ? 0 : 1);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
        if (i > 1 && j > 1 && word[i - 1] == c[j - 2] && word[i - 2] == c[j - 1])
          cur[j] = std::min(cur[j], prev2[j - 2] + 1);
      }
      prev2 = prev;
      std::swap(prev, cur);
    }
    if (prev[c.size()] < best) {
      best = prev[c.size()];
      best_name = c;
    }
  }
  // Close enough: at most a third of the word's letters edited (and at least one allowed).
  const size_t limit = std::max<size_t>(1, word.size() / 3);
  if (best == SIZE_MAX || best > limit) return {};
  return "did you mean `" + best_name + "`?";
}

}  // namespace ingero::dsl
