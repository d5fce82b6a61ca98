#include "model/stack.h"

#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

namespace ingero {

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

void fnv(uint64_t& h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= kFnvPrime;
  }
  h ^= 0xff;  // separator, so ("ab","c") and ("a","bc") differ
  h *= kFnvPrime;
}

uint64_t parse_hex(std::string_view s) {
  if (s.starts_with("0x") || s.starts_with("0X")) s.remove_prefix(2);
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else break;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string str_of(const nlohmann::json& o, const char* key) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

uint32_t uint_of(const nlohmann::json& o, const char* key) {
  const auto it = o.find(key);
  if (it == o.end()) return 0;
  if (it->is_number_unsigned() || it->is_number_integer()) {
    const auto v = it->get<int64_t>();
    return v > 0 && v < (int64_t{1} << 31) ? static_cast<uint32_t>(v) : 0;
  }
  if (it->is_string()) return static_cast<uint32_t>(std::strtoul(it->get<std::string>().c_str(), nullptr, 10));
  return 0;
}

// "symbol+0x1f" -> ("symbol", 0x1f); a symbol without an offset keeps offset 0.
void split_symbol(const std::string& s, StackFrame& f) {
  const auto plus = s.rfind("+0x");
  if (plus != std::string::npos && plus > 0) {
    f.function = s.substr(0, plus);
    f.offset = parse_hex(std::string_view(s).substr(plus + 1));
  } else {
    f.function = s;
  }
}

}  // namespace

const char* frame_kind_name(FrameKind k) {
  switch (k) {
    case FrameKind::kPython: return "python";
    case FrameKind::kKernel: return "kernel";
    default: return "native";
  }
}

ParsedStack parse_stack(const StackTrace& st) { return parse_stack_frames(st.frames); }

ParsedStack parse_stack_frames(std::string_view frames_json) {
  ParsedStack out;
  if (frames_json.empty()) return out;
  nlohmann::json j = nlohmann::json::parse(frames_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) {
    out.malformed = true;
    return out;
  }
  for (const auto& o : j) {
    if (!o.is_object()) {
      out.malformed = true;
      continue;
    }
    if (o.contains("truncated")) {
      out.truncated = true;
      continue;
    }
    StackFrame f;
    if (o.contains("pf") || o.contains("pfn")) {
      f.kind = FrameKind::kPython;
      f.file = str_of(o, "pf");
      f.function = str_of(o, "pfn");
      f.line = uint_of(o, "pl");
    } else if (o.contains("k")) {
      f.kind = FrameKind::kKernel;
      split_symbol(str_of(o, "k"), f);
    } else {
      f.kind = FrameKind::kNative;
      f.module = str_of(o, "f");
      const std::string s = str_of(o, "s");
      if (!s.empty()) split_symbol(s, f);
      const std::string ip = str_of(o, "i");
      if (!ip.empty()) f.ip = parse_hex(ip);
      f.file = str_of(o, "sf");
      f.line = uint_of(o, "sl");
    }
    out.frames.push_back(std::move(f));
  }
  return out;
}

