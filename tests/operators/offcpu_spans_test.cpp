#include <gtest/gtest.h>

#include "model/ops.h"
#include "operators/offcpu_spans.h"

namespace ingero {
namespace {

Event sw(uint32_t tid, uint64_t ts, uint8_t flags, OffCpuState st = OffCpuState::kUnknown, uint64_t dur = 0) {
  Event e;
  e.source = Source::kHost;
  e.op = op::kSchedSwitch;
  e.pid = e.tid = tid;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.flags = flags;
  e.prev_state = st;
  return e;
}

TEST(OffCpuSpans, WholeSpansPassThrough) {
  OffCpuSpanBuilder b(OffCpuNode{});
  std::vector<Event> out;
  b.add(sw(1, 100, 0, OffCpuState::kUnknown, 50), out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ts_ns, 100u);
  EXPECT_EQ(out[0].dur_ns, 50u);
}

TEST(OffCpuSpans, PairsHalvesPerThread) {
  OffCpuSpanBuilder b(OffCpuNode{});
  std::vector<Event> out;
  auto out1 = sw(1, 100, event_flags::kSwitchOut, OffCpuState::kPreempted);
  out1.arg1 = 999;  // the task that ran instead
  b.add(out1, out);
  b.add(sw(2, 110, event_flags::kSwitchOut, OffCpuState::kSleeping), out);
  b.add(sw(2, 130, event_flags::kSwitchIn), out);
  b.add(sw(1, 160, event_flags::kSwitchIn), out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].tid, 2u);
  EXPECT_EQ(out[0].dur_ns, 20u);
  EXPECT_EQ(out[0].prev_state, OffCpuState::kSleeping);
  EXPECT_EQ(out[1].tid, 1u);
  EXPECT_EQ(out[1].ts_ns, 100u);
  EXPECT_EQ(out[1].dur_ns, 60u);
  EXPECT_EQ(out[1].arg1, 999u);
  EXPECT_EQ(out[1].prev_state, OffCpuState::kPreempted);
}

TEST(OffCpuSpans, SwitchInWithoutPartnerIsCountedAndDropped) {
  OffCpuSpanBuilder b(OffCpuNode{});
  std::vector<Event> out;
  b.add(sw(7, 100, event_flags::kSwitchIn), out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(b.unpaired(), 1u);
}

TEST(OffCpuSpans, OpenSpansCloseAtTheEndFlaggedTruncated) {
  OffCpuSpanBuilder b(OffCpuNode{});
  std::vector<Event> out;
  b.add(sw(3, 100, event_flags::kSwitchOut), out);
  b.finish(400, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dur_ns, 300u);
  EXPECT_TRUE(out[0].flags & event_flags::kTruncated);
  EXPECT_EQ(b.truncated(), 1u);
  EXPECT_EQ(b.open_spans(), 0u);
}

TEST(OffCpuSpans, FiltersByStateAndMinimum) {
  OffCpuNode n;
  n.min_ns = 10;
  n.states = {OffCpuState::kPreempted};
  OffCpuSpanBuilder b(n);
  std::vector<Event> out;
  b.add(sw(1, 0, 0, OffCpuState::kPreempted, 5), out);     // too short
  b.add(sw(1, 10, 0, OffCpuState::kSleeping, 50), out);    // wrong state
  b.add(sw(1, 100, 0, OffCpuState::kPreempted, 50), out);  // kept
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ts_ns, 100u);
}

}  // namespace
}  // namespace ingero
