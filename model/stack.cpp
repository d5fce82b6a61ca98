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

namespace {

bool ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
}

bool word_at(std::string_view s, size_t i, std::string_view w) {
  return s.substr(i, w.size()) == w && (i == 0 || !ident_char(s[i - 1])) &&
         (i + w.size() >= s.size() || !ident_char(s[i + w.size()]));
}

// The symbol operators a demangler writes after `operator`, longest first so that `operator<<=`
// is not read as `operator<` followed by `<=`.
constexpr std::string_view kOperatorSymbols[] = {"()", "[]", "->*", "<=>", "<<=", ">>=", "->", "<<", ">>", "<=",
                                                 ">=", "==", "!=",  "&&",  "||",  "++",  "--", "+=", "-=", "*=",
                                                 "/=", "%=", "&=",  "|=",  "^=",  "<",   ">",  "+",  "-",  "*",
                                                 "/",  "%",  "&",   "|",   "^",   "~",   "!",  "=",  ","};

size_t match_close(std::string_view s, size_t open);

// Length of the operator name starting at `i` ("operator()", "operator< ", "operator new[]",
// "operator\"\"_km", the conversion "operator unsigned long"), 0 when no operator name starts there.
// `conversion` is set for a conversion operator, whose type the caller shortens like any other.
size_t operator_name(std::string_view s, size_t i, bool* conversion = nullptr) {
  if (!word_at(s, i, "operator")) return 0;
  size_t j = i + 8;
  if (conversion) *conversion = false;
  if (j >= s.size()) return 8;
  if (s.substr(j, 2) == "\"\"") {  // user-defined literal: operator"" _km
    j += 2;
    if (j < s.size() && s[j] == ' ') ++j;
    while (j < s.size() && ident_char(s[j])) ++j;
    return j - i;
  }
  for (std::string_view op : kOperatorSymbols)
    if (s.substr(j, op.size()) == op) return j + op.size() - i;
  if (s[j] != ' ') return 8;
  for (std::string_view w : {"new[]", "delete[]", "new", "delete", "co_await"})
    if (s.substr(j + 1, w.size()) == w && (j + 1 + w.size() >= s.size() || !ident_char(s[j + 1 + w.size()])))
      return j + 1 + w.size() - i;
  // A conversion operator: its type runs to the parameter list (a top-level '(').
  size_t k = j + 1;
  while (k < s.size() && s[k] != '(') {
    if (s[k] == '<' || s[k] == '[' || s[k] == '{') {
      const size_t close = match_close(s, k);
      if (close == std::string_view::npos) return 8;
      k = close;
    }
    ++k;
  }
  if (conversion) *conversion = true;
  return k - i;
}

// The index of the bracket that closes the one at `open` ('(', '<', '[' or '{'); npos when it is
// never closed. Operator names inside ("&Foo::operator()", "operator<") and "->" are not brackets;
// a '<' inside parentheses may be a less-than ("(1)<(2)") and is given up when its ')' comes first.
size_t match_close(std::string_view s, size_t open) {
  std::string expect;  // the closers awaited, innermost last
  for (size_t i = open; i < s.size(); ++i) {
    const char c = s[i];
    if (c == 'o') {
      if (const size_t n = operator_name(s, i)) {
        i += n - 1;
        continue;
      }
    }
    if (c == '-' && i + 1 < s.size() && s[i + 1] == '>') {
      ++i;
      continue;
    }
    if (c == '(' || c == '<' || c == '[' || c == '{') {
      expect += c == '(' ? ')' : c == '<' ? '>' : c == '[' ? ']' : '}';
      continue;
    }
    if (c != ')' && c != '>' && c != ']' && c != '}') continue;
    if (c == '>' && (expect.empty() || expect.back() != '>')) continue;  // a greater-than
    while (!expect.empty() && expect.back() != c && expect.back() == '>') expect.pop_back();
    if (expect.empty() || expect.back() != c) return std::string_view::npos;  // unbalanced
    expect.pop_back();
    if (expect.empty()) return i;
  }
  return std::string_view::npos;
}

