// Key-by / shard: packs the key fields of an event into a fixed 16-byte key and picks the shard.
//
// Contract: a key holds only the fields named (others are zero), so two events with equal named
// fields get equal keys. Keys order totally (for deterministic output). shard_of() maps a pid to
// one of n shards with a fixed hash: every thread of a process lands in the same shard, which is
// what per-thread joins need. Stateless.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/event.h"
#include "model/expr.h"

namespace ingero {

struct Key {
  uint64_t hi = 0;  // pid << 32 | tid
  uint64_t lo = 0;  // source << 56 | op << 48 | node << 32 | uint16(rank) << 16
  bool operator==(const Key&) const = default;
  auto operator<=>(const Key&) const = default;

  uint32_t pid() const { return static_cast<uint32_t>(hi >> 32); }
  uint32_t tid() const { return static_cast<uint32_t>(hi); }
  Source source() const { return static_cast<Source>(lo >> 56); }
  uint8_t op() const { return static_cast<uint8_t>(lo >> 48); }
  uint16_t node() const { return static_cast<uint16_t>(lo >> 32); }
  int16_t rank() const { return static_cast<int16_t>(static_cast<uint16_t>(lo >> 16)); }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = k.hi * 0x9E3779B97F4A7C15ull ^ (k.lo + 0x632BE59BD9B4E019ull + (k.hi << 6));
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

class KeyBy {
 public:
  explicit KeyBy(const std::vector<Field>& fields);
  Key key_of(const Event& e) const;
  bool has(Field f) const;
  // Value of a key field as a row slot would hold it.
  static double field_value(const Key& k, Field f);
  // Every key field of `e` packed as key_of packs it, and the bits of that this KeyBy keeps:
  // key_of(e) == Key{full_key(e).hi & hi_mask(), full_key(e).lo & lo_mask()}. The engine packs
  // an event once and masks it for each window group that keys it.
  static Key full_key(const Event& e) {
    return {static_cast<uint64_t>(e.pid) << 32 | e.tid,
            static_cast<uint64_t>(e.source) << 56 | static_cast<uint64_t>(e.op) << 48 |
                static_cast<uint64_t>(e.node) << 32 | static_cast<uint64_t>(static_cast<uint16_t>(e.rank)) << 16};
  }
  uint64_t hi_mask() const { return (pid_ ? 0xFFFFFFFF00000000ull : 0) | (tid_ ? 0xFFFFFFFFull : 0); }
  uint64_t lo_mask() const {
    return (source_ ? 0xFFull << 56 : 0) | (op_ ? 0xFFull << 48 : 0) | (node_ ? 0xFFFFull << 32 : 0) |
           (rank_ ? 0xFFFFull << 16 : 0);
  }
  // The same fields in the order the event stores them (pid, tid; node, rank, source, op are
  // adjacent members), so packing is two loads where the layout allows: an identity for a
  // cache, not a Key (it does not order as keys do). Two events have equal masked raw keys
  // exactly when they have equal masked full keys (equal key_of).
  static Key raw_key(const Event& e) {
    if constexpr (std::endian::native == std::endian::little) {
      static_assert(offsetof(Event, tid) == offsetof(Event, pid) + 4 &&
                    offsetof(Event, rank) == offsetof(Event, node) + 2 &&
                    offsetof(Event, source) == offsetof(Event, node) + 4 &&
                    offsetof(Event, op) == offsetof(Event, node) + 5 && offsetof(Event, op) + 3 <= sizeof(Event));
      uint64_t hi = 0, lo = 0;
      std::memcpy(&hi, &e.pid, sizeof hi);
      std::memcpy(&lo, &e.node, sizeof lo);  // node, rank, source, op and two more bytes, dropped
      return {hi, lo & 0xFFFFFFFFFFFFull};
    }
    return {static_cast<uint64_t>(e.pid) | static_cast<uint64_t>(e.tid) << 32,
            static_cast<uint64_t>(e.node) | static_cast<uint64_t>(static_cast<uint16_t>(e.rank)) << 16 |
                static_cast<uint64_t>(e.source) << 32 | static_cast<uint64_t>(e.op) << 40};
  }
  uint64_t raw_hi_mask() const { return (pid_ ? 0xFFFFFFFFull : 0) | (tid_ ? 0xFFFFFFFF00000000ull : 0); }
  uint64_t raw_lo_mask() const {
    return (node_ ? 0xFFFFull : 0) | (rank_ ? 0xFFFFull << 16 : 0) | (source_ ? 0xFFull << 32 : 0) |
           (op_ ? 0xFFull << 40 : 0);
  }

 private:
  bool pid_ = false, tid_ = false, source_ = false, op_ = false, node_ = false, rank_ = false;
};

inline unsigned shard_of(uint32_t pid, unsigned shards) {
  const uint64_t h = (static_cast<uint64_t>(pid) * 0x9E3779B97F4A7C15ull) >> 32;
  return shards ? static_cast<unsigned>(h % shards) : 0;
}

}  // namespace ingero
