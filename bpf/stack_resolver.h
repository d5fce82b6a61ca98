// StackResolver: what BPF captured at an event (struct ip_stack_record: registers, a window of the
// user stack, the frame-pointer stack, Python (code, instruction) pairs; or off-CPU stack ids)
// -> one ParsedStack -> deduplicated by stack_content_hash -> the id an Event carries in
// stack_id, and the stored form (encode_stack) for TraceMeta::stacks.
//
// Contract:
// - Native user frames: the .eh_frame/DWARF unwind of the copied window (Unwinder), or the
//   frame-pointer stack when that one is longer (the cross-check), symbolized by the Symbolizer.
//   At a uretprobe the callee has returned: a frame for the probed function itself (its API
//   symbol, module = the library attached for its source) is put first.
// - Python frames (processes registered with note_process whose layout inspect_python validated):
//   file, qualified name and the line being executed, decoded from the strings and line table
//   BPF read at the event (BpfProbes::read_code); a code object BPF could not read gives a frame
//   with function "<unknown>". They are spliced in where the first native
//   _PyEval_EvalFrameDefault frame is (innermost first, so the Python frames that eval loop runs
//   come right before it), or after the native frames when none is found.
// - Kernel frames (off-CPU spans, samples in kernel code) come first, then the user frames. An
//   off-CPU span sent from its syscall return (IP_STK_OFFCPU) has the kernel stack of where it
//   slept (stack_ids) and the full user stacks (window + Python) of the blocking call.
// - `truncated` is set when the Python walk or the native unwind was cut.
// - note_process(pid): Symbolizer::note_process (maps + ELFs kept, so a process that exits later
//   still resolves) and inspect_python -> BpfProbes::set_python, or a warning and native only
//   (written to py_procs as minor 0, so BPF does not register it itself). A refusal that only
//   means "interpreter not started yet" or "already exited" is not cached.
//   forget_process(pid) undoes both; call it only once the process's records have drained.
// - Python frames from a process's first stack (issue 43): the poller sees a process only after
//   its first records, and a short job can make all its calls before that. So the interpreter
//   executables are handed to BPF up front (learn_interpreters at start: the python3/python3.N
//   of $PATH, /usr/bin, /usr/local/bin, conda and pyenv; learn_binary for each validated
//   process's executable), and BPF registers a process of one of them itself at its first stack
//   (stack.bpf.h py_self_register). User space validates such a process when it first decodes
//   its frames (python_minor): same _PyRuntime, or refused; an exited process keeps BPF's checks.
// - One owner thread (the live poller). Never throws: what cannot be resolved is counted.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bpf/ingero_bpf.h"
#include "bpf/probes.h"
#include "model/stack.h"
#include "model/trace.h"

namespace ingero::bpf {

class Symbolizer;
class Unwinder;

struct StackResolverStats {
  uint64_t resolved = 0;       // records turned into a stack
  uint64_t unique = 0;         // distinct stacks (new ids)
  uint64_t empty = 0;          // records with nothing resolvable
  uint64_t python_stacks = 0;  // stacks with at least one Python frame
  uint64_t unknown_code = 0;   // Python frames whose code object BPF had not read
  uint64_t truncated = 0;
  uint64_t python_procs = 0;    // processes with validated Python offsets
  uint64_t python_refused = 0;  // Python processes whose layout did not validate
  uint64_t python_bins = 0;     // interpreter executables BPF registers processes of itself
};

class StackResolver {
 public:
  explicit StackResolver(BpfProbes& probes);
  ~StackResolver();
  StackResolver(const StackResolver&) = delete;
  StackResolver& operator=(const StackResolver&) = delete;

  // The library attached for a source, for the probed-function frame ("libcudart.so.13").
  void set_module(Source s, std::string module_basename);

  void note_process(uint32_t pid);
  // An interpreter executable (inspect_python_binary; `libpython`: where its libpython is, or
  // empty) handed to BPF, so its processes get Python frames from their first stack on, before
  // user space has seen them. False when it is not a supported CPython.
  bool learn_binary(const std::string& exe, const std::string& libpython);
  // learn_binary for every python_interpreter_candidates() entry; how many were learned.
  size_t learn_interpreters();
  void forget_process(uint32_t pid);
  bool noted(uint32_t pid) const { return noted_.count(pid) != 0; }

  // A stack-ring record -> stack id (0: nothing resolved). `len` = valid bytes of `r`.
  uint64_t resolve(const ip_stack_record& r, size_t len);
  // An off-CPU span's stacks (ids + 1 from IP_REC_STACKIDS, 0 = none) -> stack id.
  uint64_t resolve_offcpu(uint32_t pid, uint32_t kstack_id1, uint32_t ustack_id1);

  // Stacks first seen since the last call (id, stored form).
  std::vector<std::pair<uint64_t, StackTrace>> take_new() { return std::exchange(new_, {}); }
  std::vector<std::string> take_warnings() { return std::exchange(warnings_, {}); }
  StackResolverStats stats() const { return stats_; }

 private:
  struct Code {
    bool ok = false;
    std::string file, name;
    int firstlineno = 0;
    std::vector<uint8_t> linetable;
  };
  uint64_t finish(ParsedStack& st, const std::vector<uint64_t>& ips);
  // Kernel frames of a stack_ids id (+1; 0 = none), our own tracepoint frames dropped.
  void add_kernel_from_id(uint32_t kstack_id1, ParsedStack& st, std::vector<uint64_t>& all_ips);
  const Code& code(uint32_t pid, uint64_t addr);
  // The CPython minor of a process whose walks are decoded, validating a process BPF registered
  // itself the first time; -1: none (native only).
  int python_minor(uint32_t pid);
  void refuse_python(uint32_t pid, const std::string& why);
  void add_python(const ip_stack_record& r, uint32_t pid, ParsedStack& st);

  BpfProbes& probes_;
  std::unique_ptr<Symbolizer> sym_;
  std::unique_ptr<Unwinder> unw_;
  std::map<int, std::string> module_;  // Source -> library basename
  std::set<uint32_t> noted_;
  std::unordered_map<uint32_t, int> minor_;          // pid -> CPython minor (validated)
  std::set<std::pair<uint64_t, uint64_t>> learned_;  // (inode, size) of executables in py_bins
  std::map<std::pair<uint32_t, uint64_t>, Code> codes_;
  std::set<uint64_t> known_;
  std::vector<std::pair<uint64_t, StackTrace>> new_;
  std::vector<std::string> warnings_;
  StackResolverStats stats_;
};

// Compact CPython str data (kind 1 = Latin-1/ASCII, 2 = UCS-2, 4 = UCS-4) -> UTF-8.
std::string py_str_utf8(const char* data, size_t bytes, unsigned kind);

}  // namespace ingero::bpf
