#include "operators/chain_annotate.h"

#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "model/format.h"
#include "model/ops.h"
#include "model/plan.h"
#include "model/stack.h"
#include "operators/severity.h"

namespace ingero {

namespace {

bool is_rate_or_gap(const Chain& c) { return c.category == "throughput_drop" || c.category == "launch_gap"; }

double value_of(const Chain& c, const char* name) {
  for (const auto& [k, v] : c.values)
    if (k == name) return v;
  return std::nan("");
}

bool finite_pos(double v) { return v == v && std::isfinite(v) && v > 0; }

std::string pct(double share) { return format_value(share, Unit::kPercent); }

// Weight and count per stack id, then the top N as ChainStacks of one role.
struct StackTally {
  std::unordered_map<uint64_t, std::pair<double, uint64_t>> by_id;  // id -> (weight, events)
  double total = 0;
  void add(uint64_t id, double w) {
    total += w;
    if (!id) return;
    auto& slot = by_id[id];
    slot.first += w;
    ++slot.second;
  }
};

std::string thread_name(const TraceMeta& meta, uint32_t pid, uint32_t tid) {
  if (auto it = meta.thread_names.find(tid); it != meta.thread_names.end() && !it->second.empty()) return it->second;
  if (auto it = meta.process_names.find(pid); it != meta.process_names.end()) return it->second;
  return {};
}

// The sentence of the throughput rule that a time split replaces (rules/trends.rules).
constexpr std::string_view kGenericSentence = "The GPU is being fed less";

}  // namespace

bool is_launch_op(Source s, uint8_t op) {
  return (s == Source::kCuda && op == op::kCudaLaunchKernel) || (s == Source::kDriver && op == op::kCuLaunchKernel) ||
         (s == Source::kGraph && op == op::kGraphLaunch);
}

ChainAnnotator::ChainAnnotator(AnnotateOptions o) : opt_(o) {
  if (opt_.resident_bytes > 0) spill_ = std::make_unique<SpillFile>(opt_.resident_bytes);
  if (opt_.top_stacks == 0) opt_.top_stacks = 3;
  if (opt_.gap_window_ns == 0) opt_.gap_window_ns = 10'000'000'000;
  if (opt_.max_records == 0) opt_.max_records = 1;
}

// --- ChainRecordSeries --------------------------------------------------------------------------

namespace {

uint8_t* put_varint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80u);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

uint64_t tuple_hash(uint64_t stack, Source source, uint8_t op, OffCpuState state) {
  uint64_t h = stack * 0x9e3779b97f4a7c15ull;
  h ^= (uint64_t{static_cast<uint8_t>(source)} << 16 | uint64_t{op} << 8 | uint64_t{static_cast<uint8_t>(state)}) +
       0x632be59bd9b4e019ull + (h << 6) + (h >> 2);
  return h;
}

}  // namespace

void ChainRecordSeries::encode(std::vector<uint8_t>& out, uint64_t& prev_ts, const ChainRecord& r) {
  uint8_t buf[48];  // three varints (<= 10 bytes each), then at most 3 bytes and a varint inline
  uint8_t* p = put_varint(buf, r.ts - prev_ts);
  prev_ts = r.ts;
  p = put_varint(p, r.dur);
  auto same = [&r](const Tuple& t) {
    return t.stack == r.stack && t.source == r.source && t.op == r.op && t.state == r.state;
  };
  // Consecutive records mostly share their tuple: the last code used (by any series on this
  // thread) is tried first, and only used when this table holds that very tuple under it.
  static thread_local uint32_t last_code = 0;
  uint32_t code = 0;
  if (last_code && last_code <= tuples_.size() && same(tuples_[last_code - 1])) {
    code = last_code;
  } else {
    const uint64_t h = tuple_hash(r.stack, r.source, r.op, r.state);
    if (auto it = tuple_index_.find(h); it != tuple_index_.end()) {
      if (same(tuples_[it->second - 1])) code = it->second;
    } else if (tuples_.size() < kMaxTuples) {
      tuples_.push_back({r.stack, r.source, r.op, r.state});
      code = static_cast<uint32_t>(tuples_.size());
      tuple_index_.emplace(h, code);
    }
    if (code) last_code = code;
  }
  p = put_varint(p, code);
  if (!code) {
    // Table full or a hash collision: the tuple inline.
    *p++ = static_cast<uint8_t>(r.source);
    *p++ = r.op;
    *p++ = static_cast<uint8_t>(r.state);
    p = put_varint(p, r.stack);
  }
  out.insert(out.end(), buf, p);
}

ChainRecordSeries::Block ChainRecordSeries::make_block(const ChainRecord* first, size_t n) {
  static thread_local std::vector<uint8_t> scratch;
  scratch.clear();
  Block b;
  b.base_ts = first[0].ts;
  uint64_t prev = b.base_ts;
  for (size_t i = 0; i < n; ++i) encode(scratch, prev, first[i]);
  b.last_ts = first[n - 1].ts;
  b.n = static_cast<uint32_t>(n);
  b.bytes.assign(scratch.begin(), scratch.end());
  return b;
}

std::vector<ChainRecord> ChainRecordSeries::decode_block(const Block& b) const {
  std::vector<ChainRecord> v(b.n);
  std::vector<uint8_t> scratch;
  const uint8_t* base = data_of(b, scratch);
  if (base == nullptr) {
    // An unreadable spilled block: as many empty records at its last timestamp (see the header).
    for (auto& r : v) r.ts = b.last_ts;
    return v;
  }
  const uint8_t* p = base + b.off;
  uint64_t prev = b.base_ts;
  for (auto& r : v) p = decode(p, prev, tuples_, r);
  return v;
}

const uint8_t* ChainRecordSeries::data_of(const Block& b, std::vector<uint8_t>& scratch) const {
  if (!b.spilled()) return b.bytes.data();
  scratch.resize(b.slot.len);
  return spill_ != nullptr && spill_->get(b.slot, scratch.data()) ? scratch.data() : nullptr;
}

void ChainRecordSeries::add_block(Block b) {
  if (spill_ != nullptr) {
    spill_->add_resident(static_cast<std::ptrdiff_t>(b.bytes.size()));
    if (spill_->over_budget() && b.bytes.size() <= UINT32_MAX &&
        spill_->put(b.bytes.data(), static_cast<uint32_t>(b.bytes.size()), b.slot)) {
      spill_->add_resident(-static_cast<std::ptrdiff_t>(b.bytes.size()));
      std::vector<uint8_t>().swap(b.bytes);
    }
  }
  blocks_.push_back(std::move(b));
}

void ChainRecordSeries::forget(Block& b) {
  if (spill_ == nullptr) return;
  if (b.spilled()) spill_->release(b.slot);
  else spill_->add_resident(-static_cast<std::ptrdiff_t>(b.bytes.size()));
  b.slot = {};
}

