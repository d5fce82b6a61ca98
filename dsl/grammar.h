// The rule language grammar (Boost.Spirit X3), declared here and defined in grammar_def.h;
// grammar.cpp is the only file that instantiates it. dsl/parser.h drives these rules item by
// item and clause by clause so that one syntax error does not hide the next.
//
// EBNF (terminals quoted; `kw` = a word not followed by [A-Za-z0-9_]; `#` starts a comment):
//
//   file        = { top_item | rule } ;
//   top_item    = "import" string
//               | "param" ident "=" expr            (* a literal: number, string or list *)
//               | "list" ident "=" list
//               | "def" ident "=" expr ;           (* a reusable expression, inlined *)
//   rule        = rule_head { clause } "end" ;
//   rule_head   = "rule" ident [ string ] ;
//   clause      = "from" stream
//               | "window" ident [ number ] [ "every" number ] [ "by" ident { "," ident } ]
//               | "let" ident "=" expr { "," ident "=" expr }
//               | "require" expr
//               | "join" ident "=" stream "on" ident ident [ number ] "tail" expr { option }
//               | "trend" ident ident [ number ] [ "of" "peak" ] "over" number "windows"
//               | "peer" ident "across" ident { option }
//               | "severity" sev_case { "," sev_case }
//               | "category" ident
//               | ( "summary" | "root_cause" | "explanation" ) string
//               | "fix" "[" [ string { "," string } ] "]"
//               | "evidence" "[" [ ident { "," ident } ] "]"
//               | "test" string "{" { fixture } expect "}" ;
//   stream      = ident { "," ident } [ "states" list ] [ "min" number ] [ "where" expr ] ;
//   option      = ( "horizon" | "exemplars" | "z" | "floor" | "min_peers" ) number ;
//   sev_case    = ident [ "when" expr ] ;
//   fixture     = "event" ident { attr } ;
//   expect      = "expect" [ "no" ] ident { attr } ;
//   attr        = ident atom ;                      (* key not "event" / "expect" *)
//   expr        = unary { binop unary } ;           (* precedence applied after parsing *)
//   binop       = "or" | "and" | "<" | "<=" | ">" | ">=" | "==" | "!=" | "in" | "not" "in"
//               | "+" | "-" | "*" | "/"
//               | "~" ;                             (* `stack`/`site` ~ pattern(s), docs/rules.md *)
//   unary       = { "-" | "not" } primary ;
//   primary     = number | string | list | ident "(" [ expr { "," expr } ] ")"
//               | ident [ "." ident ] | "(" expr ")" ;
//   list        = "[" [ atom { "," atom } ] "]" ;
//   atom        = number | string | ident ;
//   number      = digits [ "." digits ] [ exponent ] unit_suffix ;   (* no space before unit *)
//   unit_suffix = "%" | { letter | digit | "_" } ;                   (* ns us ms s m h B KiB % x *)
//   string      = '"' { char | '\"' | '\\' | '\n' | '\t' } '"' ;   (* one line *)
//   ident       = ( letter | "_" ) { letter | digit | "_" } ;
#pragma once

#include <boost/spirit/home/x3.hpp>

#include "dsl/ast.h"

namespace ingero::dsl::parser {
namespace x3 = boost::spirit::x3;

struct top_item_class;
struct rule_head_class;
struct clause_class;
struct expr_class;

using top_item_type = x3::rule<top_item_class, ast::TopItem>;
using rule_head_type = x3::rule<rule_head_class, ast::RuleHead>;
using clause_type = x3::rule<clause_class, ast::Clause>;
using expr_type = x3::rule<expr_class, ast::Expr>;

BOOST_SPIRIT_DECLARE(top_item_type, rule_head_type, clause_type, expr_type)

}  // namespace ingero::dsl::parser

namespace ingero::dsl {
parser::top_item_type const& top_item_rule();
parser::rule_head_type const& rule_head_rule();
parser::clause_type const& clause_rule();
parser::expr_type const& expr_rule();
}  // namespace ingero::dsl
