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

}  // namespace
}  // namespace ingero