void ChainRecordSeries::bring_back(Block& b) {
  if (!b.spilled()) return;
  std::vector<uint8_t> bytes(b.slot.len);
  if (spill_ == nullptr || !spill_->get(b.slot, bytes.data())) {
    // Unreadable: re-encode the block as the empty records decode_block() gives for it.
    const std::vector<ChainRecord> v = decode_block(b);
    Block e = make_block(v.data(), v.size());
    bytes = std::move(e.bytes);
    b.base_ts = e.base_ts;
    b.off = 0;
  }
  spill_->release(b.slot);
  b.slot = {};
  spill_->add_resident(static_cast<std::ptrdiff_t>(bytes.size()));
  b.bytes = std::move(bytes);
}

void ChainRecordSeries::seal() {
  add_block(make_block(open_.data(), kBlock));
  open_.erase(open_.begin(), open_.begin() + static_cast<std::ptrdiff_t>(kBlock));
}

bool ChainRecordSeries::insert(const ChainRecord& r) {
  bool in_order = true;
  max_dur_ = std::max(max_dur_, r.dur);
  ++size_;
  if (open_.empty() || open_.back().ts <= r.ts) {
    open_.push_back(r);
  } else if (open_.front().ts <= r.ts || blocks_.empty() || blocks_.back().last_ts <= r.ts) {
    // Late, but not behind any sealed record: into the open tail after its equals.
    auto it = std::upper_bound(open_.begin(), open_.end(), r.ts,
                               [](uint64_t ts, const ChainRecord& x) { return ts < x.ts; });
    open_.insert(it, r);
    in_order = false;
  } else {
    // Behind a sealed record: re-encode the first block holding a newer one, with `r` after its
    // equals (every earlier block ends at or before r.ts).
    auto bit = std::upper_bound(blocks_.begin(), blocks_.end(), r.ts,
                                [](uint64_t ts, const Block& b) { return ts < b.last_ts; });
    std::vector<ChainRecord> v = decode_block(*bit);
    auto it = std::upper_bound(v.begin(), v.end(), r.ts, [](uint64_t ts, const ChainRecord& x) { return ts < x.ts; });
    v.insert(it, r);
    forget(*bit);
    *bit = make_block(v.data(), v.size());
    if (spill_ != nullptr) spill_->add_resident(static_cast<std::ptrdiff_t>(bit->bytes.size()));
    in_order = false;
  }
  if (open_.size() >= 2 * kBlock) seal();
  return in_order;
}

ChainRecord ChainRecordSeries::front() const {
  ChainRecord r;
  if (!blocks_.empty()) {
    const Block& b = blocks_.front();
    std::vector<uint8_t> scratch;
    const uint8_t* base = data_of(b, scratch);
    if (base == nullptr) {
      r.ts = b.last_ts;
      return r;
    }
    uint64_t prev = b.base_ts;
    decode(base + b.off, prev, tuples_, r);
  } else if (!open_.empty()) {
    r = open_.front();
  }
  return r;
}

ChainRecord ChainRecordSeries::front_to_pop() {
  if (!blocks_.empty()) bring_back(blocks_.front());
  return front();
}

void ChainRecordSeries::pop_front() {
  if (!blocks_.empty()) {
    Block& b = blocks_.front();
    bring_back(b);
    ChainRecord r;
    const uint8_t* p = decode(b.bytes.data() + b.off, b.base_ts, tuples_, r);
    b.off = static_cast<uint32_t>(p - b.bytes.data());
    if (--b.n == 0) {
      forget(b);
      blocks_.pop_front();
    }
  } else if (!open_.empty()) {
    open_.erase(open_.begin());
  } else {
    return;
  }
  if (--size_ == 0) {
    max_dur_ = 0;
    tuples_.clear();
    tuple_index_.clear();
  }
}

size_t ChainRecordSeries::drop_before(uint64_t ts) {
  size_t dropped = 0;
  // Whole sealed blocks (all their records start at or before last_ts), while one stays ahead: the
  // last record's removal goes through pop_front(), which resets the series when it empties.
  while (blocks_.size() > 1 || (blocks_.size() == 1 && !open_.empty())) {
    Block& b = blocks_.front();
    if (b.last_ts >= ts) break;
    dropped += b.n;
    size_ -= b.n;
    forget(b);
    blocks_.pop_front();
  }
  while (!empty() && front_to_pop().ts < ts) {
    pop_front();
    ++dropped;
  }
  return dropped;
}

size_t ChainRecordSeries::heap_bytes() const {
  size_t n = open_.capacity() * sizeof(ChainRecord) + tuples_.capacity() * sizeof(Tuple) + tuple_index_.size() * 32 +
             tuple_index_.bucket_count() * sizeof(void*);
  n += (blocks_.size() + 1) * sizeof(Block);  // deque nodes, roughly
  for (const Block& b : blocks_) n += b.bytes.capacity();
  return n;
}

// --- ChainAnnotator ------------------------------------------------------------------------------

size_t ChainAnnotator::retained_bytes() const {
  size_t n = 0;
  for (const auto& [k, t] : threads_) n += t.calls.heap_bytes() + t.offcpu.heap_bytes() + t.samples.heap_bytes();
  if (spill_ != nullptr) n += spill_->heap_bytes();
  return n;
}

void ChainAnnotator::note_launch(Thread& t, const Event& e) {
  if (!opt_.detect_gaps) return;
  if (t.have_launch && e.ts_ns >= t.last_launch_end && e.ts_ns - t.last_launch_end >= opt_.gap_min_ns) {
    Gap g;
    g.key = thread_key(t.node, t.tid);
    g.start = t.last_launch_end;
    g.end = e.ts_ns;
    g.before_id = t.last_launch_id;
    g.after_id = e.id;
    g.source = e.source;
    g.op = e.op;
    const uint64_t ctx = opt_.gap_context_ns;
    g.before = launches_in(t, g.start > ctx ? g.start - ctx : 0, g.start + 1);
    pending_gaps_.push_back(g);
    ++counters_.gaps;
  }
  if (!t.have_launch || e.end_ns() > t.last_launch_end) {
    t.last_launch_end = e.end_ns();
    t.last_launch_id = e.id;
  }
  t.have_launch = true;
}

