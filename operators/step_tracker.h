// Step boundaries as they happen: the engine's `from steps` stream (issue 40, item 3: "emit step
// boundaries as events the engine and rules can use").
//
// StepInference (operators/step_inference.h) judges a whole trace at its end. This operator runs
// the same analysis while the events flow and turns each step it can settle into an event, so
// rules can window by steps (`window steps 20`) and compare a process's steps with its own.
//
// Contract:
// - observe() takes the events of the processes this instance owns, in time order (one engine
//   shard's owned events); flush(final, out) appends the steps settled since the last
//   flush (final: every step, after judging each process over its whole trace) as events: source Source::kStep, op 0,
//   ts_ns = the step's first boundary, dur_ns = its length (the next boundary - ts), pid/rank/node = the process, tid =
//   the thread whose marker ends the step, arg0 = the step's ordinal in its process (0, 1, 2, ... in time order, never
//   reused), arg1 = the wait of the marker that ends it (the synchronising call's duration; for
//   launch bursts, the launch-free gap before the burst), flags = kSynthetic, plus event_flags::kStepIrregular
//   when the step is not within 20% of the period (a stall, a missing marker).
//   Per process the steps come in ordinal order; each ts is the previous step's end.
// - Locking on: a process is judged (StepInference::pick, over the newest kJudgedMarkers = 1024
//   markers of each series: at least 85 steps at 12 markers a step) once it has been active kMinSpanNs
//   (2 s) and then whenever its markers grew by a quarter (at most kMaxGap = 2048, plus 6; after
//   kQuickTries = 3 judgements with no lock, and once locked, doubled, at most 8 kMaxGap; an
//   unlock starts the quick judgements again); a period accepted with
//   confidence >= kLockConfidence (0.8; any accepted period at the final flush) is locked on, and
//   its steps are tracked but held back until the lock is confirmed: followed over as much time
//   again as it was judged on, with at most a quarter of that time in irregular steps (then the
//   held steps go out). Early on, the launches inside one long step are as regular as steps (a
//   10 s step of the generator: launches every 133 ms for 4 s, judged "x2, 266 ms" with confidence
//   0.83-0.92 before the first gap); the gap that follows is an irregular step of 60% of the
//   time, so such a lock never confirms. Locked, the process is judged again when its markers
//   doubled: another series, k or a period more than 10% off moves the lock there (from the last
//   boundary that went out). O(markers) amortised.
//   Once locked, the first step starts at the first boundary of the judged markers, so the steps
//   from before the lock come out too, once confirmed (their events are late in time; step
//   windows close by count, not by the watermark).
// - Tracking: the next boundary after b is the marker of the locked series among the next 2k (from
//   the (floor(k/2)+1)-th on)
//   that is closest to b + period when within 20% of a period (a regular step), else the k-th
//   next marker (an irregular step: a stall is a long step, not a lost phase) - exactly
//   StepInference's tracking. A decision waits until 2k markers follow b or one lies past
//   b + 1.2 periods (no later marker can then change it), or the final flush.
// - Unlocking: when over half of the time of the last kRecent (20) steps (at least kMinSteps) is
//   in irregular steps (the pace changed, or the lock was on a sub-step pattern), held steps are
//   dropped and the process goes back to "locking on" from the last boundary that went out,
//   ordinals continuing. A stall (one step of 3 periods among regular ones) does not unlock.
// - The final flush judges the whole trace (as StepInference::finish does) unless the process's
//   lock is confirmed already, never unlocks, and lets every step it tracks go out.
// - A process with no period never gets steps (StepInference's method "none").
// - Explicit markers win (add_markers, before the first event; replay: the trace's
//   ip_annotations): a process whose markers make at least one step gets its steps from them
//   (StepInference::marker_boundaries), none inferred. Step [b_i, b_i+1] goes out once an event
//   of the process at or past b_i+1 is seen (the rest at the final flush); tid = the marker's
//   thread when it named one, else the thread of that event; arg1 = 0; never irregular. Live
//   capture hands markers over only at its end, so a live run infers.
// - Memory: StepInference's rings (bounded) plus, per locked process, the markers of its series
//   after its last boundary (at most about 2k + what one flush brought).
// - Event-driven: judgements and tracking happen as each marker arrives (inside observe()), so the
//   steps - boundaries, ordinals, flags - are a function of each process's events alone, whatever
//   the batches or the flushes (flush() only hands over what is out, and finishes at the end).
//   The engine's shards see each process's events in the same order at any thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/event.h"
#include "model/steps.h"
#include "operators/step_inference.h"

