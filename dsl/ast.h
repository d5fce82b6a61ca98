// The rule language's syntax tree, as produced by the X3 grammar (dsl/grammar.h).
//
// Contract:
// - Every node that a diagnostic may point at derives from x3::position_tagged; the grammar's
//   on_success handler stores the node's byte offsets into the source text in id_first/id_last
//   (half-open [id_first, id_last)). Offsets, not iterators: the tree outlives the parse buffer
//   handling and line:col is computed only when a diagnostic is rendered (dsl/diagnostics.h).
// - Expressions are kept flat (`first op operand op operand ...`): operator precedence is applied
//   after parsing by dsl/expr_build.cpp with an explicit stack, so a deeply chained expression
//   never recurses in the parser or in the tree builder.
// - This header pulls in only X3's small AST support headers; no parser code.
#pragma once

#include <boost/optional.hpp>
#include <boost/spirit/home/x3/support/ast/position_tagged.hpp>
#include <boost/spirit/home/x3/support/ast/variant.hpp>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace ingero::dsl::ast {
namespace x3 = boost::spirit::x3;

struct Ident : x3::position_tagged {
  std::string name;
};

// A number with the unit suffix written right after it ("10ms", "50%", "3x", "1GiB", "7").
// The suffix is kept as text; the checker validates it, so a typo gets a did-you-mean.
struct Number : x3::position_tagged {
  double value = 0;
  std::string unit;
};

struct String : x3::position_tagged {
  std::string value;
};

// List items and fixture values.
struct Atom : x3::variant<Number, String, Ident> {
  using base_type::base_type;
  using base_type::operator=;
};

struct List : x3::position_tagged {
  std::vector<Atom> items;
};

struct Expr;

// f(args): aggregates (count(), quantile(duration, 0.99), p99(duration)) and scalar functions.
struct Call : x3::position_tagged {
  Ident fn;
  std::vector<Expr> args;
};

// A name, optionally with a member: `p99`, `off.share`, `window.start`.
struct Path : x3::position_tagged {
  Ident head;
  boost::optional<Ident> member;
};

struct Primary : x3::variant<Number, String, List, Call, Path, x3::forward_ast<Expr>> {
  using base_type::base_type;
  using base_type::operator=;
};

enum class UnOp : uint8_t { kNeg, kNot };
enum class BinOp : uint8_t {
  kOr,
  kAnd,
  kLt,
  kLe,
  kGt,
  kGe,
  kEq,
  kNe,
  kIn,
  kNotIn,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMatch,  // `stack ~ "glob"`, `site ~ ["glob", ...]`
};

struct Unary : x3::position_tagged {
  std::vector<UnOp> ops;
  Primary operand;
};

struct Operation {
  BinOp op = BinOp::kAdd;
  Unary operand;
};

struct Expr : x3::position_tagged {
  Unary first;
  std::vector<Operation> rest;
};

// ---- clauses of a rule ---------------------------------------------------------------------

// `cuda, driver [states [..]] [min 1ms] [where EXPR]` or `offcpu ...`
struct Stream : x3::position_tagged {
  std::vector<Ident> sources;
  boost::optional<List> states;
  boost::optional<Number> min;
  boost::optional<Expr> where;
};

struct Option : x3::position_tagged {
  Ident key;
  Number value;
};

struct FromClause : x3::position_tagged {
  Stream stream;
};

struct WindowClause : x3::position_tagged {
  Ident kind;  // tumbling | sliding | whole
  boost::optional<Number> size;
  boost::optional<Number> slide;  // `every`
  std::vector<Ident> keys;        // `by`
};

struct Binding : x3::position_tagged {
  Ident name;
  Expr value;
};

struct LetClause : x3::position_tagged {
  std::vector<Binding> bindings;
};

struct RequireClause : x3::position_tagged {
  Expr pred;
};

struct JoinClause : x3::position_tagged {
  Ident name;
  Stream stream;
  Ident key;   // tid | pid | host
  Ident mode;  // overlapping | within
  boost::optional<Number> within;
  Expr tail;
  std::vector<Option> options;  // horizon, exemplars
};

struct TrendClause : x3::position_tagged {
  Ident value;
  Ident mode;  // rising | below
  boost::optional<Number> factor;
  Number windows;
};

struct PeerClause : x3::position_tagged {
  Ident value;
  Ident group;
  std::vector<Option> options;  // z, floor, min_peers
};

struct SeverityCase : x3::position_tagged {
  Ident level;
  boost::optional<Expr> when;
};

struct SeverityClause : x3::position_tagged {
  std::vector<SeverityCase> cases;
};

struct CategoryClause : x3::position_tagged {
  Ident value;
};

struct TextClause : x3::position_tagged {
  Ident kind;  // summary | root_cause | explanation
  String text;
};

struct FixClause : x3::position_tagged {
  std::vector<String> items;
};

struct EvidenceClause : x3::position_tagged {
  std::vector<Ident> names;
};

struct FixtureAttr : x3::position_tagged {
  Ident key;
  Atom value;
};

struct FixtureEvent : x3::position_tagged {
  Ident op;
  std::vector<FixtureAttr> attrs;
};

struct Expect : x3::position_tagged {
  bool negated = false;            // `expect no match`
  Ident what;                      // match
  std::vector<FixtureAttr> attrs;  // severity high, chains 2
};

struct TestClause : x3::position_tagged {
  String name;
  std::vector<FixtureEvent> events;
  Expect expect;
};

struct Clause : x3::variant<FromClause, WindowClause, LetClause, RequireClause, JoinClause, TrendClause, PeerClause,
                            SeverityClause, CategoryClause, TextClause, FixClause, EvidenceClause, TestClause> {
  using base_type::base_type;
  using base_type::operator=;
};

// ---- top level -----------------------------------------------------------------------------

struct Import : x3::position_tagged {
  String path;
};

struct Param : x3::position_tagged {
  Ident name;
  Expr value;
};

struct ListDecl : x3::position_tagged {
  Ident name;
  List value;
};

struct Def : x3::position_tagged {
  Ident name;
  Expr value;
};

struct TopItem : x3::variant<Import, Param, ListDecl, Def> {
  using base_type::base_type;
  using base_type::operator=;
};

struct RuleHead : x3::position_tagged {
  Ident name;
  boost::optional<String> title;
};

// Assembled by the parse driver clause by clause (so one bad clause does not hide the others).
struct Rule : x3::position_tagged {
  RuleHead head;
  std::vector<Clause> clauses;
  bool syntax_error = false;  // a clause did not parse: later passes stay quiet about what it defined
};

using Item = std::variant<Import, Param, ListDecl, Def, Rule>;

struct File {
  std::vector<Item> items;
};

}  // namespace ingero::dsl::ast
