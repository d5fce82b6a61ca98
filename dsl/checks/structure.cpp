// Pass `structure`: one RuleSema per rule of the files given to the compiler (not of files that
// are only imported). Checks that each rule has its required clauses once, in pipeline order:
//   from -> window -> (let | require)* -> (join -> (let | require)*)* -> [trend | peer] -> ...
// Output clauses (severity, category, summary, root_cause, explanation, fix, evidence) and tests
// may appear anywhere after the rule head.
#include "dsl/sema.h"

namespace ingero::dsl {
namespace {

template <class... Ts>
struct Overload : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overload(Ts...) -> Overload<Ts...>;

}  // namespace

void pass_structure(Module& m) {
  std::map<std::string, std::pair<const FileUnit*, int>> names;
  for (auto& fp : m.files) {
    FileUnit& f = *fp;
    if (f.imported_only) continue;
    for (const auto& item : f.ast.items) {
      const auto* rule = std::get_if<ast::Rule>(&item);
      if (!rule) continue;
      RuleSema r;
      r.file = &f;
      r.rule = rule;
      r.name = rule->head.name.name;
      if (rule->head.title) r.title = rule->head.title->value;
      if (rule->id_last > rule->id_first)
        r.hash = content_hash(
            std::string_view(f.src.text())
                .substr(static_cast<size_t>(rule->id_first), static_cast<size_t>(rule->id_last - rule->id_first)));
      if (r.name.empty()) {
        r.broken = true;  // the head did not parse; its error is reported
      } else if (auto it = names.find(r.name); it != names.end()) {
        const int line = it->second.first->src.line_col(static_cast<size_t>(it->second.second)).first;
        m.error_at(f, rule->head.name, "E0110",
                   "rule `" + r.name + "` is already defined (" + it->second.first->src.path() + ":" +
                       std::to_string(line) + ")",
                   "rule names are unique across every loaded file");
      } else {
        names[r.name] = {&f, rule->head.name.id_first};
      }

      int stage = 0;  // 0 nothing, 1 from, 2 window, 3 trend/peer
      const ast::x3::position_tagged* trend_or_peer = nullptr;
      auto order = [&](const ast::x3::position_tagged& n, const char* what, int need) {
        if (stage < need) {
          m.error(f, n.id_first, n.id_first + static_cast<int>(std::string(what).size()), "E0602",
                  std::string("`") + what + "` must come after `" + (need == 1 ? "from" : "window") + "`");
          r.broken = true;
          return false;
        }
        return true;
      };
      auto once = [&](const void* existing, const ast::x3::position_tagged& n, const char* what) {
        if (existing) {
          m.error(f, n.id_first, n.id_first + static_cast<int>(std::string(what).size()), "E0604",
                  std::string("duplicate `") + what + "` clause");
          return false;
        }
        return true;
      };
      for (const auto& clause : rule->clauses) {
        boost::apply_visitor(
            Overload{
                [&](const ast::FromClause& c) {
                  if (!once(r.from, c, "from")) return;
                  if (stage > 0) {
                    m.error(f, c.id_first, c.id_first + 4, "E0602", "`from` must be the first clause");
                    r.broken = true;
                  }
                  r.from = &c;
                  stage = std::max(stage, 1);
                },
                [&](const ast::WindowClause& c) {
                  if (!once(r.window, c, "window")) return;
                  if (!order(c, "window", 1)) return;
                  if (stage > 2) {
                    m.error(f, c.id_first, c.id_first + 6, "E0602", "`window` must come before `trend`/`peer`");
                    r.broken = true;
                  }
                  r.window = &c;
                  stage = std::max(stage, 2);
                },
                [&](const ast::LetClause& c) {
                  if (!order(c, "let", 2)) return;
                  Step s;
                  s.kind = Step::Kind::kLet;
                  s.let = &c;
                  s.pos = c.id_first;
                  s.end = c.id_last;
                  r.steps.push_back(std::move(s));
                },
                [&](const ast::RequireClause& c) {
                  if (!order(c, "require", 2)) return;
                  Step s;
                  s.kind = Step::Kind::kRequire;
                  s.require = &c;
                  s.pos = c.id_first;
                  s.end = c.id_last;
                  r.steps.push_back(std::move(s));
                },
                [&](const ast::JoinClause& c) {
                  if (!order(c, "join", 2)) return;
                  if (trend_or_peer) {
                    m.error(f, c.id_first, c.id_first + 4, "E0602", "`join` must come before `trend`/`peer`");
                    r.broken = true;
                    return;
                  }
                  Step s;
                  s.kind = Step::Kind::kJoin;
                  s.join = &c;
                  s.pos = c.id_first;
                  s.end = c.id_last;
                  r.steps.push_back(std::move(s));
                },
                [&](const ast::TrendClause& c) {
                  if (!order(c, "trend", 2)) return;
                  if (trend_or_peer) {
                    m.error(f, c.id_first, c.id_first + 5, "E0605", "a rule has at most one `trend` or `peer`");
                    return;
                  }
                  trend_or_peer = &c;
                  Step s;
                  s.kind = Step::Kind::kTrend;
                  s.trend = &c;
                  s.pos = c.id_first;
                  s.end = c.id_last;
                  r.steps.push_back(std::move(s));
                  stage = 3;
                },
                [&](const ast::PeerClause& c) {
                  if (!order(c, "peer", 2)) return;
                  if (trend_or_peer) {
                    m.error(f, c.id_first, c.id_first + 4, "E0605", "a rule has at most one `trend` or `peer`");
                    return;
                  }
                  trend_or_peer = &c;
                  Step s;
                  s.kind = Step::Kind::kPeer;
                  s.peer = &c;
                  s.pos = c.id_first;
                  s.end = c.id_last;
                  r.steps.push_back(std::move(s));
                  stage = 3;
                },
                [&](const ast::SeverityClause& c) {
                  if (once(r.severity, c, "severity")) r.severity = &c;
                },
                [&](const ast::CategoryClause& c) {
                  if (once(r.category_clause, c, "category")) r.category_clause = &c;
                },
                [&](const ast::TextClause& c) {
                  const std::string& k = c.kind.name;
                  if (once(r.texts.count(k) ? &c : nullptr, c, k.c_str())) r.texts[k] = &c;
                },
                [&](const ast::FixClause& c) {
                  if (once(r.fix_clause, c, "fix")) r.fix_clause = &c;
                },
                [&](const ast::EvidenceClause& c) {
                  if (once(r.evidence_clause, c, "evidence")) r.evidence_clause = &c;
                },
                [&](const ast::TestClause& c) { r.tests.push_back(&c); },
            },
            clause.get());
      }
      const auto& head = rule->head.name;
      auto missing = [&](const char* what, const char* hint) {
        m.error_at(f, head, "E0601", "rule `" + r.name + "` has no `" + what + "` clause", hint);
        r.broken = true;
      };
      if (!r.name.empty() && !rule->syntax_error) {
        if (!r.from) missing("from", "start the rule with `from SOURCE [where ...]`");
        if (!r.window) missing("window", "add e.g. `window tumbling 10s by pid, op`");
        if (!r.category_clause) missing("category", "add e.g. `category cpu_contention`");
        if (!r.texts.count("summary")) missing("summary", "add `summary \"...\"` (a template with {slots})");
      }
      m.rules.push_back(std::move(r));
    }
  }
}

}  // namespace ingero::dsl
