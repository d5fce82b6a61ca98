#include "dsl/parser.h"

#include <cctype>
#include <cstring>

#include "dsl/config.h"
#include "dsl/grammar.h"

namespace ingero::dsl {
namespace {

namespace x3 = boost::spirit::x3;
using It = parser::iterator_type;

const std::vector<std::string> kTopKeywords = {"rule", "param", "list", "def", "import"};
const std::vector<std::string> kClauseKeywords = {"from",       "window",      "let",      "require",  "join",
                                                  "trend",      "peer",        "severity", "category", "summary",
                                                  "root_cause", "explanation", "fix",      "evidence", "test"};
const std::vector<std::string> kOptionKeywords = {"horizon", "exemplars", "z", "floor", "min_peers"};

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

class Driver {
 public:
  Driver(const SourceText& src, std::vector<Diagnostic>& diags, const ParseLimits& limits)
      : src_(src), diags_(diags), limits_(limits), begin_(src.text().data()), end_(begin_ + src.text().size()) {}

  ast::File run() {
    ast::File file;
    parser::g_parse_begin = begin_;
    It it = begin_;
    while (!stopped_) {
      skip(it);
      if (it == end_) break;
      if (at_word(it, "rule")) {
        ast::Rule rule;
        if (parse_rule(it, rule)) file.items.emplace_back(std::move(rule));
      } else if (at_any(it, kTopKeywords)) {
        ast::TopItem item;
        const It start = it;
        if (parse_one(it, top_item_rule(), item)) {
          boost::apply_visitor([&](auto& v) { file.items.emplace_back(std::move(v)); }, item.get());
        } else {
          sync_top(it, start);
        }
      } else {
        const std::string tok = token_at(it);
        std::string hint = did_you_mean(word_at(it), kTopKeywords);
        if (hint.empty() && at_any(it, kClauseKeywords)) hint = "clauses belong inside `rule NAME ... end`";
        error("E0002", it, it + token_len(it), "expected `rule`, `param`, `list`, `def` or `import`, found " + tok,
              hint);
        sync_top(it, it);
      }
    }
    parser::g_parse_begin = nullptr;
    return file;
  }

  bool parse_expr(It pos, It end, ast::Expr& out) {
    int depth = 0;
    for (It p = pos; p != end; ++p) {
      if (static_cast<unsigned char>(*p) >= 0x80) {
        error("E0007", p, p + 1, "non-ASCII character in a placeholder");
        return false;
      }
      if (*p == '(' || *p == '[') ++depth;
      if (*p == ')' || *p == ']') --depth;
      if (depth > limits_.max_nesting) {
        error("E0003", p, p + 1, "brackets nested more than " + std::to_string(limits_.max_nesting) + " deep");
        return false;
      }
    }
    parser::g_parse_begin = begin_;
    It it = pos;
    const bool ok = parse_one(it, expr_rule(), out, end);
    parser::g_parse_begin = nullptr;
    if (!ok) return false;
    if (it != end) {
      error("E0001", it, it + 1, "expected the end of the placeholder, found " + token_at(it, end));
      return false;
    }
    return true;
  }

 private:
  // Parses with `r`; on failure reports a diagnostic and returns false (iterator unspecified).
  template <class Rule, class Attr>
  bool parse_one(It& it, const Rule& r, Attr& attr, It stop = nullptr) {
    if (!stop) stop = end_;
    const It start = it;
    try {
      if (x3::phrase_parse(it, stop, r, parser::skipper, attr)) return true;
      it = start;
      error("E0001", it, it + token_len(it), "expected " + std::string(x3::what(r)) + ", found " + token_at(it));
      return false;
    } catch (const x3::expectation_failure<It>& e) {
      report_expectation(e.where(), e.which(), stop);
      it = e.where();
      return false;
    }
  }

