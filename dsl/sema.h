// Internal state of the rule compiler shared by the checks (dsl/checks/*.cpp) and the lowering
// (dsl/lowering.cpp). Not a public header: it includes the AST (X3 support headers).
//
// The passes run in the order of check_passes() (checks/passes.cpp); each reads what earlier
// passes filled in and adds its own results here. A pass never stops at the first problem: it
// reports, marks the rule `broken` where later passes could not make sense of it, and goes on.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dsl/ast.h"
#include "dsl/compiler.h"
#include "model/ops.h"
#include "model/plan.h"

namespace ingero::dsl {

// Types of expression values. Units are types: a duration never compares with a bare number.
enum class Ty : uint8_t {
  kUnknown,  // after an error (never reported twice)
  kNumber,   // a unitless literal or arg0/arg1: compatible with ratio, count, rate, id
  kDuration,
  kBytes,
  kRatio,
  kCount,
  kRate,
  kBool,
  kId,  // pid, tid, node, rank, gpu_id, ...
  kOp,
  kSource,
  kState,
  kString,
  kList,
};
const char* ty_name(Ty t);
Unit ty_unit(Ty t);

struct FileUnit;

// A resolved expression: the engine's ExprOp plus a type and a source span.
struct TExpr {
  ExprOp op = ExprOp::kConst;
  double value = 0;
  Unit unit = Unit::kNone;  // constants: how the literal was written
  Field field = Field::kTs;
  std::string name;                             // kRef; string literals: their text
  std::vector<std::pair<Source, uint8_t>> ops;  // op constants (ty kOp)
  std::vector<TExpr> args;                      // operands; kIn: args[0] in args[1..]
  std::vector<std::string> patterns;            // kStackMatch/kSiteMatch; empty: the bare
                                                // `stack`/`site` before `~` is applied
  Ty ty = Ty::kUnknown;
  bool literal = false;   // written as a number literal
  bool from_not = false;  // a `not x` operand (precedence check)
  const FileUnit* file = nullptr;
  int pos = 0, end = 0;
};

struct FileUnit {
  SourceText src;
  ast::File ast;
  bool imported_only = false;  // reached through `import` only
  std::vector<FileUnit*> imports;
  std::map<std::string, const ast::Param*> params;
  std::map<std::string, const ast::ListDecl*> lists;
  std::map<std::string, const ast::Def*> defs;
  std::map<std::string, TExpr> param_values;  // resolved params (after overrides)
};

struct StreamSpec {
  const ast::Stream* node = nullptr;
  bool offcpu = false;
  bool account = false;  // `from accounting`: slices of feeding threads' time (AccountNode)
  bool steps = false;    // `from steps`: one event per step of each process (StepNode)
  std::vector<Source> sources;
  OffCpuNode offcpu_node;
  std::optional<TExpr> where;
};

struct Step {
  enum class Kind { kLet, kRequire, kJoin, kTrend, kPeer } kind = Kind::kLet;
  int pos = 0, end = 0;
  const ast::LetClause* let = nullptr;
  std::vector<std::pair<std::string, TExpr>> lets;
  const ast::RequireClause* require = nullptr;
  TExpr pred;
  std::string label;
  const ast::JoinClause* join = nullptr;
  JoinNode join_node;
  StreamSpec right;
  TExpr tail;
  const ast::TrendClause* trend = nullptr;
  TrendNode trend_node;
  const ast::PeerClause* peer = nullptr;
  PeerNode peer_node;
};

struct SevCase {
  Severity level = Severity::kMedium;
  std::optional<TExpr> when;
};

struct RuleSema {
  FileUnit* file = nullptr;
  const ast::Rule* rule = nullptr;
  std::string name, title, hash;
  bool broken = false;
  const ast::FromClause* from = nullptr;
  const ast::WindowClause* window = nullptr;
  StreamSpec stream;
  WindowNode window_node;
  std::vector<AggSpec> aggs;
  std::vector<Step> steps;
  std::map<std::string, Ty> slot_types;  // filled by the units pass, in order
  std::vector<std::string> slot_order;
  const ast::SeverityClause* severity = nullptr;
  std::vector<SevCase> sev_cases;
  std::string category;
  std::map<std::string, const ast::TextClause*> texts;
  std::string summary, root_cause, explanation;
  std::vector<std::string> fix, evidence;
  const ast::FixClause* fix_clause = nullptr;
  const ast::EvidenceClause* evidence_clause = nullptr;
  const ast::CategoryClause* category_clause = nullptr;
  std::vector<std::pair<std::string, TExpr>> template_lets;
  std::vector<const ast::TestClause*> tests;
};

struct Module {
  CompileOptions opts;
  std::vector<std::unique_ptr<FileUnit>> files;
  std::vector<RuleSema> rules;
  std::vector<Diagnostic> diags;
  std::vector<RuleTest> tests;