void ChainAnnotator::add(std::span<const Event> events) {
  for (const Event& e : events) {
    ++counters_.events;
    Series Thread::*series = nullptr;
    if (is_gpu_api(e.source)) {
      series = &Thread::calls;
      ++counters_.calls;
    } else if (e.source == Source::kHost && e.op == op::kSchedSwitch && e.dur_ns > 0 &&
               !(e.flags & (event_flags::kSwitchOut | event_flags::kSwitchIn))) {
      series = &Thread::offcpu;
      ++counters_.offcpu_spans;
    } else if (e.source == Source::kHost && e.op == op::kCpuSample) {
      series = &Thread::samples;
      ++counters_.samples;
    } else {
      ++counters_.ignored;
      continue;
    }
    if (e.ts_ns > newest_) newest_ = e.ts_ns;
    if (series == &Thread::calls) {
      const uint64_t pk = thread_key(e.node, e.pid);
      if (auto it = first_call_.find(pk); it != first_call_.end()) {
        if (e.ts_ns < it->second) it->second = e.ts_ns;  // a late call of a live source
      } else if (first_call_.size() < (1u << 20)) {
        first_call_.emplace(pk, e.ts_ns);
      }
    }
    auto [slot, created] = threads_.try_emplace(thread_key(e.node, e.tid));
    Thread& t = slot->second;
    if (created && spill_ != nullptr)
      for (Series* ser : {&t.calls, &t.offcpu, &t.samples}) ser->set_spill(spill_.get());
    t.pid = e.pid;
    t.tid = e.tid;
    t.node = e.node;
    if (e.rank >= 0) t.rank = e.rank;
    Rec r;
    r.ts = e.ts_ns;
    r.dur = e.dur_ns;
    r.stack = e.stack_id;
    r.source = e.source;
    r.op = e.op;
    r.state = e.prev_state;
    if (!(t.*series).insert(r)) ++counters_.out_of_order;
    ++records_;
    if (series == &Thread::calls && is_launch_op(e.source, e.op)) note_launch(t, e);
  }
  if (opt_.retention_ns && newest_ > opt_.retention_ns && records_ > opt_.min_records)
    evict(newest_ - opt_.retention_ns);
  if (records_ > opt_.max_records) enforce_cap();
}

void ChainAnnotator::evict(uint64_t horizon) {
  horizon_ = std::max(horizon_, horizon);
  for (auto it = threads_.begin(); it != threads_.end();) {
    Thread& t = it->second;
    for (Series* s : {&t.calls, &t.offcpu, &t.samples}) {
      // A record goes once it ended before the horizon; one that started more than a retention
      // before it goes regardless (a span open for minutes must not pin everything behind it).
      while (!s->empty()) {
        const Rec f = s->front_to_pop();
        const uint64_t keep_until = f.ts + std::min(f.dur, opt_.retention_ns ? opt_.retention_ns : f.dur);
        if (keep_until >= horizon) break;
        s->pop_front();
        --records_;
        ++counters_.evicted;
      }
    }
    const bool empty = t.calls.empty() && t.offcpu.empty() && t.samples.empty();
    // An idle thread's launch-gap state goes with it: a gap longer than the retention has no
    // context left to judge it anyway.
    if (empty && (!t.have_launch || t.last_launch_end < horizon)) it = threads_.erase(it);
    else ++it;
  }
}

void ChainAnnotator::enforce_cap() {
  while (records_ > opt_.max_records) {
    uint64_t oldest = UINT64_MAX;
    for (auto& [k, t] : threads_)
      for (Series* s : {&t.calls, &t.offcpu, &t.samples})
        if (!s->empty()) oldest = std::min(oldest, s->front_to_pop().ts);
    if (oldest == UINT64_MAX) return;
    const uint64_t step = std::max<uint64_t>(1'000'000, (newest_ > oldest ? newest_ - oldest : 0) / 8);
    const uint64_t horizon = oldest + step;
    horizon_ = std::max(horizon_, horizon);
    for (auto& [k, t] : threads_)
      for (Series* s : {&t.calls, &t.offcpu, &t.samples}) {
        const size_t n = s->drop_before(horizon);
        records_ -= n;
        counters_.evicted += n;
        counters_.capped += n;
      }
  }
}

size_t ChainAnnotator::launches_in(const Thread& t, uint64_t start, uint64_t end) const {
  size_t n = 0;
  t.calls.for_each(start, end, [&n](const Rec& r) {
    if (is_launch_op(r.source, r.op)) ++n;
  });
  return n;
}

TimeSplit ChainAnnotator::time_split(uint16_t node, uint32_t tid, uint64_t start, uint64_t end) const {
  TimeSplit ts;
  auto it = threads_.find(thread_key(node, tid));
  if (it == threads_.end() || end <= start) return ts;
  const Thread& t = it->second;
  const double span = static_cast<double>(end - start);
  // Union of the call intervals clipped to the window (calls nest: runtime over driver).
  std::vector<std::pair<uint64_t, uint64_t>> u;
  {
    const uint64_t from = start > t.calls.max_dur() ? start - t.calls.max_dur() : 0;
    t.calls.for_each(from, end, [&](const Rec& r) {
      const uint64_t a = std::max(r.ts, start), b = std::min(r.end(), end);
      if (a >= b) return;
      if (!u.empty() && a <= u.back().second) u.back().second = std::max(u.back().second, b);
      else u.emplace_back(a, b);
    });
  }
  uint64_t in_calls = 0;
  for (const auto& [a, b] : u) in_calls += b - a;
  auto overlap_calls = [&u](uint64_t a, uint64_t b) {
    auto i = std::lower_bound(u.begin(), u.end(), a,
                              [](const std::pair<uint64_t, uint64_t>& x, uint64_t v) { return x.second <= v; });
    uint64_t o = 0;
    for (; i != u.end() && i->first < b; ++i) o += std::min(b, i->second) - std::max(a, i->first);
    return o;
  };
  uint64_t pre = 0, blocked = 0, unknown = 0;
  {
    const uint64_t from = start > t.offcpu.max_dur() ? start - t.offcpu.max_dur() : 0;
    uint64_t covered = start;  // spans of one thread should not overlap; never count twice if they do
    t.offcpu.for_each(from, end, [&](const Rec& r) {
      const uint64_t a = std::max({r.ts, start, covered}), b = std::min(r.end(), end);
      if (a >= b) return;
      covered = b;
      const uint64_t out = (b - a) - overlap_calls(a, b);
      switch (r.state) {
        case OffCpuState::kPreempted: pre += out; break;
        case OffCpuState::kUnknown: unknown += out; break;
        default: blocked += out; break;
      }
    });
  }
  const uint64_t busy = in_calls + pre + blocked + unknown;
  const uint64_t on_cpu = busy < end - start ? (end - start) - busy : 0;
  ts.present = true;
  ts.tid = tid;
  ts.start_ns = start;
  ts.end_ns = end;
  ts.in_calls = static_cast<double>(in_calls) / span;
  ts.off_cpu_preempted = static_cast<double>(pre) / span;
  ts.off_cpu_blocked = static_cast<double>(blocked) / span;
  ts.off_cpu_unknown = static_cast<double>(unknown) / span;
  ts.on_cpu = static_cast<double>(on_cpu) / span;
  const std::pair<const char*, double> parts[] = {{"in_calls", ts.in_calls},
                                                  {"off_cpu_preempted", ts.off_cpu_preempted},
                                                  {"off_cpu_blocked", ts.off_cpu_blocked},
                                                  {"off_cpu_unknown", ts.off_cpu_unknown},
                                                  {"on_cpu", ts.on_cpu}};
  double best = -1;
  for (const auto& [name, v] : parts)
    if (v > best) {
      best = v;
      ts.dominant = name;
    }
  return ts;
}

void ChainAnnotator::annotate(std::vector<Chain>& chains, const TraceMeta& meta) {
  for (Chain& c : chains) annotate(c, meta);
}

