// Parse driver: source text -> ast::File, with every syntax error as a diagnostic.
//
// Contract:
// - Never throws and never recurses without bound: a pre-scan rejects bracket nesting deeper than
//   Limits::max_nesting and files larger than Limits::max_bytes before X3 runs.
// - Parses item by item, and inside a rule clause by clause; after an error it resumes at the next
//   line that starts with a clause keyword, `end` or a top-level keyword, so every independent
//   error in a file is reported (up to Limits::max_errors).
// - X3 expectation failures are caught here and become E0001 diagnostics.
#pragma once

#include <string_view>
#include <vector>

#include "dsl/ast.h"
#include "dsl/diagnostics.h"

namespace ingero::dsl {

struct ParseLimits {
  size_t max_bytes = 1u << 20;
  int max_nesting = 32;
  size_t max_errors = 50;
};

ast::File parse_rules_text(const SourceText& src, std::vector<Diagnostic>& diags, const ParseLimits& limits = {});

// Parses one expression inside `src` at [pos, end) (template placeholders). Positions in `out`
// are offsets into src. False with a diagnostic when the text is not exactly one expression.
bool parse_expression_at(const SourceText& src, size_t pos, size_t end, ast::Expr& out, std::vector<Diagnostic>& diags);

// The clause keywords (for suggestions and error recovery).
const std::vector<std::string>& clause_keywords();

}  // namespace ingero::dsl
