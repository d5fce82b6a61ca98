// Shared tables and helpers of the compiler passes (see sema.h).
#include "dsl/sema.h"

#include <cctype>

namespace ingero::dsl {

const char* ty_name(Ty t) {
  switch (t) {
    case Ty::kNumber: return "a number";
    case Ty::kDuration: return "a duration";
    case Ty::kBytes: return "a size in bytes";
    case Ty::kRatio: return "a ratio";
    case Ty::kCount: return "a count";
    case Ty::kRate: return "a rate";
    case Ty::kBool: return "a condition";
    case Ty::kId: return "an id";
    case Ty::kOp: return "an op";
    case Ty::kSource: return "a source";
    case Ty::kState: return "an off-CPU state";
    case Ty::kString: return "a string";
    case Ty::kList: return "a list";
    default: return "an unknown value";
  }
}

Unit ty_unit(Ty t) {
  switch (t) {
    case Ty::kDuration: return Unit::kNs;
    case Ty::kBytes: return Unit::kBytes;
    case Ty::kRatio: return Unit::kRatio;
    case Ty::kCount: return Unit::kCount;
    case Ty::kRate: return Unit::kPerSecond;
    case Ty::kBool: return Unit::kBool;
    default: return Unit::kNone;
  }
}

namespace {
struct UnitDef {
  const char* suffix;
  double scale;
  Ty ty;
  Unit unit;
};
constexpr UnitDef kUnits[] = {
    {"ns", 1, Ty::kDuration, Unit::kNs},
    {"us", 1e3, Ty::kDuration, Unit::kNs},
    {"ms", 1e6, Ty::kDuration, Unit::kNs},
    {"s", 1e9, Ty::kDuration, Unit::kNs},
    {"m", 60e9, Ty::kDuration, Unit::kNs},
    {"h", 3600e9, Ty::kDuration, Unit::kNs},
    {"B", 1, Ty::kBytes, Unit::kBytes},
    {"KB", 1e3, Ty::kBytes, Unit::kBytes},
    {"MB", 1e6, Ty::kBytes, Unit::kBytes},
    {"GB", 1e9, Ty::kBytes, Unit::kBytes},
    {"KiB", 1024.0, Ty::kBytes, Unit::kBytes},
    {"MiB", 1048576.0, Ty::kBytes, Unit::kBytes},
    {"GiB", 1073741824.0, Ty::kBytes, Unit::kBytes},
    {"%", 0.01, Ty::kRatio, Unit::kPercent},
    {"x", 1, Ty::kRatio, Unit::kRatio},
};
}  // namespace

bool parse_unit_suffix(const std::string& suffix, double& scale, Ty& ty, Unit& unit) {
  if (suffix.empty()) {
    scale = 1;
    ty = Ty::kNumber;
    unit = Unit::kNone;
    return true;
  }
  for (const auto& u : kUnits)
    if (suffix == u.suffix) {
      scale = u.scale;
      ty = u.ty;
      unit = u.unit;
      return true;
    }
  return false;
}

const std::vector<std::string>& unit_suffixes() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& u : kUnits) v.emplace_back(u.suffix);
    return v;
  }();
  return names;
}

bool find_state(const std::string& name, OffCpuState& out) {
  static const std::pair<const char*, OffCpuState> kStates[] = {{"unknown", OffCpuState::kUnknown},
                                                                {"preempted", OffCpuState::kPreempted},
                                                                {"sleeping", OffCpuState::kSleeping},
                                                                {"disk_wait", OffCpuState::kDiskWait},
                                                                {"other", OffCpuState::kOther}};
  for (const auto& [n, s] : kStates)
    if (name == n) {
      out = s;
      return true;
    }
  return false;
}

const std::vector<std::string>& state_names() {
  static const std::vector<std::string> v = {"unknown", "preempted", "sleeping", "disk_wait", "other"};
  return v;
}

bool find_event_field(const std::string& name, Field& f, Ty& ty) {
  if (name == "bytes") {
    f = Field::kArg0;
    ty = Ty::kBytes;
    return true;
  }
  if (name == "state") {
    f = Field::kPrevState;
    ty = Ty::kState;
    return true;
  }
  if (!parse_field(name, f)) return false;
  switch (f) {
    case Field::kTs:
    case Field::kDuration:
    case Field::kEnd: ty = Ty::kDuration; break;
    case Field::kSource: ty = Ty::kSource; break;
    case Field::kOp: ty = Ty::kOp; break;
    case Field::kPrevState: ty = Ty::kState; break;
    case Field::kArg0:
    case Field::kArg1:
    case Field::kRet: ty = Ty::kNumber; break;
    default: ty = Ty::kId;
  }
  return true;
}

std::vector<std::string> event_field_names() {
  std::vector<std::string> v = {"bytes", "state"};
  for (int i = 0; i <= static_cast<int>(Field::kGpuId); ++i) v.emplace_back(field_name(static_cast<Field>(i)));
  return v;
}

bool parse_severity(const std::string& name, Severity& out) {
  if (name == "low") out = Severity::kLow;
  else if (name == "medium") out = Severity::kMedium;
  else if (name == "high") out = Severity::kHigh;
  else return false;
  return true;
}

std::string text_of(const FileUnit& f, int pos, int end) {
  const std::string& t = f.src.text();
  if (pos < 0 || end <= pos || static_cast<size_t>(end) > t.size()) return {};
  std::string out;
  bool space = false;
  for (int i = pos; i < end; ++i) {
    const char c = t[static_cast<size_t>(i)];
    if (c == '#') {  // a comment inside a multi-line expression
      while (i < end && t[static_cast<size_t>(i)] != '\n') ++i;
      space = true;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

void Module::error(const FileUnit& f, int pos, int end, const char* code, std::string msg, std::string hint) {
  if (too_many()) return;
  diags.push_back(f.src.make(DiagLevel::kError, code, static_cast<size_t>(std::max(pos, 0)),
                             static_cast<size_t>(std::max(end, pos)), std::move(msg), std::move(hint)));
}

void Module::warning(const FileUnit& f, int pos, int end, const char* code, std::string msg, std::string hint) {
  if (too_many()) return;
  diags.push_back(f.src.make(DiagLevel::kWarning, code, static_cast<size_t>(std::max(pos, 0)),
                             static_cast<size_t>(std::max(end, pos)), std::move(msg), std::move(hint)));
}

void for_each_expr(RuleSema& r, const std::function<void(TExpr&, Ctx)>& fn) {
  if (r.stream.where) fn(*r.stream.where, Ctx::kEvent);
  for (auto& s : r.steps) {
    for (auto& [n, e] : s.lets) fn(e, Ctx::kRow);
    if (s.kind == Step::Kind::kRequire) fn(s.pred, Ctx::kRow);
    if (s.kind == Step::Kind::kJoin) {
      if (s.right.where) fn(*s.right.where, Ctx::kEvent);
      fn(s.tail, Ctx::kTail);
    }
  }
  for (auto& c : r.sev_cases)
    if (c.when) fn(*c.when, Ctx::kRow);
  for (auto& [n, e] : r.template_lets) fn(e, Ctx::kRow);
}

}  // namespace ingero::dsl
