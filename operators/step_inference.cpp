#include "operators/step_inference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "model/ops.h"

namespace ingero {
namespace {

struct SyncOp {
  Source source;
  uint8_t op;
  const char* name;  // the API symbol a GPU engineer knows
  int cls;           // 0 blocking wait, 1 NCCL collective
};

constexpr std::array<SyncOp, StepInference::kSyncSlots> kSyncOps{{
    {Source::kCuda, op::kCudaStreamSync, "cudaStreamSynchronize", 0},
    {Source::kCuda, op::kCudaDeviceSync, "cudaDeviceSynchronize", 0},
    {Source::kCuda, op::kCudaEventSync, "cudaEventSynchronize", 0},
    {Source::kDriver, op::kCuCtxSynchronize, "cuCtxSynchronize", 0},
    {Source::kDriver, op::kCuStreamSynchronize, "cuStreamSynchronize", 0},
    {Source::kCuda, op::kCudaMemcpy, "cudaMemcpy", 0},
    {Source::kDriver, op::kCuMemcpy, "cuMemcpy", 0},
    {Source::kDriver, op::kCuMemcpyDtoH, "cuMemcpyDtoH", 0},
    {Source::kNccl, op::kNcclAllReduce, "ncclAllReduce", 1},
    {Source::kNccl, op::kNcclAllGather, "ncclAllGather", 1},
    {Source::kNccl, op::kNcclReduceScatter, "ncclReduceScatter", 1},
    {Source::kNccl, op::kNcclBroadcast, "ncclBroadcast", 1},
    {Source::kNccl, op::kNcclSend, "ncclSend", 1},
    {Source::kNccl, op::kNcclRecv, "ncclRecv", 1},
}};

constexpr int kClassBursts = 2;
constexpr double kMinShare = 0.8;

int sync_slot(Source s, uint8_t o) {
  for (size_t i = 0; i < kSyncOps.size(); ++i)
    if (kSyncOps[i].source == s && kSyncOps[i].op == o) return static_cast<int>(i);
  return -1;
}

bool is_launch(Source s, uint8_t o) {
  return (s == Source::kCuda && o == op::kCudaLaunchKernel) || (s == Source::kDriver && o == op::kCuLaunchKernel) ||
         (s == Source::kGraph && o == op::kGraphLaunch);
}

uint64_t burst_threshold(size_t j) {
  uint64_t t = StepInference::kBurstBaseNs;
  for (size_t i = 0; i < j; ++i) t *= 4;
  return t;
}

constexpr std::array<uint64_t, StepInference::kBurstLadder> kBurstThresholds = [] {
  std::array<uint64_t, StepInference::kBurstLadder> a{};
  uint64_t t = StepInference::kBurstBaseNs;
  for (auto& x : a) {
    x = t;
    t *= 4;
  }
  return a;
}();

uint64_t key_of(const Event& e) {
  return (static_cast<uint64_t>(e.node) << 48) | (static_cast<uint64_t>(static_cast<uint16_t>(e.rank)) << 32) | e.pid;
}

std::string fmt_dur(double ns) {
  char buf[48];
  if (ns >= 1e9) std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
  else if (ns >= 1e6) std::snprintf(buf, sizeof buf, "%.1f ms", ns / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f us", ns / 1e3);
  return buf;
}

double median_of(std::vector<double>& v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

uint64_t nearest_rank(std::vector<uint64_t> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto idx = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  idx = idx == 0 ? 0 : idx - 1;
  return v[std::min(idx, v.size() - 1)];
}

// One series judged: the chosen lag, its dispersion, the boundaries and what they give.
struct Candidate {
  bool ok = false;
  int cls = 0;
  size_t slot = 0;
  bool ends = true;
  size_t k = 0;
  double dispersion = std::numeric_limits<double>::infinity();
  double confidence = 0;
  uint64_t period = 0, p50 = 0, p99 = 0, count = 0;
  size_t steps = 0;
  std::vector<uint64_t> boundaries;
  std::string method;
};

// Whether some lag's k-step intervals may have MAD / median <= kMaxDispersion: at least
// floor(count / 2) + 1 of them within kMaxDispersion of their median (a margin of 1e-6 over it, so
// rounding never rejects what judge() would accept). When none may, judge() cannot accept the
// series, whatever else it computes: one selection per lag instead of two.
bool may_be_regular(const std::vector<uint64_t>& t, std::vector<double>& iv) {
  const size_t n = t.size();
  for (size_t k = 1; k <= StepInference::kMaxLag && (n - 1) / k >= StepInference::kMinSteps; ++k) {
    iv.clear();
    for (size_t i = 0; i + k < n; ++i) iv.push_back(static_cast<double>(t[i + k] - t[i]));
    const double m = median_of(iv);
    if (m <= 0) continue;
    const double lim = StepInference::kMaxDispersion * m * (1 + 1e-6);
    size_t near = 0;
    for (double x : iv) near += std::fabs(x - m) <= lim ? 1 : 0;
    if (near >= iv.size() / 2 + 1) return true;
  }
  return false;
}

// Judge one marker series: t sorted ascending, w the wait of each marker (aligned with t).
// `ok_only`: the caller reads only accepted candidates (StepInference::pick), so a series that
// cannot be accepted is left at once (k = 0), without the lag, dispersion and reason of it.
Candidate judge(const std::vector<uint64_t>& t, const std::vector<uint64_t>& w, uint64_t total, uint64_t key_span,
                bool ok_only = false) {
  Candidate c;
  const size_t n = t.size();
  if (n < StepInference::kMinSteps + 1) return c;
  if (ok_only) {
    // An upper bound of the confidence first: q, regular <= 1, the regular steps lie within
    // [t.front(), t.back()] (coverage), and there are at most n - 1 steps (size). Below
    // kMinConfidence (a margin of 1e-6 for rounding) nothing below can accept the series.
    const double span = static_cast<double>(t.back() - t.front());
    const double coverage = key_span ? std::min(1.0, 2.0 * span / static_cast<double>(key_span)) : 1.0;
    const double size = std::min(1.0, 0.5 + static_cast<double>(n - 1) / 40.0);
    if (coverage * size < StepInference::kMinConfidence * (1 - 1e-6)) return c;
    std::vector<double> scratch;
    if (!may_be_regular(t, scratch)) return c;
  }
  std::vector<double> disp(StepInference::kMaxLag + 1, std::numeric_limits<double>::infinity());
  std::vector<double> med(StepInference::kMaxLag + 1, 0), mad(StepInference::kMaxLag + 1, 0);
  std::vector<double> share(StepInference::kMaxLag + 1, 0);  // of the k-step intervals within 10% of their median
  std::vector<double> iv, dev;
  double best_norm = std::numeric_limits<double>::infinity();
  for (size_t k = 1; k <= StepInference::kMaxLag && (n - 1) / k >= StepInference::kMinSteps; ++k) {
    iv.clear();
    for (size_t i = 0; i + k < n; ++i) iv.push_back(static_cast<double>(t[i + k] - t[i]));
    const double m = median_of(iv);
    if (m <= 0) continue;
    dev.clear();
    for (double x : iv) dev.push_back(std::fabs(x - m));
    size_t near = 0;
    for (double x : dev) near += x <= 0.1 * m ? 1 : 0;
    share[k] = static_cast<double>(near) / static_cast<double>(dev.size());
    const double a = median_of(dev);
    med[k] = m;
    mad[k] = a;
    disp[k] = a / m;
    best_norm = std::min(best_norm, disp[k] * std::sqrt(static_cast<double>(k)));
  }
  if (!std::isfinite(best_norm)) return c;
  // The smallest lag whose k-step intervals are nearly all within 10% of their median; else (jitter
  // over 10%) the smallest whose normalised dispersion is near the best.
  size_t k = 0;
  for (size_t j = 1; j <= StepInference::kMaxLag && !k; ++j)
    if (std::isfinite(disp[j]) && share[j] >= kMinShare && disp[j] <= StepInference::kMaxDispersion) k = j;
  for (size_t j = 1; j <= StepInference::kMaxLag && !k; ++j)
    if (std::isfinite(disp[j]) && disp[j] * std::sqrt(static_cast<double>(j)) <= 1.5 * best_norm + 0.005) k = j;
  c.k = k;
  c.dispersion = disp[k];
  if (disp[k] > StepInference::kMaxDispersion) return c;

  // The period: the mean of the regular k-step intervals (within 3 scaled MADs of the median).
  const double tol_iv = std::max(3 * 1.4826 * mad[k], 0.005 * med[k]);
  double sum = 0;
  size_t used = 0;
  for (size_t i = 0; i + k < n; ++i) {
    const auto x = static_cast<double>(t[i + k] - t[i]);
    if (std::fabs(x - med[k]) <= tol_iv) {
      sum += x;
      ++used;
    }
  }
  const double period = used ? sum / static_cast<double>(used) : med[k];

  // The phase: the residue whose markers wait longest (median).
  size_t phase = 0;
  double best_wait = -1;
  for (size_t r = 0; r < k; ++r) {
    std::vector<double> ws;
    for (size_t i = r; i < n; i += k) ws.push_back(static_cast<double>(w[i]));
    const double mw = median_of(ws);
    if (mw > best_wait) {
      best_wait = mw;
      phase = r;
    }
  }

  // Track the boundaries from the first marker of that phase.
  const double tol = 0.2 * period;
  size_t i = phase;
  c.boundaries.push_back(t[i]);
  std::vector<uint64_t> step_times;
  size_t regular = 0;
  double regular_ns = 0;  // time covered by regular steps
  while (i + 1 < n) {
    size_t best = n;
    double best_err = std::numeric_limits<double>::infinity();
    // Over half a step's markers on (k = 2: not the very next one), so a pace that doubles
    // does not read as the same period with half the markers.
    for (size_t j = i + 1 + k / 2; j < n && j <= i + 2 * k; ++j) {
      const double err = std::fabs(static_cast<double>(t[j] - t[i]) - period);
      if (err < best_err) {
        best_err = err;
        best = j;
      }
    }
    size_t next = 0;
    if (best < n && best_err <= tol) {
      next = best;
      ++regular;
      regular_ns += static_cast<double>(t[next] - t[i]);
    } else if (i + k < n) {
      next = i + k;
    } else {
      break;
    }
    step_times.push_back(t[next] - t[i]);
    c.boundaries.push_back(t[next]);
    i = next;
  }
  c.steps = step_times.size();
  if (c.steps < StepInference::kMinSteps) return c;
  const double q = std::max(0.0, 1.0 - (c.dispersion / 0.2) * (c.dispersion / 0.2));
  const double reg = static_cast<double>(regular) / static_cast<double>(c.steps);
  const double coverage = key_span ? std::min(1.0, 2.0 * regular_ns / static_cast<double>(key_span)) : 1.0;
  const double size = std::min(1.0, 0.5 + static_cast<double>(c.steps) / 40.0);
  c.confidence = q * reg * coverage * size;
  c.period = static_cast<uint64_t>(std::llround(period));
  c.p50 = nearest_rank(step_times, 0.50);
  c.p99 = nearest_rank(step_times, 0.99);
  c.count = c.steps + (total > n ? (total - n) / k : 0);
  c.ok = c.confidence >= StepInference::kMinConfidence;
  return c;
}

// A series may change pace (warm-up, then training; a fast phase, then a starved one): judge it
// whole and its latest 2/3, 4/9, ... (at least kMinSteps + 1 markers); a shorter one replaces a
// longer one only when that was not accepted or when it is more confident by over 0.1. A suffix's
// count is its own steps.
Candidate judge_phases(const std::vector<uint64_t>& t, const std::vector<uint64_t>& w, uint64_t total,
                       uint64_t key_span, bool ok_only = false) {
  Candidate best = judge(t, w, total, key_span, ok_only);
  std::vector<uint64_t> ts, ws;
  for (size_t n = t.size() * 2 / 3; n >= StepInference::kMinSteps + 1; n = n * 2 / 3) {
    ts.assign(t.end() - static_cast<std::ptrdiff_t>(n), t.end());
    ws.assign(w.end() - static_cast<std::ptrdiff_t>(n), w.end());
    Candidate c = judge(ts, ws, n, key_span, ok_only);
    const bool c_better = c.ok != best.ok ? c.ok
                          : c.ok          ? c.confidence > best.confidence + 0.1
                                          : c.k && (!best.k || c.dispersion < best.dispersion);
    if (c_better) best = std::move(c);
  }
  return best;
}

// The series' markers in time order: (time, wait), by start or by end.
// `last`: only the newest `last` markers of the series.
void linearise(const StepInference::Series& s, bool ends, std::vector<uint64_t>& t, std::vector<uint64_t>& w,
               size_t last = StepInference::kMaxMarkers) {
  const size_t size = s.ts.size(), n = std::min(size, last);
  std::vector<std::pair<uint64_t, uint64_t>> m;
  m.reserve(n);
  for (size_t j = 0; j < n; ++j) {
    const size_t at = s.at(n, j);  // oldest first once the ring has wrapped
    m.emplace_back(ends ? s.ts[at] + s.dur[at] : s.ts[at], s.dur[at]);
  }
  std::sort(m.begin(), m.end());
  t.clear();
  w.clear();
  for (const auto& [a, b] : m) {
    t.push_back(a);
    w.push_back(b);
  }
}

bool better(const Candidate& a, const Candidate& b, double best_conf) {
  // Within 0.1 of the best confidence: class, ends before starts, more steps, smaller k, slot.
  const bool a_top = a.confidence >= best_conf - 0.1, b_top = b.confidence >= best_conf - 0.1;
  if (a_top != b_top) return a_top;
  if (!a_top) return a.confidence > b.confidence;
  if (a.cls != b.cls) return a.cls < b.cls;
  if (a.ends != b.ends) return a.ends;
  if (a.count != b.count) return a.count > b.count;
  if (a.k != b.k) return a.k < b.k;
  return a.slot < b.slot;
}

// Every series of a key judged: the accepted candidates (method set), the most regular rejected
// one (for the reason) and how many markers there were.
struct Judged {
  std::vector<Candidate> cands;
  Candidate closest;
  std::string closest_name;
  size_t markers = 0;
  // The best accepted candidate, or null.
  const Candidate* pick() const {
    if (cands.empty()) return nullptr;
    double best_conf = 0;
    for (const auto& c : cands) best_conf = std::max(best_conf, c.confidence);
    const Candidate* p = &cands[0];
    for (const auto& c : cands)
      if (better(c, *p, best_conf)) p = &c;
    return p;
  }
};

// `phases`: also judge the latest 2/3, 4/9, ... of each series (judge_phases); else only whole.
// `ok_only`: only the accepted candidates are wanted (StepInference::pick): a series that cannot be
// accepted is left early, and a series judged whole and rejected is not judged again until it has
// new markers (Series::rejected_total: with the same markers it stays rejected, since the key's
// span only grows and so its coverage only shrinks).
Judged judge_key(const StepInference::KeyState& s, size_t last = StepInference::kMaxMarkers, bool phases = true,
                 bool ok_only = false) {
  Judged j;
  const uint64_t key_span = s.last_ns > s.first_ns ? s.last_ns - s.first_ns : 0;
  std::vector<uint64_t> t, w;
  auto consider = [&](Candidate c, std::string name) {
    if (c.ok) {
      c.method = std::move(name);
      j.cands.push_back(std::move(c));
    } else if (c.k && (c.dispersion < j.closest.dispersion ||
                       (c.dispersion == j.closest.dispersion && c.confidence > j.closest.confidence))) {
      j.closest = std::move(c);
      j.closest_name = std::move(name);
    }
  };
  for (size_t i = 0; i < kSyncOps.size(); ++i) {
    const auto& series = s.sync[i];
    if (!series || series->ts.empty()) continue;
    j.markers += series->ts.size();
    for (const bool ends : {true, false}) {
      const bool cache = ok_only && !phases;
      if (cache && series->rejected_total[ends] == series->total && series->rejected_last[ends] == last) continue;
      linearise(*series, ends, t, w, last);
      Candidate c = phases ? judge_phases(t, w, series->total, key_span, ok_only)
                           : judge(t, w, series->total, key_span, ok_only);
      if (cache && !c.ok) {
        series->rejected_total[ends] = series->total;
        series->rejected_last[ends] = last;
      }
      c.cls = kSyncOps[i].cls;
      c.slot = i;
      c.ends = ends;
      std::string name = std::string(kSyncOps[i].name) + " x" + std::to_string(c.k) + (ends ? "" : " (call starts)");
      consider(std::move(c), std::move(name));
    }
  }
  for (size_t b = 0; b < s.bursts.size(); ++b) {
    const auto& series = s.bursts[b];
    if (!series || series->ts.empty()) continue;
    j.markers += series->ts.size();
    const bool cache = ok_only && !phases;
    if (cache && series->rejected_total[0] == series->total && series->rejected_last[0] == last) continue;
    linearise(*series, false, t, w, last);
    Candidate c = phases ? judge_phases(t, w, series->total, key_span, ok_only)
                         : judge(t, w, series->total, key_span, ok_only);
    if (cache && !c.ok) {
      series->rejected_total[0] = series->total;
      series->rejected_last[0] = last;
    }
    c.cls = kClassBursts;
    c.slot = kSyncOps.size() + b;
    c.ends = false;  // a burst start is its only time
    std::string name = "launch bursts x" + std::to_string(c.k) +
                       " (gap >= " + fmt_dur(static_cast<double>(burst_threshold(b))) + ")";
    consider(std::move(c), std::move(name));
  }
  return j;
}

ProcessSteps infer(const StepInference::KeyState& s) {
  ProcessSteps out;
  out.pid = s.pid;
  out.rank = s.rank;
  out.node = s.node;
  out.first_ns = s.first_ns;
  out.last_ns = s.last_ns;
  const uint64_t key_span = s.last_ns > s.first_ns ? s.last_ns - s.first_ns : 0;
  const Judged j = judge_key(s);
  if (const Candidate* pick = j.pick()) {
    out.count = pick->count;
    out.period_ns = pick->period;
    out.p50_ns = pick->p50;
    out.p99_ns = pick->p99;
    out.method = pick->method;
    out.confidence = std::round(pick->confidence * 1000.0) / 1000.0;
    out.boundaries = pick->boundaries;
    return out;
  }
  out.method = "none";
  if (j.markers == 0) {
    out.reason = "no synchronisation or kernel launch among its " + std::to_string(s.gpu_calls) + " GPU call(s)";
  } else if (!j.closest.k) {
    out.reason = "too few markers for " + std::to_string(StepInference::kMinSteps) + " steps (" +
                 std::to_string(j.markers) + " sync/launch-burst markers)";
  } else {
    char buf[160];
    std::snprintf(buf, sizeof buf, "no regular spacing (most regular: %s, dispersion %.2f, confidence %.2f)",
                  j.closest_name.c_str(), j.closest.dispersion, j.closest.confidence);
    out.reason = buf;
  }
  // The fallback: fixed intervals from the first GPU call, the last kMaxMarkers of them.
  out.fallback_interval_ns = StepInference::kFallbackIntervalNs;
  const uint64_t intervals = key_span / StepInference::kFallbackIntervalNs + 1;
  const uint64_t from = intervals > StepInference::kMaxMarkers ? intervals - StepInference::kMaxMarkers : 0;
  for (uint64_t g = from; g <= intervals; ++g)
    out.boundaries.push_back(s.first_ns + g * StepInference::kFallbackIntervalNs);
  return out;
}

// The (node, pid) a marker or a key belongs to.
uint64_t process_key(uint16_t node, uint32_t pid) { return (static_cast<uint64_t>(node) << 32) | pid; }

// Steps from the markers the program sent (the header's "Explicit markers win"): false when they
// make no complete step (fewer than two boundaries).
bool steps_from_markers(std::vector<StepMarker> m, ProcessSteps& out) {
  std::stable_sort(m.begin(), m.end(), [](const StepMarker& a, const StepMarker& b) { return a.ts_ns < b.ts_ns; });
  struct Boundary {
    uint64_t ts;
    int64_t epoch;  // -1 unknown
  };
  std::vector<Boundary> b;
  std::vector<int64_t> epochs;
  int64_t epoch = -1;
  bool prev = false;
  int64_t prev_step = -1;
  for (const StepMarker& x : m) {
    if (x.ts_ns == 0) continue;
    if (x.has_epoch && x.epoch >= 0) {
      epoch = x.epoch;
      epochs.push_back(x.epoch);
    }
    if (!x.has_step) continue;
    const bool repeat = prev && x.step >= 0 && x.step == prev_step;
    prev = true;
    prev_step = x.step;
    if (!repeat) b.push_back({x.ts_ns, epoch});
  }
  if (b.size() < 2) return false;
  const uint64_t total = b.size();
  if (b.size() > StepInference::kMaxMarkers) b.erase(b.begin(), b.end() - StepInference::kMaxMarkers);
  std::vector<uint64_t> times, all;
  for (size_t i = 1; i < b.size(); ++i) {
    all.push_back(b[i].ts - b[i - 1].ts);
    if (b[i].epoch == b[i - 1].epoch) times.push_back(all.back());
  }
  if (times.empty()) times = all;  // every step crossed an epoch: one step per epoch
  std::vector<double> v(times.begin(), times.end());
  const double med = median_of(v);
  std::vector<double> dev;
  dev.reserve(times.size());
  for (uint64_t t : times) dev.push_back(std::fabs(static_cast<double>(t) - med));
  const double tol = std::max(3 * 1.4826 * median_of(dev), 0.005 * med);
  double sum = 0;
  size_t used = 0;
  for (uint64_t t : times)
    if (std::fabs(static_cast<double>(t) - med) <= tol) {
      sum += static_cast<double>(t);
      ++used;
    }
  std::sort(epochs.begin(), epochs.end());
  out.count = total - 1;
  out.period_ns = static_cast<uint64_t>(std::llround(used ? sum / static_cast<double>(used) : med));
  out.p50_ns = nearest_rank(times, 0.50);
  out.p99_ns = nearest_rank(times, 0.99);
  out.method = "annotated (step)";
  out.reason.clear();
  out.confidence = 1;
  out.boundaries.clear();
  for (const Boundary& x : b) out.boundaries.push_back(x.ts);
  out.fallback_interval_ns = 0;
  out.epochs = static_cast<uint64_t>(std::unique(epochs.begin(), epochs.end()) - epochs.begin());
  return true;
}

}  // namespace

void StepInference::Series::add(uint64_t t, uint64_t d, uint32_t thread) {
  if (total == 0) first_ts = t;
  ++total;
  if (ts.size() < kMaxMarkers) {
    ts.push_back(t);
    dur.push_back(d);
    tid.push_back(thread);
    return;
  }
  ts[head] = t;
  dur[head] = d;
  tid[head] = thread;
  head = (head + 1) % kMaxMarkers;
}

StepInference::Pick StepInference::pick(const KeyState& s, size_t last) {
  Pick p;
  // Judging only the newest markers already looks at the latest phase: no suffixes then.
  const Judged j = judge_key(s, last, last >= kMaxMarkers, true);
  const Candidate* c = j.pick();
  if (!c || c->boundaries.empty()) return p;
  p.ok = true;
  p.slot = c->slot;
  p.ends = c->ends;
  p.k = c->k;
  p.period = c->period;
  p.confidence = c->confidence;
  p.first_boundary = c->boundaries.front();
  p.method = c->method;
  return p;
}

std::vector<uint64_t> StepInference::marker_boundaries(std::span<const StepMarker> markers) {
  ProcessSteps p;
  if (!steps_from_markers(std::vector<StepMarker>(markers.begin(), markers.end()), p)) return {};
  return p.boundaries;
}

StepInference::StepInference() = default;
StepInference::~StepInference() = default;

StepInference::KeyState& StepInference::state(const Event& e) {
  const uint64_t k = key_of(e);
  if (k == last_key_ && last_state_) return *last_state_;
  // Processes interleave in time: a small direct-mapped cache before the map.
  auto& c = cache_[(k * 0x9E3779B97F4A7C15ull) >> 58];
  if (c.second && c.first == k) {
    last_key_ = k;
    last_state_ = c.second;
    return *c.second;
  }
  auto& slot = keys_[k];
  if (!slot) {
    slot = std::make_unique<KeyState>();
    slot->pid = e.pid;
    slot->rank = e.rank;
    slot->node = e.node;
  }
  last_key_ = k;
  last_state_ = slot.get();
  c = {k, slot.get()};
  return *slot;
}

void StepInference::evict(uint64_t now) {
  constexpr uint64_t kGraceNs = 5'000'000'000;  // late events of the process have had this to come
  std::set<uint64_t> procs;
  size_t kept = 0;
  for (const auto& x : exits_) {
    if (x.second + kGraceNs < now) procs.insert(x.first);
    else exits_[kept++] = x;
  }
  exits_.resize(kept);
  if (procs.empty()) return;
  {
    std::lock_guard<std::mutex> lk(markers_mu_);
    for (auto it = procs.begin(); it != procs.end();) it = markers_.count(*it) ? procs.erase(it) : std::next(it);
  }
  std::vector<uint64_t> gone;
  for (const auto& [k, s] : keys_)
    if (procs.count(process_key(s->node, s->pid))) gone.push_back(k);
  if (gone.empty()) return;
  std::sort(gone.begin(), gone.end());  // judged in key order: the same whatever the map's order
  for (uint64_t k : gone) {
    const KeyState* s = keys_.at(k).get();
    finished_.push_back(infer(*s));
    for (auto it = launcher_.begin(); it != launcher_.end();)
      it = it->second == s ? launcher_.erase(it) : std::next(it);
    for (auto& c : cache_)
      if (c.second == s) c = {};
    if (last_state_ == s) {
      last_state_ = nullptr;
      last_key_ = UINT64_MAX;
    }
    keys_.erase(k);
  }
  while (finished_.size() > max_finished_) {
    finished_.pop_front();
    ++finished_dropped_;
  }
}

void StepInference::observe(const Event* events, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const Event& e = events[i];
    if (!is_gpu_api(e.source)) {
      if (evict_ && e.source == Source::kHost && e.op == op::kProcessExit && e.pid == e.tid) [[unlikely]]
        exits_.emplace_back(process_key(e.node, e.pid), e.ts_ns);
      // The launching thread preempted after its last launch: that time is no launch gap.
      if (e.source == Source::kHost && e.op == op::kSchedSwitch && e.prev_state == OffCpuState::kPreempted &&
          e.dur_ns > 0)
        if (auto it = launcher_.find((uint64_t{e.node} << 32) | e.tid); it != launcher_.end()) {
          KeyState& ks = *it->second;
          if (ks.last_launch_tid == e.tid && e.ts_ns >= ks.last_launch) ks.preempted_since += e.dur_ns;
        }
      continue;
    }
    KeyState& s = state(e);
    ++s.gpu_calls;
    s.first_ns = std::min(s.first_ns, e.ts_ns);
    s.last_ns = std::max(s.last_ns, e.end_ns());
    if (is_launch(e.source, e.op)) {
      uint64_t gap = s.launched && e.ts_ns > s.last_launch ? e.ts_ns - s.last_launch : 0;
      gap = gap > s.preempted_since ? gap - s.preempted_since : 0;
      s.preempted_since = 0;
      if (s.last_launch_tid != e.tid) {
        s.last_launch_tid = e.tid;
        launcher_[(uint64_t{e.node} << 32) | e.tid] = &s;
      }
      for (size_t j = 0; j < kBurstLadder; ++j) {
        if (s.launched && gap < kBurstThresholds[j]) break;  // the thresholds grow: none further
        auto& series = s.bursts[j];
        if (!series) series = std::make_unique<Series>();
        series->add(e.ts_ns, gap, e.tid);
        ++s.markers;
      }
      s.launched = true;
      s.last_launch = std::max(s.last_launch, e.ts_ns);
      continue;
    }
    const int slot = sync_slot(e.source, e.op);
    if (slot < 0) continue;
    auto& series = s.sync[static_cast<size_t>(slot)];
    if (!series) series = std::make_unique<Series>();
    series->add(e.ts_ns, e.dur_ns, e.tid);
    ++s.markers;
  }
  if (evict_ && !exits_.empty() && n > 0) evict(events[n - 1].ts_ns);
}

void StepInference::add_markers(std::span<const StepMarker> markers) {
  std::lock_guard<std::mutex> lk(markers_mu_);
  for (const StepMarker& m : markers) markers_[process_key(m.node, m.pid)].push_back(m);
}

std::vector<ProcessSteps> StepInference::results() const {
  // The processes whose own markers make at least one step: they win over the inference.
  std::map<uint64_t, ProcessSteps> annotated;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> marker_span;  // first, last marker
  {
    std::lock_guard<std::mutex> lk(markers_mu_);
    for (const auto& [k, v] : markers_) {
      ProcessSteps p;
      if (!steps_from_markers(v, p)) continue;
      uint64_t lo = UINT64_MAX, hi = 0;
      for (const StepMarker& m : v)
        if (m.ts_ns) lo = std::min(lo, m.ts_ns), hi = std::max(hi, m.ts_ns);
      marker_span[k] = {lo, hi};
      annotated.emplace(k, std::move(p));
    }
  }
  std::vector<const KeyState*> states;
  states.reserve(keys_.size());
  for (const auto& [k, s] : keys_) states.push_back(s.get());
  std::vector<ProcessSteps> out;
  out.reserve(states.size() + annotated.size());
  std::set<uint64_t> used;
  for (const KeyState* s : states) {
    const uint64_t pk = process_key(s->node, s->pid);
    auto it = annotated.find(pk);
    if (it == annotated.end()) {
      out.push_back(infer(*s));
      continue;
    }
    ProcessSteps p = it->second;
    p.pid = s->pid;
    p.rank = s->rank;
    p.node = s->node;
    p.first_ns = s->first_ns;
    p.last_ns = s->last_ns;
    out.push_back(std::move(p));
    used.insert(pk);
  }
  for (const ProcessSteps& f : finished_) {  // judged at exit; markers handed over later still win
    const uint64_t pk = process_key(f.node, f.pid);
    auto it = annotated.find(pk);
    if (it == annotated.end()) {
      out.push_back(f);
      continue;
    }
    ProcessSteps p = it->second;
    p.pid = f.pid;
    p.rank = f.rank;
    p.node = f.node;
    p.first_ns = f.first_ns;
    p.last_ns = f.last_ns;
    out.push_back(std::move(p));
    used.insert(pk);
  }
  for (auto& [k, p] : annotated) {
    if (used.count(k)) continue;
    p.pid = static_cast<uint32_t>(k & 0xffffffffu);
    p.node = static_cast<uint16_t>(k >> 32);
    p.rank = -1;
    p.first_ns = marker_span[k].first;
    p.last_ns = marker_span[k].second;
    out.push_back(p);
  }
  std::sort(out.begin(), out.end(), [](const ProcessSteps& a, const ProcessSteps& b) {
    if (a.node != b.node) return a.node < b.node;
    if (a.pid != b.pid) return a.pid < b.pid;
    return a.rank < b.rank;
  });
  return out;
}

void StepInference::finish(const TraceMeta& /*meta*/, AnalysisResult& result) {
  auto steps = results();
  result.steps.insert(result.steps.end(), std::make_move_iterator(steps.begin()), std::make_move_iterator(steps.end()));
}

}  // namespace ingero
