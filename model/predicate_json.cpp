#include "model/predicate_json.h"

#include <string>

namespace ingero {

namespace {

using nlohmann::json;

std::string text_of(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double number_of(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

json predicate_to_json(const PredicateResult& p) {
  return {{"label", p.label},   {"lhs", p.lhs},           {"rhs", p.rhs},          {"margin", p.margin},
          {"passed", p.passed}, {"lhs_text", p.lhs_text}, {"rhs_text", p.rhs_text}};
}

PredicateResult predicate_from_json(const json& j) {
  PredicateResult p;
  if (!j.is_object()) return p;
  p.label = text_of(j, "label");
  p.lhs = number_of(j, "lhs");
  p.rhs = number_of(j, "rhs");
  p.margin = number_of(j, "margin");
  const auto passed = j.find("passed");
  p.passed = passed != j.end() && passed->is_boolean() && passed->get<bool>();
  p.lhs_text = text_of(j, "lhs_text");
  p.rhs_text = text_of(j, "rhs_text");
  return p;
}

}  // namespace ingero