  void report_expectation(It where, const std::string& which, It stop) {
    // X3 reports the position before the skipper ran; point at the next token instead, except
    // for an unterminated string (inside a lexeme, where the end of the line is the point).
    if (which.rfind("`\"` to close", 0) != 0) {
      It p = where;
      skip(p);
      where = std::min(p, stop);
    }
    std::string what = which;
    if (what.size() >= 2 && (what.front() == '\'' || what.front() == '"') && what.back() == what.front())
      what = "`" + what.substr(1, what.size() - 2) + "`";
    if (what.rfind("`\"` to close", 0) == 0) {
      if (where == stop || *where == '\n' || *where == '\r') {
        error("E0006", where, where, "unterminated string", "strings end on the line they start; close it with `\"`");
        return;
      }
      if (*where == '\\') {
        error("E0006", where, where + std::min<std::ptrdiff_t>(2, stop - where), "unknown escape sequence in string",
              "use \\\", \\\\, \\n or \\t");
        return;
      }
    }
    std::string hint;
    if (where != stop && *where == '=' && (where + 1 == stop || where[1] != '=')) hint = "compare with `==`";
    error("E0001", where, where + token_len(where, stop), "expected " + what + ", found " + token_at(where, stop),
          hint);
  }

  bool parse_rule(It& it, ast::Rule& rule) {
    const It start = it;
    if (!parse_one(it, rule_head_rule(), rule.head)) {
      rule.syntax_error = true;
      sync_clause(it, start);
      // fall through and keep reading clauses so their errors are reported too
    }
    rule.id_first = static_cast<int>(start - begin_);
    while (!stopped_) {
      skip(it);
      if (it == end_) {
        error("E0603", start, start + 4, "rule `" + rule.head.name.name + "` has no `end`",
              "close the rule with `end`");
        return false;
      }
      if (at_word(it, "end")) {
        it += 3;
        rule.id_last = static_cast<int>(it - begin_);
        return true;
      }
      if (at_any(it, kTopKeywords)) {
        error("E0603", start, start + 4, "rule `" + rule.head.name.name + "` has no `end`",
              "add `end` before line " + std::to_string(src_.line_col(static_cast<size_t>(it - begin_)).first));
        rule.id_last = static_cast<int>(it - begin_);
        return false;
      }
      if (!at_any(it, kClauseKeywords)) {
        std::vector<std::string> cands = kClauseKeywords;
        cands.insert(cands.end(), kOptionKeywords.begin(), kOptionKeywords.end());
        cands.emplace_back("end");
        std::string hint = did_you_mean(word_at(it), cands);
        if (hint.empty() && *it == '=') hint = "compare with `==`";
        error("E0002", it, it + token_len(it), "expected a clause or `end`, found " + token_at(it), hint);
        rule.syntax_error = true;
        sync_clause(it, it);
        continue;
      }
      const It clause_start = it;
      ast::Clause clause;
      if (parse_one(it, clause_rule(), clause)) {
        rule.clauses.push_back(std::move(clause));
      } else {
        rule.syntax_error = true;
        sync_clause(it, clause_start);
      }
    }
    return false;
  }

