// short_symbol / frame_label on C++ names (issue 43, item 5): a shortened name keeps every bracket
// whole ("[clone .isra.0]" was once cut to ".isra.0]"), starts at the start of a name and keeps the
// function's own name. Checked on hand-picked names and on every frame of the shared traces.
#include <cxxabi.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/stack.h"
#include "sinks/store/sqlite_util.h"

namespace ingero {
namespace {

std::string demangle(const std::string& sym) {
  if (!sym.starts_with("_Z")) return sym;
  int status = 0;
  char* out = abi::__cxa_demangle(sym.c_str(), nullptr, nullptr, &status);
  std::string s = status == 0 && out ? std::string(out) : sym;
  std::free(out);
  return s;
}

// Operator names are the only place a lone bracket belongs to a name; the check removes them.
std::string without_operator_names(const std::string& s) {
  static const std::regex op(R"(operator(\(\)|\[\]|->\*?|<=>|<<=?|>>=?|[-+*/%^&|~!=<>,]=?|&&|\|\||\+\+|--))");
  return std::regex_replace(s, op, "operator@");
}

// Empty when (), <>, [] and {} nest properly, else what is wrong.
std::string bracket_problem(const std::string& label) {
  std::string expect;
  for (char c : without_operator_names(label)) {
    if (c == '(' || c == '<' || c == '[' || c == '{') expect += c == '(' ? ')' : c == '<' ? '>' : c == '[' ? ']' : '}';
    if (c == ')' || c == '>' || c == ']' || c == '}') {
      if (expect.empty() || expect.back() != c) return std::string("unexpected '") + c + "'";
      expect.pop_back();
    }
  }
  return expect.empty() ? "" : "unclosed, expecting '" + expect + "'";
}

bool ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$'; }

// The function's own name read backwards from the demangled text: the identifier (or operator
// name) just before its final parameter list, after the clone suffixes, ABI tags and qualifiers.
std::string own_name(std::string d) {
  d = std::regex_replace(d, std::regex(R"( \[clone [^\]]*\])"), "");
  d = std::regex_replace(d, std::regex(R"(\[abi:[^\]]*\])"), "");
  d = std::regex_replace(d, std::regex(R"(( const| volatile| &&| &)+$)"), "");
  if (d.empty() || d.back() != ')') return d.substr(d.rfind(':') == std::string::npos ? 0 : d.rfind(':') + 1);
  int depth = 0;
  size_t i = d.size();
  while (i-- > 0) {
    if (d[i] == ')') ++depth;
    if (d[i] == '(' && --depth == 0) break;
  }
  size_t end = i;
  if (end > 0 && d[end - 1] == '>') {  // template arguments: skip them
    int angle = 0;
    while (end-- > 0) {
      if (d[end] == '>') ++angle;
      if (d[end] == '<' && --angle == 0) break;
    }
  }
  const size_t op = d.rfind("operator", end);
  if (op != std::string::npos && op + 12 >= end) return d.substr(op, end - op);  // operator(), operator<
  size_t begin = end;
  while (begin > 0 && (ident(d[begin - 1]) || d[begin - 1] == '~')) --begin;
  return d.substr(begin, end - begin);
}

TEST(FrameLabel, KeepsBracketsCloneSuffixesAndOperatorNamesWhole) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"at::native::copy_impl(at::Tensor&, at::Tensor const&, bool) [clone .isra.0]",
       "at::native::copy_impl() [clone .isra.0]"},
      {"at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
       "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const [clone .isra.0]",
       "at::native::(anonymous namespace)::launch_clamp_scalar()::{lambda()#1}::operator()() [clone .isra.0]"},
      {"f(int) [clone .isra.0] [clone .cold]", "f() [clone .isra.0] [clone .cold]"},
      {"std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > ns::name[abi:cxx11](int)",
       "ns::name()"},
      {"a::b::operator<(a::b const&)", "a::b::operator<()"},
      {"bool ns::operator< <int>(ns::X<int> const&, ns::X<int> const&)", "ns::operator< <\u2026>()"},
      {"ns::S& ns::S::operator<<=(int)", "ns::S::operator<<=()"},
      {"ns::Ptr<int>::operator->() const", "ns::Ptr<\u2026>::operator->()"},
      {"ns::Ptr<int>::operator>(ns::Ptr<int> const&) const", "ns::Ptr<\u2026>::operator>()"},
      {"operator new[](unsigned long)", "operator new[]()"},
      {"ns::Q::operator unsigned long() const", "ns::Q::operator unsigned long()"},
      {"ns::Q::operator std::vector<int, std::allocator<int> >() const", "ns::Q::operator std::vector<\u2026>()"},
      {"void std::_Function_handler<void (int), ns::run(int)::{lambda(int, float)#2}>::_M_invoke(std::_Any_data "
       "const&, "
       "int&&)",
       "std::_Function_handler<\u2026>::_M_invoke()"},
      {"ns::run(int)::{lambda(int, float)#2}::operator()(int, float) const", "ns::run()::{lambda()#2}::operator()()"},
      {"void (*ns::handler(int))(double)", "(*ns::handler())()"},
      {"ns::T::~T()", "ns::T::~T()"},
      {"main.cold", "main.cold"},
      {"void ns::broken<int(", "void ns::broken<int("},  // a truncated name is kept as it is
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(short_symbol(in), want) << in;
  StackFrame f{FrameKind::kNative, cases[0].first, "", 0, "libtorch_cuda.so", 0, 0};
  EXPECT_EQ(frame_label(f), "at::native::copy_impl() [clone .isra.0] in libtorch_cuda.so");
}