StackTrace encode_stack(const ParsedStack& st, const std::vector<uint64_t>& ips) {
  nlohmann::json frames = nlohmann::json::array();
  for (const auto& f : st.frames) {
    nlohmann::json o = nlohmann::json::object();
    switch (f.kind) {
      case FrameKind::kPython:
        o["pf"] = f.file;
        o["pfn"] = f.function;
        o["pl"] = f.line;
        break;
      case FrameKind::kKernel: o["k"] = f.offset ? f.function + "+" + hex(f.offset) : f.function; break;
      case FrameKind::kNative:
        if (!f.function.empty()) o["s"] = f.offset ? f.function + "+" + hex(f.offset) : f.function;
        else o["i"] = hex(f.ip);
        o["f"] = f.module;
        if (!f.file.empty()) {
          o["sf"] = f.file;
          o["sl"] = f.line;
        }
        break;
    }
    frames.push_back(std::move(o));
  }
  if (st.truncated) frames.push_back(nlohmann::json{{"truncated", true}});
  nlohmann::json jips = nlohmann::json::array();
  for (uint64_t ip : ips) jips.push_back(hex(ip));
  // Invalid UTF-8 from a trace is replaced, never thrown on.
  return StackTrace{jips.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    frames.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

uint64_t stack_content_hash(const ParsedStack& st) {
  uint64_t h = kFnvOffset;
  for (const auto& f : st.frames) {
    fnv(h, frame_kind_name(f.kind));
    fnv(h, f.function);
    fnv(h, f.file);
    fnv(h, std::to_string(f.line));
    fnv(h, f.module);
    // Unresolved native frames differ only by address: keep it (offset within the module would
    // be better, but an unresolved frame has no module base to subtract).
    if (f.function.empty()) fnv(h, hex(f.ip));
    else fnv(h, hex(f.offset));
  }
  if (st.truncated) fnv(h, "truncated");
  return h ? h : 1;
}

const StackFrame* innermost_python(const ParsedStack& st) {
  for (const auto& f : st.frames)
    if (f.kind == FrameKind::kPython) return &f;
  return nullptr;
}

namespace {
bool gpu_library(const std::string& module) {
  for (const char* lib : {"libcudart", "libcuda.", "libnccl", "libcublas", "libcudnn", "[uprobes]"})
    if (module.find(lib) != std::string::npos) return true;
  return false;
}
}  // namespace

const StackFrame* call_site(const ParsedStack& st) {
  if (const StackFrame* py = innermost_python(st)) return py;
  for (const auto& f : st.frames)
    if (f.kind == FrameKind::kNative && !gpu_library(f.module)) return &f;
  return st.frames.empty() ? nullptr : &st.frames.front();
}

std::string frame_text(const StackFrame& f) {
  switch (f.kind) {
    case FrameKind::kPython:
      return f.file + ":" + std::to_string(f.line) + " in " + (f.function.empty() ? "?" : f.function);
    case FrameKind::kKernel: return f.function.empty() ? "[kernel]" : f.function + " [kernel]";
    case FrameKind::kNative: {
      std::string s = f.function.empty() ? hex(f.ip) : f.function;
      if (!f.file.empty()) s += " (" + f.file + ":" + std::to_string(f.line) + ")";
      if (!f.module.empty()) s += " in " + f.module;
      return s;
    }
  }
  return {};
}

std::string short_symbol(std::string_view sym) {
  // A bracket that belongs to an operator's name (operator<, operator<<=, operator(), operator->)
  // is part of the name, not a template or parameter list.
  auto operator_at = [&](size_t i) {
    size_t j = i;
    while (j > 0 && (sym[j - 1] == '<' || sym[j - 1] == '>' || sym[j - 1] == '=' || sym[j - 1] == '-' ||
                     sym[j - 1] == '(' || sym[j - 1] == ' '))
      --j;
    return j >= 8 && sym.substr(j - 8, 8) == "operator";
  };
  // Pass 1: drop a trailing parameter list (and cv/ref qualifiers after it).
  std::string_view s = sym;
  {
    size_t end = s.size();
    while (end > 0 && s[end - 1] != ')') --end;
    if (end > 0 && end < s.size()) {
      const std::string_view tail = s.substr(end);
      if (tail.find_first_not_of(" constvlaie&") != std::string_view::npos) end = 0;  // not qualifiers
    }
    if (end > 0) {
      int depth = 0;
      for (size_t i = end; i-- > 0;) {
        if (s[i] == ')') ++depth;
        else if (s[i] == '(' && --depth == 0) {
          if (i > 0 && s.substr(i).find("anonymous namespace") != 1) s = s.substr(0, i);
          break;
        }
      }
    }
  }
  // Pass 2: collapse template arguments; remember the last top-level space (after a return type).
  std::string out;
  out.reserve(s.size());
  int angle = 0, paren = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<' && !operator_at(i + 1) && paren == 0) {
      if (angle++ == 0) out += "<\u2026>";
      continue;
    }
    if (c == '>' && angle > 0 && paren == 0) {
      --angle;
      continue;
    }
    if (angle > 0) continue;
    if (c == '(') ++paren;
    if (c == ')' && paren > 0) --paren;
    out += c;
  }
  // Pass 3: drop a return type ("void ns::f" -> "ns::f"): the text before the last top-level
  // space, unless that space is inside "(anonymous namespace)" or an operator's name.
  paren = 0;
  size_t cut = std::string::npos;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == '(') ++paren;
    else if (out[i] == ')' && paren > 0) --paren;
    else if (out[i] == ' ' && paren == 0 && !(i >= 8 && out.compare(i - 8, 8, "operator") == 0)) cut = i;
  }
  if (cut != std::string::npos) out = out.substr(cut + 1);
  if (out.empty()) return std::string(sym);
  return out + (s.size() < sym.size() ? "()" : "");
}

std::string frame_label(const StackFrame& f) {
  if (f.kind != FrameKind::kNative || f.function.empty()) return frame_text(f);
  std::string s = short_symbol(f.function);
  if (!f.file.empty()) s += " (" + f.file + ":" + std::to_string(f.line) + ")";
  if (!f.module.empty()) s += " in " + f.module;
  return s;
}

}  // namespace ingero
