// A replay of batches already in memory, for bench's run phase and its per-rule and scaling runs.
#pragma once

#include <vector>

#include "model/trace.h"

namespace ingero::cli {

// Replays batches already in memory, exactly as the reader produced them (watermarks, final
// flag), with a copy of the reader's metadata. The batches are borrowed and lent out, so the
// same trace can be replayed for the pack, then for every rule, and by several threads at once.
class PreloadedSource final : public EventSource {
 public:
  PreloadedSource(const std::vector<Batch>& batches, const TraceMeta& meta) : batches_(batches), meta_(meta) {}
  // Lends each batch's events (Batch::lent) instead of copying them: the run phase times the
  // analysis, not a copy of every event (400 MB for 5 M events) that no other source makes on the
  // engine's thread. A borrowed batch may itself lend its events (bench --scaling's slices).
  bool next(Batch& out) override {
    if (pos_ >= batches_.size()) return false;
    const Batch& b = batches_[pos_++];
    out.events.clear();
    out.lent = &b.view();
    out.watermark = b.watermark;
    out.seq = b.seq;
    out.final = b.final;
    return true;
  }
  TraceMeta& meta() override { return meta_; }
  PrefetchHint upcoming() override {
    if (pos_ >= batches_.size()) return {};
    const std::vector<Event>& next = batches_[pos_].view();
    return {next.data(), next.size() * sizeof(Event)};
  }

 private:
  const std::vector<Batch>& batches_;
  size_t pos_ = 0;
  TraceMeta meta_;
};

}  // namespace ingero::cli
