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
// - Stack predicates (kStackMatch: some frame of the event's stack matches one of `patterns`;
//   kSiteMatch: its call site does; globs over frame_text() of model/stack.h) ask a
//   StackMatcher. Without one, or for an event without a known stack, they are false (0), never
//   NaN, so `not (site ~ "...")` holds for events without a stack.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/event.h"
#include "model/stack.h"

namespace ingero {

enum class Unit : uint8_t { kNone, kNs, kBytes, kRatio, kPercent, kCount, kPerSecond, kBool };

// Fields of an Event an expression may read.
enum class Field : uint8_t {
  kTs,
  kDuration,
  kEnd,
  kPid,
  kTid,
  kSource,
  kOp,
  kRet,
  kArg0,
  kArg1,
  kStackId,
  kCgroupId,
  kNode,
  kRank,
  kPrevState,
  kGpuId,
  kSite,  // the call site of the event's stack: a window key only (the engine interns it through
          // StackTable::site_index); read_field gives NaN
};
const char* field_name(Field f);  // "duration"
bool parse_field(const std::string& name, Field& out);
// The field as eval() reads it: a double (uint64 fields rounded above 2^53); NaN for kSite.
// Inline: the engine's route checks read one field per event (engine/route_check.h).
inline double read_field(const Event& e, Field f) {
  switch (f) {
    case Field::kTs: return static_cast<double>(e.ts_ns);
    case Field::kDuration: return static_cast<double>(e.dur_ns);
    case Field::kEnd: return static_cast<double>(e.end_ns());
    case Field::kPid: return e.pid;
    case Field::kTid: return e.tid;
    case Field::kSource: return static_cast<double>(e.source);
    case Field::kOp: return e.op;
    case Field::kRet: return e.ret;
    case Field::kArg0: return static_cast<double>(e.arg0);
    case Field::kArg1: return static_cast<double>(e.arg1);
    case Field::kStackId: return static_cast<double>(e.stack_id);
    case Field::kCgroupId: return static_cast<double>(e.cgroup_id);
    case Field::kNode: return e.node;
    case Field::kRank: return e.rank;
    case Field::kPrevState: return static_cast<double>(e.prev_state);
    case Field::kGpuId: return e.gpu_id;
    case Field::kSite: break;
  }
  return std::numeric_limits<double>::quiet_NaN();
}
Unit field_unit(Field f);

enum class ExprOp : uint8_t {
  kConst,  // value
  kField,  // event field (filters only)
  kRef,    // a named row slot (lets, aggregates, key fields, join outputs)
  kNeg,
  kNot,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kLt,
  kLe,
  kGt,
  kGe,
  kEq,
  kNe,
  kAnd,
  kOr,
  kIn,  // field/ref value in `set`
  kMin,
  kMax,
  kAbs,
  kStackMatch,  // any frame of the event's stack matches one of `patterns` (events only)
  kSiteMatch,   // the call site of the event's stack matches one of `patterns` (events only)
};

struct Expr {
  ExprOp op = ExprOp::kConst;
  double value = 0;          // kConst
  Unit unit = Unit::kNone;   // kConst (and the inferred unit of the result, if known)
  Field field = Field::kTs;  // kField
  std::string name;          // kRef: the slot's name; resolved to `slot` by the engine
  int slot = -1;
  std::vector<double> set;            // kIn
  std::vector<std::string> patterns;  // kStackMatch, kSiteMatch: globs (`*`, `?`), any may match
  std::vector<std::shared_ptr<const Expr>> args;

