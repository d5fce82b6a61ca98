// CPython introspection from outside the process: the per-version layouts BPF needs to walk a
// thread's Python frames, finding and validating _PyRuntime in a live process, decoding line
// tables and str objects, and a user-space walk of one thread's frames (for tests and `check`).
// User-space only; no BPF, no libbpf (library ip_stacks).
//
// Contract:
// - Supported: CPython 3.10, 3.11, 3.12, 3.13 (default, GIL) builds on x86-64 Linux with glibc,
//   libpython shared (libpython3.X.so.1.0) or linked statically into the executable. Offsets are
//   a fixed table per minor version (docs/stacks.md, measured from the pyenv builds' DWARF);
//   inspect_python VALIDATES them against the live process before anyone uses them. A process
//   that does not validate (other layout, free-threaded 3.13t, musl, TSS key >= 32) gives nullopt
//   and a reason: native stacks only, never garbage frames.
// - The thread state of a thread is found through the gilstate TSS key (pthread_getspecific slot),
//   which stays bound whether or not the thread holds the GIL (PyTorch and ctypes release it around
//   CUDA calls). BPF reads it as *(fsbase + kGlibcSpecificOffset + 16*key + 8).
// - Reading another process's memory needs root or ptrace rights over it; failures are reported
//   through `why`, never thrown.
// - Python frames are innermost first, kind python: file = co_filename, function = co_qualname
//   (co_name on 3.10), line = the line being executed (from the instruction offset and the line
//   table), not the def line.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/stack.h"

