// Filter: keeps the events for which a predicate over event fields is true.
//
// Contract: input any batch of events; output the kept events appended to `out`, in input order.
// Stateless, so it is safe on any thread; watermarks pass through untouched. A predicate that
// evaluates to NaN (a missing value) drops the event.
#pragma once

#include <vector>

#include "model/event.h"
#include "model/expr.h"

namespace ingero {

class FilterOp {
 public:
  explicit FilterOp(ExprPtr pred) : pred_(std::move(pred)) {}
  bool keep(const Event& e) const { return !pred_ || truthy(eval(*pred_, e)); }
  void apply(const std::vector<Event>& in, std::vector<Event>& out) const {
    for (const auto& e : in)
      if (keep(e)) out.push_back(e);
  }

 private:
  ExprPtr pred_;
};

}  // namespace ingero
