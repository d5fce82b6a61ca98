// Pass `output`: what a chain says. `category` is an identifier; summary, root_cause,
// explanation and fix are templates whose `{name}` placeholders must name a row slot or one of
// op, source, node, process, key; a placeholder holding an expression (`{p99 / p50}`) becomes a
// hidden let `_tN` evaluated just before the chain is emitted.
#include "dsl/sema.h"

namespace ingero::dsl {
namespace {

bool is_ident(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  return true;
}

// Checks the template in `str` and returns its text with expression placeholders renamed.
std::string expand(Module& m, RuleSema& r, const ast::String& str) {
  FileUnit& f = *r.file;
  const std::string& src = f.src.text();
  std::vector<std::string> names;
  const int begin = str.id_first + 1, end = str.id_last - 1;
  bool ok = true;
  for (int i = begin; i < end; ++i) {
    if (src[static_cast<size_t>(i)] == '\\') {
      ++i;
      continue;
    }
    if (src[static_cast<size_t>(i)] == '}') {
      m.error(f, i, i + 1, "E0701", "`}` without `{` in a template", "templates put names in braces: {p99}");
      ok = false;
      continue;
    }
    if (src[static_cast<size_t>(i)] != '{') continue;
    int j = i + 1;
    while (j < end && src[static_cast<size_t>(j)] != '}' && src[static_cast<size_t>(j)] != '{') ++j;
    if (j >= end || src[static_cast<size_t>(j)] != '}') {
      m.error(f, i, i + 1, "E0701", "unclosed `{` in a template", "close the placeholder with `}`");
      return {};
    }
    std::string inner = text_of(f, i + 1, j);
    static const std::set<std::string> kBuiltins = {"op", "source", "node", "process", "key"};
    if (inner.rfind("task:", 0) == 0) {
      // {task:slot}: the process a pid slot names (e.g. top_task(preempted)), by name.
      const std::string slot = inner.substr(5);
      auto it = r.slot_types.find(slot);
      if (it == r.slot_types.end() || it->second != Ty::kId) {
        m.error(f, i + 1, j, "E0701", "`{task:...}` names the process of a pid slot, e.g. {task:by}",
                "let by = top_task(preempted)");
        ok = false;
      } else {
        names.push_back(inner);
      }
    } else if (is_ident(inner) && (kBuiltins.count(inner) || r.slot_types.count(inner))) {
      names.push_back(inner);
    } else if (inner.empty()) {
      m.error(f, i, j + 1, "E0701", "empty placeholder `{}` in a template");
      ok = false;
    } else {
      ast::Expr e;
      if (!parse_expression_at(f.src, static_cast<size_t>(i) + 1, static_cast<size_t>(j), e, m.diags)) {
        ok = false;
      } else {
        std::set<std::string> slots;
        for (const auto& [n, _] : r.slot_types) slots.insert(n);
        Resolver res{m, f, &r, Ctx::kRow, &slots};
        TExpr t = res.resolve(e);
        const Ty ty = type_row_expr(m, r, t);
        if (ty == Ty::kBool) {
          m.error(f, i + 1, j, "E0701", "a placeholder shows a value, not a condition");
          ok = false;
        }
        const std::string name = "_t" + std::to_string(r.template_lets.size() + 1);
        r.slot_types[name] = ty;
        r.template_lets.emplace_back(name, std::move(t));
        names.push_back(name);
      }
    }
    i = j;
  }
  if (!ok) return {};
  std::string out;
  size_t k = 0;
  const std::string& v = str.value;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != '{') {
      out += v[i];
      continue;
    }
    const size_t close = v.find('}', i);
    if (close == std::string::npos || k >= names.size()) return out + v.substr(i);
    out += "{" + names[k++] + "}";
    i = close;
  }
  return out;
}

}  // namespace

void pass_output(Module& m) {
  for (auto& r : m.rules) {
    FileUnit& f = *r.file;
    if (r.category_clause) r.category = r.category_clause->value.name;
    if (r.evidence_clause)
      m.error_at(f, *r.evidence_clause, "E0703",
                 "`evidence` cannot be chosen yet: every chain lists its tail calls and each join's "
                 "exemplar events automatically",
                 "remove the clause");
    if (!r.from || !r.window) continue;
    if (auto it = r.texts.find("summary"); it != r.texts.end()) r.summary = expand(m, r, it->second->text);
    if (auto it = r.texts.find("root_cause"); it != r.texts.end()) r.root_cause = expand(m, r, it->second->text);
    if (auto it = r.texts.find("explanation"); it != r.texts.end()) r.explanation = expand(m, r, it->second->text);
    if (r.fix_clause)
      for (const auto& s : r.fix_clause->items) r.fix.push_back(expand(m, r, s));
    if (r.summary.size() > 4096 || r.explanation.size() > 16384)
      m.error_at(f, r.rule->head.name, "E0704", "chain texts are limited to 4 KiB (summary) and 16 KiB (explanation)");
  }
}

}  // namespace ingero::dsl
