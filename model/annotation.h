// Explicit annotations a traced program sends about itself (`trace --annotate`), in Ingero's
// annotation protocol (agent v0.17.0; docs/steps.md "Explicit step markers" has the sources), so
// the PyTorch Lightning and Ray helpers written for Ingero work unchanged.
//
// The wire format: newline-delimited JSON, one object per line:
//   {"labels":{"step":"42","epoch":"3"},"pid":1234,"ts":1700000000000000000}
//   labels      required: a non-empty object of at most 32 key/value pairs; keys 1-64 bytes of
//               [A-Za-z0-9_.-]; values strings of at most 256 bytes (we also take integers and
//               keep their decimal text: an extension, Ingero refuses them)
//   ts          optional unix ns (an integer > 0); absent or 0: the receive time
//   pid         optional: the process the annotation is about (default: the sender, SO_PEERCRED)
//   start_time  optional: that pid's start time, /proc/<pid>/stat field 22 (clock ticks)
//   span_start, span_end  optional unix ns, both or neither, end >= start: a phase, not an instant
//   v           optional protocol version: 1 (anything else is refused)
//   tid         optional (ours, not Ingero's): the thread the annotation is about
// Other keys are ignored (Go's decoder, which Ingero uses, ignores them too). A line is at most
// kMaxLineBytes bytes.
//
// Contract: parse_annotation_line() never throws, allocates only for the line it is given, and
// says what is wrong with a line in one line of text (a JSON syntax error with its column, or the
// field and the rule it breaks). What the fields mean for steps: step_marker_of().
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "model/steps.h"

namespace ingero {

namespace annotation_limits {
inline constexpr size_t kMaxLineBytes = size_t{16} * 1024;
inline constexpr size_t kMaxLabels = 32;
inline constexpr size_t kMaxKeyBytes = 64;
inline constexpr size_t kMaxValueBytes = 256;
inline constexpr int64_t kProtocolVersion = 1;
}  // namespace annotation_limits

struct Annotation {
  uint64_t ts_ns = 0;                           // unix ns (CLOCK_REALTIME); 0 after parsing when the line gave none
  bool ts_given = false;                        // the line had "ts" (else the receiver stamps the receive time)
  uint32_t pid = 0;                             // the process it is about (0 after parsing: the line did not say)
  uint32_t tid = 0;                             // the thread it is about (0: not said)
  uint16_t node = 0;                            // index into TraceMeta::nodes (set by whoever receives or reads it)
  uint64_t start_time = 0;                      // /proc/<pid>/stat start time, clock ticks; 0 = unknown
  uint64_t span_start_ns = 0, span_end_ns = 0;  // a phase (both set) or an instant (both 0)
  std::map<std::string, std::string> labels;    // validated keys and values
  // SO_PEERCRED of the connection it came on (all 0: not from a socket, e.g. an Ingero table).
  uint32_t peer_pid = 0, peer_uid = 0, peer_gid = 0;

  const std::string* label(const std::string& key) const {
    auto it = labels.find(key);
    return it == labels.end() ? nullptr : &it->second;
  }
};

// Parses one line (without its newline; a trailing '\r' is allowed). True with `out` filled, or
// false with `error` saying what is wrong. Fields the line does not have stay at their defaults.
bool parse_annotation_line(std::string_view line, Annotation& out, std::string& error);

// True when `key` is a valid label key: 1..kMaxKeyBytes bytes of [A-Za-z0-9_.-].
bool valid_label_key(std::string_view key);

// The labels as one JSON object text (keys sorted), as stored in ip_annotations.labels.
std::string labels_json(const Annotation& a);
// The reverse, for stored rows: false (labels cleared) unless `text` is a JSON object of strings
// (integers are kept as their decimal text). Never throws.
bool parse_labels_json(std::string_view text, std::map<std::string, std::string>& labels);

// The step marker an annotation carries: true when it has a "step" or an "epoch" label (the keys
// Ingero's Lightning callback sends: "step" = trainer.global_step at each batch start, "epoch" =
// trainer.current_epoch). Its time is span_start for a phase, else ts; its step/epoch numbers are
// the labels' values when they are decimal integers (else -1, the label still counts).
bool step_marker_of(const Annotation& a, StepMarker& out);

// "42" -> 42; "-1", "4.5", "", "x", "99999999999999999999" -> -1.
int64_t label_number(const std::string& value);

}  // namespace ingero
