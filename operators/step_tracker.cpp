#include "operators/step_tracker.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "model/ops.h"

namespace ingero {

void StepTracker::lock(Track& tr, const StepInference::KeyState& s, const StepInference::Pick& p) {
  tr.locked = true;
  tr.slot = p.slot;
  tr.ends = p.ends;
  tr.k = std::max<size_t>(p.k, 1);
  tr.period = std::max<uint64_t>(p.period, 1);
  tr.confirmed = false;
  tr.recent.clear();
  tr.held.clear();
  tr.pending.clear();
  tr.consumed = 0;  // re-read the series' whole ring: the markers after the boundary are pending
  const bool first = !tr.has_boundary;
  if (first) {
    tr.has_boundary = true;
    tr.b = Marker{p.first_boundary, 0, 0};
  }
  pull(tr, s, first);
  // The first boundary is a marker of the series: its wait and thread come from it.
  if (first) {
    for (const Marker& m : tr.pending)
      if (m.t == tr.b.t) tr.b = m;
    std::erase_if(tr.pending, [&](const Marker& m) { return m.t <= tr.b.t; });
  }
}

void StepTracker::pull(Track& tr, const StepInference::KeyState& s, bool inclusive) {
  const StepInference::Series* series = s.series(tr.slot);
  if (!series || series->ts.empty()) return;
  const uint64_t fresh = series->total - tr.consumed;
  const size_t m = static_cast<size_t>(std::min<uint64_t>(fresh, series->ts.size()));
  tr.consumed = series->total;
  const size_t before = tr.pending.size();
  for (size_t i = 0; i < m; ++i) {
    const size_t at = series->at(m, i);
    const uint64_t t = tr.ends ? series->ts[at] + series->dur[at] : series->ts[at];
    if (t < tr.b.t || (t == tr.b.t && !inclusive)) continue;
    tr.pending.push_back(Marker{t, series->dur[at], series->tid[at]});
  }
  // Call ends are nearly, not exactly, in order (a long call ends after later short ones).
  if (tr.pending.size() != before)
    std::sort(tr.pending.begin(), tr.pending.end(), [](const Marker& a, const Marker& b) { return a.t < b.t; });
}

double StepTracker::irregular_share(const std::vector<Event>& steps, size_t last) {
  uint64_t all = 0, irregular = 0;
  for (size_t i = steps.size() > last ? steps.size() - last : 0; i < steps.size(); ++i) {
    all += steps[i].dur_ns;
    if (steps[i].flags & event_flags::kStepIrregular) irregular += steps[i].dur_ns;
  }
  return all ? static_cast<double>(irregular) / static_cast<double>(all) : 0.0;
}

void StepTracker::release(Track& tr, std::vector<Event>& out) {
  for (Event& e : tr.held) {
    e.arg0 = tr.ordinal++;
    out.push_back(e);
  }
  if (!tr.held.empty()) tr.emitted = Marker{tr.held.back().end_ns(), tr.held.back().arg1, tr.held.back().tid};
  tr.has_emitted = tr.has_emitted || !tr.held.empty();
  tr.held.clear();
}

void StepTracker::unlock(Track& tr, const StepInference::KeyState& s) {
  tr.locked = false;
  tr.confirmed = false;
  tr.held.clear();
  tr.pending.clear();
  tr.recent.clear();
  tr.tried_at = s.markers;
  tr.tries = 0;  // judged again soon: the pace changed
  // Steps not yet out are dropped: the next lock starts at the last boundary that went out.
  tr.has_boundary = tr.has_emitted;
  if (tr.has_emitted) tr.b = tr.emitted;
}

void StepTracker::advance(Track& tr, const StepInference::KeyState& s, bool final, std::vector<Event>& out) {
  const double period = static_cast<double>(tr.period);
  const double tol = 0.2 * period;
  const size_t k = tr.k;
  size_t used = 0;  // pending markers consumed (erased once at the end)
  while (tr.locked && used < tr.pending.size()) {
    const size_t avail = tr.pending.size() - used;
    const Marker* p = tr.pending.data() + used;
    // No later marker can change the decision once 2k markers follow b or one is past b + 1.2 P.
    const bool settled = final || avail >= 2 * k || static_cast<double>(p[avail - 1].t - tr.b.t) > period + tol;
    if (!settled) break;
    size_t best = avail;
    double best_err = INFINITY;
    for (size_t j = k / 2; j < avail && j < 2 * k; ++j) {  // over half a step on (StepInference)
      const double err = std::fabs(static_cast<double>(p[j].t - tr.b.t) - period);
      if (err < best_err) {
        best_err = err;
        best = j;
      }
    }
    size_t next;
    bool regular = false;
    if (best < avail && best_err <= tol) {
      next = best;
      regular = true;
    } else if (avail >= k) {
      next = k - 1;
    } else {
      break;  // fewer than k markers and none near a period: wait (or, final, stop here)
    }
    const Marker& nb = p[next];
    Event e;
    e.ts_ns = tr.b.t;
    e.dur_ns = nb.t - tr.b.t;
    e.source = Source::kStep;
    e.op = 0;
    e.pid = s.pid;
    e.rank = s.rank;
    e.node = s.node;
    e.tid = nb.tid;
    e.arg1 = nb.wait;
    e.flags = event_flags::kSynthetic | (regular ? 0 : event_flags::kStepIrregular);
    tr.b = nb;
    used += next + 1;
    tr.held.push_back(e);
    tr.recent.push_back(e);
    if (tr.recent.size() > kRecent) tr.recent.erase(tr.recent.begin());
    // The period no longer describes the time (a new pace, or a lock on the launches inside one
    // step, whose gaps between bursts are long irregular "steps"): find it again from the last
    // boundary that went out, ordinals going on.
    if (!final && tr.recent.size() >= StepInference::kMinSteps && irregular_share(tr.recent, kRecent) > 0.5) {
      unlock(tr, s);
      return;
    }
    // Confirmed once the lock has been followed over as much time as it was judged on, with at
    // most a quarter of that time in irregular steps: its held steps go out.
    if (!tr.confirmed && tr.held.size() >= StepInference::kMinSteps && tr.b.t >= tr.judged_to &&
        tr.b.t - tr.judged_to >= tr.judged_to - s.first_ns && irregular_share(tr.held, tr.held.size()) <= 0.25)
      tr.confirmed = true;
    if (tr.confirmed) release(tr, out);
  }
  tr.pending.erase(tr.pending.begin(),
                   tr.pending.begin() + static_cast<std::ptrdiff_t>(std::min(used, tr.pending.size())));
  // At the end the judgement is the whole trace's (StepInference's own): what it tracks goes out.
  if (final) release(tr, out);
}

void StepTracker::judge(Track& tr, const StepInference::KeyState& s, bool final) {
  tr.tried_at = s.markers;
  ++tr.tries;
  const StepInference::Pick p = StepInference::pick(s, final ? StepInference::kMaxMarkers : kJudgedMarkers);
  const bool sure = p.ok && (final || p.confidence >= kLockConfidence);
  const bool same = tr.locked && p.slot == tr.slot && p.ends == tr.ends && p.k == tr.k &&
                    std::fabs(static_cast<double>(p.period) - static_cast<double>(tr.period)) <=
                        0.1 * static_cast<double>(tr.period);
  // A first lock, or a judgement over more history that picks another series, k or pace.
  if (sure && !same) {
    if (tr.locked) unlock(tr, s);
    lock(tr, s, p);
    tr.judged_to = s.last_ns;
  }
}

void StepTracker::on_marker(Track& tr, const StepInference::KeyState& s) {
  // Judge (again) once the markers grew by a quarter (at most kMaxGap, plus 6), or, after
  // kQuickTries judgements with no lock, doubled (at most 8 kMaxGap): a process with no period is
  // not judged over and over, one that lost its lock is judged again soon. Locked: doubled (at
  // most 8 kMaxGap). A judgement reads at most kJudgedMarkers per series, so this stays
  // O(markers). Not before the process has been active kMinSpanNs.
  const uint64_t grow = tr.locked || tr.tries >= kQuickTries ? std::min<uint64_t>(tr.tried_at, 8 * kMaxGap)
                                                             : std::min<uint64_t>(tr.tried_at / 4, kMaxGap);
  const uint64_t due = tr.tried_at + grow + 6;
  if (s.markers >= due && s.last_ns > s.first_ns && s.last_ns - s.first_ns >= kMinSpanNs) judge(tr, s, false);
  if (!tr.locked) return;
  pull(tr, s);
  advance(tr, s, false, ready_);
}

void StepTracker::observe(const Event* events, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const Event& e = events[i];
    if (!is_gpu_api(e.source)) {
      // Of the rest, StepInference reads only preempted switches (launch gaps that are no steps).
      if (e.source == Source::kHost && e.op == op::kSchedSwitch && e.prev_state == OffCpuState::kPreempted)
        inference_.observe(&e, 1);
      continue;
    }
    inference_.observe(&e, 1);
    const StepInference::KeyState* s = inference_.last_state();
    if (!s) continue;
    if (s->user == UINT32_MAX) {
      s->user = static_cast<uint32_t>(tracks_.size());
      tracks_.emplace_back();
    }
    Track& tr = tracks_[s->user];
    if (tr.seen == 0 && !marks_.empty() && !tr.marked) {
      const auto it = marks_.find(uint64_t{s->node} << 32 | s->pid);
      tr.marked = it != marks_.end();
    }
    if (tr.marked) {
      tr.last_tid = e.tid;
      emit_marked(tr, *s, marks_.at(uint64_t{s->node} << 32 | s->pid), e.ts_ns, e.tid);
      tr.seen = std::max<uint64_t>(tr.seen, 1);
      continue;
    }
    if (s->markers == tr.seen) continue;
    tr.seen = s->markers;
    on_marker(tr, *s);
  }
}

