// Pass `tests`: turns each `test "name" { event ... expect ... }` into a RuleTest with concrete
// events. Event attributes: at, dur, every (durations), repeat (count), pid, tid, rank, node, gpu,
// ret, arg0, arg1, bytes, state, stack. `stack "train.py:42 in train_step; main.py:7 in main"`
// gives the event a stack: frames innermost first, separated by `;`, each `FILE:LINE in FUNCTION`
// (a Python frame) or any other text (a native frame of that symbol). Timestamps start at kFixtureBaseNs (aligned to
// any window size that divides 10^18 ns). At most 100000 events per fixture line and 200000 per test.
#include <cmath>

#include "dsl/sema.h"
#include "model/stack.h"

namespace ingero::dsl {
namespace {

std::string trim(std::string_view v) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return std::string(v);
}

// `stack "a.py:3 in f; b.py:9 in g; cudaMemcpy"` -> a parsed stack, innermost first.
ParsedStack fixture_stack(const std::string& text) {
  ParsedStack st;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string::npos) end = text.size();
    const std::string f = trim(std::string_view(text).substr(start, end - start));
    start = end + 1;
    if (f.empty()) continue;
    StackFrame fr;
    const size_t in = f.find(" in ");
    const size_t colon = in == std::string::npos ? std::string::npos : f.rfind(':', in);
    bool python = colon != std::string::npos && colon > 0 && colon + 1 < in;
    for (size_t i = colon + 1; python && i < in; ++i) python = f[i] >= '0' && f[i] <= '9';
    if (python) {
      fr.kind = FrameKind::kPython;
      fr.file = f.substr(0, colon);
      fr.line = static_cast<uint32_t>(std::stoul(f.substr(colon + 1, in - colon - 1).substr(0, 9)));
      fr.function = f.substr(in + 4);
    } else {
      fr.kind = FrameKind::kNative;
      fr.function = f;
    }
    st.frames.push_back(std::move(fr));
  }
  return st;
}

constexpr double kMaxRepeat = 100000;
constexpr size_t kMaxEvents = 200000;

const std::vector<std::string>& attr_names() {
  static const std::vector<std::string> v = {"at",  "dur", "every", "repeat", "pid",   "tid",   "rank", "node",
                                             "gpu", "ret", "arg0",  "arg1",   "bytes", "state", "stack"};
  return v;
}

std::vector<std::string> op_names() {
  std::vector<std::string> v;
  for (const auto& o : all_ops()) v.emplace_back(o.name);
  return v;
}

}  // namespace