  // Canonical text, stable across runs: used by plan dumps and golden tests.
  std::string to_string() const;
  // Whether this tree holds a stack predicate (the engine then keeps a stack table).
  bool uses_stacks() const;
};
using ExprPtr = std::shared_ptr<const Expr>;

// Answers stack predicates for the evaluator. The engine gives each shard one (with a cache);
// tests may implement their own. Must not throw.
class StackMatcher {
 public:
  virtual ~StackMatcher() = default;
  // Whether `e` (a kStackMatch or kSiteMatch node) holds for the stack `stack_id` (never 0).
  virtual bool match(const Expr& e, uint64_t stack_id) const = 0;
};

// Glob match: `*` any run of characters (also empty), `?` one character, everything else
// literal and case-sensitive. Linear in |text| x |pattern| at worst, no recursion.
bool glob_match(std::string_view pattern, std::string_view text);
// The uncached answer for one parsed stack (what a StackMatcher computes).
bool stack_matches(const Expr& e, const ParsedStack& st);

// The stacks of a trace, shared by every shard: filled from TraceMeta::stacks by the engine
// before the run (replay) and as new ones appear (live). Thread-safe; ids are never removed.
class StackTable {
 public:
  // Adds (parsed) every stack of `stacks` this table lacks. Cheap when nothing is new.
  void sync(const std::map<uint64_t, StackTrace>& stacks);
  // Null when unknown.
  std::shared_ptr<const ParsedStack> find(uint64_t id) const;
  size_t size() const;

  // Windows keyed by call site: each distinct call-site text (frame_text(call_site())) gets an
  // index, 1.. in order of first use, shared by every shard. 0 = the event has no (known) stack;
  // kOtherSites = every site after the first 65,533 (never more state than that).
  static constexpr uint16_t kOtherSites = 0xffff;
  uint16_t site_index(uint64_t stack_id);
  // "train.py:42 in train_step"; "(no stack)" for 0, "(other sites)" for kOtherSites.
  std::string site_text(uint16_t index) const;
  // A value for the `site` row slot that does not depend on the order sites were first seen
  // (thread count, batch size): the FNV-64 of the text, cut to 53 bits so a double holds it.
  double site_value(uint16_t index) const;

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<const ParsedStack>> stacks_;
  std::unordered_map<std::string, uint16_t> site_ids_;
  std::vector<std::string> sites_{"(no stack)"};
};

// Evaluation. `ev` serves kField, `row` serves kRef (slots resolved by the engine); either may be
// null when the expression cannot reference it (a field with no event reads NaN). `stacks`
// serves kStackMatch/kSiteMatch (null: they are false).
double eval(const Expr& e, const Event* ev, const double* row, const StackMatcher* stacks);
inline double eval(const Expr& e, const Event* ev, const double* row) { return eval(e, ev, row, nullptr); }
inline double eval(const Expr& e, const Event& ev) { return eval(e, &ev, nullptr); }
inline double eval(const Expr& e, const double* row) { return eval(e, nullptr, row); }
inline bool truthy(double v) { return v == v && v != 0.0; }  // NaN is false

// Partial evaluation of a filter for events of one source and op (the engine specialises a
// filter's residual part per (source, op) pair once, at compile time):
// - fold_source_op: `e` with every read of the event's source and op replaced by `source`/`op`
//   and every subtree that then reads nothing (no field, ref or stack predicate) replaced by its
//   value; `x or TRUE` is TRUE and `x and FALSE` is FALSE whatever x (eval has no side effects).
//   For every event with that source and op, eval(result) == eval(e), bit for bit.
// - simplify_truth: drops the operands that cannot change the truth of a predicate
//   (`TRUE and x` -> x, `FALSE or x` -> x, at the top and recursively): truthy(eval(result)) ==
//   truthy(eval(e)) for every event, though the values may differ (x for `1 and x`).
// Both return `e` itself when nothing changes; never throw beyond allocation failure.
ExprPtr fold_source_op(const ExprPtr& e, Source source, uint8_t op);
ExprPtr simplify_truth(const ExprPtr& e);

// Builders (for default plans and tests).
namespace ex {
ExprPtr num(double v, Unit u = Unit::kNone);
ExprPtr ns(double v);  // a duration in ns
ExprPtr field(Field f);
ExprPtr ref(std::string name);
ExprPtr bin(ExprOp op, ExprPtr a, ExprPtr b);
ExprPtr un(ExprOp op, ExprPtr a);
ExprPtr in(ExprPtr a, std::vector<double> set);
ExprPtr stack_match(ExprOp op, std::vector<std::string> patterns);  // kStackMatch | kSiteMatch
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