TEST(FrameLabel, EveryFrameOfTheSharedTraces) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(INGERO_SHARED_DATA, ec)) GTEST_SKIP() << "shared traces not found: " << INGERO_SHARED_DATA;
  size_t dbs = 0, frames = 0, cpp = 0, clones = 0;
  for (const auto& e : fs::directory_iterator(INGERO_SHARED_DATA, ec)) {
    if (e.path().extension() != ".db") continue;
    const std::string path = e.path().string();
    std::string err;
    // Read-only and immutable: the shared files must stay byte for byte as they are.
    const auto probe = sqlite_detail::probe_sqlite_file(path);
    auto db = sqlite_detail::open_readonly(path, probe, err);
    ASSERT_TRUE(db) << path << ": " << err;
    if (!sqlite_detail::table_exists(db.get(), "stack_traces")) continue;
    ++dbs;
    sqlite_detail::Stmt st(db.get(), "SELECT frames FROM stack_traces");
    ASSERT_TRUE(st.ok()) << st.error();
    while (st.step() == SQLITE_ROW) {
      const char* txt = reinterpret_cast<const char*>(sqlite3_column_text(st.get(), 0));
      ParsedStack p = parse_stack_frames(txt ? txt : "");
      ASSERT_FALSE(p.malformed) << path;
      for (StackFrame& f : p.frames) {
        if (f.kind == FrameKind::kPython) continue;
        ++frames;
        if (f.function.empty()) continue;  // unresolved: shown as its address
        const bool mangled = f.function.starts_with("_Z");
        f.function = demangle(f.function);
        const std::string label = frame_label(f);
        const std::string name = short_symbol(f.function);
        SCOPED_TRACE(f.function + "  ->  " + label);
        cpp += mangled;
        EXPECT_EQ(bracket_problem(label), "");
        ASSERT_FALSE(name.empty());
        EXPECT_TRUE(ident(name[0]) || name[0] == '(' || name[0] == '~') << "starts with '" << name[0] << "'";
        // The first word is a whole word of the demangled name, not the tail of one.
        size_t w = 0;
        while (w < name.size() && ident(name[w])) ++w;
        if (w > 0) {
          const std::string word = name.substr(0, w);
          bool whole = false;
          for (size_t at = f.function.find(word); at != std::string::npos && !whole; at = f.function.find(word, at + 1))
            whole = (at == 0 || !ident(f.function[at - 1])) &&
                    (at + w == f.function.size() || !ident(f.function[at + w]));
          EXPECT_TRUE(whole) << "'" << word << "' starts mid-token";
        }
        const std::string own = own_name(f.function);
        ASSERT_FALSE(own.empty());
        EXPECT_NE(name.find(own), std::string::npos) << "lost its own name '" << own << "'";
        if (f.function.find("[clone ") != std::string::npos) {
          ++clones;
          const std::string clone = f.function.substr(f.function.find("[clone "));
          EXPECT_TRUE(label.ends_with(clone + " in " + f.module)) << "clone suffix not kept whole";
        }
        EXPECT_TRUE(label.ends_with(" in " + f.module));
      }
    }
  }
  if (dbs == 0) GTEST_SKIP() << "no shared trace with a stack_traces table under " << INGERO_SHARED_DATA;
  // The shared traces hold 34 distinct mangled C++ names, three of them clones (counted per frame).
  EXPECT_GT(cpp, 50u);
  EXPECT_GT(clones, 0u);
  std::printf("%zu databases, %zu native frames, %zu C++ frames, %zu clone frames checked\n", dbs, frames, cpp, clones);
}

}  // namespace
}  // namespace ingero