void pass_tests(Module& m) {
  for (auto& r : m.rules) {
    FileUnit& f = *r.file;
    std::set<std::string> names;
    for (const ast::TestClause* tc : r.tests) {
      RuleTest t;
      t.file = f.src.path();
      std::tie(t.line, t.col) = f.src.line_col(static_cast<size_t>(tc->id_first));
      t.rule = r.name;
      t.name = tc->name.value;
      if (!names.insert(t.name).second)
        m.error_at(f, tc->name, "E0802", "rule `" + r.name + "` already has a test named \"" + t.name + "\"");
      bool ok = true;
      uint64_t next_id = 1;
      for (const auto& fe : tc->events) {
        const OpInfo* info = find_op(fe.op.name);
        if (!info) {
          m.error_at(f, fe.op, "E0801", "unknown op `" + fe.op.name + "`", did_you_mean(fe.op.name, op_names()));
          ok = false;
          continue;
        }
        Event e;
        e.source = info->source;
        e.op = info->op;
        e.pid = 100;
        bool tid_set = false;
        double at = 0, every = 0, repeat = 1;
        std::set<std::string> seen;
        for (const auto& a : fe.attrs) {
          const std::string& k = a.key.name;
          if (std::find(attr_names().begin(), attr_names().end(), k) == attr_names().end()) {
            std::string hint = did_you_mean(k, attr_names());
            if (hint.empty())
              hint =
                  "event attributes: at, dur, every, repeat, pid, tid, rank, node, gpu, ret, arg0, arg1, bytes, state, "
                  "stack";
            m.error_at(f, a.key, "E0802", "unknown event attribute `" + k + "`", hint);
            ok = false;
            continue;
          }
          if (!seen.insert(k).second) {
            m.error_at(f, a.key, "E0802", "`" + k + "` is given twice");
            ok = false;
            continue;
          }
          if (k == "stack") {
            const auto* str = boost::get<ast::String>(&a.value.get());
            const ParsedStack st = str ? fixture_stack(str->value) : ParsedStack{};
            if (st.frames.empty()) {
              m.error_at(f, a, "E0802", "`stack` needs a string of frames, innermost first",
                         "e.g. `stack \"train.py:42 in train_step; train.py:90 in main\"`");
              ok = false;
              continue;
            }
            e.stack_id = stack_content_hash(st);
            t.stacks[e.stack_id] = encode_stack(st);
            continue;
          }
          Resolver res{m, f, &r, Ctx::kConst};
          TExpr v = res.resolve_atom(a.value, Ty::kUnknown);
          if (v.ty == Ty::kUnknown) {
            ok = false;
            continue;
          }
          auto need = [&](bool cond, const std::string& what, const std::string& hint = {}) {
            if (!cond) {
              m.error_at(f, a, v.ty == Ty::kNumber && what.find("duration") != std::string::npos ? "E0302" : "E0802",
                         // NOLINTNEXTLINE(performance-inefficient-string-concatenation): error text, once per error
                         "`" + k + "` needs " + what + ", found " + ty_name(v.ty), hint);
              ok = false;
            }
            return cond;
          };
          const bool whole = v.op == ExprOp::kConst && v.value >= 0 && v.value == std::floor(v.value);
          if (k == "at" || k == "dur" || k == "every") {
            if (!need(v.ty == Ty::kDuration && v.value >= 0, "a duration", "add a unit, e.g. `" + k + " 5ms`"))
              continue;
            if (k == "at") at = v.value;
            else if (k == "every") every = v.value;
            else e.dur_ns = static_cast<uint64_t>(v.value);
          } else if (k == "repeat") {
            if (need(v.ty == Ty::kNumber && whole && v.value >= 1 && v.value <= kMaxRepeat, "a count from 1 to 100000"))
              repeat = v.value;
          } else if (k == "state") {
            if (need(v.ty == Ty::kState, "an off-CPU state"))
              e.prev_state = static_cast<OffCpuState>(static_cast<int>(v.value));
          } else if (k == "bytes") {
            if (need((v.ty == Ty::kBytes || v.ty == Ty::kNumber) && whole && v.value < 1.8e19, "a size"))
              e.arg0 = static_cast<uint64_t>(v.value);
          } else {
            if (!need(v.ty == Ty::kNumber && whole && v.value < 4e9, "a whole number")) continue;
            const double x = v.value;
            if (k == "pid") e.pid = static_cast<uint32_t>(x);
            else if (k == "tid") e.tid = static_cast<uint32_t>(x), tid_set = true;
            else if (k == "rank") e.rank = static_cast<int16_t>(std::min(x, 32767.0));
            else if (k == "node") e.node = static_cast<uint16_t>(std::min(x, 65535.0));
            else if (k == "gpu") e.gpu_id = static_cast<uint8_t>(std::min(x, 255.0));
            else if (k == "ret") e.ret = static_cast<int32_t>(std::min(x, 2147483647.0));
            else if (k == "arg0") e.arg0 = static_cast<uint64_t>(x);
            else if (k == "arg1") e.arg1 = static_cast<uint64_t>(x);
          }
        }
        if (!tid_set) e.tid = e.pid;
        if (t.events.size() + static_cast<size_t>(repeat) > kMaxEvents) {
          m.error_at(f, fe, "E0804", "a test holds at most " + std::to_string(kMaxEvents) + " events");
          ok = false;
          break;
        }
        for (int i = 0; i < static_cast<int>(repeat); ++i) {
          Event ev = e;
          ev.ts_ns = kFixtureBaseNs + static_cast<uint64_t>(at + every * i);
          ev.id = next_id++;
          t.events.push_back(ev);
        }
      }
      const auto& ex = tc->expect;
      t.expect_match = !ex.negated;
      if (ex.what.name != "match") {
        m.error_at(f, ex.what, "E0803", "expected `match` after `expect" + std::string(ex.negated ? " no" : "") + "`");
        ok = false;
      }
      for (const auto& a : ex.attrs) {
        const auto* id = boost::get<ast::Ident>(&a.value.get());
        const auto* num = boost::get<ast::Number>(&a.value.get());
        Severity sev;
        if (a.key.name == "severity" && id && parse_severity(id->name, sev) && !ex.negated) {
          t.severity = sev;
        } else if (a.key.name == "chains" && num && num->unit.empty() && num->value >= 0 &&
                   num->value == std::floor(num->value) && num->value < 1e6 && !ex.negated) {
          t.expect_chains = static_cast<int>(num->value);
        } else {
          m.error_at(f, a, "E0803", "expected `severity low|medium|high` or `chains N` after `expect match`");
          ok = false;
        }
      }
      if (ok) m.tests.push_back(std::move(t));
    }
  }
}

}  // namespace ingero::dsl
