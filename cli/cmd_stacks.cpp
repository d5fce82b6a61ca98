// `ingero-pipeline stacks`: where in the code a trace's calls came from.
//
// Contract:
// - Reads any trace open_any_trace() reads (Ingero 0.8/0.9 SQLite, ours, LMDB; the embedded
//   sample when --db is omitted). Only events whose stack is known (stack_id != 0 and present in
//   TraceMeta::stacks once the source is drained) are attributed to a site; the others are
//   counted in the header ("calls without a stack"), never guessed.
// - Selected events: every GPU API call (CUDA, driver, graph, NCCL) by default, or the one op
//   named by --op (any op of model/ops.h; `cpu_sample` counts samples instead of time).
//   --pid keeps one process, --min drops calls shorter than the duration before anything is
//   computed.
// - A call is slow when its duration >= max(p95, 3 x p50) of its (pid, op) (nearest-rank, over
//   the selected calls): the same definition the tail rules use.
// - A site is call_site() of the stack (model/stack.h): the innermost Python frame, else the
//   innermost native frame outside the CUDA libraries. Sites are ranked by total time (or by
//   slow-call time with --sort slow); shares are of the time of calls that have a stack.
// - --folded prints one line per distinct stack, outermost frame first, frames joined by ';',
//   then a space and the value (total ns of its calls; samples for cpu_sample): the input of
//   flamegraph.pl and speedscope. Native C++ symbols are demangled for display; the text table
//   shows them short (frame_label), --json and --folded whole (frame_text).
// - A trace with no stacks is not an error: the text says so, JSON has an empty `sites`, --folded
//   prints nothing; exit 0. Missing/unreadable file: exit 3; unknown op: exit 2.
#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/config.h"
#include "cli/pipeline_common.h"
#include "model/format.h"
#include "model/ops.h"
#include "model/stack.h"

namespace ingero::cli {
namespace {

struct StacksArgs {
  std::string db;
  std::string op;
  uint32_t pid = 0;
  bool json = false;
  bool folded = false;
  size_t limit = 20;
  std::string min;
  std::string sort = "total";
};

// "_ZN2at6native5copy_..." -> "at::native::copy_(...)"; anything else is returned as it is.
std::string demangle(const std::string& name) {
  if (!name.starts_with("_Z")) return name;
  int status = 0;
  char* out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || !out) {
    std::free(out);
    return name;
  }
  std::string s(out);
  std::free(out);
  return s;
}

// A parsed stack with its native symbols demangled, ready for display.
ParsedStack display_stack(const StackTrace& st) {
  ParsedStack p = parse_stack(st);
  for (auto& f : p.frames)
    if (f.kind != FrameKind::kPython) f.function = demangle(f.function);
  return p;
}

// Nearest-rank percentile of sorted values: index ceil(p*n)-1.
uint64_t nearest_rank(const std::vector<uint64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t i = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  i = i == 0 ? 0 : i - 1;
  return sorted[std::min(i, sorted.size() - 1)];
}

// The selected calls of one (pid, source, op): every duration (for its p50/p95), and the calls
// with a stack again with their stack id (8 bytes per call without a stack, 24 with one).
struct Group {
  std::vector<uint64_t> durs;
  std::vector<std::pair<uint64_t, uint64_t>> stacked;  // (duration, stack_id)
};

struct Call {
  uint64_t dur;
  uint64_t stack_id;
  uint32_t pid;
};

struct StackUse {
  uint64_t calls = 0, total = 0;
};

struct Site {
  std::string text;
  const StackFrame* frame = nullptr;  // points into StackTable
  uint64_t calls = 0, total = 0, slow_calls = 0, slow = 0;
  std::vector<uint64_t> durs;
  std::map<uint64_t, StackUse> stacks;  // stack_id -> use
  std::set<std::string> ops;
  std::set<uint32_t> pids;
  uint64_t top_stack() const {
    uint64_t best = 0;
    StackUse bu;
    for (const auto& [id, u] : stacks)
      if (u.total > bu.total || (u.total == bu.total && u.calls > bu.calls) || best == 0) {
        best = id;
        bu = u;
      }
    return best;
  }
};

nlohmann::json frame_json(const StackFrame& f) {
  nlohmann::json j = {{"kind", frame_kind_name(f.kind)}, {"function", f.function}};
  if (!f.file.empty()) j["file"] = f.file;
  if (f.line) j["line"] = f.line;
  if (!f.module.empty()) j["module"] = f.module;
  if (f.kind == FrameKind::kNative && f.function.empty()) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(f.ip));
    j["ip"] = buf;
  }
  return j;
}

