// The stored JSON form of a rule predicate (PredicateResult), one for every store that keeps
// results: LMDB chain records, SQLite's ip_chains.predicates and ip_rule_outcomes.miss.
// {label, lhs, rhs, margin, passed, lhs_text, rhs_text}. Reading is lenient, as stores are
// read from files that may be damaged or hostile: a missing or mistyped field reads as its
// default, and nothing throws.
#pragma once

#include <nlohmann/json.hpp>

#include "model/result.h"

namespace ingero {

nlohmann::json predicate_to_json(const PredicateResult& p);
PredicateResult predicate_from_json(const nlohmann::json& j);

}  // namespace ingero