namespace ingero::bpf {

// glibc x86-64 (2.27 .. 2.38 at least): offsetof(struct pthread, specific_1stblock) from fsbase.
// Slot i (key < 32) is {seq u64, data ptr} at +16*i; data at +8.
inline constexpr uint32_t kGlibcSpecificOffset = 0x310;
inline constexpr uint32_t kGlibcSpecificFastKeys = 32;

struct PyOffsets {           // byte offsets for one CPython minor version, x86-64 (table in docs/stacks.md)
  int minor = 0;             // 10..13
  uint32_t runtime_tss = 0;  // _PyRuntime -> Py_tss_t of autoTSSkey (the key is at +4, _is_initialized at +0)
  uint32_t runtime_interp_head = 0, interp_threads_head = 0, tstate_interp = 0,
           tstate_native_thread_id = 0;  // native_thread_id: 0 on 3.10 (absent)
  uint32_t tstate_next = 0;              // tstate->next (the interpreter's thread list)
  uint32_t tstate_thread_id = 0;         // tstate->thread_id (pthread_self(), every version)
  uint32_t tstate_frame = 0;  // 3.10: tstate->frame (PyFrameObject*); 3.11/3.12: tstate->cframe; 3.13: current_frame
  int32_t cframe_current_frame = -1;  // 3.11: 8, 3.12: 0, else -1 (no cframe indirection)
  uint32_t
      frame_code = 0,
      frame_back = 0,
      frame_instr = 0;  // 3.10: f_code, f_back, f_lasti(int, code units); 3.11+: code, previous, prev_instr/instr_ptr
  int32_t frame_owner = -1;  // 3.11+: owner byte offset (skip owner == 3, FRAME_OWNED_BY_CSTACK), -1 on 3.10
  uint32_t code_filename = 0, code_name = 0, code_qualname = 0 /*0 on 3.10*/, code_firstlineno = 0, code_linetable = 0,
           code_bytecode = 0;     // 3.10: co_code (PyBytesObject*); 3.11+: co_code_adaptive (inline)
  uint32_t str_ascii_data = 0;    // sizeof(PyASCIIObject): compact ASCII data offset
  uint32_t str_compact_data = 0;  // sizeof(PyCompactUnicodeObject): non-ASCII compact data offset
  uint32_t str_state = 0;         // offset of the state bitfield (kind/compact/ascii)
  uint32_t bytes_data = 0;        // PyBytesObject ob_sval offset (3.10 co_code / linetable are bytes)
  uint32_t bytes_size = 0;        // PyVarObject ob_size offset (length of a bytes object)
};
const PyOffsets* py_offsets_for(int minor);  // null for unsupported versions

struct PyProcess {
  uint32_t pid = 0;
  int minor = 0;
  std::string version;          // "3.12.1" (3.10: "3.10" from the file name)
  std::string module;           // the ELF holding _PyRuntime (exe or libpython3.X.so.1.0), full path
  uint64_t runtime_addr = 0;    // absolute address of _PyRuntime in the process
  uint32_t tss_key = 0;         // the autoTSSkey value read from the process (must be < 32 for glibc's fast path)
  uint64_t interp_head = 0;     // the main interpreter (interpreters.head) at inspection time
  uint64_t code_type_addr = 0;  // &PyCode_Type in the process: frames whose code is not a code object are skipped
  PyOffsets off;
};

// Finds libpython or a static python exe in /proc/PID/maps, locates _PyRuntime (.dynsym/.symtab)
// and the version (Py_Version in 3.11+, the library/exe name otherwise), and VALIDATES via
// /proc/PID/mem: Py_tss_t initialized and key < 32, interpreters.head non-null, its threads list
// non-empty, tstate->interp == head, the glibc TSS slot of some listed thread (found from its
// tstate->thread_id == pthread_self() == fsbase, without stopping it) points back at its thread
// state; on 3.13 also _Py_DebugOffsets at _PyRuntime+0 (cookie "xdebugpy") against the table.
// A musl process is refused. Returns nullopt with `why` on any failure (not Python,
// unsupported version, free-threaded build, validation failed) — never garbage.
std::optional<PyProcess> inspect_python(uint32_t pid, std::string& why);

// What BPF needs to find _PyRuntime in a process of one interpreter executable by itself, from the
// process's first stack on, before user space has seen the process (issue 43: a short process
// could run all its calls before the poller validated it; docs/stacks.md "Python frames from the
// first call"). Read from the files alone. In a process of this executable (mm->exe_file's inode
// number and size equal ino/size): load bias = mm->start_code - text_vaddr; _PyRuntime =
// bias + runtime_off (static libpython), or *(bias + got_vaddr) + runtime_off (shared: the GOT
// slot the executable called Py_BytesMain through, which is resolved once the interpreter runs).
struct PyBinary {
  std::string exe, module;  // module: the ELF holding _PyRuntime (exe or libpython3.X.so)
  uint64_t ino = 0, size = 0;
  int minor = 0;
  std::string version;
  uint64_t text_vaddr = 0;  // lowest p_vaddr of the executable's PF_X PT_LOADs (how the kernel sets start_code)
  uint64_t got_vaddr = 0;   // shared libpython: the exe's GOT slot of Py_BytesMain; 0: static
  int64_t runtime_off = 0;  // static: _PyRuntime's vaddr; shared: _PyRuntime - Py_BytesMain in libpython
  PyOffsets off;
};

// Reads `exe` (and its libpython: `libpython_hint` when given, else DT_NEEDED through RUNPATH,
// ../lib and the system directories) for the PyBinary above; the version from Py_Version in the
// file (3.10: the name), on 3.13 the file's _Py_DebugOffsets against the table. nullopt + why for
// anything else (not CPython, free-threaded, unsupported version, no Py_BytesMain relocation).
std::optional<PyBinary> inspect_python_binary(const std::string& exe, const std::string& libpython_hint,
                                              std::string& why);

// Executables named python3 / python3.N in $PATH, /usr/bin, /usr/local/bin, /opt/conda/bin and
// the pyenv versions ($PYENV_ROOT, ~/.pyenv, /root/.pyenv), resolved and deduplicated.
std::vector<std::string> python_interpreter_candidates();

// The byte offset of the executing instruction in the code's bytecode, from what a frame holds
// (`instr`): 3.10: f_lasti in code units -> f_lasti*2 (negative, frame not started: 0).
// 3.11/3.12 prev_instr and 3.13 instr_ptr both point at the instruction being executed (the CALL
// in a frame that called out): instr - (code_addr + code_bytecode). UINT32_MAX when `instr` lies
// before the bytecode.
uint32_t py_lasti_bytes(int minor, uint64_t code_addr, uint64_t instr, const PyOffsets& off);

// The line being executed: `lasti_bytes` = byte offset of the current instruction in the code's
// bytecode (3.10: f_lasti*2; 3.11+: (instr_ptr - (code + code_bytecode)) as bytes). Decodes 3.10
// co_linetable (the 3.10 format) and the 3.11+ location table. Returns 0 when the table does not
// cover the offset.
uint32_t python_line(int minor, std::span<const uint8_t> linetable, int firstlineno, uint32_t lasti_bytes);

// Decodes a str object's bytes as read from memory (header + data, as many bytes as were read) to
// UTF-8: compact ASCII and compact non-ASCII kinds 1/2/4. Empty on anything it does not recognise.
std::string py_string(const PyOffsets& off, std::span<const uint8_t> obj);

// A thread's fsbase (== pthread_self() with glibc), read with a brief PTRACE_SEIZE +
// PTRACE_INTERRUPT + PTRACE_GETREGS + PTRACE_DETACH. Needs ptrace rights; nullopt with `why`.
std::optional<uint64_t> thread_fsbase(uint32_t pid, uint32_t tid, std::string& why);

// The thread state of the thread whose fsbase is given, read exactly as BPF does: the gilstate
// TSS slot *(fsbase + kGlibcSpecificOffset + 16*tss_key + 8). 0 when unreadable or unset.
uint64_t py_tstate_via_tss(const PyProcess& p, uint64_t fsbase);

// The thread states of the main interpreter's thread list (interp->threads.head, then ->next),
// at most `max` of them. Empty with `why` on a read failure.
std::vector<uint64_t> py_thread_states(const PyProcess& p, size_t max, std::string& why);

// The Python frames of the thread state `tstate`, innermost first (see the contract), at most
// max_frames; `truncated` set when more remained. Reads /proc/PID/mem.
std::vector<StackFrame> py_walk_tstate(const PyProcess& p, uint64_t tstate, size_t max_frames, bool& truncated,
                                       std::string& why);

// User-space walk of a live process's Python stack for one thread (reads /proc/PID/mem; for
// tests and `check`): frames innermost first, kind python, with file / qualname / executing
// line. The thread state is found by native_thread_id (3.11+), else through the TSS slot from
// the thread's fsbase (thread_fsbase; the only way on 3.10). Empty with `why` on failure (a
// thread without a Python thread state gives empty and says so).
std::vector<StackFrame> py_walk_thread(const PyProcess& p, uint32_t tid, std::string& why);

}  // namespace ingero::bpf
