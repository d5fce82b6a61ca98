// Diagnostics of the rule compiler: what went wrong, where, and what to do about it.
//
// Contract:
// - A Diagnostic is self-contained (it carries the source line it points at), so it can be
//   rendered after the sources are gone.
// - Text form (stable; golden tests compare it byte for byte):
//       rules/x.rules:3:19: error[E0201]: unknown name `durration`
//          3 |   from cuda where durration > 5ms
//            |                   ^^^^^^^^^
//            = hint: did you mean `duration`?
// - JSON form: an array of objects {file, line, col, end_line, end_col, severity, code, message,
//   hint}. Lines and columns are 1-based; columns count bytes; end_col is exclusive.
// - Codes are stable (docs/rules.md lists them): E00xx syntax and limits, E01xx imports and
//   definitions, E02xx names, E03xx types and units, W04xx possible division by zero, E05xx
//   bounded state, E06xx rule structure, E07xx output, E08xx inline tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ingero::dsl {

enum class DiagLevel : uint8_t { kError, kWarning };

struct Diagnostic {
  DiagLevel level = DiagLevel::kError;
  std::string code;  // "E0201"
  std::string message;
  std::string hint;  // may be empty
  std::string file;
  int line = 0, col = 0;  // 1-based
  int end_line = 0, end_col = 0;
  std::string source_line;  // the text of `line` (no newline)
};

// A source text with a line table: turns byte offsets into line:col and makes diagnostics.
class SourceText {
 public:
  SourceText() = default;
  SourceText(std::string path, std::string text);
  const std::string& path() const { return path_; }
  const std::string& text() const { return text_; }
  // 1-based line and column of byte offset `pos` (clamped to the text).
  std::pair<int, int> line_col(size_t pos) const;
  std::string_view line_text(int line) const;
  Diagnostic make(DiagLevel level, std::string code, size_t pos, size_t end, std::string message,
                  std::string hint = {}) const;

 private:
  std::string path_, text_;
  std::vector<size_t> line_starts_;
};

std::string render_diagnostics(const std::vector<Diagnostic>& diags);
std::string render_diagnostics_json(const std::vector<Diagnostic>& diags);
size_t count_errors(const std::vector<Diagnostic>& diags);

// "did you mean `x`?" for the candidate closest to `word` (edit distance), or "" if none is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace ingero::dsl