namespace {

// Ingero stores C++ symbols mangled; chains show them as a person reads them.
std::string demangled(const std::string& sym) {
  if (sym.rfind("_Z", 0) != 0) return sym;
  int status = 0;
  char* out = abi::__cxa_demangle(sym.c_str(), nullptr, nullptr, &status);
  std::string s = status == 0 && out ? std::string(out) : sym;
  std::free(out);
  return s;
}

// Parsed stacks (symbols demangled) by id, cached across annotate() calls.
const ParsedStack* lookup_stack(const TraceMeta& meta, uint64_t id, std::unordered_map<uint64_t, ParsedStack>& cache,
                                uint64_t& missing) {
  if (auto it = cache.find(id); it != cache.end()) return &it->second;
  auto m = meta.stacks.find(id);
  if (m == meta.stacks.end()) {
    ++missing;
    return nullptr;
  }
  ParsedStack p = parse_stack(m->second);
  for (auto& f : p.frames)
    if (f.kind != FrameKind::kPython) f.function = demangled(f.function);
  return &cache.emplace(id, std::move(p)).first->second;
}

void top_stacks(const StackTally& t, const char* role, size_t n, const TraceMeta& meta,
                std::unordered_map<uint64_t, ParsedStack>& cache, uint64_t& missing, std::vector<ChainStack>& out) {
  if (t.total <= 0) return;
  std::vector<std::pair<uint64_t, std::pair<double, uint64_t>>> v(t.by_id.begin(), t.by_id.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    if (a.second.first != b.second.first) return a.second.first > b.second.first;
    return a.first < b.first;
  });
  for (size_t i = 0; i < v.size() && i < n; ++i) {
    ChainStack s;
    s.role = role;
    s.stack_id = v[i].first;
    s.share = v[i].second.first / t.total;
    s.calls = v[i].second.second;
    if (const ParsedStack* p = lookup_stack(meta, s.stack_id, cache, missing)) {
      s.frames = p->frames;
      s.truncated = p->truncated;
    }
    out.push_back(std::move(s));
  }
}

const ChainStack* first_of_role(const Chain& c, const char* role) {
  for (const auto& s : c.stacks)
    if (s.role == role && !s.frames.empty()) return &s;
  return nullptr;
}

std::string site_of(const ChainStack* s) {
  if (!s) return {};
  ParsedStack p;
  p.frames = s->frames;
  const StackFrame* f = call_site(p);
  return f ? frame_label(*f) : std::string();
}

}  // namespace

void describe_wait(Chain& c) {
  if (!c.over_time || c.category != "input_starvation") return;
  const ChainStack* top = first_of_role(c, "offcpu");
  const std::string site = site_of(top);
  if (site.empty() || c.summary.find("; waiting in ") != std::string::npos) return;
  c.summary += "; waiting in " + site;
  std::string frames;
  for (size_t i = 0, shown = 0; top && i < top->frames.size() && shown < 6; ++i) {
    const std::string f = frame_label(top->frames[i]);
    if (f.empty()) continue;
    frames += (shown++ ? " < " : "") + f;
  }
  c.explanation += " Where it waited (the top off-CPU stack, " + pct(top->share) +
                   " of its blocked time in the window" + ", innermost first): " + frames + ".";
}

namespace {

// Root cause, summary suffix, explanation and first fix from the launching thread's time split.
void apply_split(Chain& c, const std::string& tname) {
  const TimeSplit& s = c.time_split;
  const std::string who = "tid " + std::to_string(s.tid) + (tname.empty() ? "" : " (" + tname + ")");
  const std::string sample_site = site_of(first_of_role(c, "sample"));
  const std::string wait_site = site_of(first_of_role(c, "offcpu"));
  std::string root, suffix, fix;
  if (s.dominant == "on_cpu") {
    root = "CPU-bound work in the launching thread between launches: " + who + " was on CPU outside CUDA calls for " +
           pct(s.on_cpu) + " of the window";
    if (!sample_site.empty()) root += "; top sampled stack at " + sample_site;
    suffix = "on CPU between launches for " + pct(s.on_cpu) + " of the window";
    fix =
        "Profile what the launching thread computes between launches (the sampled stacks; py-spy) and move it off "
        "the launch path or onto the GPU";
  } else if (s.dominant == "off_cpu_preempted") {
    root = "CPU contention: the launching thread " + who + " was runnable but preempted for " +
           pct(s.off_cpu_preempted) + " of the window";
    suffix = "preempted for " + pct(s.off_cpu_preempted) + " of the window";
    fix = "Pin the launching thread's process to dedicated cores and move CPU-heavy neighbours away";
  } else if (s.dominant == "off_cpu_blocked") {
    root = "Waiting: the launching thread " + who + " was blocked off CPU for " + pct(s.off_cpu_blocked) +
           " of the window";
    if (!wait_site.empty()) root += ", waiting at " + wait_site;
    suffix = "blocked for " + pct(s.off_cpu_blocked) + " of the window";
    fix = "Look at the off-CPU stacks for what the launching thread waits on (input queue, lock, I/O)";
  } else if (s.dominant == "off_cpu_unknown") {
    root = "The launching thread " + who + " was off CPU (state not recorded) for " + pct(s.off_cpu_unknown) +
           " of the window";
    if (!wait_site.empty()) root += ", at " + wait_site;
    suffix = "off CPU for " + pct(s.off_cpu_unknown) + " of the window";
    fix = "Record with live capture (it records why a thread was off CPU) to tell contention from waiting";
  } else {
    root = "Time inside CUDA calls: the launching thread " + who + " spent " + pct(s.in_calls) +
           " of the window inside CUDA/driver calls (GPU-bound work or synchronisation)";
    suffix = "inside CUDA calls for " + pct(s.in_calls) + " of the window";
    fix = "Look at the slowest calls' stacks for synchronisations (.item(), .cpu(), cudaStreamSynchronize) in the loop";
  }
  c.root_cause = root;
  // A gap chain's summary already names the thread.
  c.summary += c.category == "launch_gap" ? "; " + suffix
                                          : "; launching thread tid " + std::to_string(s.tid) + " " + suffix;
  const std::string split_text = "Where the launching thread " + who + " spent the window: in CUDA calls " +
                                 pct(s.in_calls) + ", on CPU between calls " + pct(s.on_cpu) + ", preempted " +
                                 pct(s.off_cpu_preempted) + ", blocked " + pct(s.off_cpu_blocked) +
                                 ", off CPU with unknown state " + pct(s.off_cpu_unknown) + ".";
  const size_t at = c.explanation.find(kGenericSentence);
  if (at != std::string::npos) c.explanation.erase(at);
  if (!c.explanation.empty() && c.explanation.back() != ' ') c.explanation += ' ';
  c.explanation += split_text;
  c.recommendations.insert(c.recommendations.begin(), fix);
}

}  // namespace

