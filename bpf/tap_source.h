// An EventSource that forwards another source's batches unchanged and shows each batch to a
// callback first (live view statistics, the SQLite sink). Exactly what the engine consumes is what
// the callback sees, so a database written from it replays to the same chains.
#pragma once

#include <functional>
#include <utility>

#include "model/trace.h"

namespace ingero::bpf {

class TapSource final : public EventSource {
 public:
  TapSource(EventSource& inner, std::function<void(const Batch&)> tap) : inner_(inner), tap_(std::move(tap)) {}
  bool next(Batch& out) override {
    if (!inner_.next(out)) return false;
    if (tap_) tap_(out);
    return true;
  }
  TraceMeta& meta() override { return inner_.meta(); }

 private:
  EventSource& inner_;
  std::function<void(const Batch&)> tap_;
};

}  // namespace ingero::bpf