  // ---- lexical helpers (whitespace and comments exactly as the skipper sees them) ----------
  void skip(It& it) const {
    while (it != end_) {
      if (std::isspace(static_cast<unsigned char>(*it))) {
        ++it;
      } else if (*it == '#') {
        while (it != end_ && *it != '\n') ++it;
      } else {
        break;
      }
    }
  }
  bool at_word(It it, const char* w) const {
    const size_t n = std::strlen(w);
    if (static_cast<size_t>(end_ - it) < n || std::memcmp(it, w, n) != 0) return false;
    return it + n == end_ || !ident_char(it[n]);
  }
  bool at_any(It it, const std::vector<std::string>& words) const {
    for (const auto& w : words)
      if (at_word(it, w.c_str())) return true;
    return false;
  }
  std::string word_at(It it) const {
    std::string w;
    while (it != end_ && ident_char(*it) && w.size() < 64) w += *it++;
    return w;
  }
  size_t token_len(It it, It stop = nullptr) const {
    if (!stop) stop = end_;
    if (it >= stop) return 0;
    size_t n = 0;
    if (ident_char(*it)) {
      while (it + n != stop && ident_char(it[n]) && n < 64) ++n;
      return n;
    }
    return (*it == '\n' || *it == '\r') ? 0 : 1;
  }
  std::string token_at(It it, It stop = nullptr) const {
    if (!stop) stop = end_;
    if (it >= stop) return "end of file";
    if (*it == '\n' || *it == '\r') return "end of line";
    const size_t n = token_len(it, stop);
    std::string t(it, n);
    for (char& c : t)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    return "`" + t + "`";
  }
  // Resume at the next line starting with a keyword of `words` (or a top-level keyword).
  void sync_to(It& it, It from, const std::vector<std::string>& words, bool stop_at_end) {
    It p = std::max(it, from);
    while (p != end_ && *p != '\n') ++p;
    while (p != end_) {
      ++p;  // past '\n'
      It q = p;
      while (q != end_ && (*q == ' ' || *q == '\t' || *q == '\r')) ++q;
      if (q != end_ && (at_any(q, words) || at_any(q, kTopKeywords) || (stop_at_end && at_word(q, "end")))) {
        it = q;
        return;
      }
      while (p != end_ && *p != '\n') ++p;
    }
    it = end_;
  }
  void sync_clause(It& it, It from) { sync_to(it, from, kClauseKeywords, true); }
  void sync_top(It& it, It from) { sync_to(it, from, {}, false); }

  void error(const char* code, It pos, It end, std::string msg, std::string hint = {}) {
    if (stopped_) return;
    if (diags_.size() >= limits_.max_errors) {
      stopped_ = true;
      return;
    }
    diags_.push_back(src_.make(DiagLevel::kError, code, static_cast<size_t>(pos - begin_),
                               static_cast<size_t>(end - begin_), std::move(msg), std::move(hint)));
  }

  const SourceText& src_;
  std::vector<Diagnostic>& diags_;
  const ParseLimits& limits_;
  It begin_, end_;
  bool stopped_ = false;
};

// Rejects input that could make the recursive-descent parser recurse too deeply.
bool prescan(const SourceText& src, std::vector<Diagnostic>& diags, const ParseLimits& limits) {
  const std::string& t = src.text();
  if (t.size() > limits.max_bytes) {
    diags.push_back(
        src.make(DiagLevel::kError, "E0005", 0, 0,
                 "file is " + std::to_string(t.size()) + " bytes; the limit is " + std::to_string(limits.max_bytes)));
    return false;
  }
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"' || c == '\n') in_string = false;
      continue;
    }
    if (static_cast<unsigned char>(c) >= 0x80) {
      // X3's character classes take ASCII only (they assert, or read outside their tables).
      diags.push_back(src.make(DiagLevel::kError, "E0007", i, i + 1, "non-ASCII character outside a string or comment",
                               "names and operators are ASCII; UTF-8 text belongs in strings"));
      return false;
    }
    if (c == '#') {
      while (i < t.size() && t[i] != '\n') ++i;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '(' || c == '[' || c == '{') {
      if (++depth > limits.max_nesting) {
        diags.push_back(src.make(DiagLevel::kError, "E0003", i, i + 1,
                                 "brackets nested more than " + std::to_string(limits.max_nesting) + " deep",
                                 "split the expression with `let` or `def`"));
        return false;
      }
    } else if (c == ')' || c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return true;
}

}  // namespace

const std::vector<std::string>& clause_keywords() { return kClauseKeywords; }

ast::File parse_rules_text(const SourceText& src, std::vector<Diagnostic>& diags, const ParseLimits& limits) {
  if (!prescan(src, diags, limits)) return {};
  Driver d(src, diags, limits);
  return d.run();
}

bool parse_expression_at(const SourceText& src, size_t pos, size_t end, ast::Expr& out,
                         std::vector<Diagnostic>& diags) {
  ParseLimits limits;
  Driver d(src, diags, limits);
  const char* base = src.text().data();
  return d.parse_expr(base + pos, base + end, out);
}

}  // namespace ingero::dsl