void ChainAnnotator::annotate(Chain& c, const TraceMeta& meta) {
  annotate_body(c, meta);
  apply_losses(c, meta);
  // The annotator states facts (values warmup.*, launches, lost_events, slow.*; the time split);
  // operators/severity.h decides the severity from them.
  SeverityContext ctx;
  switch (grade_chain(c, ctx).reason) {
    case SeverityReason::kWarmup: ++counters_.warmup_demoted; break;
    case SeverityReason::kSplitCap:
    case SeverityReason::kIdle: ++counters_.split_capped; break;
    case SeverityReason::kNotInLoop: ++counters_.not_in_loop; break;
    case SeverityReason::kLossy: ++counters_.loss_demoted; break;
    default: break;
  }
}

// Losses in the chain's window (contract in the header).
void ChainAnnotator::apply_losses(Chain& c, const TraceMeta& meta) {
  const InputHealth& h = meta.health;
  if (h.loss_spans.empty()) return;
  const uint64_t ws = c.window_start, we = std::max(c.window_start, c.window_end);
  const LossSpan lost = h.losses_between(ws > kLossMarginNs ? ws - kLossMarginNs : 0,
                                         we > UINT64_MAX - kLossMarginNs ? UINT64_MAX : we + kLossMarginNs);
  c.dropped_events = lost.total();
  if (lost.total() == 0) return;
  c.values.emplace_back("lost_events", static_cast<double>(lost.total()));
  std::string where;
  auto part = [&where](uint64_t n, const char* what) {
    if (n) where += (where.empty() ? "" : ", ") + format_count(static_cast<double>(n)) + " " + what;
  };
  part(lost.gpu, "GPU-call records (ring full)");
  part(lost.host, "host records (ring full)");
  part(lost.queue, "events behind a full engine queue");
  const std::string n = format_count(static_cast<double>(lost.total()));
  const std::string span = format_ns(static_cast<double>(lost.end_ns - lost.start_ns));
  if (c.category != "launch_gap" && c.category != "throughput_drop") {
    if (!c.explanation.empty() && c.explanation.back() != ' ') c.explanation += ' ';
    c.explanation += "The capture lost " + n + " events in or next to this window (" + where +
                     "); this chain rests on the calls it recorded.";
    return;
  }
  // The chain stands on events not being there: the tracer's own losses can explain it.
  const char* missing = c.category == "launch_gap" ? "the launches missing from the gap"
                                                   : "the calls missing from the rate";
  c.summary = "lossy capture (" + n + " events lost in this window): " + c.summary;
  c.root_cause = std::string("Not established: the capture lost ") + n + " events (" + where + ") in " + span +
                 " of capture time overlapping this window, so " + missing +
                 " may be events the tracer lost, not a pause of the program. Was: " + c.root_cause;
  if (!c.explanation.empty() && c.explanation.back() != ' ') c.explanation += ' ';
  c.explanation += "The capture lost " + n + " events in or next to this window (" + where +
                   "): what is missing here may be those events, so this is not reported as a cause.";
  c.recommendations.insert(c.recommendations.begin(),
                           "Capture again with a larger ring (trace --ring-mb) or fewer probes (--disable) and "
                           "compare: a gap that stays without losses is real");
}

