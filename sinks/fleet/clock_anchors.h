// Clock anchors: what a capture records so that `merge` knows how far its event clock is from
// wall time and how far to trust that (sinks/fleet/merge.h reads them; docs/fleet.md).
//
// Contract:
// - sample_clock_anchor(offset) reads CLOCK_MONOTONIC, CLOCK_REALTIME, CLOCK_MONOTONIC a few
//   times and keeps the tightest bracket: event_ns = middle of the bracket converted with the
//   capture's fixed monotonic->unix `offset` (what every event's ts went through), wall_ns = the
//   REALTIME reading, bracket_ns = the bracket's width. adjtimex() adds the kernel's NTP error
//   bound (maxerror/esterror, us) and STA_UNSYNC. event_ns - wall_ns drifts from its first value
//   when the wall clock is slewed or stepped after the capture fixed its offset: a jump of more
//   than 1 ms between anchors is a clock step (merge reports it).
// - write_clock_anchors() appends rows to table ip_clock_anchors(node, event_ns, wall_ns,
//   bracket_ns, maxerror_us, esterror_us, unsync) of an existing SQLite database (created if
//   missing). Returns false with `error`; never throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ingero {

struct ClockAnchor {
  int64_t event_ns = 0, wall_ns = 0, bracket_ns = 0;
  int64_t maxerror_us = 0, esterror_us = 0;
  bool unsync = false;
};

ClockAnchor sample_clock_anchor(int64_t mono_to_unix_offset_ns);

bool write_clock_anchors(const std::string& db_path, const std::string& node, const std::vector<ClockAnchor>& anchors,
                         std::string& error);

}  // namespace ingero
