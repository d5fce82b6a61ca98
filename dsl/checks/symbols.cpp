// Pass `symbols`: collects params, lists and defs per file; rejects duplicates and params whose
// value is not a literal; applies param overrides from CompileOptions::params.
#include <set>

#include "dsl/sema.h"

namespace ingero::dsl {
namespace {

template <class T>
const T* lookup(const FileUnit& f, const std::string& name, const FileUnit** where,
                std::map<std::string, const T*> FileUnit::*table, std::set<const FileUnit*>& seen) {
  if (!seen.insert(&f).second) return nullptr;
  const auto& tab = f.*table;
  if (auto it = tab.find(name); it != tab.end()) {
    if (where) *where = &f;
    return it->second;
  }
  for (const FileUnit* imp : f.imports)
    if (const T* r = lookup(*imp, name, where, table, seen)) return r;
  return nullptr;
}

const TExpr* lookup_param(const FileUnit& f, const std::string& name, std::set<const FileUnit*>& seen) {
  if (!seen.insert(&f).second) return nullptr;
  if (auto it = f.param_values.find(name); it != f.param_values.end()) return &it->second;
  for (const FileUnit* imp : f.imports)
    if (const TExpr* r = lookup_param(*imp, name, seen)) return r;
  return nullptr;
}

void collect_names(const FileUnit& f, std::set<const FileUnit*>& seen, std::vector<std::string>& out) {
  if (!seen.insert(&f).second) return;
  for (const auto& [n, _] : f.params) out.push_back(n);
  for (const auto& [n, _] : f.lists) out.push_back(n);
  for (const auto& [n, _] : f.defs) out.push_back(n);
  for (const FileUnit* imp : f.imports) collect_names(*imp, seen, out);
}

bool is_literal(const TExpr& e) {
  if (e.op == ExprOp::kConst) return true;
  if (e.op == ExprOp::kNeg && e.args.size() == 1) return is_literal(e.args[0]);
  return e.ty == Ty::kList || e.ty == Ty::kString;
}

}  // namespace

const TExpr* find_param(const FileUnit& f, const std::string& name) {
  std::set<const FileUnit*> seen;
  return lookup_param(f, name, seen);
}
const ast::ListDecl* find_list(const FileUnit& f, const std::string& name, const FileUnit** where) {
  std::set<const FileUnit*> seen;
  return lookup(f, name, where, &FileUnit::lists, seen);
}
const ast::Def* find_def(const FileUnit& f, const std::string& name, const FileUnit** where) {
  std::set<const FileUnit*> seen;
  return lookup(f, name, where, &FileUnit::defs, seen);
}
std::vector<std::string> scope_names(const FileUnit& f) {
  std::set<const FileUnit*> seen;
  std::vector<std::string> out;
  collect_names(f, seen, out);
  return out;
}

void pass_symbols(Module& m) {
  // Declarations first, in every file, so that a param may be used by a rule above it.
  for (auto& fp : m.files) {
    FileUnit& f = *fp;
    std::map<std::string, const ast::Ident*> seen;
    auto declare = [&](const ast::Ident& id) {
      if (auto it = seen.find(id.name); it != seen.end()) {
        const int line = f.src.line_col(static_cast<size_t>(it->second->id_first)).first;
        m.error_at(f, id, "E0110", "`" + id.name + "` is already defined on line " + std::to_string(line));
        return false;
      }
      seen[id.name] = &id;
      return true;
    };
    for (const auto& item : f.ast.items) {
      if (const auto* p = std::get_if<ast::Param>(&item)) {
        if (declare(p->name)) f.params[p->name.name] = p;
      } else if (const auto* l = std::get_if<ast::ListDecl>(&item)) {
        if (declare(l->name)) f.lists[l->name.name] = l;
      } else if (const auto* d = std::get_if<ast::Def>(&item)) {
        if (declare(d->name)) f.defs[d->name.name] = d;
      }
    }
  }
  // Param values: literals only (a param is a knob, not a computation).
  for (auto& fp : m.files) {
    FileUnit& f = *fp;
    for (const auto& [name, p] : f.params) {
      Resolver r{m, f};
      r.ctx = Ctx::kConst;
      TExpr v = r.resolve(p->value);
      if (v.ty != Ty::kUnknown && !is_literal(v)) {
        m.error_at(f, p->value, "E0111", "the value of param `" + name + "` must be a literal",
                   "use `def` for a computed expression");
        v.ty = Ty::kUnknown;
      }
      f.param_values[name] = std::move(v);
    }
  }
  // Overrides (`--param name=value`): parsed as an expression in a file of their own.
  for (const auto& [name, text] : m.opts.params) {
    auto unit = std::make_unique<FileUnit>();
    unit->src = SourceText("<param " + name + ">", text);
    unit->imported_only = true;
    FileUnit& u = *unit;
    m.files.push_back(std::move(unit));
    bool found = false;
    for (auto& fp : m.files) {
      auto it = fp->param_values.find(name);
      if (it == fp->param_values.end()) continue;
      found = true;
      ast::Expr e;
      if (!parse_expression_at(u.src, 0, u.src.text().size(), e, m.diags)) break;
      Resolver r{m, u};
      r.ctx = Ctx::kConst;
      TExpr v = r.resolve(e);
      if (v.ty == Ty::kUnknown) break;
      if (!is_literal(v)) {
        m.error(u, 0, static_cast<int>(text.size()), "E0111", "the value of param `" + name + "` must be a literal");
        break;
      }
      it->second = std::move(v);
    }
    if (!found) m.error(u, 0, static_cast<int>(text.size()), "E0112", "no param named `" + name + "`");
  }
}

}  // namespace ingero::dsl