void ChainAnnotator::annotate_body(Chain& c, const TraceMeta& meta) {
  if (stack_cache_.size() > 65536) stack_cache_.clear();
  c.threads.clear();
  c.stacks.clear();
  c.time_split = TimeSplit{};
  const uint64_t ws = c.window_start, we = c.window_end;
  if (we <= ws) return;
  if (horizon_ && ws < horizon_) {
    ++counters_.too_old;
    return;
  }
  const bool gap = c.category == "launch_gap";
  const double p50 = value_of(c, "p50"), p95 = value_of(c, "p95");
  const bool by_time = finite_pos(p50);
  const double thr = by_time ? std::max(finite_pos(p95) ? p95 : 0.0, 3 * p50) : 0.0;

  // The chain's threads: its key, as far as the chain names one.
  std::vector<const Thread*> cand;
  for (const auto& [k, t] : threads_) {
    // Rules keyed by pid leave node 0 even on multi-node traces: only a named node filters.
    if (c.node && t.node != c.node) continue;
    if (c.pid && t.pid != c.pid) continue;
    if (c.tid && t.tid != c.tid) continue;
    if (!c.pid && !c.tid && c.rank >= 0 && t.rank != c.rank) continue;
    cand.push_back(&t);
  }
  std::sort(cand.begin(), cand.end(), [](const Thread* a, const Thread* b) { return a->tid < b->tid; });

  struct Slow {
    const Thread* t;
    uint64_t ts, end;
  };
  std::vector<Slow> slow;
  std::map<uint32_t, std::pair<double, uint32_t>> per_tid;  // tid -> (weight, pid)
  StackTally calls_tally;
  // Warm-up: the key's calls that started in their process's warm-up, and (tail chains) the
  // durations of every other call of the key in the window, to re-judge the tail without them.
  uint64_t warm_calls = 0, warm_ns = 0;
  double warm_w = 0;
  // The slow calls behind the chain and their time beyond the median call (operators/severity.h).
  uint64_t slow_calls = 0;
  double slow_excess = 0;
  std::vector<uint64_t> rest_durs;
  // A trace's last window ends at its last event (engine: window_end = last_ts), which is in it.
  const uint64_t calls_end = meta.last_ts && we == meta.last_ts ? we + 1 : we;
  if (!gap) {
    for (const Thread* t : cand) {
      const uint64_t warm_until = warmup_end(t->node, t->pid);
      t->calls.for_each(ws, calls_end, [&](const Rec& r) {
        if (c.op) {
          if (r.source != c.source || r.op != c.op) return;
        } else if (c.source != Source::kUnknown && r.source != c.source) {
          return;
        }
        const bool warm = r.ts < warm_until;
        if (by_time && !warm && rest_durs.size() < (1u << 22)) rest_durs.push_back(r.dur);
        if (by_time && static_cast<double>(r.dur) < thr) return;
        const double w = by_time ? static_cast<double>(r.dur) : 1.0;
        ++slow_calls;
        if (by_time) slow_excess += std::max(0.0, static_cast<double>(r.dur) - p50);
        if (warm) {
          ++warm_calls;
          warm_w += w;
          warm_ns += r.dur;
        }
        auto& slot = per_tid[t->tid];
        slot.first += w;
        slot.second = t->pid;
        calls_tally.add(r.stack, w);
        if (slow.size() < (1u << 20)) slow.push_back({t, r.ts, r.end()});
      });
    }
  } else if (c.tid) {
    per_tid[c.tid] = {1.0, c.pid};
  }
  if (!gap) {
    c.values.emplace_back("slow.calls", static_cast<double>(slow_calls));
    if (by_time) c.values.emplace_back("slow.excess_ns", slow_excess);
  }
  if (calls_tally.total > 0 || gap) {
    const double total = gap ? 1.0 : calls_tally.total;
    for (const auto& [tid, wp] : per_tid)
      c.threads.push_back({tid, thread_name(meta, wp.second, tid), total > 0 ? wp.first / total : 0});
    std::stable_sort(c.threads.begin(), c.threads.end(),
                     [](const ThreadShare& a, const ThreadShare& b) { return a.share > b.share; });
    if (c.tid == 0 && !c.threads.empty()) c.tid = c.threads.front().tid;
  }
  // Warm-up is about slow calls; a rule over time judges the thread's time, warm-up or not.
  if (warm_calls && !c.over_time) apply_warmup(c, warm_calls, warm_w, calls_tally.total, rest_durs, by_time, warm_ns);
  // Implicit synchronisation is about the launch loop: a thread that launched no kernel in the
  // window is not stalling one (a cleanup or checkpoint thread), so its chain is only LOW.
  if (c.category == "implicit_sync" && c.tid) {
    size_t launches = 0;
    for (const Thread* t : cand)
      if (t->tid == c.tid) launches += launches_in(*t, ws, calls_end);
    c.values.emplace_back("launches", static_cast<double>(launches));
    if (launches == 0)
      c.root_cause += "; but tid " + std::to_string(c.tid) +
                      " launched no kernel in this window, so these calls do not hold up a launch loop";
  }
  top_stacks(calls_tally, "call", opt_.top_stacks, meta, stack_cache_, counters_.stacks_missing, c.stacks);
  // Tail chains (slow calls) and implicit synchronisation (every call of the key) name their site.
  if (const ChainStack* top = first_of_role(c, "call"); top && (by_time || c.category == "implicit_sync")) {
    const std::string site = site_of(top);
    if (!site.empty())
      c.recommendations.insert(c.recommendations.begin(),
                               "Start at the code that issued the slow calls: " + site + " (" + pct(top->share) +
                                   " of the slow-call time; every stack: explain -v, explain_chain)");
  }

  // A finding over time (rules/time.rules): the thread's off-CPU stacks of the kind the finding is
  // about, over its window; an input wait says where it waited.
  if (c.over_time) {
    const bool want_blocked = c.category != "cpu_contention";
    StackTally off;
    for (const Thread* t : cand) {
      if (t->tid != c.tid) continue;
      const Series& sp = t->offcpu;
      const uint64_t from = ws > sp.max_dur() ? ws - sp.max_dur() : 0;
      sp.for_each(from, we, [&](const Rec& r) {
        const bool blocked = r.state == OffCpuState::kSleeping || r.state == OffCpuState::kDiskWait ||
                             r.state == OffCpuState::kOther;
        if (want_blocked != blocked) return;
        const uint64_t a = std::max(r.ts, ws), b = std::min(r.end(), we);
        if (a < b) off.add(r.stack, static_cast<double>(b - a));
      });
    }
    top_stacks(off, "offcpu", opt_.top_stacks, meta, stack_cache_, counters_.stacks_missing, c.stacks);
    describe_wait(c);
    return;
  }

  // Where the slow calls' threads were while off CPU.
  if (c.category == "cpu_contention" || c.category == "blocking") {
    const bool want_blocked = c.category == "blocking";
    StackTally off;
    for (const Slow& s : slow) {
      const Series& sp = s.t->offcpu;
      const uint64_t from = s.ts > sp.max_dur() ? s.ts - sp.max_dur() : 0;
      sp.for_each(from, s.end, [&](const Rec& r) {
        const bool blocked = r.state == OffCpuState::kSleeping || r.state == OffCpuState::kDiskWait;
        const bool preempted = r.state == OffCpuState::kPreempted || r.state == OffCpuState::kUnknown;
        if (want_blocked ? !blocked : !preempted) return;
        const uint64_t a = std::max(r.ts, s.ts), b = std::min(r.end(), s.end);
        if (a < b) off.add(r.stack, static_cast<double>(b - a));
      });
    }
    top_stacks(off, "offcpu", opt_.top_stacks, meta, stack_cache_, counters_.stacks_missing, c.stacks);
  }

  if (!is_rate_or_gap(c)) return;
  // The launching thread: most launches of the process in the window, else most GPU API calls.
  const Thread* launcher = nullptr;
  if (gap) {
    for (const Thread* t : cand)
      if (t->tid == c.tid) launcher = t;
  } else {
    size_t best_launch = 0, best_calls = 0;
    for (const Thread* t : cand) {
      size_t launches = 0, calls = 0;
      t->calls.for_each(ws, we, [&](const Rec& r) {
        ++calls;
        if (is_launch_op(r.source, r.op)) ++launches;
      });
      if (launches > best_launch || (launches == best_launch && calls > best_calls)) {
        if (launches || calls) launcher = t;
        best_launch = launches;
        best_calls = calls;
      }
    }
  }
  if (!launcher) return;
  c.time_split = time_split(launcher->node, launcher->tid, ws, we);
  if (!c.time_split.present) return;
  StackTally off, samples;
  {
    const Series& sp = launcher->offcpu;
    const uint64_t from = ws > sp.max_dur() ? ws - sp.max_dur() : 0;
    sp.for_each(from, we, [&off, ws, we](const Rec& r) {
      const uint64_t a = std::max(r.ts, ws), b = std::min(r.end(), we);
      if (a < b) off.add(r.stack, static_cast<double>(b - a));
    });
    launcher->samples.for_each(ws, we, [&samples](const Rec& r) { samples.add(r.stack, 1.0); });
  }
  top_stacks(off, "offcpu", opt_.top_stacks, meta, stack_cache_, counters_.stacks_missing, c.stacks);
  top_stacks(samples, "sample", opt_.top_stacks, meta, stack_cache_, counters_.stacks_missing, c.stacks);
  apply_split(c, thread_name(meta, launcher->pid, launcher->tid));
  // Severity follows the split (operators/severity.h, rule 3): the time split is the fact.
}

uint64_t ChainAnnotator::warmup_end(uint16_t node, uint32_t pid) const {
  if (!opt_.warmup_ns) return 0;
  const auto it = first_call_.find(thread_key(node, pid));
  if (it == first_call_.end()) return 0;
  return it->second > UINT64_MAX - opt_.warmup_ns ? UINT64_MAX : it->second + opt_.warmup_ns;
}

