// Stacks: where in the code an event happened. The parsed form every reader, the annotator and
// every sink share, and the codec for the form a trace database stores (Ingero's `stack_traces`).
//
// Contract:
// - Frames are innermost first. A Python frame carries file, function (qualified name where the
//   interpreter has one) and the line being executed; a native frame its symbol (demangled), the
//   module (library file name) and, when DWARF had it, file and line; a kernel frame its symbol.
// - Storage (TraceMeta::stacks, SQLite `stack_traces.frames`, LMDB) is Ingero's compact JSON:
//   native `{"s": "symbol+0xoff", "f": "module"}` or `{"i": "0xip", "f": "module"}` when
//   unresolved; Python `{"pf": file, "pfn": function, "pl": line}`; ours adds `{"k": "symbol"}`
//   for kernel frames, `"sf"`/`"sl"` (source file/line of a native frame) and a final
//   `{"truncated": true}` marker. Readers ignore keys they do not know, so Ingero's tools read ours.
// - parse_stack never throws: malformed JSON gives an empty stack with `malformed` set.
// - stack_content_hash is FNV-64 over the frames' content (not addresses), so the same code path
//   in two processes (ASLR) or two runs dedups to one id; 0 is never returned (0 = no stack).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/trace.h"

namespace ingero {

enum class FrameKind : uint8_t { kNative = 0, kPython = 1, kKernel = 2 };

struct StackFrame {
  FrameKind kind = FrameKind::kNative;
  std::string function;  // Python: qualname; native/kernel: demangled symbol without +0xoff
  std::string file;      // Python: source file; native: source file from DWARF, if any
  uint32_t line = 0;     // Python: the line being executed; native: DWARF line, if any; 0 = none
  std::string module;    // native: library or executable file name ("libcudart.so.13")
  uint64_t offset = 0;   // native: offset into the symbol (the +0x part); 0 when unknown
  uint64_t ip = 0;       // native, unresolved: the raw address
};

struct ParsedStack {
  std::vector<StackFrame> frames;  // innermost first
  bool truncated = false;          // deeper than what was captured
  bool malformed = false;          // the stored JSON could not be read
};

const char* frame_kind_name(FrameKind k);  // "native" | "python" | "kernel"

ParsedStack parse_stack(const StackTrace& st);
ParsedStack parse_stack_frames(std::string_view frames_json);
// The storage form; `ips` (hex JSON array) is kept as given (Ingero fills it, we may leave "[]").
StackTrace encode_stack(const ParsedStack& st, const std::vector<uint64_t>& ips = {});
uint64_t stack_content_hash(const ParsedStack& st);

// The innermost Python frame, else null.
const StackFrame* innermost_python(const ParsedStack& st);
// The call site a person would look at first: the innermost Python frame when there is one, else
// the innermost native frame outside the CUDA/NCCL libraries (the caller of the probed function),
// else the innermost frame; null for an empty stack.
const StackFrame* call_site(const ParsedStack& st);
// "train.py:142 in forward", "libtorch_cuda.so: at::native::copy_ (copy.cpp:88)", "futex_wait".
std::string frame_text(const StackFrame& f);
// The same for a person reading one line: a C++ symbol without its return type, template
// arguments and parameter list ("at::native::gpu_kernel_impl_nocast<…>()" instead of 600
// characters), Python and kernel frames as frame_text. frame_text stays the full form that
// patterns match and JSON carries.
std::string frame_label(const StackFrame& f);
// "void ns::f<int, std::vector<x>>(int, char const*) const" -> "ns::f<…>()".
std::string short_symbol(std::string_view demangled);

}  // namespace ingero
