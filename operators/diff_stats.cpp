// The statistics of `ingero-pipeline diff` (operators/diff_stats.h).
#include "operators/diff_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

#include "model/ops.h"

namespace ingero::diff {
namespace {

double nearest_rank(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

std::array<uint64_t, acct::kBuckets> buckets_of(const ThreadAccounting& t) {
  std::array<uint64_t, acct::kBuckets> b{};
  auto call = [&t](const char* k) {
    const auto it = t.in_calls_ns.find(k);
    return it == t.in_calls_ns.end() ? 0 : it->second;
  };
  auto blocked = [&t](const char* k) {
    const auto it = t.blocked_ns.find(k);
    return it == t.blocked_ns.end() ? 0 : it->second;
  };
  b[acct::kPreempted] = t.preempted_ns;
  b[acct::kLaunch] = call("launch");
  b[acct::kCopy] = call("copy");
  b[acct::kSync] = call("sync");
  b[acct::kAlloc] = call("alloc");
  b[acct::kCollective] = call("collective");
  b[acct::kOtherCall] = call("other");
  b[acct::kOnCpu] = t.on_cpu_ns;
  b[acct::kLock] = blocked("lock");
  b[acct::kIo] = blocked("io");
  b[acct::kNetwork] = blocked("network");
  b[acct::kSleep] = blocked("sleep");
  b[acct::kBlockedOther] = blocked("other");
  b[acct::kUnknown] = t.unknown_ns;
  return b;
}

std::string process_name(const AnalysisResult& r, uint32_t pid) {
  const auto it = r.meta.process_names.find(pid);
  return it == r.meta.process_names.end() ? "" : it->second;
}

// The thread of `pid` with the most time inside GPU calls; null when the pid has none.
const ThreadAccounting* main_thread(const AnalysisResult& r, uint32_t pid) {
  const ThreadAccounting* best = nullptr;
  for (const auto& t : r.accounting)
    if (t.pid == pid && (!best || t.in_calls_total() > best->in_calls_total())) best = &t;
  return best;
}

uint32_t focus_pid(const AnalysisResult& r) {
  const ThreadAccounting* best = nullptr;
  for (const auto& t : r.accounting)
    if (!best || t.in_calls_total() > best->in_calls_total()) best = &t;
  return best ? best->pid : 0;
}

// The same process on the other side: by name, else by pid, else that side's own focus.
uint32_t matching_pid(const AnalysisResult& other, const std::string& name, uint32_t pid) {
  // The same pid under the same name first: the ranks of a merged fleet trace share one name.
  for (const auto& t : other.accounting)
    if (t.pid == pid && process_name(other, t.pid) == name) return pid;
  if (!name.empty())
    for (const auto& t : other.accounting)
      if (process_name(other, t.pid) == name) return t.pid;
  for (const auto& t : other.accounting)
    if (t.pid == pid) return pid;
  return focus_pid(other);
}

const ProcessSteps* steps_of(const AnalysisResult& r, uint32_t pid) {
  const ProcessSteps* best = nullptr;
  for (const auto& s : r.steps)
    if (s.pid == pid && (!best || (s.period_ns > 0 && (best->period_ns == 0 || s.count > best->count)))) best = &s;
  return best;
}

std::vector<double> step_times(const ProcessSteps* s) {
  std::vector<double> v;
  if (!s || s->period_ns == 0) return v;
  for (size_t i = 1; i < s->boundaries.size(); ++i)
    v.push_back(static_cast<double>(s->boundaries[i] - s->boundaries[i - 1]));
  return v;
}

// Per whole second of the thread (first and last dropped: partial), each bucket's share.
std::vector<std::array<double, acct::kBuckets>> second_shares(const AnalysisResult& r, const ThreadAccounting* t,
                                                              bool fold) {
  std::vector<std::array<double, acct::kBuckets>> out;
  if (!t) return out;
  for (const auto& s : r.accounting_series) {
    if (s.tid != t->tid || s.node != t->node) continue;
    for (size_t i = 1; i + 1 < s.bins.size(); ++i) {
      const uint64_t sum = std::accumulate(s.bins[i].begin(), s.bins[i].end(), uint64_t{0});
      if (sum == 0) continue;
      std::array<double, acct::kBuckets> sh{};
      for (size_t b = 0; b < acct::kBuckets; ++b) sh[b] = static_cast<double>(s.bins[i][b]) / static_cast<double>(sum);
      if (fold) {
        sh[acct::kUnknown] += sh[acct::kOnCpu];
        sh[acct::kOnCpu] = 0;
      }
      out.push_back(sh);
    }
  }
  return out;
}

// `fold`: one side has scheduler data and the other not, so on CPU there is unknown here.
std::array<double, acct::kBuckets> per_unit(const ThreadAccounting* t, double unit_ns, bool fold) {
  std::array<double, acct::kBuckets> out{};
  if (!t || t->wall_ns == 0) return out;
  auto b = buckets_of(*t);
  if (fold) {
    b[acct::kUnknown] += b[acct::kOnCpu];
    b[acct::kOnCpu] = 0;
  }
  for (size_t i = 0; i < acct::kBuckets; ++i)
    out[i] = static_cast<double>(b[i]) / static_cast<double>(t->wall_ns) * unit_ns;
  return out;
}

std::string op_kind(Source s, uint8_t op) {
  if (s == Source::kNccl) return "collective";
  std::string n = op_name(s, op);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (n.find("memcpy") != std::string::npos) return "copy";  // before "sync": cudaMemcpyAsync
  if (n.find("sync") != std::string::npos) return "sync";
  if (n.find("launch") != std::string::npos) return "launch";
  if (n.find("alloc") != std::string::npos || n.find("free") != std::string::npos) return "alloc";
  return "other_call";
}

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", x * 100);
  return buf;
}

std::string pvalue(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, p < 0.0001 ? "p<0.0001" : "p=%.4f", p);
  return buf;
}

std::string signed_ns(double ns) { return (ns < 0 ? "-" : "+") + format_ns(std::fabs(ns)); }

// What a change in bucket `b` means, and its category.
std::pair<std::string, std::string> cause_name(uint8_t b, const ThreadAccounting* after,
                                               const ThreadAccounting* before) {
  switch (b) {
    case acct::kPreempted: {
      const ThreadAccounting* t = after && !after->preempted_by.empty() ? after : before;
      std::string who;
      if (t && !t->preempted_by.empty()) {
        const auto& p = t->preempted_by.front();
        who = " by " + (p.comm.empty() ? "tid " + std::to_string(p.tid) : p.comm);
        if (p.pid) who += " (pid " + std::to_string(p.pid) + ")";
      }
      return {"CPU contention" + who, "cpu_contention"};
    }
    case acct::kLock: return {"input wait (blocked on a lock)", "input_starvation"};
    case acct::kIo: return {"input wait (blocked on disk I/O)", "input_starvation"};
    case acct::kNetwork: return {"input wait (blocked on the network)", "input_starvation"};
    case acct::kSleep: return {"sleeping (timers)", "input_starvation"};
    case acct::kBlockedOther: return {"input wait (blocked, reason unknown)", "input_starvation"};
    case acct::kSync:
      return {"waiting for the GPU (synchronisations: longer kernels or added device-to-host syncs)", "gpu_bound"};
    case acct::kLaunch: return {"host API time launching kernels", "host_api"};
    case acct::kCopy: return {"host API time in memory copies", "host_api"};
    case acct::kAlloc: return {"host API time allocating GPU memory", "host_api"};
    case acct::kOtherCall: return {"host API time in other GPU calls", "host_api"};
    case acct::kCollective: return {"collectives (waiting for peers or the network)", "collective"};
    case acct::kOnCpu: return {"host compute between GPU calls", "host_compute"};
    default: return {"time the trace cannot place (no scheduler state)", "unknown"};
  }
}

// The cause category a chain is evidence for ("" for none).
std::string chain_cause_category(const ChainRow& c) {
  if (c.category == "cpu_contention" || c.rule.find("preempt") != std::string::npos) return "cpu_contention";
  // The rule pack's category where one exists (rules/time.rules input_wait: input_starvation).
  if (c.category == "blocking" || c.category == "input_starvation" || c.rule.find("input") != std::string::npos)
    return "input_starvation";
  if (c.category == "block_io") return "input_starvation";
  return c.category;
}

std::vector<ChainRow> chain_rows(const AnalysisResult& b, const AnalysisResult& a) {
  std::map<std::tuple<std::string, std::string, std::string, std::string>, ChainRow> rows;
  auto add = [&rows](const AnalysisResult& r, bool after) {
    for (const auto& c : r.chains) {
      const std::string proc = process_name(r, c.pid);
      const std::string thr = c.threads.empty() ? "" : c.threads.front().name;
      ChainRow& row = rows[{c.rule, c.category, proc, thr}];
      row.rule = c.rule;
      row.category = c.category;
      row.process = proc;
      row.thread = thr;
      const uint64_t len = c.window_end > c.window_start ? c.window_end - c.window_start : 0;
      (after ? row.after : row.before) += 1;
      (after ? row.after_ns : row.before_ns) += len;
    }
  };
  add(b, false);
  add(a, true);
  std::vector<ChainRow> out;
  for (auto& [k, r] : rows) {
    if (r.before == 0) r.change = "appeared";
    else if (r.after == 0) r.change = "vanished";
    else if (r.after_ns * 4 > r.before_ns * 5 || r.after * 4 > r.before * 5) r.change = "grew";
    else if (r.before_ns * 4 > r.after_ns * 5 || r.before * 4 > r.after * 5) r.change = "shrank";
    else r.change = "same";
    out.push_back(std::move(r));
  }
  return out;
}

// Incidents side by side (contract: IncidentRow in the header).
std::vector<IncidentRow> incident_rows(const DiffSide& before, const DiffSide& after, double unit_b, double unit_a,
                                       const DiffOptions& opt) {
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string, int>;
  std::map<Key, IncidentRow> rows;
  std::map<Key, std::pair<bool, bool>> material;  // a MEDIUM/HIGH incident before, after
  std::map<Key, std::pair<int, int>> worst_sev;   // the worst severity before, after (-1: none)
  auto add = [&](const DiffSide& side, bool is_after, double unit) {
    const AnalysisResult& r = *side.result;
    const double wall = std::max<double>(1, static_cast<double>(side.wall_ns));
    const uint64_t t0 = r.meta.first_ts;
    for (const Incident& in : r.incidents) {
      std::string thread;
      if (auto it = r.meta.thread_names.find(in.tid); in.tid && it != r.meta.thread_names.end()) thread = it->second;
      for (const auto& t : r.accounting)
        if (thread.empty() && t.tid == in.tid && t.pid == in.pid && t.node == in.node) thread = t.comm;
      const std::string node = r.meta.nodes.size() > 1 && in.node < r.meta.nodes.size() ? r.meta.nodes[in.node] : "";
      std::string process = process_name(r, in.pid);
      if (process.empty() && in.pid) process = "pid " + std::to_string(in.pid);
      const Key key{in.rule, in.category, process, thread, node, in.rank};
      IncidentRow& row = rows[key];
      worst_sev.try_emplace(key, -1, -1);
      row.rule = in.rule;
      row.category = in.category;
      row.process = process;
      row.thread = thread;
      row.node = node;
      row.rank = in.rank;
      auto& worst = is_after ? worst_sev[key].second : worst_sev[key].first;
      worst = std::max(worst, static_cast<int>(in.severity));
      (is_after ? row.after_severity : row.before_severity) = severity_name(static_cast<Severity>(worst));
      (is_after ? row.after_count : row.before_count) += 1;
      (is_after ? row.after_lost_ns : row.before_lost_ns) += in.lost_ns;
      (is_after ? row.after_ns : row.before_ns) += static_cast<double>(in.lost_ns) / wall * unit;
      if (in.severity >= Severity::kMedium) (is_after ? material[key].second : material[key].first) = true;
      const auto rel = [t0](uint64_t ts) { return static_cast<double>(ts > t0 ? ts - t0 : 0) / 1e9; };
      char span[96];
      std::snprintf(span, sizeof span, " +%.1fs .. +%.1fs", rel(in.start_ns), rel(in.end_ns));
      row.evidence.push_back(std::string(is_after ? "after: " : "before: ") + severity_name(in.severity) + span +
                             ", lost " + format_ns(static_cast<double>(in.lost_ns)) +
                             (in.lost_ns ? "" : " (not measured for this kind)") + ": " + in.summary);
    }
  };
  add(before, false, unit_b);
  add(after, true, unit_a);
  std::vector<IncidentRow> out;
  for (auto& [k, r] : rows) {
    const auto [was, is] = material[k];
    if (!was && !is) continue;
    const double d = r.after_ns - r.before_ns;
    const bool effect = std::fabs(d) >= opt.min_effect * unit_b &&
                        std::fabs(d) >= static_cast<double>(opt.min_effect_ns);
    if (!was) r.change = "appeared";
    else if (!is) r.change = "vanished";
    else if (effect && r.after_ns > 1.25 * r.before_ns) r.change = "grew";
    else if (effect && r.before_ns > 1.25 * r.after_ns) r.change = "shrank";
    else r.change = "same";
    out.push_back(std::move(r));
  }
  auto rank = [](const std::string& c) {
    return c == "appeared" ? 0 : c == "grew" ? 1 : c == "vanished" ? 2 : c == "shrank" ? 3 : 4;
  };
  std::stable_sort(out.begin(), out.end(), [&](const IncidentRow& x, const IncidentRow& y) {
    if (rank(x.change) != rank(y.change)) return rank(x.change) < rank(y.change);
    return std::fabs(x.after_ns - x.before_ns) > std::fabs(y.after_ns - y.before_ns);
  });
  return out;
}

// Stragglers named on AFTER (both sides merged fleet traces): a cause each, put first, with the
// focus thread's buckets it explains marked (contract in the header).
void add_straggler_causes(const DiffSide& before, const DiffSide& after, const ThreadAccounting* focus,
                          const DiffOptions& opt, double unit_b, DiffReport& rep) {
  if (!before.fleet || !after.fleet) return;
  std::vector<Cause> found;
  for (const RankStraggler& g : after.stragglers) {
    auto cost = [](const RankStraggler& x) { return x.cost_share * static_cast<double>(x.step_ns); };
    double was = 0;
    for (const RankStraggler& b : before.stragglers)
      if (b.rank == g.rank && b.node == g.node) was = cost(b);
    Cause c;
    c.category = "straggler";
    c.after_ns = cost(g);
    c.before_ns = was;
    c.added_ns = c.after_ns - c.before_ns;
    c.what = "rank " + std::to_string(g.rank) + " (" + g.node + ") arriving late at the collectives";
    c.significant = c.added_ns >= opt.min_effect * unit_b && c.added_ns >= static_cast<double>(opt.min_effect_ns);
    c.p = std::numeric_limits<double>::quiet_NaN();  // named by the straggler rules, not by a U test
    char buf[320];
    if (g.last_share >= 0)
      std::snprintf(buf, sizeof buf,
                    "after: rank %d arrived last in %.0f%% of %llu steps, a median %s late, costing the job %.1f%% of "
                    "its %s step (arrival order on the corrected clock)",
                    g.rank, g.last_share * 100, static_cast<unsigned long long>(g.collectives),
                    format_ns(static_cast<double>(g.median_lag_ns)).c_str(), g.cost_share * 100,
                    format_ns(static_cast<double>(g.step_ns)).c_str());
    else
      std::snprintf(buf, sizeof buf,
                    "after: rank %d waits a median %s less than the other ranks at the collectives (clocks cannot "
                    "order arrivals: the wait-least signal)",
                    g.rank, format_ns(static_cast<double>(g.median_lag_ns)).c_str());
    c.evidence.emplace_back(buf);
    c.evidence.push_back(was > 0 ? "before: the same rank cost " + format_ns(was) + " per step"
                                 : "before: no straggling rank");
    if (c.significant && focus) {
      const bool focus_is_late = focus->rank >= 0 ? focus->rank == g.rank : g.pid != 0 && focus->pid == g.pid;
      for (Cause& other : rep.causes) {
        if (!other.explained_by.empty() || other.bucket.empty() || !(other.added_ns > 0)) continue;
        const bool wait = other.bucket == acct::bucket_name(acct::kSync) ||
                          other.bucket == acct::bucket_name(acct::kCollective);
        if (focus_is_late == wait) continue;  // the late rank computes longer; the others wait longer
        other.explained_by = c.what;
        c.evidence.push_back(std::string(focus_is_late ? "on rank " : "the ranks wait: on ") + focus->comm +
                             " (the focus thread) " + other.bucket + " " + signed_ns(other.added_ns) + " per step");
      }
    }
    found.push_back(std::move(c));
  }
  std::stable_sort(found.begin(), found.end(), [](const Cause& x, const Cause& y) { return x.added_ns > y.added_ns; });
  // Significant stragglers first (they explain the waits of everyone else), the rest after.
  auto sig_end = std::stable_partition(found.begin(), found.end(), [](const Cause& c) { return c.significant; });
  rep.causes.insert(rep.causes.begin(), std::make_move_iterator(found.begin()), std::make_move_iterator(sig_end));
  rep.causes.insert(rep.causes.end(), std::make_move_iterator(sig_end), std::make_move_iterator(found.end()));
  if (after.stragglers.empty()) rep.notes.emplace_back("merged fleet traces: no straggling rank on the AFTER side");
}

}  // namespace

