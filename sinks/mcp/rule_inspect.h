// Rule introspection over the plan IR, for list_rules, explain_chain and why_not.
//
// Contract:
// - plan_rules(): one RuleView per Emit node of a plan (a rule = the path of nodes ending in it),
//   with its predicates (Require labels) and the canonical text of its nodes.
// - relaxed_rule_plan(): the sub-plan of one rule with every Require replaced by "true", so the
//   engine emits a row for every window/key that reaches the end of the rule; the original
//   predicates are returned beside it and judged with evaluate_predicate() against each row's
//   values (Chain::values). Trend and Peer stages are kept as they are: they filter by history,
//   not by a threshold, and the answer says so.
// - Pure functions over the IR; never throw.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/plan.h"
#include "model/result.h"

namespace ingero::mcp {

struct RuleView {
  std::string name, category, summary;
  std::vector<std::string> severity;    // "HIGH when <expr>", ..., "MEDIUM otherwise"
  std::vector<std::string> predicates;  // Require labels, in order
  std::vector<std::string> recommendations;
  std::vector<int> nodes;          // node ids of the rule's path, ascending
  std::string plan_text;           // canonical lines of those nodes
  bool has_history_stage = false;  // Trend or Peer: not relaxed by why_not
};

std::vector<RuleView> plan_rules(const Plan& plan);

struct RelaxedRule {
  Plan plan;
  std::vector<RequireNode> requires_;  // the original predicates, in path order
};

// False when `rule` is not in the plan.
bool relaxed_rule_plan(const Plan& plan, const std::string& rule, RelaxedRule& out);

// Evaluates a Require predicate against named row values. For a comparison it reports both
// sides and the margin (positive = passed by that much; for "<" and "<=" the sign is flipped so
// that positive always means "on the passing side"). `unknown` names a slot the row lacks.
PredicateResult evaluate_predicate(const RequireNode& req, const std::map<std::string, double>& values,
                                   std::string* unknown = nullptr);

}  // namespace ingero::mcp
