// compile_rules(): parse every file, run the ordered checks, lower what is clean.
#include "dsl/compiler.h"

#include <algorithm>
#include <cstdio>

#include "dsl/sema.h"

namespace ingero::dsl {

std::string content_hash(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

CompileResult compile_rules(const std::vector<RuleSource>& files, const CompileOptions& opts) {
  Module m;
  m.opts = opts;
  for (const auto& src : files) {
    auto unit = std::make_unique<FileUnit>();
    unit->src = SourceText(src.path, src.text);
    unit->ast = parse_rules_text(unit->src, m.diags, opts.limits);
    m.files.push_back(std::move(unit));
  }
  for (const auto& pass : check_passes()) pass.run(m);

  CompileResult out;
  // Diagnostics in file order, then by position (passes report in their own order).
  std::map<std::string, size_t> file_rank;
  for (size_t i = 0; i < m.files.size(); ++i) file_rank.emplace(m.files[i]->src.path(), i);
  std::stable_sort(m.diags.begin(), m.diags.end(), [&](const Diagnostic& a, const Diagnostic& b) {
    const size_t fa = file_rank.count(a.file) ? file_rank[a.file] : SIZE_MAX;
    const size_t fb = file_rank.count(b.file) ? file_rank[b.file] : SIZE_MAX;
    if (fa != fb) return fa < fb;
    if (a.line != b.line) return a.line < b.line;
    return a.col < b.col;
  });
  out.diagnostics = std::move(m.diags);
  out.tests = std::move(m.tests);
  if (count_errors(out.diagnostics) > 0) return out;

  std::map<std::string, int> streams;
  for (const auto& r : m.rules) {
    if (r.broken) continue;
    CompiledRule cr;
    cr.name = r.name;
    cr.title = r.title;
    cr.hash = r.hash;
    cr.file = r.file->src.path();
    cr.line = r.file->src.line_col(static_cast<size_t>(r.rule->id_first)).first;
    cr.plan = lower_rule(r);
    lower_rule_into(r, out.plan, streams);
    out.rules.push_back(std::move(cr));
  }
  for (const auto& problem : out.plan.validate()) {
    Diagnostic d;
    d.code = "E0900";
    d.message = "internal error: the lowered plan is not runnable: " + problem;
    d.file = files.empty() ? "<none>" : files[0].path;
    d.line = d.col = d.end_line = d.end_col = 1;
    out.diagnostics.push_back(std::move(d));
  }
  return out;
}

// ---- parse tree dump ------------------------------------------------------------------------

namespace {

struct Dumper {
  const SourceText& src;
  std::string out;

  std::string at(const ast::x3::position_tagged& n) const {
    auto [l, c] = src.line_col(static_cast<size_t>(std::max(n.id_first, 0)));
    return std::to_string(l) + ":" + std::to_string(c);
  }
  void line(int depth, const std::string& s) { out += std::string(static_cast<size_t>(depth) * 2, ' ') + s + "\n"; }

  static const char* binop(ast::BinOp op) {
    static const char* kNames[] = {"or", "and",    "<", "<=", ">", ">=", "==", "!=",
                                   "in", "not in", "+", "-",  "*", "/",  "~"};
    static_assert(sizeof kNames / sizeof kNames[0] == static_cast<size_t>(ast::BinOp::kMatch) + 1,
                  "one name per ast::BinOp");
    return kNames[static_cast<int>(op)];
  }
  std::string num(const ast::Number& n) const {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%g", n.value);
    return std::string(buf) + n.unit;
  }
  std::string atom(const ast::Atom& a) const {
    if (const auto* n = boost::get<ast::Number>(&a.get())) return num(*n);
    if (const auto* s = boost::get<ast::String>(&a.get())) return "\"" + s->value + "\"";
    return boost::get<ast::Ident>(a.get()).name;
  }
  std::string expr(const ast::Expr& e) const {
    std::string s = unary(e.first);
    for (const auto& o : e.rest) s += std::string(" ") + binop(o.op) + " " + unary(o.operand);
    return e.rest.empty() ? s : "{" + s + "}";
  }
  std::string unary(const ast::Unary& u) const {
    std::string s;
    for (auto op : u.ops) s += op == ast::UnOp::kNeg ? "neg " : "not ";
    return s + primary(u.operand);
  }
  std::string primary(const ast::Primary& p) const {
    if (const auto* n = boost::get<ast::Number>(&p.get())) return num(*n);
    if (const auto* s = boost::get<ast::String>(&p.get())) return "\"" + s->value + "\"";
    if (const auto* l = boost::get<ast::List>(&p.get())) {
      std::string s = "[";
      for (size_t i = 0; i < l->items.size(); ++i) s += (i ? ", " : "") + atom(l->items[i]);
      return s + "]";
    }
    if (const auto* c = boost::get<ast::Call>(&p.get())) {
      std::string s = c->fn.name + "(";
      for (size_t i = 0; i < c->args.size(); ++i) s += (i ? ", " : "") + expr(c->args[i]);
      return s + ")";
    }
    if (const auto* path = boost::get<ast::Path>(&p.get()))
      return path->head.name + (path->member ? "." + path->member->name : "");
    return "(" + expr(boost::get<ast::x3::forward_ast<ast::Expr>>(p.get()).get()) + ")";
  }
  std::string stream(const ast::Stream& s) const {
    std::string t;
    for (size_t i = 0; i < s.sources.size(); ++i) t += (i ? "," : "") + s.sources[i].name;
    if (s.states) {
      t += " states=[";
      for (size_t i = 0; i < s.states->items.size(); ++i) t += (i ? "," : "") + atom(s.states->items[i]);
      t += "]";
    }
    if (s.min) t += " min=" + num(*s.min);
    if (s.where) t += " where=" + expr(*s.where);
    return t;
  }
  std::string options(const std::vector<ast::Option>& opts) const {
    std::string t;
    for (const auto& o : opts) t += " " + o.key.name + "=" + num(o.value);
    return t;
  }

  void clause(const ast::Clause& c) {
    struct V {
      Dumper& d;
      void operator()(const ast::FromClause& c) { d.line(2, d.at(c) + " from " + d.stream(c.stream)); }
      void operator()(const ast::WindowClause& c) {
        std::string s = d.at(c) + " window " + c.kind.name;
        if (c.size) s += " size=" + d.num(*c.size);
        if (c.slide) s += " every=" + d.num(*c.slide);
        if (!c.keys.empty()) {
          s += " by=";
          for (size_t i = 0; i < c.keys.size(); ++i) s += (i ? "," : "") + c.keys[i].name;
        }
        d.line(2, s);
      }
      void operator()(const ast::LetClause& c) {
        d.line(2, d.at(c) + " let");
        for (const auto& b : c.bindings) d.line(3, d.at(b) + " " + b.name.name + " = " + d.expr(b.value));
      }
      void operator()(const ast::RequireClause& c) { d.line(2, d.at(c) + " require " + d.expr(c.pred)); }
      void operator()(const ast::JoinClause& c) {
        d.line(2, d.at(c) + " join " + c.name.name + " = " + d.stream(c.stream) + " on=" + c.key.name +
                      " mode=" + c.mode.name + (c.within ? " " + d.num(*c.within) : "") + " tail=" + d.expr(c.tail) +
                      d.options(c.options));
      }
      void operator()(const ast::TrendClause& c) {
        d.line(2, d.at(c) + " trend " + c.value.name + " " + c.mode.name + (c.factor ? " " + d.num(*c.factor) : "") +
                      " windows=" + d.num(c.windows));
      }
      void operator()(const ast::PeerClause& c) {
        d.line(2, d.at(c) + " peer " + c.value.name + " across=" + c.group.name + d.options(c.options));
      }
      void operator()(const ast::SeverityClause& c) {
        d.line(2, d.at(c) + " severity");
        for (const auto& k : c.cases)
          d.line(3, d.at(k) + " " + k.level.name + (k.when ? " when " + d.expr(*k.when) : ""));
      }
      void operator()(const ast::CategoryClause& c) { d.line(2, d.at(c) + " category " + c.value.name); }
      void operator()(const ast::TextClause& c) {
        d.line(2, d.at(c) + " " + c.kind.name + " \"" + c.text.value + "\"");
      }
      void operator()(const ast::FixClause& c) {
        d.line(2, d.at(c) + " fix");
        for (const auto& s : c.items) d.line(3, d.at(s) + " \"" + s.value + "\"");
      }
      void operator()(const ast::EvidenceClause& c) {
        std::string s = d.at(c) + " evidence";
        for (const auto& n : c.names) s += " " + n.name;
        d.line(2, s);
      }
      void operator()(const ast::TestClause& c) {
        d.line(2, d.at(c) + " test \"" + c.name.value + "\"");
        for (const auto& e : c.events) {
          std::string s = d.at(e) + " event " + e.op.name;
          for (const auto& a : e.attrs) s += " " + a.key.name + "=" + d.atom(a.value);
          d.line(3, s);
        }
        std::string s = d.at(c.expect) + " expect " + (c.expect.negated ? "no " : "") + c.expect.what.name;
        for (const auto& a : c.expect.attrs) s += " " + a.key.name + "=" + d.atom(a.value);
        d.line(3, s);
      }
    };
    boost::apply_visitor(V{*this}, c.get());
  }

  void file(const ast::File& f) {
    for (const auto& item : f.items) {
      if (const auto* i = std::get_if<ast::Import>(&item)) line(0, at(*i) + " import \"" + i->path.value + "\"");
      if (const auto* p = std::get_if<ast::Param>(&item))
        line(0, at(*p) + " param " + p->name.name + " = " + expr(p->value));
      if (const auto* l = std::get_if<ast::ListDecl>(&item)) {
        std::string s = at(*l) + " list " + l->name.name + " = [";
        for (size_t i = 0; i < l->value.items.size(); ++i) s += (i ? ", " : "") + atom(l->value.items[i]);
        line(0, s + "]");
      }
      if (const auto* d = std::get_if<ast::Def>(&item))
        line(0, at(*d) + " def " + d->name.name + " = " + expr(d->value));
      if (const auto* r = std::get_if<ast::Rule>(&item)) {
        line(0, at(*r) + " rule " + r->head.name.name + (r->head.title ? " \"" + r->head.title->value + "\"" : ""));
        for (const auto& c : r->clauses) clause(c);
      }
    }
  }
};

}  // namespace

std::string dump_ast(const RuleSource& file, std::vector<Diagnostic>* diags) {
  SourceText src(file.path, file.text);
  std::vector<Diagnostic> local;
  ast::File f = parse_rules_text(src, diags ? *diags : local);
  Dumper d{src, {}};
  d.file(f);
  return d.out;
}

}  // namespace ingero::dsl