std::string format_ns(double ns) {
  char buf[48];
  if (ns >= 1e9) std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
  else if (ns >= 1e6) std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
  else if (ns >= 1e3) std::snprintf(buf, sizeof buf, "%.0f us", ns / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  return buf;
}

UTest mann_whitney(std::span<const double> a, std::span<const double> b) {
  UTest t;
  t.n1 = a.size();
  t.n2 = b.size();
  if (t.n1 < 3 || t.n2 < 3) return t;
  std::vector<std::pair<double, int>> all;
  all.reserve(t.n1 + t.n2);
  for (double x : a) all.emplace_back(x, 0);
  for (double x : b) all.emplace_back(x, 1);
  std::sort(all.begin(), all.end());
  const auto n = static_cast<double>(all.size());
  double rank_a = 0, ties = 0;
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j].first == all[i].first) ++j;
    const double avg = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;  // ranks i+1..j
    for (size_t k = i; k < j; ++k)
      if (all[k].second == 0) rank_a += avg;
    const auto tn = static_cast<double>(j - i);
    ties += tn * tn * tn - tn;
    i = j;
  }
  const auto n1 = static_cast<double>(t.n1), n2 = static_cast<double>(t.n2);
  t.u = rank_a - n1 * (n1 + 1) / 2;
  const double mu = n1 * n2 / 2;
  const double var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)));
  if (var <= 0) return t;     // every value equal
  const double d = mu - t.u;  // > 0: b larger
  const double corrected = std::max(0.0, std::fabs(d) - 0.5);
  t.z = std::copysign(corrected / std::sqrt(var), d);
  t.p = std::erfc(std::fabs(t.z) / std::sqrt(2.0));
  return t;
}