// A cv/ref/noexcept qualifier word at `i` (after a parameter list: dropped).
size_t qualifier_at(std::string_view s, size_t i) {
  for (std::string_view w : {"const", "volatile", "restrict", "noexcept", "transaction_safe"})
    if (word_at(s, i, w)) return w.size();
  if (s.substr(i, 2) == "&&") return 2;
  if (s.substr(i, 1) == "&") return 1;
  return 0;
}

// One pass over a demangled name (see short_symbol). Returns false when a bracket is never closed.
bool shorten(std::string_view s, std::string& out, std::string& suffix, bool top) {
  size_t cut = std::string::npos;  // where the name starts in `out`: after the last return-type space
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    bool conversion = false;
    if (const size_t n = c == 'o' ? operator_name(s, i, &conversion) : 0) {
      if (!conversion) {
        out.append(s.substr(i, n));
        if (s.substr(i + n, 2) == " <") {  // "operator< <int>": the space is not a return type's
          out += ' ';
          ++i;
        }
      } else {
        out += "operator ";
        std::string type, ignored;
        if (!shorten(s.substr(i + 9, n - 9), type, ignored, false)) return false;
        out += type;
      }
      i += n;
      continue;
    }
    if (c == '(' || c == '<' || c == '[' || c == '{') {
      const size_t close = match_close(s, i);
      if (close == std::string_view::npos) return false;
      const std::string_view inner = s.substr(i + 1, close - i - 1);
      if (c == '<') {
        out += "<\u2026>";
      } else if (c == '(') {
        // "(anonymous namespace)" is a scope's name; any other group is a parameter list (of the
        // function, or of the function a local entity lives in), shown empty.
        if (inner == "anonymous namespace") {
          out += "(anonymous namespace)";
        } else if (!inner.empty() && (inner[0] == '*' || inner[0] == '&')) {
          // a declarator around the name: "void (*ns::f(int))(double)" -> "(*ns::f())()"
          std::string body, ignored;
          if (!shorten(inner.substr(1), body, ignored, false)) return false;
          out += "(" + std::string(1, inner[0]) + body + ")";
        } else {
          out += "()";
        }
      } else if (c == '[') {
        if (inner.starts_with("clone ")) {
          if (top) suffix += " [" + std::string(inner) + "]";  // [clone .isra.0], [clone .cold]
        } else if (!inner.starts_with("abi:")) {               // [abi:cxx11] is ABI noise; keep anything else whole
          out += "[" + std::string(inner) + "]";
        }
      } else {
        // {lambda(int, float)#1}, {unnamed type#2}, {default arg#1}: kept, their own lists shortened.
        std::string body, ignored;
        if (!shorten(inner, body, ignored, false)) return false;
        out += "{" + body + "}";
      }
      i = close + 1;
      continue;
    }
    if (c == ' ') {
      size_t j = i + 1;
      if (const size_t q = j < s.size() ? qualifier_at(s, j) : 0) {
        i = j + q;  // "f(int) const", "char const*": the qualifier is dropped with its space
        continue;
      }
      if (j < s.size() && s[j] == '[') {  // " [clone .isra.0]"
        i = j;
        continue;
      }
      out += ' ';
      cut = out.size();
      i = j;
      continue;
    }
    out += c;
    ++i;
  }
  if (top && cut != std::string::npos) out.erase(0, cut);
  return true;
}

}  // namespace

std::string short_symbol(std::string_view sym) {
  // Walks the demangled name once, keeping brackets whole: template arguments become "<…>",
  // parameter lists "()", cv/ref qualifiers and ABI tags go, "(anonymous namespace)", lambdas,
  // operator names and clone suffixes stay whole, and the return type (the text before the last
  // top-level space) goes. A name whose brackets never close (a truncated symbol) is kept as is.
  std::string out, suffix;
  out.reserve(sym.size());
  if (!shorten(sym, out, suffix, true) || out.empty()) return std::string(sym);
  return out + suffix;
}

std::string frame_label(const StackFrame& f) {
  if (f.kind != FrameKind::kNative || f.function.empty()) return frame_text(f);
  std::string s = short_symbol(f.function);
  if (!f.file.empty()) s += " (" + f.file + ":" + std::to_string(f.line) + ")";
  if (!f.module.empty()) s += " in " + f.module;
  return s;
}

}  // namespace ingero
