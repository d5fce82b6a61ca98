// Fusion adaptation of the AST structs the grammar fills by attribute (multi-member structs).
// Single-member structs (Ident, String, List, RequireClause, ...) are filled by semantic actions
// in grammar_def.h instead, which sidesteps X3's single-element-sequence corner cases.
#pragma once

#include <boost/fusion/include/adapt_struct.hpp>

#include "dsl/ast.h"

BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Number, value, unit)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Call, fn, args)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Path, head, member)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Unary, ops, operand)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Operation, op, operand)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Expr, first, rest)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Stream, sources, states, min, where)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Option, key, value)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::WindowClause, kind, size, slide, keys)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Binding, name, value)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::JoinClause, name, stream, key, mode, within, tail, options)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::TrendClause, value, mode, factor, windows)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::PeerClause, value, group, options)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::SeverityCase, level, when)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::TextClause, kind, text)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::FixtureAttr, key, value)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::FixtureEvent, op, attrs)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Expect, negated, what, attrs)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::TestClause, name, events, expect)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Param, name, value)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::ListDecl, name, value)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::Def, name, value)
BOOST_FUSION_ADAPT_STRUCT(ingero::dsl::ast::RuleHead, name, title)