UTest welch(std::span<const double> a, std::span<const double> b) {
  UTest t;
  t.n1 = a.size();
  t.n2 = b.size();
  if (t.n1 < 3 || t.n2 < 3) return t;
  auto moments = [](std::span<const double> v) {
    const double n = static_cast<double>(v.size());
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
    double ss = 0;
    for (double x : v) ss += (x - mean) * (x - mean);
    return std::pair{mean, ss / (n - 1)};
  };
  const auto [ma, va] = moments(a);
  const auto [mb, vb] = moments(b);
  const double se = std::sqrt(va / static_cast<double>(t.n1) + vb / static_cast<double>(t.n2));
  if (!(se > 0)) return t;
  t.z = (mb - ma) / se;
  t.p = std::erfc(std::fabs(t.z) / std::sqrt(2.0));
  return t;
}

DiffReport compare(const DiffSide& before, const DiffSide& after, const DiffOptions& opt) {
  DiffReport rep;
  const AnalysisResult& rb = *before.result;
  const AnalysisResult& ra = *after.result;
  const uint32_t pid_b = focus_pid(rb);
  const std::string name_b = process_name(rb, pid_b);
  const uint32_t pid_a = matching_pid(ra, name_b, pid_b);
  const ThreadAccounting* tb = main_thread(rb, pid_b);
  const ThreadAccounting* ta = nullptr;
  if (tb)  // the same thread by name, else the process's main thread
    for (const auto& t : ra.accounting)
      if (t.pid == pid_a && !tb->comm.empty() && t.comm == tb->comm &&
          (!ta || t.in_calls_total() > ta->in_calls_total()))
        ta = &t;
  if (!ta) ta = main_thread(ra, pid_a);
  const ProcessSteps* sb = steps_of(rb, pid_b);
  const ProcessSteps* sa = steps_of(ra, pid_a);
  const bool steps = sb && sa && sb->period_ns > 0 && sa->period_ns > 0;
  const bool fold = tb && ta && tb->scheduler_data != ta->scheduler_data;
  rep.unit = steps ? "step" : "second";
  auto summarise = [&](SideSummary& s, const DiffSide& side, const AnalysisResult& r, uint32_t pid,
                       const ThreadAccounting* t, const ProcessSteps* st) {
    s.label = side.label;
    s.pid = pid;
    s.process = process_name(r, pid);
    s.wall_ns = side.wall_ns;
    if (t) {
      s.thread = t->comm;
      s.tid = t->tid;
    }
    if (st) {
      s.has_steps = st->period_ns > 0;
      s.period_ns = st->period_ns;
      // The mean step time, slow steps included (the period leaves them out): what a job's
      // throughput follows. From the boundaries kept (the latest steps), else the period.
      s.step_ns = st->period_ns;
      if (s.has_steps && st->boundaries.size() >= 2)
        s.step_ns = (st->boundaries.back() - st->boundaries.front()) / (st->boundaries.size() - 1);
      s.p50_ns = st->p50_ns;
      s.p99_ns = st->p99_ns;
      s.steps = st->count;
      s.method = st->method;
    }
    s.per_unit = per_unit(t, steps ? static_cast<double>(s.step_ns) : 1e9, fold);
  };
  summarise(rep.before, before, rb, pid_b, tb, sb);
  summarise(rep.after, after, ra, pid_a, ta, sa);
  const double unit_b = steps ? static_cast<double>(rep.before.step_ns) : 1e9;
  const double unit_a = steps ? static_cast<double>(rep.after.step_ns) : 1e9;

  if (steps) {
    rep.delta_ns = static_cast<double>(rep.after.step_ns) - static_cast<double>(rep.before.step_ns);
    rep.delta_pct = rep.delta_ns / static_cast<double>(rep.before.step_ns);
    const auto xb = step_times(sb), xa = step_times(sa);
    rep.step_p = std::min(1.0, 2 * std::min(mann_whitney(xb, xa).p, welch(xb, xa).p));  // Bonferroni over the two
    rep.step_significant = rep.step_p < opt.alpha && std::fabs(rep.delta_ns) >= opt.min_effect * unit_b &&
                           std::fabs(rep.delta_ns) >= static_cast<double>(opt.min_effect_ns);
  }

  // Ops: latency distributions and calls per unit.
  std::map<std::pair<Source, uint8_t>, std::pair<const OpSample*, const OpSample*>> ops;
  for (const auto& o : before.ops) ops[{o.source, o.op}].first = &o;
  for (const auto& o : after.ops) ops[{o.source, o.op}].second = &o;
  const double wall_b = std::max<double>(1, static_cast<double>(before.wall_ns));
  const double wall_a = std::max<double>(1, static_cast<double>(after.wall_ns));
  for (const auto& [key, pair] : ops) {
    OpRow row;
    row.op = op_name(key.first, key.second);
    row.kind = op_kind(key.first, key.second);
    static const std::vector<double> kNone;
    const auto& db = pair.first ? pair.first->durations_ns : kNone;
    const auto& da = pair.second ? pair.second->durations_ns : kNone;
    row.before_count = pair.first ? pair.first->count : 0;
    row.after_count = pair.second ? pair.second->count : 0;
    row.before_per_unit = static_cast<double>(row.before_count) / wall_b * unit_b;
    row.after_per_unit = static_cast<double>(row.after_count) / wall_a * unit_a;
    row.before_p50 = nearest_rank(db, 0.5);
    row.after_p50 = nearest_rank(da, 0.5);
    row.before_p99 = nearest_rank(db, 0.99);
    row.after_p99 = nearest_rank(da, 0.99);
    row.p = mann_whitney(db, da).p;
    row.median_change = row.before_p50 > 0 ? (row.after_p50 - row.before_p50) / row.before_p50 : 0;
    row.significant = row.p < opt.op_alpha && std::fabs(row.median_change) >= opt.min_op_shift;
    rep.ops.push_back(std::move(row));
  }
  std::stable_sort(rep.ops.begin(), rep.ops.end(),
                   [](const OpRow& x, const OpRow& y) { return x.significant > y.significant; });

  rep.chains = chain_rows(rb, ra);
  rep.incidents = incident_rows(before, after, unit_b, unit_a, opt);

  // Causes: each bucket's change per unit, tested on the per-second shares.
  const auto shares_b = second_shares(rb, tb, fold), shares_a = second_shares(ra, ta, fold);
  if (fold) rep.notes.emplace_back("only one side records the scheduler state: its on-CPU time is compared as unknown");
  for (uint8_t b = 0; b < acct::kBuckets; ++b) {
    Cause c;
    std::tie(c.what, c.category) = cause_name(b, ta, tb);
    c.bucket = acct::bucket_name(b);
    c.before_ns = rep.before.per_unit[b];
    c.after_ns = rep.after.per_unit[b];
    c.added_ns = c.after_ns - c.before_ns;
    if (c.before_ns == 0 && c.after_ns == 0) continue;
    std::vector<double> xb, xa;
    for (const auto& s : shares_b) xb.push_back(s[b]);
    for (const auto& s : shares_a) xa.push_back(s[b]);
    c.p = mann_whitney(xb, xa).p;
    c.significant = c.p < opt.alpha && std::fabs(c.added_ns) >= opt.min_effect * unit_b &&
                    std::fabs(c.added_ns) >= static_cast<double>(opt.min_effect_ns);
    c.evidence.push_back(std::string(acct::bucket_name(b)) + " time of " + (ta ? ta->comm : std::string("?")) + ": " +
                         format_ns(c.before_ns) + " -> " + format_ns(c.after_ns) + " per " + rep.unit + " (" +
                         pvalue(c.p) + " over " + std::to_string(xb.size()) + " vs " + std::to_string(xa.size()) +
                         " whole seconds)");
    if (b == acct::kPreempted && ta)
      for (const auto& p : ta->preempted_by)
        c.evidence.push_back("after: " + (p.comm.empty() ? "tid " + std::to_string(p.tid) : p.comm) +
                             (p.pid ? " (pid " + std::to_string(p.pid) + ")" : "") + " ran for " +
                             format_ns(static_cast<double>(p.ns)) + " while the thread was runnable");
    for (const auto& o : rep.ops) {
      if (o.kind != c.bucket) continue;
      const bool more_calls = std::fabs(o.after_per_unit - o.before_per_unit) >= 0.1 * std::max(1.0, o.before_per_unit);
      if (!o.significant && !more_calls) continue;
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s: %.2f -> %.2f calls per %s, p50 %s -> %s (%s)", o.op.c_str(),
                    o.before_per_unit, o.after_per_unit, rep.unit.c_str(), format_ns(o.before_p50).c_str(),
                    format_ns(o.after_p50).c_str(), pvalue(o.p).c_str());
      c.evidence.emplace_back(buf);
    }
    for (const auto& in : rep.incidents) {
      ChainRow as_chain;
      as_chain.rule = in.rule;
      as_chain.category = in.category;
      if ((in.change == "appeared" || in.change == "grew") && chain_cause_category(as_chain) == c.category)
        c.evidence.push_back("incident " + in.rule + " (" + in.category + ") on " + in.process +
                             (in.thread.empty() ? "" : "/" + in.thread) + " " + in.change + ": lost " +
                             format_ns(in.before_ns) + " -> " + format_ns(in.after_ns) + " per " + rep.unit);
    }
    for (const auto& ch : rep.chains)
      if ((ch.change == "appeared" || ch.change == "grew") && chain_cause_category(ch) == c.category)
        c.evidence.push_back("chain " + ch.rule + " (" + ch.category + ") on " + ch.process +
                             (ch.thread.empty() ? "" : "/" + ch.thread) + " " + ch.change + ": " +
                             std::to_string(ch.before) + " -> " + std::to_string(ch.after));
    rep.causes.push_back(std::move(c));
  }
  std::stable_sort(rep.causes.begin(), rep.causes.end(),
                   [](const Cause& x, const Cause& y) { return x.added_ns > y.added_ns; });
  add_straggler_causes(before, after, ta, opt, unit_b, rep);

  // Feeding threads of the focus process, side by side.
  std::map<std::string, ThreadRow> threads;
  auto add_threads = [&](const AnalysisResult& r, uint32_t pid, bool after, double unit) {
    for (const auto& t : r.accounting) {
      if (t.pid != pid) continue;
      const std::string key = t.comm.empty() ? "tid " + std::to_string(t.tid) : t.comm;
      ThreadRow& row = threads[key];
      row.process = process_name(r, pid);
      row.thread = key;
      (after ? row.in_after : row.in_before) = true;
      (after ? row.after : row.before) = per_unit(&t, unit, fold);
    }
  };
  add_threads(rb, pid_b, false, unit_b);
  add_threads(ra, pid_a, true, unit_a);
  for (auto& [k, r] : threads) rep.threads.push_back(std::move(r));

  // The sentence.
  const bool up = steps ? rep.delta_ns >= 0 : true;
  std::vector<const Cause*> named;
  for (const auto& c : rep.causes)
    if (c.significant && c.explained_by.empty() && (c.bucket.empty() || (c.added_ns > 0) == up)) named.push_back(&c);
  std::sort(named.begin(), named.end(),
            [](const Cause* x, const Cause* y) { return std::fabs(x->added_ns) > std::fabs(y->added_ns); });
  std::string s;
  if (steps) {
    s = signed_ns(rep.delta_ns) + " per step (" + pct(rep.delta_pct) + ", " +
        format_ns(static_cast<double>(rep.before.step_ns)) + " -> " +
        format_ns(static_cast<double>(rep.after.step_ns)) + ", " +
        (rep.step_significant ? "significant" : "within noise") + ")";
  } else {
    s = "no step period on " + std::string(sb && sb->period_ns ? "the AFTER side" : "the BEFORE side") +
        ": per second of " + (ta ? ta->comm : std::string("the main feeding thread"));
  }
  if (named.empty()) {
    s += ": no cause stands out from the noise";
  } else {
    for (size_t i = 0; i < named.size(); ++i)
      s += std::string(i ? ", " : ": ") + signed_ns(named[i]->added_ns) + " from " + named[i]->what;
  }
  rep.verdict = s;
  return rep;
}

}  // namespace ingero::diff