// Re-judges a chain without its process's warm-up calls (contract in the header).
void ChainAnnotator::apply_warmup(Chain& c, uint64_t warm_calls, double warm_w, double total_w,
                                  std::vector<uint64_t>& rest, bool by_time, uint64_t warm_ns) {
  const double share = total_w > 0 ? std::min(1.0, warm_w / total_w) : 0.0;
  c.values.emplace_back("warmup.calls", static_cast<double>(warm_calls));
  c.values.emplace_back("warmup.share", share);
  c.values.emplace_back("warmup.window_ns", static_cast<double>(opt_.warmup_ns));
  const std::string secs = format_duration(opt_.warmup_ns);
  bool only_warmup = false;
  if (by_time) {
    if (rest.size() < opt_.warmup_min_calls) {
      only_warmup = true;
    } else {
      auto rank = [&](double q) {
        size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(rest.size())));
        k = k ? k - 1 : 0;
        std::nth_element(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(k), rest.end());
        return static_cast<double>(rest[k]);
      };
      const double p50 = rank(0.5), p99 = rank(0.99);
      only_warmup = !(p50 > 0 && p99 >= opt_.warmup_tail_ratio * p50);
    }
  } else {
    only_warmup = share >= 0.5;
  }
  const std::string what = std::to_string(warm_calls) + (by_time ? " of the slow calls" : " of the calls") +
                           " started in the process's warm-up (its first " + secs + " of GPU calls)";
  const bool abnormal = only_warmup && static_cast<double>(warm_ns) >= static_cast<double>(opt_.warmup_abnormal_ns);
  c.values.emplace_back("warmup.only", only_warmup ? 1.0 : 0.0);
  c.values.emplace_back("warmup.abnormal", abnormal ? 1.0 : 0.0);
  if (!only_warmup) {
    if (!c.explanation.empty() && c.explanation.back() != ' ') c.explanation += ' ';
    c.explanation += what + "; the chain stands without them.";
    return;
  }
  if (abnormal) {
    c.summary = "abnormal warm-up: " + c.summary;
    if (!c.explanation.empty() && c.explanation.back() != ' ') c.explanation += ' ';
    c.explanation += what + ", holding " + format_value(static_cast<double>(warm_ns), Unit::kNs) +
                     ": a warm-up this slow is itself abnormal (slow context creation, autotuning or compilation).";
    return;
  }
  c.summary = "warm-up: " + c.summary;
  c.root_cause =
      "Warm-up, not steady state: " + what +
      " (CUDA context creation, first allocations, autotuning, compilation); without them there is no chain. "
      "Warm-up is excluded from the judgement (param warmup = " +
      secs + "; `--param warmup=0s` turns it off). Was: " + c.root_cause;
}

Chain ChainAnnotator::gap_chain(const GapGroup& g, const TraceMeta& meta) {
  const Gap& gp = g.longest;
  const auto it = threads_.find(gp.key);
  Chain c;
  c.rule = "launch_gap";
  c.rule_hash = "builtin";
  c.category = "launch_gap";
  c.source = gp.source;
  c.op = gp.op;
  c.tid = static_cast<uint32_t>(gp.key & 0xffffffffu);
  c.node = static_cast<uint16_t>(gp.key >> 32);
  if (it != threads_.end()) {
    c.pid = it->second.pid;
    c.rank = it->second.rank;
  }
  c.window_start = gp.start;
  c.window_end = gp.end;
  const uint64_t len = gp.end - gp.start;
  c.severity = len >= opt_.gap_high_ns ? Severity::kHigh : Severity::kMedium;
  const std::string proc = meta.process_names.count(c.pid) ? meta.process_names.at(c.pid)
                                                           : "pid " + std::to_string(c.pid);
  const std::string others = g.gaps > 1 ? " (the longest of " + format_count(static_cast<double>(g.gaps)) +
                                              " gaps >= " + format_ns(static_cast<double>(opt_.gap_min_ns)) +
                                              " in this " + format_ns(static_cast<double>(opt_.gap_window_ns)) +
                                              " window, " + format_ns(static_cast<double>(g.total_ns)) + " in all)"
                                        : "";
  c.summary = "tid " + std::to_string(c.tid) + " of " + proc + " went " + format_ns(static_cast<double>(len)) +
              " without launching GPU work" + others;
  c.root_cause = "Launch gap: the thread that launches the GPU work stopped launching for a while";
  c.explanation = "Thread " + std::to_string(c.tid) + " launched GPU work before and after a pause of " +
                  format_ns(static_cast<double>(len)) + others + "; the GPU had nothing new from it in between.";
  c.recommendations = {"Compare with throughput_drop and blocking chains of the same process and window"};
  EvidenceItem ev;
  ev.kind = "gap";
  ev.unit = "ns";
  ev.value = static_cast<double>(len);
  ev.detail = "no launch between event " + std::to_string(gp.before_id) + " and event " + std::to_string(gp.after_id) +
              " (" + format_ns(static_cast<double>(len)) + ")";
  ev.event_ids = {gp.before_id, gp.after_id};
  c.evidence.push_back(ev);
  PredicateResult p;
  p.label = "gap >= " + format_ns(static_cast<double>(opt_.gap_min_ns));
  p.lhs = static_cast<double>(len);
  p.rhs = static_cast<double>(opt_.gap_min_ns);
  p.margin = p.lhs - p.rhs;
  p.passed = true;
  p.lhs_text = format_ns(p.lhs);
  p.rhs_text = format_ns(p.rhs);
  c.predicates.push_back(p);
  c.values = {{"gap", static_cast<double>(len)},
              {"gaps", static_cast<double>(g.gaps)},
              {"gap_total", static_cast<double>(g.total_ns)},
              {"gap_min", static_cast<double>(opt_.gap_min_ns)}};
  c.id = "launch_gap:pid=" + std::to_string(c.pid) + ",tid=" + std::to_string(c.tid) + ":" + std::to_string(gp.start);
  annotate(c, meta);
  return c;
}

std::vector<Chain> ChainAnnotator::take_gap_chains(const TraceMeta& meta, bool final) {
  std::vector<Chain> out;
  if (!opt_.detect_gaps) return out;
  const uint64_t ctx = opt_.gap_context_ns;
  std::vector<Gap> still;
  for (const Gap& g : pending_gaps_) {
    if (!final && newest_ < g.end + ctx) {
      still.push_back(g);
      continue;
    }
    auto it = threads_.find(g.key);
    if (it == threads_.end()) continue;
    const size_t before = g.before;
    const size_t after = launches_in(it->second, g.end, g.end + ctx);
    if (before < opt_.gap_min_launches || after < opt_.gap_min_launches) continue;
    GapGroup& grp = groups_[{g.key, g.start / opt_.gap_window_ns}];
    ++grp.gaps;
    grp.total_ns += g.end - g.start;
    grp.window_end = (g.start / opt_.gap_window_ns + 1) * opt_.gap_window_ns;
    if (g.end - g.start > grp.longest.end - grp.longest.start) grp.longest = g;
  }
  pending_gaps_ = std::move(still);
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (final || newest_ >= it->second.window_end + ctx) {
      out.push_back(gap_chain(it->second, meta));
      ++counters_.gap_chains;
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
  std::sort(out.begin(), out.end(), chain_canonical_order);
  return out;
}

void annotate_result(AnalysisResult& r, ChainAnnotator& a) {
  a.annotate(r.chains, r.meta);
  auto gaps = a.take_gap_chains(r.meta, true);
  for (auto& g : gaps) r.chains.push_back(std::move(g));
  std::sort(r.chains.begin(), r.chains.end(), chain_canonical_order);
}

WarmupEffect warmup_effect(const std::vector<Chain>& chains, const std::string& rule) {
  WarmupEffect w;
  for (const auto& c : chains) {
    if (c.rule != rule) continue;
    const double calls = value_of(c, "warmup.calls");
    if (!(calls > 0)) continue;
    ++w.chains;
    w.calls += static_cast<uint64_t>(calls);
    if (value_of(c, "warmup.only") == 1.0) {
      ++w.only;
      w.only_calls += static_cast<uint64_t>(calls);
      if (value_of(c, "warmup.abnormal") == 1.0) ++w.abnormal;
      else ++w.demoted;
    }
  }
  return w;
}

std::string warmup_why_not_text(const WarmupEffect& w, uint64_t warmup_ns) {
  const std::string param = "param warmup = " + format_duration(warmup_ns);
  if (warmup_ns == 0) return "  warm-up: off (" + param + "): every call was judged as steady state.\n";
  std::string s = "  warm-up (" + param + ", per process from its first GPU call): ";
  if (w.chains == 0)
    return s +
           "no chain of this rule had calls in a warm-up. Warm-up never hides a rule's rows from the engine; it "
           "only re-judges the chains that fired.\n";
  s += std::to_string(w.chains) + " chain(s) had " + std::to_string(w.calls) + " call(s) in a warm-up";
  if (w.demoted)
    s += "; " + std::to_string(w.demoted) + " stood on warm-up calls alone and are reported LOW as \"warm-up:\"";
  if (w.abnormal)
    s += "; " + std::to_string(w.abnormal) +
         " stood on an abnormal warm-up (its calls held 5 s or more) and kept "
         "their severity";
  if (w.chains > w.only) s += "; " + std::to_string(w.chains - w.only) + " stand without their warm-up calls";
  s += ". `--param warmup=0s` judges every call as steady state.\n";
  return s;
}

}  // namespace ingero

