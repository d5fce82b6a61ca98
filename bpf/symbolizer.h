// Symbolizer: user and kernel addresses -> StackFrame (module, demangled symbol, +offset, and the
// source file/line when DWARF is present). User-space only; no BPF, no libbpf (library ip_stacks).
//
// Contract:
// - note_process(pid) snapshots /proc/PID/maps and opens every executable file-backed mapping's
//   ELF (through /proc/PID/map_files/..., falling back to /proc/PID/root/PATH, then PATH). Each
//   ELF is kept open (fd + libelf/libdw handles) in a cache keyed by its GNU build-id (fallback:
//   path + size + mtime), so a pid's addresses still resolve after the process exited or the file
//   was deleted, as long as note_process ran while the process was alive.
// - forget_process(pid) drops only the pid's map snapshot; the ELF cache stays (LRU-bounded to
//   kMaxElfs files; an ELF still referenced by a known pid is never evicted).
// - symbolize_user(pid, ips) returns one frame per ip, same order, kind native. module = file
//   basename, function = demangled symbol (abi::__cxa_demangle; plain C names as is), offset =
//   ip - symbol start, file/line from DWARF (libdw) when the ELF has it. An ip outside every
//   known mapping makes the maps be re-read once per call (a dlopen after attach; rate-limited,
//   see ensure_mapped); if it still misses, the frame is unresolved: function empty, ip = the
//   raw address. An address inside a known ELF that no symbol covers (a stripped library's
//   local function) keeps the module and gets ip = its ELF virtual address (module-relative:
//   the same in every process and run, so stacks dedup across ASLR; `addr2line -e MODULE IP`
//   resolves it offline). A pid never noted is noted on first use (if still alive). The vDSO
//   resolves as module "[vdso]".
// - Return addresses: callers pass return addresses (as the unwinder gives them); every ip but
//   the first of a call is looked up at ip-1 so that a call as the last instruction of a function
//   resolves to the caller, not the next symbol. symbolize_user's `first_is_exact` says whether
//   ips[0] is an exact ip (true: a sampled or probed ip) or also a return address.
// - symbolize_kernel reads /proc/kallsyms once (lazily) and resolves to kind kernel frames
//   ("function" = symbol, "module" = the [module] name when not vmlinux). Addresses are hidden
//   (all zero) without CAP_SYSLOG; then every frame is unresolved (ip set).
// - Thread-compatible: one owner thread (the live poller). Never throws; bad input gives
//   unresolved frames and counts in stats().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/stack.h"

// libelf's handle (<libelf.h> declares it as a typedef of this struct).
extern "C" {
struct Elf;
}

namespace ingero::bpf {

struct MapEntry {
  uint64_t start = 0, end = 0, offset = 0;  // [start, end) in the process, file offset of start
  std::string path;                         // as in /proc/PID/maps ("" for anonymous)
  bool exec = false;                        // 'x' permission
  uint64_t dev = 0, ino = 0;                // (major<<32|minor, inode) from maps; 0 for anonymous
};

// One ELF file mapped by a process, as the unwinder reports it to libdw.
struct LoadedModule {
  std::string path;         // the path in the maps (may be " (deleted)" or in another mount namespace)
  int fd = -1;              // an open fd on the file, owned by the Symbolizer (dup it to hand it on)
  uint64_t bias = 0;        // load bias: process address = ELF vaddr + bias
  uint64_t lo = 0, hi = 0;  // lowest and highest process address mapped from the file
};

class Symbolizer {  // thread-compatible (one owner thread: the live poller)
 public:
  static constexpr size_t kMaxElfs = 256;

  Symbolizer();
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // Snapshot /proc/PID/maps and open (keep an fd / mmap of) every executable mapping's ELF, keyed
  // by build-id (fallback: path+size+mtime), so stacks resolve after the process exits or a file is
  // deleted. Returns false when the maps could not be read (process gone, no permission).
  bool note_process(uint32_t pid);
  void forget_process(uint32_t pid);  // drop the pid's maps (ELF cache stays, LRU-bounded)

  // User addresses -> frames (kind native), one per ip, same order. See the contract above.
  std::vector<StackFrame> symbolize_user(uint32_t pid, std::span<const uint64_t> ips, bool first_is_exact = true);
  // Kernel addresses -> frames (kind kernel) from /proc/kallsyms.
  std::vector<StackFrame> symbolize_kernel(std::span<const uint64_t> ips);

  // The pid's map snapshot (all mappings, executable or not), sorted by start; null when unknown.
  // Valid until the next non-const call.
  const std::vector<MapEntry>* maps(uint32_t pid);

  // For the unwinder: read `len` bytes at process address `addr` from the file backing the
  // mapping that contains it (read-only data: .eh_frame, .text, .rodata). False when `addr` is not
  // file-backed in the snapshot or the read falls outside the file.
  bool read_mapped(uint32_t pid, uint64_t addr, void* out, size_t len);

  // The pid's ELF modules (one per file) with their load bias; `generation` (if not null) is set
  // to a number that changes whenever the pid's snapshot is re-read. Null when the pid is unknown.
  const std::vector<LoadedModule>* modules(uint32_t pid, uint64_t* generation = nullptr);

  // True when `addr` lies in a mapping of the pid's snapshot, re-reading the maps first if it does
  // not (a library dlopen()ed after the snapshot). Re-reads caused by unknown addresses (here and
  // in symbolize_user) happen at most once per 100 ms per pid, and count in stats().maps_rereads;
  // a re-read only opens the files it did not have open yet.
  bool ensure_mapped(uint32_t pid, uint64_t addr);

  // The build-id (hex) of the ELF mapped at `addr` in pid, "" when unknown or absent.
  std::string build_id_at(uint32_t pid, uint64_t addr);

  struct Stats {
    uint64_t elf_opened = 0;    // ELF files opened (cache misses)
    uint64_t cache_hits = 0;    // mappings served by an ELF already open (same build-id)
    uint64_t unresolved = 0;    // user/kernel frames left without a symbol
    uint64_t maps_rereads = 0;  // /proc/PID/maps re-read after an address missed
    uint64_t elf_evicted = 0;   // ELFs dropped by the LRU bound
  };
  Stats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// abi::__cxa_demangle; the input unchanged when it is not a mangled C++ name.
std::string demangle(const char* name);

// Every defined symbol of an ELF's .symtab and .dynsym: fn(name, value, size, st_info). Shared by
// the symbolizer (function symbols) and the CPython introspection (_PyRuntime, Py_Version).
void for_each_elf_symbol(
    ::Elf* elf, const std::function<void(const char* name, uint64_t value, uint64_t size, unsigned char info)>& fn);

}  // namespace ingero::bpf