void StepTracker::add_markers(std::span<const StepMarker> markers) {
  std::unordered_map<uint64_t, std::vector<StepMarker>> by;
  for (const StepMarker& m : markers) by[uint64_t{m.node} << 32 | m.pid].push_back(m);
  for (auto& [k, v] : by) {
    Marks mk;
    mk.boundaries = StepInference::marker_boundaries(v);
    if (mk.boundaries.size() < 2) continue;
    std::stable_sort(v.begin(), v.end(), [](const StepMarker& a, const StepMarker& b) { return a.ts_ns < b.ts_ns; });
    for (uint64_t b : mk.boundaries) {
      const auto at = std::lower_bound(v.begin(), v.end(), b,
                                       [](const StepMarker& m, uint64_t t) { return m.ts_ns < t; });
      mk.tids.push_back(at != v.end() && at->ts_ns == b ? at->tid : 0);
    }
    marks_[k] = std::move(mk);
  }
}

void StepTracker::emit_marked(Track& tr, const StepInference::KeyState& s, const Marks& m, uint64_t upto,
                              uint32_t tid) {
  while (tr.next_mark + 1 < m.boundaries.size() && m.boundaries[tr.next_mark + 1] <= upto) {
    const size_t i = tr.next_mark++;
    Event e;
    e.ts_ns = m.boundaries[i];
    e.dur_ns = m.boundaries[i + 1] - m.boundaries[i];
    e.source = Source::kStep;
    e.pid = s.pid;
    e.rank = s.rank;
    e.node = s.node;
    e.tid = m.tids[i + 1] ? m.tids[i + 1] : tid;
    e.arg0 = tr.ordinal++;
    e.flags = event_flags::kSynthetic;
    ready_.push_back(e);
  }
}

