// Expressions in plans: predicates over events (filters) and over window rows (lets, requires,
// severities). The rule DSL lowers its expressions to this tree; the default plans build it with
// the helpers at the bottom.
//
// Semantics (never throw):
// - Values are doubles carrying a Unit. Times are nanoseconds, sizes bytes, ratios plain numbers
//   (50% is stored as 0.5 with Unit::kPercent for printing).
// - Division by zero, and anything computed from a missing value, yields NaN; every comparison
//   with NaN is false, so a rule whose ratio has a zero denominator simply does not fire.
//   The DSL's checker warns where a denominator may be zero.
// - `and`/`or` short-circuit; booleans are 1.0/0.0.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/event.h"

namespace ingero {

enum class Unit : uint8_t { kNone, kNs, kBytes, kRatio, kPercent, kCount, kPerSecond, kBool };

// Fields of an Event an expression may read.
enum class Field : uint8_t {
  kTs, kDuration, kEnd, kPid, kTid, kSource, kOp, kRet, kArg0, kArg1, kStackId, kCgroupId,
  kNode, kRank, kPrevState, kGpuId,
};
const char* field_name(Field f);          // "duration"
bool parse_field(const std::string& name, Field& out);
double read_field(const Event& e, Field f);
Unit field_unit(Field f);

enum class ExprOp : uint8_t {
  kConst,     // value
  kField,     // event field (filters only)
  kRef,       // a named row slot (lets, aggregates, key fields, join outputs)
  kNeg, kNot,
  kAdd, kSub, kMul, kDiv,
  kLt, kLe, kGt, kGe, kEq, kNe,
  kAnd, kOr,
  kIn,        // field/ref value in `set`
  kMin, kMax, kAbs,
};

struct Expr {
  ExprOp op = ExprOp::kConst;
  double value = 0;                  // kConst
  Unit unit = Unit::kNone;           // kConst (and the inferred unit of the result, if known)
  Field field = Field::kTs;          // kField
  std::string name;                  // kRef: the slot's name; resolved to `slot` by the engine
  int slot = -1;
  std::vector<double> set;           // kIn
  std::vector<std::shared_ptr<const Expr>> args;

  // Canonical text, stable across runs: used by plan dumps and golden tests.
  std::string to_string() const;
};
using ExprPtr = std::shared_ptr<const Expr>;

// Evaluation. `ev` serves kField, `row` serves kRef (slots resolved by the engine); either may be
// null when the expression cannot reference it (a field with no event reads NaN).
double eval(const Expr& e, const Event* ev, const double* row);
inline double eval(const Expr& e, const Event& ev) { return eval(e, &ev, nullptr); }
inline double eval(const Expr& e, const double* row) { return eval(e, nullptr, row); }
inline bool truthy(double v) { return v == v && v != 0.0; }  // NaN is false

// Builders (for default plans and tests).
namespace ex {
ExprPtr num(double v, Unit u = Unit::kNone);
ExprPtr ns(double v);                 // a duration in ns
ExprPtr field(Field f);
ExprPtr ref(std::string name);
ExprPtr bin(ExprOp op, ExprPtr a, ExprPtr b);
ExprPtr un(ExprOp op, ExprPtr a);
ExprPtr in(ExprPtr a, std::vector<double> set);
inline ExprPtr gt(ExprPtr a, ExprPtr b) { return bin(ExprOp::kGt, std::move(a), std::move(b)); }
inline ExprPtr ge(ExprPtr a, ExprPtr b) { return bin(ExprOp::kGe, std::move(a), std::move(b)); }
inline ExprPtr lt(ExprPtr a, ExprPtr b) { return bin(ExprOp::kLt, std::move(a), std::move(b)); }
inline ExprPtr eq(ExprPtr a, ExprPtr b) { return bin(ExprOp::kEq, std::move(a), std::move(b)); }
inline ExprPtr land(ExprPtr a, ExprPtr b) { return bin(ExprOp::kAnd, std::move(a), std::move(b)); }
inline ExprPtr lor(ExprPtr a, ExprPtr b) { return bin(ExprOp::kOr, std::move(a), std::move(b)); }
inline ExprPtr div(ExprPtr a, ExprPtr b) { return bin(ExprOp::kDiv, std::move(a), std::move(b)); }
inline ExprPtr mul(ExprPtr a, ExprPtr b) { return bin(ExprOp::kMul, std::move(a), std::move(b)); }
}  // namespace ex

}  // namespace ingero