  void error(const FileUnit& f, int pos, int end, const char* code, std::string msg, std::string hint = {});
  void warning(const FileUnit& f, int pos, int end, const char* code, std::string msg, std::string hint = {});
  // msg and hint are moved into error(); clang-tidy 14 does not see a move into a call whose
  // arguments depend on the template parameter, hence the NOLINT.
  template <class Node>
  // NOLINTNEXTLINE(performance-unnecessary-value-param): moved into error(), see above
  void error_at(const FileUnit& f, const Node& n, const char* code, std::string msg, std::string hint = {}) {
    error(f, n.id_first, n.id_last, code, std::move(msg), std::move(hint));
  }
  bool too_many() const { return diags.size() >= 200; }
};

// Names known to the language.
bool parse_unit_suffix(const std::string& suffix, double& scale, Ty& ty, Unit& unit);
const std::vector<std::string>& unit_suffixes();
bool find_state(const std::string& name, OffCpuState& out);
const std::vector<std::string>& state_names();
// Event fields of the language: the engine's plus `bytes` (= arg0, in bytes) and `state`.
bool find_event_field(const std::string& name, Field& f, Ty& ty);
std::vector<std::string> event_field_names();
bool parse_severity(const std::string& name, Severity& out);
std::string text_of(const FileUnit& f, int pos, int end);  // source slice, whitespace collapsed

// Scope lookups: the file itself, then its imports (depth first). `where` gets the defining file.
const TExpr* find_param(const FileUnit& f, const std::string& name);
const ast::ListDecl* find_list(const FileUnit& f, const std::string& name, const FileUnit** where);
const ast::Def* find_def(const FileUnit& f, const std::string& name, const FileUnit** where);
std::vector<std::string> scope_names(const FileUnit& f);

// Resolution of expressions (checks/names.cpp), used by several passes.
enum class Ctx { kEvent, kRow, kTail, kConst };
struct Resolver {
  Module& m;
  FileUnit& file;
  RuleSema* rule = nullptr;
  Ctx ctx = Ctx::kConst;
  const std::set<std::string>* slots = nullptr;  // slots defined so far (row/tail)
  std::set<std::string> active_defs;
  int budget = 4096;      // nodes left (defs inline)
  std::string agg_alias;  // name for an aggregate that is a let's whole value
  TExpr resolve(const ast::Expr& e);
  TExpr resolve_atom(const ast::Atom& a, Ty want);

 private:
  TExpr primary(const ast::Primary& p);
  TExpr unary(const ast::Unary& u);
  TExpr call(const ast::Call& c);
  TExpr bucket_call(const ast::Call& c);
  bool per_window(const ast::Call& c);
  TExpr aggregate_ref(const ast::Call& c, TExpr t, AggSpec spec, const std::string& hidden, bool by_field);
  TExpr name(const ast::Path& p);
  TExpr number(const ast::Number& n);
  TExpr list(const ast::List& l);
  TExpr bad(int pos, int end);
};

// Passes, in order (checks/passes.cpp).
using Pass = void (*)(Module&);
struct PassEntry {
  const char* name;
  Pass run;
};
const std::vector<PassEntry>& check_passes();
void pass_imports(Module&);
void pass_symbols(Module&);
void pass_structure(Module&);
void pass_names(Module&);
void pass_units(Module&);
void pass_zero_division(Module&);
void pass_bounds(Module&);
void pass_output(Module&);
void pass_tests(Module&);

// Types one more row expression of `r` after the units pass (template placeholders).
Ty type_row_expr(Module& m, RuleSema& r, TExpr& e);

// Lowering (lowering.cpp).
Plan lower_rule(const RuleSema& r);
// Appends the rule to `plan`, sharing stream nodes recorded in `streams`.
void lower_rule_into(const RuleSema& r, Plan& plan, std::map<std::string, int>& streams);
ExprPtr lower_expr(const TExpr& e, const RuleSema& r, bool event_ctx);

// Walks every expression of a rule (for passes that inspect them all).
void for_each_expr(RuleSema& r, const std::function<void(TExpr&, Ctx)>& fn);

}  // namespace ingero::dsl