namespace ingero {

class StepTracker {
 public:
  static constexpr size_t kRecent = 20;                     // steps judged for unlocking
  static constexpr uint64_t kMinSpanNs = 2'000'000'000ull;  // activity before the first judgement
  static constexpr double kLockConfidence = 0.8;
  static constexpr uint32_t kQuickTries = 3;  // judgements at +25% markers; then at x2
  static constexpr size_t kJudgedMarkers = 1024;
  static constexpr uint64_t
      kMaxGap = 2048;  // markers between quick judgements, at most  // newest markers per series judged before the end

  void observe(const Event* events, size_t n);
  // The program's own step markers (any order, several processes); before the first observe().
  void add_markers(std::span<const StepMarker> markers);
  // Appends the steps settled since the last flush, in (node, pid, rank, ordinal) order.
  void flush(bool final, std::vector<Event>& out);

  // Processes locked on a period now (tests, diagnostics).
  size_t locked() const;

 private:
  struct Marker {
    uint64_t t = 0, wait = 0;
    uint32_t tid = 0;
  };
  struct Track {
    uint64_t tried_at = 0;  // KeyState::markers at the last judgement
    bool locked = false;
    bool confirmed = false;  // its steps go out as they are tracked (else they are held)
    size_t slot = 0, k = 1;
    bool ends = true;
    uint64_t period = 0;
    uint64_t judged_to = 0;  // the process's last call end when the lock was judged
    uint64_t consumed = 0;   // markers of the locked series already read (Series::total)
    bool has_boundary = false;
    Marker b;  // the last boundary tracked
    bool has_emitted = false;
    Marker emitted;  // the last boundary that went out
    std::vector<Marker> pending;
    std::vector<Event> held;    // tracked, not yet confirmed
    std::vector<Event> recent;  // the last kRecent steps tracked
    uint64_t ordinal = 0;       // of the next step to go out
    uint64_t seen = 0;          // KeyState::markers when last looked at
    uint32_t tries = 0;         // judgements so far
    bool marked = false;        // steps from the program's markers (marks), not inferred
    size_t next_mark = 0;       // the next boundary of marks to end a step at
    uint32_t last_tid = 0;      // marked: the thread of its last GPU call
  };

  void lock(Track& tr, const StepInference::KeyState& s, const StepInference::Pick& p);
  void unlock(Track& tr, const StepInference::KeyState& s);
  // Reads the series' markers added since the last pull into `pending` (those after the last
  // boundary; `inclusive`: at it too).
  void pull(Track& tr, const StepInference::KeyState& s, bool inclusive = false);
  void advance(Track& tr, const StepInference::KeyState& s, bool final, std::vector<Event>& out);
  void release(Track& tr, std::vector<Event>& out);  // held steps go out, with their ordinals
  // The share of the time of the last `last` steps that was in irregular steps.
  static double irregular_share(const std::vector<Event>& steps, size_t last);

  // A marker was added to process `s`: judge it when due, track its locked series.
  void on_marker(Track& tr, const StepInference::KeyState& s);
  void judge(Track& tr, const StepInference::KeyState& s, bool final);

  StepInference inference_;
  struct Marks {
    std::vector<uint64_t> boundaries;
    std::vector<uint32_t> tids;  // the marker's thread at each boundary (0: not said)
  };
  // A marked process's steps up to `upto` (UINT64_MAX: all).
  void emit_marked(Track& tr, const StepInference::KeyState& s, const Marks& m, uint64_t upto, uint32_t tid);
  std::unordered_map<uint64_t, Marks> marks_;  // (node << 32 | pid) -> its markers' boundaries
  std::deque<Track> tracks_;                   // KeyState::user indexes it (a deque: tracks never move)
  std::vector<Event> ready_;                   // steps out since the last flush
};

}  // namespace ingero
