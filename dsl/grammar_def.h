// Definitions of the rule language grammar declared in grammar.h (EBNF there).
// Included only by grammar.cpp: everything here is template code that X3 instantiates once.
//
// Conventions:
// - `>` (expectation) after a token that commits to a construct, so a syntax error points at the
//   first token that cannot continue it; the parse driver (parser.cpp) catches the exception.
// - Rule names are phrased for messages ("expected an expression").
// - Single-member AST structs are filled with `assign_to` actions; multi-member ones by fusion.
#pragma once

#include <type_traits>
#include <utility>

#include "dsl/ast.h"
#include "dsl/ast_adapted.h"
#include "dsl/config.h"
#include "dsl/grammar.h"

namespace ingero::dsl::parser {
namespace x3 = boost::spirit::x3;

// Records [first, last) as byte offsets into the parsed text (see ast.h).
struct annotate {
  template <class Iterator, class T, class Context>
  void on_success(const Iterator& first, const Iterator& last, T& node, const Context&) {
    if constexpr (std::is_base_of_v<x3::position_tagged, T>) {
      node.id_first = static_cast<int>(first - g_parse_begin);
      node.id_last = static_cast<int>(last - g_parse_begin);
    }
  }
};

template <auto Member>
struct assign_to {
  template <class Context>
  void operator()(Context& ctx) const {
    (x3::_val(ctx).*Member) = std::move(x3::_attr(ctx));
  }
};

struct kw_class;
// A keyword: the word not followed by an identifier character. Named "`word`" for messages.
#define IP_KW(word) (x3::rule<kw_class>{"`" word "`"} = x3::lexeme[x3::lit(word) >> !(ascii_alnum | x3::lit('_'))])
#define IP_TOKEN(text, name) (x3::rule<kw_class>{name} = x3::lit(text))

struct UrealNoNanInf : x3::ureal_policies<double> {
  template <class Iterator, class Attribute>
  static bool parse_nan(Iterator&, const Iterator&, Attribute&) {
    return false;
  }
  template <class Iterator, class Attribute>
  static bool parse_inf(Iterator&, const Iterator&, Attribute&) {
    return false;
  }
};
inline const x3::real_parser<double, UrealNoNanInf> real{};

struct BinOpSymbols : x3::symbols<ast::BinOp> {
  BinOpSymbols() {
    add("+", ast::BinOp::kAdd)("-", ast::BinOp::kSub)("*", ast::BinOp::kMul)("/", ast::BinOp::kDiv)(
        "<", ast::BinOp::kLt)("<=", ast::BinOp::kLe)(">", ast::BinOp::kGt)(">=", ast::BinOp::kGe)(
        "==", ast::BinOp::kEq)("!=", ast::BinOp::kNe)("~", ast::BinOp::kMatch);
  }
};
inline const BinOpSymbols bin_symbols;

struct EscapeSymbols : x3::symbols<char> {
  EscapeSymbols() { add("\\\"", '"')("\\\\", '\\')("\\n", '\n')("\\t", '\t'); }
};
inline const EscapeSymbols escapes;

// ---- rule objects ------------------------------------------------------------------------
struct ident_str_class;
struct ident_class : annotate {};
struct number_class : annotate {};
struct string_body_class;
struct string_class : annotate {};
struct atom_class;
struct atom_list_class;
struct list_class : annotate {};
struct args_class;
struct call_class : annotate {};
struct path_class : annotate {};
struct primary_class;
struct unop_class;
struct unary_class : annotate {};
struct binop_class;
struct operation_class;
struct expr_class : annotate {};
struct stream_class : annotate {};
struct option_key_class : annotate {};
struct option_class : annotate {};
struct from_clause_class : annotate {};
struct window_clause_class : annotate {};
struct binding_class : annotate {};
struct let_clause_class : annotate {};
struct require_clause_class : annotate {};
struct join_clause_class : annotate {};
struct trend_clause_class : annotate {};
struct peer_clause_class : annotate {};
struct sev_case_class : annotate {};
struct severity_clause_class : annotate {};
struct category_clause_class : annotate {};
struct text_kind_class : annotate {};
struct text_clause_class : annotate {};
struct string_list_class;
struct ident_list_class;
struct fix_clause_class : annotate {};
struct evidence_clause_class : annotate {};
struct fixture_attr_class : annotate {};
struct fixture_event_class : annotate {};
struct expect_class : annotate {};
struct test_clause_class : annotate {};
struct clause_class;
struct import_class : annotate {};
struct param_class : annotate {};
struct list_decl_class : annotate {};
struct def_class : annotate {};
struct top_item_class;
struct rule_head_class : annotate {};

const x3::rule<ident_str_class, std::string> ident_str = "a name";
const x3::rule<ident_class, ast::Ident> ident = "a name";
const x3::rule<number_class, ast::Number> number = "a number";
const x3::rule<string_body_class, std::string> string_body = "a string";
const x3::rule<string_class, ast::String> string_lit = "a string";
const x3::rule<atom_class, ast::Atom> atom = "a value";
const x3::rule<atom_list_class, std::vector<ast::Atom>> atom_list = "a list of values";
const x3::rule<list_class, ast::List> list = "a list";
const x3::rule<args_class, std::vector<ast::Expr>> args = "arguments";
const x3::rule<call_class, ast::Call> call = "a function call";
const x3::rule<path_class, ast::Path> path = "a name";
const x3::rule<primary_class, ast::Primary> primary = "an operand";
const x3::rule<unop_class, ast::UnOp> unop = "an operator";
const x3::rule<unary_class, ast::Unary> unary = "an operand";
const x3::rule<binop_class, ast::BinOp> binop = "an operator";
const x3::rule<operation_class, ast::Operation> operation = "an operator";
const expr_type expr = "an expression";
const x3::rule<stream_class, ast::Stream> stream = "an event source";
const x3::rule<option_key_class, ast::Ident> option_key = "an option";
const x3::rule<option_class, ast::Option> option = "an option";
const x3::rule<from_clause_class, ast::FromClause> from_clause = "a `from` clause";
const x3::rule<window_clause_class, ast::WindowClause> window_clause = "a `window` clause";
const x3::rule<binding_class, ast::Binding> binding = "a binding `name = expression`";
const x3::rule<let_clause_class, ast::LetClause> let_clause = "a `let` clause";
const x3::rule<require_clause_class, ast::RequireClause> require_clause = "a `require` clause";
const x3::rule<join_clause_class, ast::JoinClause> join_clause = "a `join` clause";
const x3::rule<trend_clause_class, ast::TrendClause> trend_clause = "a `trend` clause";
const x3::rule<peer_clause_class, ast::PeerClause> peer_clause = "a `peer` clause";
const x3::rule<sev_case_class, ast::SeverityCase> sev_case = "a severity level";
const x3::rule<severity_clause_class, ast::SeverityClause> severity_clause = "a `severity` clause";
const x3::rule<category_clause_class, ast::CategoryClause> category_clause = "a `category` clause";
const x3::rule<text_kind_class, ast::Ident> text_kind = "`summary`, `root_cause` or `explanation`";
const x3::rule<text_clause_class, ast::TextClause> text_clause = "a text clause";
const x3::rule<string_list_class, std::vector<ast::String>> string_list = "a list of strings";
const x3::rule<ident_list_class, std::vector<ast::Ident>> ident_list = "a list of names";
const x3::rule<fix_clause_class, ast::FixClause> fix_clause = "a `fix` clause";
const x3::rule<evidence_clause_class, ast::EvidenceClause> evidence_clause = "an `evidence` clause";
const x3::rule<fixture_attr_class, ast::FixtureAttr> fixture_attr = "an event attribute";
const x3::rule<fixture_event_class, ast::FixtureEvent> fixture_event = "a fixture event";
const x3::rule<expect_class, ast::Expect> expect_ = "`expect match` or `expect no match`";
const x3::rule<test_clause_class, ast::TestClause> test_clause = "a `test` clause";
const clause_type clause = "a clause";
const x3::rule<import_class, ast::Import> import_ = "an import";
const x3::rule<param_class, ast::Param> param = "a param";
const x3::rule<list_decl_class, ast::ListDecl> list_decl = "a list";
const x3::rule<def_class, ast::Def> def = "a def";
const top_item_type top_item = "a top-level item";
const rule_head_type rule_head = "a rule";

// Rules whose definition ends in a semantic action get their position from a wrapper rule:
// X3 calls on_success with no attribute for a rule whose right-hand side has an action.
struct ident_raw_class;
const x3::rule<ident_raw_class, ast::Ident> ident_raw = "ident";
struct string_lit_raw_class;
const x3::rule<string_lit_raw_class, ast::String> string_lit_raw = "string_lit";
struct list_raw_class;
const x3::rule<list_raw_class, ast::List> list_raw = "list";
struct from_clause_raw_class;
const x3::rule<from_clause_raw_class, ast::FromClause> from_clause_raw = "from_clause";
struct let_clause_raw_class;
const x3::rule<let_clause_raw_class, ast::LetClause> let_clause_raw = "let_clause";
struct require_clause_raw_class;
const x3::rule<require_clause_raw_class, ast::RequireClause> require_clause_raw = "require_clause";
struct severity_clause_raw_class;
const x3::rule<severity_clause_raw_class, ast::SeverityClause> severity_clause_raw = "severity_clause";
struct category_clause_raw_class;
const x3::rule<category_clause_raw_class, ast::CategoryClause> category_clause_raw = "category_clause";
struct fix_clause_raw_class;
const x3::rule<fix_clause_raw_class, ast::FixClause> fix_clause_raw = "fix_clause";
struct evidence_clause_raw_class;
const x3::rule<evidence_clause_raw_class, ast::EvidenceClause> evidence_clause_raw = "evidence_clause";
struct import_raw_class;
const x3::rule<import_raw_class, ast::Import> import_raw = "import_";

// ---- definitions -------------------------------------------------------------------------
inline const auto identchar = ascii_alnum | x3::lit('_');

const auto ident_str_def = x3::lexeme[(ascii_alpha | x3::char_('_')) >> *(ascii_alnum | x3::char_('_'))];
const auto ident_raw_def = ident_str[assign_to<&ast::Ident::name>{}];
const auto number_def = x3::lexeme[real >> x3::raw[x3::lit('%') | *(ascii_alnum | x3::lit('_'))]];
const auto string_body_def = x3::lexeme['"' > *(escapes | ~x3::char_("\"\\\n\r")) >
                                        IP_TOKEN("\"", "`\"` to close the string")];
const auto string_lit_raw_def = string_body[assign_to<&ast::String::value>{}];
const auto atom_def = number | string_lit | ident;
const auto atom_list_def = -(atom % ',');
const auto list_raw_def = (x3::lit('[') > atom_list > IP_TOKEN("]", "`]`"))[assign_to<&ast::List::items>{}];

const auto args_def = -(expr % ',');
const auto call_def = (ident >> '(') > args > IP_TOKEN(")", "`)`");
// Clause and top-level keywords are not names in expressions (`window.start` still is), so an
// expression cut short by a new line reports the missing operand instead of eating the clause.
const auto reserved = IP_KW("from") | IP_KW("window") | IP_KW("let") | IP_KW("require") | IP_KW("join") |
                      IP_KW("trend") | IP_KW("peer") | IP_KW("severity") | IP_KW("category") | IP_KW("summary") |
                      IP_KW("root_cause") | IP_KW("explanation") | IP_KW("fix") | IP_KW("evidence") | IP_KW("test") |
                      IP_KW("end") | IP_KW("rule") | IP_KW("param") | IP_KW("def") | IP_KW("import");
const auto path_def = !(reserved >> !x3::lit('.')) >> ident >> -('.' >> ident);
const auto primary_def = number | string_lit | list | call | path | (x3::lit('(') > expr > IP_TOKEN(")", "`)`"));
const auto unop_def = (x3::lit('-') >> x3::attr(ast::UnOp::kNeg)) | (IP_KW("not") >> x3::attr(ast::UnOp::kNot));
const auto unary_def = *unop >> primary;
const auto binop_def = bin_symbols | (IP_KW("and") >> x3::attr(ast::BinOp::kAnd)) |
                       (IP_KW("or") >> x3::attr(ast::BinOp::kOr)) |
                       (IP_KW("not") >> IP_KW("in") >> x3::attr(ast::BinOp::kNotIn)) |
                       (IP_KW("in") >> x3::attr(ast::BinOp::kIn));
const auto operation_def = binop > unary;
const auto expr_def = unary >> *operation;

const auto stream_def = (ident % ',') >> -(IP_KW("states") > list) >> -(IP_KW("min") > number) >>
                        -(IP_KW("where") > expr);
const auto option_key_def = &(IP_KW("horizon") | IP_KW("exemplars") | IP_KW("z") | IP_KW("floor") |
                              IP_KW("min_peers")) >>
                            ident;
const auto option_def = option_key > number;

const auto from_clause_raw_def = (IP_KW("from") > stream)[assign_to<&ast::FromClause::stream>{}];
const auto window_clause_def = IP_KW("window") > ident > -number > -(IP_KW("every") > number) >
                               -(IP_KW("by") > (ident % ','));
const auto binding_def = ident > IP_TOKEN("=", "`=`") > expr;
const auto let_clause_raw_def = (IP_KW("let") > (binding % ','))[assign_to<&ast::LetClause::bindings>{}];
const auto require_clause_raw_def = (IP_KW("require") > expr)[assign_to<&ast::RequireClause::pred>{}];
const auto join_clause_def = IP_KW("join") > ident > IP_TOKEN("=", "`=`") > stream > IP_KW("on") > ident > ident >
                             -number > IP_KW("tail") > expr > *option;
const auto trend_clause_def = IP_KW("trend") > ident > ident > -number > -(IP_KW("of") > IP_KW("peak")) >
                              IP_KW("over") > number > IP_KW("windows");
const auto peer_clause_def = IP_KW("peer") > ident > IP_KW("across") > ident > *option;
const auto sev_case_def = ident >> -(IP_KW("when") > expr);
const auto severity_clause_raw_def = (IP_KW("severity") > (sev_case % ','))[assign_to<&ast::SeverityClause::cases>{}];
const auto category_clause_raw_def = (IP_KW("category") > ident)[assign_to<&ast::CategoryClause::value>{}];
const auto text_kind_def = &(IP_KW("summary") | IP_KW("root_cause") | IP_KW("explanation")) >> ident;
const auto text_clause_def = text_kind > string_lit;
const auto string_list_def = -(string_lit % ',');
const auto ident_list_def = -(ident % ',');
const auto fix_clause_raw_def = (IP_KW("fix") > IP_TOKEN("[", "`[`") > string_list >
                                 IP_TOKEN("]", "`]`"))[assign_to<&ast::FixClause::items>{}];
const auto evidence_clause_raw_def = (IP_KW("evidence") > IP_TOKEN("[", "`[`") > ident_list >
                                      IP_TOKEN("]", "`]`"))[assign_to<&ast::EvidenceClause::names>{}];
const auto fixture_attr_def = !IP_KW("event") >> !IP_KW("expect") >> ident >> atom;
const auto fixture_event_def = IP_KW("event") > ident > *fixture_attr;
const auto expect__def = IP_KW("expect") > x3::matches[IP_KW("no")] > ident > *fixture_attr;
const auto test_clause_def = IP_KW("test") > string_lit > IP_TOKEN("{", "`{`") > *fixture_event > expect_ >
                             IP_TOKEN("}", "`}`");
const auto clause_def = from_clause | window_clause | let_clause | require_clause | join_clause | trend_clause |
                        peer_clause | severity_clause | category_clause | text_clause | fix_clause | evidence_clause |
                        test_clause;

const auto import_raw_def = (IP_KW("import") > string_lit)[assign_to<&ast::Import::path>{}];
const auto param_def = IP_KW("param") > ident > IP_TOKEN("=", "`=`") > expr;
const auto list_decl_def = IP_KW("list") > ident > IP_TOKEN("=", "`=`") > list;
const auto def_def = IP_KW("def") > ident > IP_TOKEN("=", "`=`") > expr;
const auto top_item_def = import_ | param | list_decl | def;
const auto rule_head_def = IP_KW("rule") > ident > -string_lit;

const auto ident_def = ident_raw;
const auto string_lit_def = string_lit_raw;
const auto list_def = list_raw;
const auto from_clause_def = from_clause_raw;
const auto let_clause_def = let_clause_raw;
const auto require_clause_def = require_clause_raw;
const auto severity_clause_def = severity_clause_raw;
const auto category_clause_def = category_clause_raw;
const auto fix_clause_def = fix_clause_raw;
const auto evidence_clause_def = evidence_clause_raw;
const auto import__def = import_raw;

BOOST_SPIRIT_DEFINE(ident_raw, string_lit_raw, list_raw, from_clause_raw, let_clause_raw, require_clause_raw,
                    severity_clause_raw, category_clause_raw, fix_clause_raw, evidence_clause_raw, import_raw)
BOOST_SPIRIT_DEFINE(ident_str, ident, number, string_body, string_lit, atom, atom_list, list, args, call, path, primary,
                    unop, unary, binop, operation, expr, stream, option_key, option, from_clause, window_clause,
                    binding, let_clause, require_clause, join_clause, trend_clause, peer_clause, sev_case,
                    severity_clause, category_clause, text_kind, text_clause, string_list, ident_list, fix_clause,
                    evidence_clause, fixture_attr, fixture_event, expect_, test_clause, clause, import_, param,
                    list_decl, def, top_item, rule_head)

#undef IP_KW
#undef IP_TOKEN

}  // namespace ingero::dsl::parser

namespace ingero::dsl {
parser::top_item_type const& top_item_rule() { return parser::top_item; }
parser::rule_head_type const& rule_head_rule() { return parser::rule_head; }
parser::clause_type const& clause_rule() { return parser::clause; }
parser::expr_type const& expr_rule() { return parser::expr; }
}  // namespace ingero::dsl