// One folded frame: no ';' (the separator) and no newline; trailing digits are harmless since
// the value is the last space-separated field.
std::string folded_frame(const StackFrame& f) {
  std::string s = frame_text(f);
  for (char& c : s)
    if (c == ';') c = ':';
    else if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  return s;
}

std::string pad(std::string s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

// The text table keeps a site to one readable line: frame_label() drops a C++ symbol's return
// type, template arguments and parameters, and what is still long is cut; --json has it whole.
std::string clip(const std::string& s, size_t max = 140) { return s.size() <= max ? s : s.substr(0, max - 3) + "..."; }

std::string pct(double share) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * share);
  return buf;
}

int run_stacks(const StacksArgs& a) {
  // --- arguments -------------------------------------------------------------------------------
  const OpInfo* only_op = nullptr;
  if (!a.op.empty()) {
    only_op = find_op(a.op);
    if (!only_op) {
      print_error("unknown op `" + a.op + "` (names as in `ingero-pipeline stats`, e.g. cudaLaunchKernel, cpu_sample)");
      return kExitUsage;
    }
  }
  uint64_t min_ns = 0;
  if (!a.min.empty() && !parse_duration(a.min, min_ns)) {
    print_error("--min: `" + a.min + "` is not a duration (e.g. 1ms, 250us)");
    return kExitUsage;
  }
  const bool samples = only_op && only_op->source == Source::kHost && only_op->op == op::kCpuSample;

  std::string error;
  auto source = open_any_trace(a.db, error);
  if (!source) {
    print_error(error);
    return kExitInput;
  }

  // --- read: the selected calls, grouped by (pid, source, op) ---------------------------------
  std::map<std::tuple<uint32_t, uint8_t, uint8_t>, Group> groups;
  uint64_t selected = 0, selected_ns = 0;
  Batch b;
  while (source->next(b)) {
    for (const Event& e : b.events) {
      if (only_op ? (e.source != only_op->source || e.op != only_op->op) : !is_gpu_api(e.source)) continue;
      if (a.pid && e.pid != a.pid) continue;
      if (e.dur_ns < min_ns) continue;
      ++selected;
      selected_ns += samples ? 1 : e.dur_ns;
      Group& g = groups[{e.pid, static_cast<uint8_t>(e.source), e.op}];
      const uint64_t v = samples ? 1 : e.dur_ns;
      g.durs.push_back(v);
      if (e.stack_id) g.stacked.emplace_back(v, e.stack_id);
    }
    if (b.final) break;
  }
  const TraceMeta& meta = source->meta();

  // --- stacks used, parsed once ----------------------------------------------------------------
  std::unordered_map<uint64_t, ParsedStack> parsed;
  auto stack_of = [&](uint64_t id) -> const ParsedStack* {
    if (id == 0) return nullptr;
    auto it = parsed.find(id);
    if (it == parsed.end()) {
      const auto m = meta.stacks.find(id);
      if (m == meta.stacks.end()) return nullptr;
      it = parsed.emplace(id, display_stack(m->second)).first;
    }
    return it->second.frames.empty() ? nullptr : &it->second;
  };

  // --- sites -----------------------------------------------------------------------------------
  std::map<std::string, Site> sites;
  std::map<uint64_t, StackUse> stack_totals;
  uint64_t stacked = 0, stacked_ns = 0, slow_total = 0, slow_stacked_ns = 0;
  for (auto& [key, g] : groups) {
    std::vector<uint64_t>& d = g.durs;
    std::sort(d.begin(), d.end());
    const uint64_t threshold = std::max(nearest_rank(d, 0.95), 3 * nearest_rank(d, 0.50));
    if (!samples) slow_total += static_cast<uint64_t>(d.end() - std::lower_bound(d.begin(), d.end(), threshold));
    const std::string opname = op_name(static_cast<Source>(std::get<1>(key)), std::get<2>(key));
    const uint32_t pid = std::get<0>(key);
    for (const auto& [dur, stack_id] : g.stacked) {
      const Call c{dur, stack_id, pid};
      const bool slow = !samples && c.dur >= threshold;
      const ParsedStack* st = stack_of(c.stack_id);
      if (!st) continue;
      ++stacked;
      stacked_ns += c.dur;
      if (slow) slow_stacked_ns += c.dur;
      const StackFrame* f = call_site(*st);
      const std::string text = frame_text(*f);
      Site& s = sites[text];
      if (!s.frame) {
        s.text = text;
        s.frame = f;
      }
      ++s.calls;
      s.total += c.dur;
      if (slow) {
        ++s.slow_calls;
        s.slow += c.dur;
      }
      s.durs.push_back(c.dur);
      auto& u = s.stacks[c.stack_id];
      ++u.calls;
      u.total += c.dur;
      auto& t = stack_totals[c.stack_id];
      ++t.calls;
      t.total += c.dur;
      s.ops.insert(opname);
      s.pids.insert(c.pid);
    }
  }

  // --- folded ----------------------------------------------------------------------------------
  if (a.folded) {
    std::map<std::string, uint64_t> lines;  // identical after display (offsets dropped): merged
    for (const auto& [id, u] : stack_totals) {
      const ParsedStack* st = stack_of(id);
      std::string line;
      // NOLINTNEXTLINE(modernize-loop-convert): clang 14 cannot compile std::views::reverse here
      for (auto it = st->frames.rbegin(); it != st->frames.rend(); ++it) {
        if (!line.empty()) line += ';';
        line += folded_frame(*it);
      }
      lines[line] += u.total;
    }
    std::vector<std::pair<std::string, uint64_t>> out(lines.begin(), lines.end());
    std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
    for (const auto& [line, v] : out) std::cout << line << ' ' << v << '\n';
    return kExitOk;
  }

  // --- rank ------------------------------------------------------------------------------------
  std::vector<Site*> ranked;
  for (auto& [_, s] : sites) {
    std::sort(s.durs.begin(), s.durs.end());
    ranked.push_back(&s);
  }
  const bool by_slow = a.sort == "slow";
  auto cmp_total = [](const Site* x, const Site* y) {
    if (x->total != y->total) return x->total > y->total;
    if (x->slow != y->slow) return x->slow > y->slow;
    return x->text < y->text;
  };
  auto cmp_slow = [](const Site* x, const Site* y) {
    if (x->slow != y->slow) return x->slow > y->slow;
    if (x->total != y->total) return x->total > y->total;
    return x->text < y->text;
  };
  std::vector<Site*> by_total_order = ranked, by_slow_order = ranked;
  std::sort(by_total_order.begin(), by_total_order.end(), cmp_total);
  std::sort(by_slow_order.begin(), by_slow_order.end(), cmp_slow);
  std::map<const Site*, size_t> rank_total, rank_slow;
  for (size_t i = 0; i < by_total_order.size(); ++i) rank_total[by_total_order[i]] = i + 1;
  for (size_t i = 0; i < by_slow_order.size(); ++i) rank_slow[by_slow_order[i]] = i + 1;
  const auto& order = by_slow ? by_slow_order : by_total_order;
  const size_t shown = a.limit ? std::min(a.limit, order.size()) : order.size();
  auto share = [](uint64_t x, uint64_t of) { return of ? static_cast<double>(x) / static_cast<double>(of) : 0.0; };
  const std::string what = only_op ? std::string(only_op->name) : "GPU API calls";
  const std::string unit = samples ? "samples" : "ns";

  if (a.json) {
    nlohmann::json j;
    j["trace"] = meta.path;
    j["format"] = meta.format;
    j["op"] = only_op ? nlohmann::json(std::string(only_op->name)) : nlohmann::json(nullptr);
    j["pid"] = a.pid ? nlohmann::json(a.pid) : nlohmann::json(nullptr);
    j["min_ns"] = min_ns;
    j["unit"] = unit;
    j["sort"] = by_slow ? "slow" : "total";
    j["stacks_in_trace"] = meta.stacks.size();
    j["calls"] = selected;
    j["total"] = selected_ns;
    j["calls_with_stack"] = stacked;
    j["total_with_stack"] = stacked_ns;
    j["slow_calls"] = slow_total;
    j["slow_with_stack"] = slow_stacked_ns;
    j["sites_total"] = order.size();
    auto& arr = j["sites"] = nlohmann::json::array();
    for (size_t i = 0; i < shown; ++i) {
      const Site& s = *order[i];
      const uint64_t top = s.top_stack();
      const ParsedStack* st = stack_of(top);
      nlohmann::json frames = nlohmann::json::array();
      for (const auto& f : st->frames) frames.push_back(frame_json(f));
      nlohmann::json o = {
          {"site", s.text},
          {"frame", frame_json(*s.frame)},
          {"rank_total", rank_total[&s]},
          {"rank_slow", rank_slow[&s]},
          {"calls", s.calls},
          {"total", s.total},
          {"total_share", share(s.total, stacked_ns)},
          {"slow_calls", s.slow_calls},
          {"slow", s.slow},
          {"slow_share", share(s.slow, slow_stacked_ns)},
          {"p50", nearest_rank(s.durs, 0.50)},
          {"p99", nearest_rank(s.durs, 0.99)},
          {"ops", s.ops},
          {"pids", s.pids},
          {"stacks", s.stacks.size()},
          {"top_stack",
           {{"stack_id", top},
            {"calls", s.stacks.at(top).calls},
            {"total", s.stacks.at(top).total},
            {"truncated", st->truncated},
            {"frames", std::move(frames)}}},
      };
      arr.push_back(std::move(o));
    }
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return kExitOk;
  }

  // --- text ------------------------------------------------------------------------------------
  auto amount = [&](uint64_t v) {
    return samples ? format_count(static_cast<double>(v)) : format_ns(static_cast<double>(v));
  };
  // What the selected events are called in the text: calls, or spans/events of a host op.
  const std::string noun = samples ? "samples" : (only_op && only_op->kind != OpKind::kCall ? "events" : "calls");
  std::cout << "Call sites of " << what << (a.pid ? " in pid " + std::to_string(a.pid) : std::string())
            << (min_ns ? " >= " + format_ns(static_cast<double>(min_ns)) : std::string()) << "  (" << meta.path
            << ")\n";
  std::cout << "  " << format_count(static_cast<double>(selected)) << " " << noun << ", "
            << format_count(static_cast<double>(stacked)) << " with a stack (" << pct(share(stacked_ns, selected_ns))
            << " of the " << (samples ? "samples" : "time") << "); " << meta.stacks.size() << " stacks in the trace\n";
  if (sites.empty()) {
    std::cout
        << (meta.stacks.empty()
                ? "  This trace has no stacks. Live capture records them for calls at or above `trace --stack-min`.\n"
                : "  None of the selected " + noun + " has a stack.\n");
    return kExitOk;
  }
  std::cout << "  Ranked by " << (by_slow ? "slow-call time" : "total time")
            << "; slow = >= max(p95, 3 x p50) of the call's (pid, op); shares of the time with a stack.\n\n";
  std::cout << pad("#", 3, true) << "  " << pad(samples ? "samples" : "total", 9, true) << pad("share", 7, true)
            << pad("calls", 8, true) << pad("slow", 9, true) << pad("slow%", 7, true) << pad("p50", 9, true)
            << pad("p99", 9, true) << "  site\n";
  for (size_t i = 0; i < shown; ++i) {
    const Site& s = *order[i];
    std::cout << pad(std::to_string(i + 1), 3, true) << "  " << pad(amount(s.total), 9, true)
              << pad(pct(share(s.total, stacked_ns)), 7, true)
              << pad(format_count(static_cast<double>(s.calls)), 8, true)
              << pad(samples ? "-" : format_ns(static_cast<double>(s.slow)), 9, true)
              << pad(samples ? "-" : pct(share(s.slow, slow_stacked_ns)), 7, true)
              << pad(samples ? "-" : format_ns(static_cast<double>(nearest_rank(s.durs, 0.50))), 9, true)
              << pad(samples ? "-" : format_ns(static_cast<double>(nearest_rank(s.durs, 0.99))), 9, true) << "  "
              << clip(frame_label(*s.frame));
    std::string ops;
    for (const auto& o : s.ops) ops += (ops.empty() ? "" : ",") + o;
    std::cout << "  [" << ops << "]\n";
  }
  if (shown < order.size()) std::cout << "  ... " << order.size() - shown << " more (--limit 0 shows all)\n";
  const Site& top = *order.front();
  const ParsedStack* st = stack_of(top.top_stack());
  std::cout << "\nTop stack of #1 (" << top.stacks.at(top.top_stack()).calls << " " << noun << "), innermost first:\n";
  for (const auto& f : st->frames) std::cout << "    " << frame_label(f) << "\n";
  if (st->truncated) std::cout << "    ... (truncated)\n";
  return kExitOk;
}