void StepTracker::flush(bool final, std::vector<Event>& out) {
  if (final) {
    inference_.for_each_key([&](uint64_t, const StepInference::KeyState& s) {
      if (s.user == UINT32_MAX) {
        s.user = static_cast<uint32_t>(tracks_.size());
        tracks_.emplace_back();
      }
      Track& tr = tracks_[s.user];
      if (tr.marked) {
        emit_marked(tr, s, marks_.at(uint64_t{s.node} << 32 | s.pid), UINT64_MAX, tr.last_tid);
        return;
      }
      // A confirmed lock is not judged again at the end (its steps went out already).
      if (s.markers > tr.tried_at && !tr.confirmed) judge(tr, s, true);
      if (!tr.locked) return;
      pull(tr, s);
      advance(tr, s, true, ready_);
    });
  }
  // In process and ordinal order, whatever the order in which processes settled them.
  std::sort(ready_.begin(), ready_.end(), [](const Event& a, const Event& b) {
    return std::tie(a.node, a.pid, a.rank, a.arg0) < std::tie(b.node, b.pid, b.rank, b.arg0);
  });
  out.insert(out.end(), ready_.begin(), ready_.end());
  ready_.clear();
}

size_t StepTracker::locked() const {
  size_t n = 0;
  for (const Track& tr : tracks_) n += tr.locked ? 1 : 0;
  return n;
}

}  // namespace ingero
