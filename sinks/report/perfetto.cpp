// Trace-event JSON writer (contract in perfetto.h).
#include "sinks/report/perfetto.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "model/ops.h"
#include "model/plan.h"
#include "model/result_json.h"
#include "model/stack.h"

namespace ingero {

// ---------------------------------------------------------------------------------------------
// Escaping and number formatting

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one.
size_t utf8_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return left >= 2 && cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (left < 3 || !cont(i + 1) || !cont(i + 2)) return 0;
    if (c == 0xE0 && b(i + 1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (left < 4 || !cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    if (c == 0xF0 && b(i + 1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(i + 1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

}  // namespace

void json_escape_append(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20 || c == 0x7F) {
            out += "\\u00";
            out += hex[c >> 4];
            out += hex[c & 15];
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    const size_t n = utf8_len(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD for one invalid byte
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
}

void append_us(std::string& out, int64_t ns) {
  uint64_t mag = ns < 0 ? static_cast<uint64_t>(-(ns + 1)) + 1 : static_cast<uint64_t>(ns);
  char buf[40];
  const int n = std::snprintf(buf, sizeof buf, "%s%" PRIu64 ".%03u", ns < 0 ? "-" : "", mag / 1000,
                              static_cast<unsigned>(mag % 1000));
  out.append(buf, static_cast<size_t>(n));
}

// ---------------------------------------------------------------------------------------------
// Filter

bool PerfettoFilter::matches(const Event& e) const {
  if (e.ts_ns < from_ns || e.ts_ns >= to_ns) return false;
  if (!pids.empty() && !pids.count(e.pid)) return false;
  if (!ops.empty() && !ops.count({e.source, e.op})) return false;
  return true;
}

bool PerfettoFilter::matches(const Chain& c) const {
  if (c.window_end <= from_ns || c.window_start >= to_ns) return false;
  if (!pids.empty() && !pids.count(c.pid)) return false;
  if (!ops.empty() && !ops.count({c.source, c.op})) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

constexpr int64_t kMappedBase = int64_t{1} << 22;  // json pids/tids of nodes > 0 start here
constexpr int64_t kLaneShift = 23;                 // json tid = base tid + (kind*lanes+lane) << 23
constexpr int64_t kHostPid = int64_t{1} << 30;     // "host" process (memory counters)
constexpr int64_t kChainsPid = kHostPid + 1;       // "ingero chains" process
constexpr int64_t kChainsTid = 1;
enum TrackKind : int { kThreadTrack = 0, kOffCpuTrack = 1, kIoTrack = 2, kChainTrack = 3 };
const char* const kTrackSuffix[] = {"", " off-CPU", " I/O", ""};

std::string u64(uint64_t v) { return std::to_string(v); }

const char* state_name(OffCpuState s) {
  switch (s) {
    case OffCpuState::kPreempted: return "preempted";
    case OffCpuState::kSleeping: return "sleeping";
    case OffCpuState::kDiskWait: return "disk wait";
    case OffCpuState::kOther: return "other";
    default: return "unknown";
  }
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

struct CounterState {
  int64_t json_pid = 0;
  Source source = Source::kUnknown;
  uint8_t op = 0;
  int64_t window = -1;
  uint64_t n = 0;
  std::vector<uint64_t> durs;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
};

}  // namespace

struct PerfettoWriter::Impl {
  PerfettoOptions o;
  PerfettoCounters c;
  std::string path, tmp, err;
  FILE* f = nullptr;
  gzFile gz = nullptr;
  std::string buf;
  bool failed = false, done = false, first = true;
  bool base_set = false;
  uint64_t base = 0;

  std::unordered_map<uint64_t, int64_t> pid_map, tid_map;  // (node << 32 | id) -> json id
  int64_t next_mapped = kMappedBase;
  std::unordered_set<int64_t> named_pids;
  std::unordered_set<uint64_t> named_tracks;                               // (json pid, json tid) named
  std::unordered_map<uint64_t, std::vector<std::vector<uint64_t>>> lanes;  // track key -> lane stacks
  std::unordered_map<uint64_t, std::string> stack_cache;
  std::unordered_map<uint64_t, CounterState> counters;
  std::map<std::pair<uint16_t, uint64_t>, std::vector<uint64_t>> exemplars;  // (node,id) -> flow ids
  std::vector<uint8_t> flow_found;                                           // by flow id - 1
  std::vector<Chain> chains;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> chain_flows;  // per chain: (flow id, event id)
  bool chains_set = false;
  bool multi_node = false;
  std::vector<AccountingSeries> acct;

  // ---- output

  void fail(const std::string& what) {
    if (!failed) err = what;
    failed = true;
  }
  void flush() {
    if (failed || buf.empty()) {
      buf.clear();
      return;
    }
    c.bytes += buf.size();
    if (gz) {
      if (gzwrite(gz, buf.data(), static_cast<unsigned>(buf.size())) != static_cast<int>(buf.size()))
        fail(path + ": write failed (disk full?)");
    } else if (std::fwrite(buf.data(), 1, buf.size(), f) != buf.size()) {
      fail(path + ": write failed (disk full?)");
    }
    buf.clear();
  }
  // Starts one element of traceEvents.
  void begin_item() {
    if (!first) buf += ",\n";
    first = false;
  }
  void end_item() {
    if (o.max_bytes && c.bytes + buf.size() > o.max_bytes && !failed) {
      fail("the JSON would exceed " + u64(o.max_bytes >> 20) + " MiB, more than the viewers open" +
           (o.max_bytes_hint.empty() ? std::string("; narrow it with --from/--to, --pid or --op")
                                     : "; " + o.max_bytes_hint));
    }
    if (buf.size() >= (1u << 20)) flush();
  }
  void ts_field(const char* key, uint64_t ts) {
    buf += ",\"";
    buf += key;
    buf += "\":";
    append_us(buf, static_cast<int64_t>(ts - base));
  }
  void set_base(uint64_t ts) {
    if (base_set) return;
    base_set = true;
    base = o.base_ns ? o.base_ns : ts - ts % 1'000'000'000ull;
  }

  // ---- names and tracks

  int64_t map_id(std::unordered_map<uint64_t, int64_t>& m, uint16_t node, uint32_t id) {
    if (node == 0 && id < kMappedBase) return id;
    const uint64_t key = (uint64_t{node} << 32) | id;
    auto it = m.find(key);
    if (it != m.end()) return it->second;
    const int64_t v = next_mapped < (int64_t{1} << kLaneShift) ? next_mapped++ : (int64_t{1} << kLaneShift) - 1;
    m.emplace(key, v);
    return v;
  }
  void meta_event(const char* name, int64_t pid, int64_t tid, const char* arg, const std::string& value, bool number) {
    begin_item();
    buf += "{\"ph\":\"M\",\"name\":\"";
    buf += name;
    buf += "\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"";
    buf += arg;
    buf += "\":";
    if (number) {
      buf += value;
    } else {
      buf += '"';
      json_escape_append(buf, value);
      buf += '"';
    }
    buf += "}}";
    end_item();
  }
  static std::string process_label(const TraceMeta& meta, uint32_t pid) {
    auto it = meta.process_names.find(pid);
    return (it != meta.process_names.end() && !it->second.empty() ? it->second : std::string("process")) + " [pid " +
           u64(pid) + "]";
  }
  std::string node_name(const TraceMeta& meta, uint16_t node) const {
    if (node < meta.nodes.size() && !meta.nodes[node].empty()) return meta.nodes[node];
    return "node " + u64(node);
  }
  int64_t process(const TraceMeta& meta, uint16_t node, uint32_t pid) {
    const int64_t jp = map_id(pid_map, node, pid);
    if (named_pids.insert(jp).second) {
      std::string name = process_label(meta, pid);
      if (multi_node || node != 0) name += " @" + node_name(meta, node);
      meta_event("process_name", jp, 0, "name", name, false);
      meta_event("process_sort_index", jp, 0, "sort_index", std::to_string(int64_t{node} * kMappedBase * 2 + pid),
                 true);
      if (multi_node || node != 0) meta_event("process_labels", jp, 0, "labels", node_name(meta, node), false);
    }
    return jp;
  }
  // "dataloader [tid 4243]": the thread's name, else its process's name, else "thread".
  static std::string thread_label(const TraceMeta& meta, uint32_t tid, uint32_t pid) {
    std::string name;
    if (auto it = meta.thread_names.find(tid); it != meta.thread_names.end()) name = it->second;
    if (name.empty())
      if (auto it = meta.process_names.find(pid); it != meta.process_names.end()) name = it->second;
    if (name.empty()) name = "thread";
    return name + " [tid " + u64(tid) + "]";
  }
  // json tid of (thread, kind, lane); names the track the first time.
  int64_t track(const TraceMeta& meta, int64_t jp, uint16_t node, uint32_t pid, uint32_t tid, int kind, int lane) {
    if (kind == kChainTrack) return name_track(meta, jp, kChainsTid + lane, pid, tid, kind, lane, lane);
    const int64_t base_tid = map_id(tid_map, node, tid);
    const int64_t jt = base_tid + (static_cast<int64_t>(kind * kMaxLanes + lane) << kLaneShift);
    return name_track(meta, jp, jt, pid, tid, kind, lane,
                      base_tid * 32 + static_cast<int64_t>(kind) * kMaxLanes + lane);
  }
  int64_t name_track(const TraceMeta& meta, int64_t jp, int64_t jt, uint32_t pid, uint32_t tid, int kind, int lane,
                     int64_t sort_index) {
    if (named_tracks.insert((static_cast<uint64_t>(jp) << 31) | static_cast<uint64_t>(jt)).second) {
      std::string name;
      if (kind == kChainTrack) {
        name = "chains";
      } else {
        name = thread_label(meta, tid, pid) + kTrackSuffix[kind];
      }
      if (lane > 0) name += " (overlap " + u64(static_cast<uint64_t>(lane)) + ")";
      meta_event("thread_name", jp, jt, "name", name, false);
      meta_event("thread_sort_index", jp, jt, "sort_index", std::to_string(sort_index), true);
    }
    return jt;
  }
  // The lane of a slice [ts, end) on a track: the first whose open slices it nests in.
  int place(uint64_t key, uint64_t ts, uint64_t end) {
    auto& ls = lanes[key];
    for (size_t i = 0; i < ls.size(); ++i) {
      auto& st = ls[i];
      while (!st.empty() && st.back() <= ts) st.pop_back();
      if (st.empty() || end <= st.back()) {
        st.push_back(end);
        return static_cast<int>(i);
      }
    }
    if (ls.size() < static_cast<size_t>(kMaxLanes)) {
      if (!ls.empty()) ++c.overlap_lanes;
      ls.emplace_back().push_back(end);
      return static_cast<int>(ls.size() - 1);
    }
    ++c.lanes_exhausted;
    return kMaxLanes - 1;
  }

  // ---- events

  std::unordered_map<uint16_t, std::pair<std::string, std::string>> op_name_cache;  // -> (name, category)
  const std::pair<std::string, std::string>& op_names(Source src, uint8_t op) {
    const uint16_t key = static_cast<uint16_t>((static_cast<unsigned>(src) << 8) | op);
    auto it = op_name_cache.find(key);
    if (it == op_name_cache.end())
      it = op_name_cache.emplace(key, std::make_pair(op_name(src, op), lower(source_name(src)))).first;
    return it->second;
  }

  const std::string& stack_fragment(const TraceMeta& meta, uint64_t stack_id) {
    static const std::string empty;
    auto it = stack_cache.find(stack_id);
    if (it != stack_cache.end()) return it->second;
    auto st = meta.stacks.find(stack_id);
    if (st == meta.stacks.end()) return empty;
    const ParsedStack ps = parse_stack(st->second);
    std::string frag = ",\"stack\":[";
    for (size_t i = 0; i < ps.frames.size(); ++i) {
      if (i) frag += ',';
      frag += '"';
      json_escape_append(frag, frame_text(ps.frames[i]));
      frag += '"';
    }
    if (ps.truncated) frag += std::string(ps.frames.empty() ? "" : ",") + "\"(truncated)\"";
    frag += ']';
    if (stack_cache.size() >= 100'000) stack_cache.clear();  // bounded; re-rendered on demand
    return stack_cache.emplace(stack_id, std::move(frag)).first->second;
  }

  void counter_event(int64_t jp, const std::string& name, uint64_t ts, double value) {
    begin_item();
    buf += "{\"ph\":\"C\",\"name\":\"";
    json_escape_append(buf, name);
    buf += "\",\"pid\":" + std::to_string(jp);
    ts_field("ts", ts);
    char v[48];
    std::snprintf(v, sizeof v, "%.6g", value);
    buf += ",\"args\":{\"value\":";
    buf += v;
    buf += "}}";
    ++c.counter_samples;
    end_item();
  }
  void flush_counter(CounterState& s, bool zero_after) {
    if (s.window < 0) return;
    const uint64_t w = o.counter_window_ns;
    const uint64_t start = base + static_cast<uint64_t>(s.window) * w;
    const std::string op = op_name(s.source, s.op);
    counter_event(s.json_pid, "calls/s " + op, start, static_cast<double>(s.n) * 1e9 / static_cast<double>(w));
    if (!s.durs.empty()) {
      const size_t k = (s.durs.size() * 99 + 99) / 100 - 1;  // nearest rank
      std::nth_element(s.durs.begin(), s.durs.begin() + static_cast<std::ptrdiff_t>(k), s.durs.end());
      counter_event(s.json_pid, "p99 ms " + op, start, static_cast<double>(s.durs[k]) / 1e6);
    }
    if (zero_after) {
      counter_event(s.json_pid, "calls/s " + op, start + w, 0);
      counter_event(s.json_pid, "p99 ms " + op, start + w, 0);
    }
  }
  void count(int64_t jp, const Event& e) {
    const uint64_t key = (static_cast<uint64_t>(jp) << 16) | (uint64_t{static_cast<uint8_t>(e.source)} << 8) | e.op;
    auto& s = counters[key];
    const int64_t win = e.ts_ns >= base ? static_cast<int64_t>((e.ts_ns - base) / o.counter_window_ns) : 0;
    if (s.window != win) {
      if (s.window >= 0) flush_counter(s, win > s.window + 1);
      s.json_pid = jp;
      s.source = e.source;
      s.op = e.op;
      s.window = win;
      s.n = 0;
      s.durs.clear();
    }
    ++s.n;
    constexpr size_t kCap = 65'536;
    if (s.durs.size() < kCap) {
      s.durs.push_back(e.dur_ns);
    } else {  // reservoir sample beyond the cap
      s.rng = s.rng * 6364136223846793005ull + 1442695040888963407ull;
      const uint64_t j = (s.rng >> 11) % s.n;
      if (j < kCap) s.durs[j] = e.dur_ns;
    }
  }

  void write_event(const Event& e, const TraceMeta& meta) {
    set_base(e.ts_ns);
    const OpInfo* info = find_op(e.source, e.op);
    const OpKind kind = info ? info->kind : (e.dur_ns ? OpKind::kCall : OpKind::kInstant);
    int track_kind = kThreadTrack;
    bool slice = true;
    std::string name;
    switch (kind) {
      case OpKind::kCall: break;
      case OpKind::kOffCpu:
        track_kind = kOffCpuTrack;
        slice = e.dur_ns > 0 && !(e.flags & (event_flags::kSwitchOut | event_flags::kSwitchIn));
        name = slice                                ? std::string("off-CPU (") + state_name(e.prev_state) + ")"
               : (e.flags & event_flags::kSwitchIn) ? "switch-in"
                                                    : "switch-out";
        break;
      case OpKind::kHostSpan: track_kind = kIoTrack; break;
      case OpKind::kInstant:
      case OpKind::kCounter: slice = false; break;
    }
    const auto& names = op_names(e.source, e.op);
    if (name.empty()) name = names.first;
    const int64_t jp = process(meta, e.node, e.pid);
    const uint64_t track_key = (static_cast<uint64_t>(map_id(tid_map, e.node, e.tid)) << 2) | track_kind;
    const int lane = slice ? place(track_key, e.ts_ns, e.end_ns()) : 0;
    const int64_t jt = track(meta, jp, e.node, e.pid, e.tid, track_kind, lane);

    begin_item();
    buf += slice ? "{\"ph\":\"X\",\"name\":\"" : "{\"ph\":\"i\",\"s\":\"t\",\"name\":\"";
    json_escape_append(buf, name);
    buf += "\",\"cat\":\"";
    buf += names.second;
    buf += "\",\"pid\":" + std::to_string(jp) + ",\"tid\":" + std::to_string(jt);
    ts_field("ts", e.ts_ns);
    if (slice) {
      buf += ",\"dur\":";
      append_us(buf, static_cast<int64_t>(e.dur_ns));
    }
    buf += ",\"args\":{\"id\":" + u64(e.id);
    if (e.node) buf += ",\"node\":" + u64(e.node);
    if (e.rank >= 0) buf += ",\"rank\":" + std::to_string(e.rank);
    if (kind == OpKind::kOffCpu) {
      buf += ",\"state\":\"";
      buf += state_name(e.prev_state);
      buf += '"';
      if (e.arg1) {
        buf += ",\"ran_instead\":\"";
        const auto other = static_cast<uint32_t>(e.arg1);
        json_escape_append(buf, thread_label(meta, other, other));
        buf += '"';
      }
    } else {
      if (is_gpu_api(e.source)) buf += ",\"ret\":" + std::to_string(e.ret);
      if (e.arg0) buf += ",\"arg0\":" + u64(e.arg0);
      if (e.arg1) buf += ",\"arg1\":" + u64(e.arg1);
    }
    if (e.flags & event_flags::kTruncated) buf += ",\"truncated\":true";
    if (e.stack_id) buf += stack_fragment(meta, e.stack_id);
    buf += "}}";
    ++c.events;
    ++(slice ? c.slices : c.instants);
    end_item();

    if (!exemplars.empty()) {
      auto it = exemplars.find({e.node, e.id});
      if (it != exemplars.end())
        for (uint64_t fid : it->second) flow_end(fid, jp, jt, e.ts_ns);
    }
    if (is_gpu_api(e.source)) count(jp, e);
  }
  void flow_end(uint64_t fid, int64_t jp, int64_t jt, uint64_t ts) {
    if (fid == 0 || fid > flow_found.size() || flow_found[fid - 1]) return;
    flow_found[fid - 1] = 1;
    begin_item();
    buf += "{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"chain evidence\",\"cat\":\"chain\",\"id\":" + u64(fid) +
           ",\"pid\":" + std::to_string(jp) + ",\"tid\":" + std::to_string(jt);
    ts_field("ts", ts);
    buf += "}";
    end_item();
  }

  void set_chains(const std::vector<Chain>& all) {
    chains.clear();
    chain_flows.clear();
    exemplars.clear();
    flow_found.clear();
    for (const auto& ch : all) {
      if (!o.filter.matches(ch)) continue;
      chains.push_back(ch);
      auto& flows = chain_flows.emplace_back();
      std::unordered_set<uint64_t> seen;
      for (const auto& ev : ch.evidence)
        for (uint64_t id : ev.event_ids) {
          if (!seen.insert(id).second) continue;
          flow_found.push_back(0);
          const uint64_t fid = flow_found.size();
          flows.emplace_back(fid, id);
          exemplars[{ch.node, id}].push_back(fid);
        }
    }
    chains_set = true;
  }

  void write_chains(const TraceMeta& meta) {
    std::vector<size_t> order(chains.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const Chain &x = chains[a], &y = chains[b];
      if (x.window_start != y.window_start) return x.window_start < y.window_start;
      return x.window_end > y.window_end;
    });
    if (!chains.empty()) {
      if (named_pids.insert(kChainsPid).second) {
        meta_event("process_name", kChainsPid, 0, "name", "ingero chains", false);
        meta_event("process_sort_index", kChainsPid, 0, "sort_index", "-1", true);
      }
    }
    for (size_t i : order) {
      const Chain& ch = chains[i];
      set_base(ch.window_start);
      const uint64_t end = std::max(ch.window_end, ch.window_start);
      const int lane = place(static_cast<uint64_t>(kChainTrack), ch.window_start, end);
      const int64_t jt = track(meta, kChainsPid, 0, 0, 0, kChainTrack, lane);
      nlohmann::json args;
      args["id"] = ch.id;
      args["rule"] = ch.rule;
      args["severity"] = severity_name(ch.severity);
      args["category"] = ch.category;
      if (ch.op) args["op"] = op_name(ch.source, ch.op);
      args["pid"] = ch.pid;
      if (ch.tid) args["tid"] = ch.tid;
      if (ch.node) args["node"] = node_name(meta, ch.node);
      args["summary"] = ch.summary;
      args["root_cause"] = ch.root_cause;
      if (!ch.explanation.empty()) args["explanation"] = ch.explanation;
      args["fix"] = ch.recommendations;
      auto& preds = args["predicates"] = nlohmann::json::array();
      for (const auto& p : ch.predicates)
        preds.push_back(p.label + ": " + p.lhs_text + " vs " + p.rhs_text + (p.passed ? " (passed)" : " (failed)"));
      auto& evs = args["evidence"] = nlohmann::json::array();
      for (const auto& ev : ch.evidence)
        evs.push_back({{"kind", ev.kind}, {"detail", ev.detail}, {"event_ids", ev.event_ids}});
      if (!ch.threads.empty()) {
        auto& th = args["threads"] = nlohmann::json::array();
        for (const auto& t : ch.threads) th.push_back({{"tid", t.tid}, {"name", t.name}, {"share", t.share}});
      }
      if (!ch.stacks.empty()) {
        auto& sts = args["stacks"] = nlohmann::json::array();
        for (const auto& s : ch.stacks) {
          nlohmann::json frames = nlohmann::json::array();
          for (const auto& fr : s.frames) frames.push_back(frame_text(fr));
          sts.push_back({{"role", s.role}, {"share", s.share}, {"calls", s.calls}, {"frames", std::move(frames)}});
        }
      }
      // Where the chain's thread's time went over its window (docs/accounting.md).
      if (ch.accounting) args["accounting"] = thread_accounting_json(*ch.accounting, meta);
      uint64_t linked = 0;
      for (const auto& [fid, id] : chain_flows[i]) {
        (void)id;
        if (flow_found[fid - 1]) ++linked;
        else ++c.missing_exemplars;
      }
      args["exemplars_linked"] = linked;
      std::string name = ch.rule + (ch.op ? " " + op_name(ch.source, ch.op) : std::string());
      begin_item();
      buf += "{\"ph\":\"X\",\"name\":\"";
      json_escape_append(buf, name);
      buf += "\",\"cat\":\"chain\",\"pid\":" + std::to_string(kChainsPid) + ",\"tid\":" + std::to_string(jt);
      ts_field("ts", ch.window_start);
      buf += ",\"dur\":";
      append_us(buf, static_cast<int64_t>(end - ch.window_start));
      buf += ",\"args\":";
      buf += args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      buf += "}";
      ++c.chains;
      end_item();
      for (const auto& [fid, id] : chain_flows[i]) {
        if (!flow_found[fid - 1]) continue;
        begin_item();
        buf += "{\"ph\":\"s\",\"name\":\"chain evidence\",\"cat\":\"chain\",\"id\":" + u64(fid) +
               ",\"pid\":" + std::to_string(kChainsPid) + ",\"tid\":" + std::to_string(jt);
        ts_field("ts", ch.window_start);
        buf += "}";
        ++c.flows;
        end_item();
      }
    }
  }

  void write_snapshots(const TraceMeta& meta) {
    bool any = false;
    for (const auto& s : meta.snapshots) {
      if (s.ts_ns < o.filter.from_ns || s.ts_ns >= o.filter.to_ns) continue;
      if (!any) {
        any = true;
        set_base(s.ts_ns);
        if (named_pids.insert(kHostPid).second) meta_event("process_name", kHostPid, 0, "name", "host", false);
      }
      counter_event(kHostPid, "host memory % used", s.ts_ns, s.mem_pct);
      counter_event(kHostPid, "host memory available MiB", s.ts_ns, static_cast<double>(s.mem_avail_mb));
      counter_event(kHostPid, "host CPU %", s.ts_ns, s.cpu_pct);
    }
  }

  // One counter sample with several values (chrome://tracing stacks them; Perfetto makes a track
  // of each, "<name> <arg>").
  void counter_multi(int64_t jp, const std::string& name, uint64_t ts, const char* const* keys, const double* values,
                     size_t n) {
    begin_item();
    buf += "{\"ph\":\"C\",\"name\":\"";
    json_escape_append(buf, name);
    buf += "\",\"pid\":" + std::to_string(jp);
    ts_field("ts", ts);
    buf += ",\"args\":{";
    for (size_t i = 0; i < n; ++i) {
      char v[48];
      std::snprintf(v, sizeof v, "%.6g", values[i]);
      if (i) buf += ',';
      buf += '"';
      buf += keys[i];
      buf += "\":";
      buf += v;
    }
    buf += "}}";
    ++c.counter_samples;
    end_item();
  }
  // "time <thread> (ms/s)" per main feeding thread: the per-second bins summed over windows of
  // counter_window_ns (whole seconds, at least one), as ms per second, then zeros after the last.
  void write_accounting(const TraceMeta& meta) {
    static constexpr const char* kKeys[] = {"in calls", "on CPU", "preempted", "blocked", "unknown"};
    constexpr uint64_t kSec = 1'000'000'000;
    const uint64_t w = std::max<uint64_t>(1, o.counter_window_ns / kSec);
    for (const auto& s : acct) {
      if (!o.filter.pids.empty() && !o.filter.pids.count(s.pid)) continue;
      bool any = false;
      int64_t jp = 0;
      std::string name;
      uint64_t last_end = 0;
      for (size_t i = 0; i < s.bins.size(); i += w) {
        const uint64_t start = (s.first_sec + i) * kSec;
        const size_t n = std::min<size_t>(w, s.bins.size() - i);
        const uint64_t end = start + n * kSec;
        if (end <= o.filter.from_ns || start >= o.filter.to_ns) continue;
        double v[5] = {};
        for (size_t k = i; k < i + n; ++k) {
          const auto& b = s.bins[k];
          for (uint8_t x = acct::kLaunch; x <= acct::kOtherCall; ++x) v[0] += static_cast<double>(b[x]);
          v[1] += static_cast<double>(b[acct::kOnCpu]);
          v[2] += static_cast<double>(b[acct::kPreempted]);
          for (uint8_t x = acct::kLock; x <= acct::kBlockedOther; ++x) v[3] += static_cast<double>(b[x]);
          v[4] += static_cast<double>(b[acct::kUnknown]);
        }
        for (double& x : v) x /= 1e6 * static_cast<double>(n);  // ms per second
        if (!any) {
          any = true;
          set_base(start);
          jp = process(meta, s.node, s.pid);
          name = "time " + thread_label(meta, s.tid, s.pid) + " (ms/s)";
          ++c.accounting_tracks;
        }
        counter_multi(jp, name, start, kKeys, v, 5);
        last_end = end;
      }
      if (any) {
        const double zero[5] = {};
        counter_multi(jp, name, last_end, kKeys, zero, 5);
      }
    }
  }

  void remove_tmp() {
    if (gz) gzclose(gz);
    if (f) std::fclose(f);
    gz = nullptr;
    f = nullptr;
    if (!tmp.empty()) ::unlink(tmp.c_str());
    tmp.clear();
  }
};

PerfettoWriter::PerfettoWriter() : impl_(std::make_unique<Impl>()) {}
PerfettoWriter::~PerfettoWriter() {
  if (!impl_->done) impl_->remove_tmp();
}

std::unique_ptr<PerfettoWriter> PerfettoWriter::create(const std::string& path, const PerfettoOptions& opts,
                                                       std::string& error) {
  if (path.empty() || path == "-") {
    error = "the Perfetto export needs an output file (-o out.json or out.json.gz)";
    return nullptr;
  }
  std::unique_ptr<PerfettoWriter> w(new PerfettoWriter());
  Impl& m = *w->impl_;
  m.o = opts;
  if (m.o.counter_window_ns == 0) m.o.counter_window_ns = 1'000'000'000;
  m.path = path;
  m.tmp = path + ".partial-" + std::to_string(::getpid());
  const bool gzip = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (gzip) {
    const std::string mode = "wb" + std::to_string(std::clamp(opts.gzip_level, 1, 9));
    m.gz = gzopen(m.tmp.c_str(), mode.c_str());
    if (m.gz) gzbuffer(m.gz, 1u << 20);
  } else {
    m.f = std::fopen(m.tmp.c_str(), "wb");
  }
  if (!m.gz && !m.f) {
    error = path + ": cannot create the output file (does its directory exist and is it writable?)";
    m.tmp.clear();
    return nullptr;
  }
  m.buf.reserve(size_t{1} << 21);
  m.buf = "{\"traceEvents\":[\n";
  return w;
}

void PerfettoWriter::set_chains(const std::vector<Chain>& chains) { impl_->set_chains(chains); }

void PerfettoWriter::set_accounting(std::vector<AccountingSeries> series) { impl_->acct = std::move(series); }

void PerfettoWriter::write_batch(const Batch& b, const TraceMeta& meta) {
  Impl& m = *impl_;
  if (m.failed || m.done) return;
  if (meta.nodes.size() > 1) m.multi_node = true;  // merged trace: label processes by node
  for (const auto& e : b.events) {
    if (!m.o.filter.matches(e)) {
      ++m.c.filtered;
      continue;
    }
    m.write_event(e, meta);
    if (m.failed) return;
  }
}

bool PerfettoWriter::resolve_flows(const std::vector<Chain>& chains, EventSource& src) {
  Impl& m = *impl_;
  if (m.failed) return false;
  m.set_chains(chains);
  if (m.exemplars.empty()) return true;
  Batch b;
  while (src.next(b)) {
    for (const auto& e : b.events) {
      auto it = m.exemplars.find({e.node, e.id});
      if (it == m.exemplars.end() || !m.o.filter.matches(e)) continue;
      const OpInfo* info = find_op(e.source, e.op);
      const int kind = !info                             ? kThreadTrack
                       : info->kind == OpKind::kOffCpu   ? kOffCpuTrack
                       : info->kind == OpKind::kHostSpan ? kIoTrack
                                                         : kThreadTrack;
      const int64_t jp = m.process(src.meta(), e.node, e.pid);
      const int64_t jt = m.track(src.meta(), jp, e.node, e.pid, e.tid, kind, 0);
      for (uint64_t fid : it->second) m.flow_end(fid, jp, jt, e.ts_ns);
    }
    if (m.failed) return false;
  }
  return !m.failed;
}

bool PerfettoWriter::finish(const std::vector<Chain>* chains, const TraceMeta& meta, std::string& error) {
  Impl& m = *impl_;
  if (m.done) {
    error = m.err.empty() ? "already finished" : m.err;
    return false;
  }
  if (chains && !m.chains_set) m.set_chains(*chains);
  if (!m.failed) {
    for (auto& [key, s] : m.counters) m.flush_counter(s, true);
    m.write_snapshots(meta);
    m.write_accounting(meta);
    m.write_chains(meta);
    m.buf += "\n],\"displayTimeUnit\":\"ns\",\"metadata\":{\"generator\":\"ingero-pipeline\",\"ts_base_unix_ns\":" +
             u64(m.base) + ",\"events\":" + u64(m.c.events) + ",\"chains\":" + u64(m.c.chains) +
             ",\"flows\":" + u64(m.c.flows) + ",\"source\":\"";
    json_escape_append(m.buf, meta.path);
    m.buf += "\"}}\n";
    m.flush();
  }
  bool closed = true;
  if (m.gz) closed = gzclose(m.gz) == Z_OK;
  if (m.f) closed = std::fclose(m.f) == 0 && closed;
  m.gz = nullptr;
  m.f = nullptr;
  if (!closed) m.fail(m.path + ": write failed when closing (disk full?)");
  if (!m.failed && std::rename(m.tmp.c_str(), m.path.c_str()) != 0)
    m.fail(m.path + ": cannot rename the finished file into place");
  m.done = true;
  if (m.failed) {
    m.remove_tmp();
    error = m.err;
    return false;
  }
  m.tmp.clear();
  return true;
}

void PerfettoWriter::abort() {
  impl_->remove_tmp();
  impl_->done = true;
}

bool PerfettoWriter::ok() const { return !impl_->failed; }
const std::string& PerfettoWriter::error() const { return impl_->err; }
const PerfettoCounters& PerfettoWriter::counters() const { return impl_->c; }
const std::string& PerfettoWriter::path() const { return impl_->path; }

}  // namespace ingero