namespace ingero {

class LiveChainAnnotator::Tap final : public EventSource {
 public:
  explicit Tap(LiveChainAnnotator& owner) : owner_(owner) {}
  bool next(Batch& out) override {
    std::lock_guard<std::mutex> lock(owner_.mu_);
    if (!owner_.in_->next(out)) return false;
    owner_.a_.add(out);
    // Gap chains are built while their events are still kept.
    for (auto& g : owner_.a_.take_gap_chains(owner_.in_->meta(), false)) owner_.gaps_ready_.push_back(std::move(g));
    return true;
  }
  TraceMeta& meta() override { return owner_.in_->meta(); }

 private:
  LiveChainAnnotator& owner_;
};

LiveChainAnnotator::LiveChainAnnotator(AnnotateOptions o) : a_(o) {}

EventSource& LiveChainAnnotator::tap(EventSource& in) {
  std::lock_guard<std::mutex> lock(mu_);
  in_ = &in;
  tap_ = std::make_unique<Tap>(*this);
  return *tap_;
}

Chain LiveChainAnnotator::annotate(const Chain& c) {
  Chain out = c;
  std::lock_guard<std::mutex> lock(mu_);
  if (!in_) return out;
  a_.annotate(out, in_->meta());
  if (done_.size() < 1'000'000) done_[out.id] = out;
  return out;
}

std::vector<Chain> LiveChainAnnotator::take_gap_chains() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Chain> out = std::move(gaps_ready_);
  gaps_ready_.clear();
  for (const auto& c : out) gaps_taken_.push_back(c);
  return out;
}

void LiveChainAnnotator::finish(AnalysisResult& r) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Chain& c : r.chains) {
    auto it = done_.find(c.id);
    if (it != done_.end() && c.over_time) {
      // A run of windows merged after it was annotated (its first window's id): keep the run,
      // take what the annotation adds.
      const Chain& a = it->second;
      c.threads = a.threads;
      c.stacks = a.stacks;
      c.time_split = a.time_split;
      if (!c.tid) c.tid = a.tid;
      describe_wait(c);
    } else if (it != done_.end()) {
      c = it->second;
    } else {
      a_.annotate(c, r.meta);
    }
  }
  for (auto& g : gaps_taken_) r.chains.push_back(std::move(g));
  for (auto& g : gaps_ready_) r.chains.push_back(std::move(g));
  gaps_taken_.clear();
  gaps_ready_.clear();
  for (auto& g : a_.take_gap_chains(r.meta, true)) r.chains.push_back(std::move(g));
  fold_into_findings_over_time(r.chains);
  std::sort(r.chains.begin(), r.chains.end(), chain_canonical_order);
}

void fold_into_findings_over_time(std::vector<Chain>& chains) {
  std::vector<size_t> over;
  for (size_t i = 0; i < chains.size(); ++i)
    if (chains[i].over_time && chains[i].tid) over.push_back(i);
  if (over.empty()) return;
  std::vector<char> drop(chains.size(), 0);
  for (size_t i = 0; i < chains.size(); ++i) {
    const Chain& c = chains[i];
    if (c.over_time || !c.tid) continue;
    for (size_t o : over) {
      Chain& f = chains[o];
      if (f.category != c.category || f.node != c.node || f.pid != c.pid || f.tid != c.tid) continue;
      if (c.window_end <= f.window_start || c.window_start >= f.window_end) continue;
      EvidenceItem e;
      e.kind = "folded";
      e.detail = "also seen by rule " + c.rule + " over " + std::to_string((c.window_end - c.window_start) / 1000000) +
                 " ms of this window: " + c.summary;
      f.evidence.push_back(std::move(e));
      // Its evidence (exemplar events: the slow calls, the off-CPU spans) stays with the finding.
      for (const auto& item : c.evidence) f.evidence.push_back(item);
      if (f.severity < c.severity) f.severity = c.severity;
      // ... as its declaration too: operators/severity.h grades from the declaration.
      const Severity cd = c.declared_severity.value_or(c.severity);
      if (f.declared_severity.value_or(f.severity) < cd) f.declared_severity = cd;
      drop[i] = 1;
      break;
    }
  }
  size_t w = 0;
  for (size_t i = 0; i < chains.size(); ++i)
    if (!drop[i]) {
      if (w != i) chains[w] = std::move(chains[i]);
      ++w;
    }
  chains.resize(w);
}

AnnotateOptions LiveChainAnnotator::replay_defaults() {
  AnnotateOptions o = defaults();
  o.min_records = 2u << 20;
  o.max_records = 8u << 20;
  o.resident_bytes = SpillFile::budget_from_env("INGERO_ANNOTATE_RESIDENT_MB", kReplayResidentBytes);
  return o;
}

SpillCounters LiveChainAnnotator::spill_counters() {
  std::lock_guard<std::mutex> lock(mu_);
  return a_.spill_counters();
}

AnnotateCounters LiveChainAnnotator::counters() {
  std::lock_guard<std::mutex> lock(mu_);
  return a_.counters();
}

size_t LiveChainAnnotator::retained() {
  std::lock_guard<std::mutex> lock(mu_);
  return a_.retained();
}

size_t LiveChainAnnotator::retained_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return a_.retained_bytes();
}

}  // namespace ingero
