// KeyBy::full_key masked by hi_mask/lo_mask (how the engine keys an event once for every window
// group) against KeyBy::key_of, on random events and every subset of the key fields.
#include <gtest/gtest.h>

#include <random>

#include "operators/key_by.h"

namespace ingero {
namespace {

TEST(KeyByMasks, MaskedFullKeyEqualsKeyOf) {
  const Field all[] = {Field::kPid, Field::kTid, Field::kSource, Field::kOp, Field::kNode, Field::kRank};
  std::mt19937_64 rng(7);
  for (unsigned subset = 0; subset < 64; ++subset) {
    std::vector<Field> fields;
    for (unsigned b = 0; b < 6; ++b)
      if (subset >> b & 1) fields.push_back(all[b]);
    const KeyBy by(fields);
    for (int i = 0; i < 500; ++i) {
      Event e;
      e.pid = static_cast<uint32_t>(rng());
      e.tid = static_cast<uint32_t>(rng());
      e.source = static_cast<Source>(rng() % 256);
      e.op = static_cast<uint8_t>(rng());
      e.node = static_cast<uint16_t>(rng());
      e.rank = static_cast<int16_t>(rng());
      e.ts_ns = rng();  // not a key field: must not leak into the key
      const Key full = KeyBy::full_key(e);
      const Key masked{full.hi & by.hi_mask(), full.lo & by.lo_mask()};
      ASSERT_EQ(masked, by.key_of(e)) << "subset " << subset;
    }
  }
}

// The raw packing (the engine's window-cache identity): two events have equal masked raw keys
// exactly when key_of gives them equal keys, for every subset of the key fields. Fields are drawn
// from small ranges so that equal and unequal pairs both occur often.
TEST(KeyByMasks, MaskedRawKeyEqualExactlyWhenKeysEqual) {
  const Field all[] = {Field::kPid, Field::kTid, Field::kSource, Field::kOp, Field::kNode, Field::kRank};
  std::mt19937_64 rng(11);
  auto random_event = [&] {
    Event e;
    e.pid = static_cast<uint32_t>(rng() % 2 ? rng() % 3 : rng());
    e.tid = static_cast<uint32_t>(rng() % 2 ? rng() % 3 : rng());
    e.source = static_cast<Source>(rng() % 3);
    e.op = static_cast<uint8_t>(rng() % 2 ? rng() % 3 : rng());
    e.node = static_cast<uint16_t>(rng() % 3);
    e.rank = static_cast<int16_t>(static_cast<int>(rng() % 4) - 1);
    e.prev_state = static_cast<OffCpuState>(rng() % 4);  // stored next to op: not a key field
    e.gpu_id = static_cast<uint8_t>(rng());
    return e;
  };
  size_t equal = 0, unequal = 0;
  for (unsigned subset = 0; subset < 64; ++subset) {
    std::vector<Field> fields;
    for (unsigned b = 0; b < 6; ++b)
      if (subset >> b & 1) fields.push_back(all[b]);
    const KeyBy by(fields);
    for (int i = 0; i < 2000; ++i) {
      const Event a = random_event(), b = random_event();
      const Key ra = KeyBy::raw_key(a), rb = KeyBy::raw_key(b);
      const bool raw_equal = (ra.hi & by.raw_hi_mask()) == (rb.hi & by.raw_hi_mask()) &&
                             (ra.lo & by.raw_lo_mask()) == (rb.lo & by.raw_lo_mask());
      const bool keys_equal = by.key_of(a) == by.key_of(b);
      ASSERT_EQ(raw_equal, keys_equal) << "subset " << subset;
      ++(keys_equal ? equal : unequal);
    }
  }
  EXPECT_GT(equal, 2000u);
  EXPECT_GT(unequal, 10000u);
}

}  // namespace
}  // namespace ingero