Registrar reg{"stacks", 15, [](CLI::App& app, int& rc) {
                auto args = std::make_shared<StacksArgs>();
                auto* cmd = app.add_subcommand(
                    "stacks",
                    "Call sites of a trace's calls (the innermost Python line, else the innermost native frame\n"
                    "outside the CUDA libraries), ranked by total time or slow-call time; or folded stacks.\n"
                    "Slow = >= max(p95, 3 x p50) of the call's (pid, op), as in the tail rules.\n"
                    "Examples:\n"
                    "  ingero-pipeline stacks --db trace.db\n"
                    "  ingero-pipeline stacks --db trace.db --op cudaStreamSynchronize --sort slow\n"
                    "  ingero-pipeline stacks --db trace.db --json | jq '.sites[0].top_stack.frames'\n"
                    "  ingero-pipeline stacks --db trace.db --folded | flamegraph.pl > calls.svg\n"
                    "  ingero-pipeline stacks --db trace.db --op cpu_sample --folded   # on-CPU samples");
                cmd->add_option("--db", args->db,
                                "Trace (Ingero 0.8/0.9 SQLite, ours, or an LMDB log); default: the embedded sample");
                cmd->add_option("--op", args->op, "Only this op (default: every CUDA/driver/graph/NCCL call)");
                cmd->add_option("--pid", args->pid, "Only this process");
                auto* json = cmd->add_flag("--json", args->json, "Machine-readable output (shape in docs/cli.md)");
                auto* folded = cmd->add_flag(
                    "--folded", args->folded,
                    "Folded stacks for flamegraph.pl/speedscope: frames outermost first, value = total ns "
                    "(samples for cpu_sample)");
                cmd->add_option("--limit", args->limit, "Sites shown (0 = all)")->capture_default_str();
                cmd->add_option("--min", args->min, "Ignore calls shorter than this (e.g. 1ms)");
                cmd->add_option("--sort", args->sort, "Rank by total time or by slow-call time")
                    ->check(CLI::IsMember({"total", "slow"}))
                    ->capture_default_str();
                folded->excludes(json);
                cmd->callback([args, &rc] { rc = run_stacks(*args); });
              }};

}  // namespace
}  // namespace ingero::cli
