#include "operators/key_by.h"

namespace ingero {

KeyBy::KeyBy(const std::vector<Field>& fields) {
  for (Field f : fields) {
    switch (f) {
      case Field::kPid: pid_ = true; break;
      case Field::kTid: tid_ = true; break;
      case Field::kSource: source_ = true; break;
      case Field::kOp: op_ = source_ = true; break;  // an op id only means something with its source
      case Field::kNode: node_ = true; break;
      case Field::kRank: rank_ = true; break;
      default: break;
    }
  }
}

bool KeyBy::has(Field f) const {
  switch (f) {
    case Field::kPid: return pid_;
    case Field::kTid: return tid_;
    case Field::kSource: return source_;
    case Field::kOp: return op_;
    case Field::kNode: return node_;
    case Field::kRank: return rank_;
    default: return false;
  }
}

Key KeyBy::key_of(const Event& e) const {
  Key k;
  if (pid_) k.hi |= static_cast<uint64_t>(e.pid) << 32;
  if (tid_) k.hi |= e.tid;
  if (source_) k.lo |= static_cast<uint64_t>(e.source) << 56;
  if (op_) k.lo |= static_cast<uint64_t>(e.op) << 48;
  if (node_) k.lo |= static_cast<uint64_t>(e.node) << 32;
  if (rank_) k.lo |= static_cast<uint64_t>(static_cast<uint16_t>(e.rank)) << 16;
  return k;
}

double KeyBy::field_value(const Key& k, Field f) {
  switch (f) {
    case Field::kPid: return k.pid();
    case Field::kTid: return k.tid();
    case Field::kSource: return static_cast<double>(k.source());
    case Field::kOp: return k.op();
    case Field::kNode: return k.node();
    case Field::kRank: return k.rank();
    default: return 0;
  }
}

}  // namespace ingero
