// Unwinder implementation: one libdwfl session per pid, built from the Symbolizer's snapshot
// (every ELF reported at its load bias, with an fd the Symbolizer keeps open), attached with our
// own thread callbacks, so the unwind reads registers and stack from the captured copy and never
// from the live process. See unwind.h for the contract.
#include "bpf/unwind.h"

#include <elfutils/libdwfl.h>
#include <unistd.h>

#include <cstring>
#include <unordered_map>

namespace ingero::bpf {

namespace {

// DWARF register numbers, x86-64 SysV ABI.
constexpr int kDwarfRbp = 6;
constexpr int kDwarfRsp = 7;

// What the callbacks see for the unwind in progress.
struct Capture {
  Symbolizer* sym = nullptr;
  uint32_t pid = 0;
  UserRegs regs;
  std::span<const uint8_t> stack;
  uint64_t stack_region_end = 0;  // end of the mapping holding sp (0: unknown)
  bool ran_off = false;
};

pid_t cb_next_thread(Dwfl*, void* arg, void** thread_argp) {
  // One thread: the captured one (identified by the pid; the tid does not matter to libdw).
  if (*thread_argp != nullptr) return 0;
  *thread_argp = arg;
  return static_cast<pid_t>(static_cast<Capture*>(arg)->pid);
}

bool cb_get_thread(Dwfl*, pid_t, void* arg, void** thread_argp) {
  *thread_argp = arg;
  return true;
}

bool cb_memory_read(Dwfl*, Dwarf_Addr addr, Dwarf_Word* result, void* arg) {
  Capture* c = static_cast<Capture*>(arg);
  const uint64_t sp = c->regs.sp;
  const uint64_t n = c->stack.size();
  if (addr >= sp && n >= 8 && addr - sp <= n - 8) {
    std::memcpy(result, c->stack.data() + (addr - sp), 8);
    return true;
  }
  // Above the copy but still in the thread's stack: the window was too small.
  const uint64_t region_end = c->stack_region_end ? c->stack_region_end : sp + (64u << 20);
  if (addr >= sp && addr < region_end) {
    c->ran_off = true;
    return false;
  }
  uint64_t v = 0;
  if (c->sym->read_mapped(c->pid, addr, &v, sizeof v)) {
    *result = v;
    return true;
  }
  return false;
}

bool cb_set_initial_registers(Dwfl_Thread* thread, void* arg) {
  Capture* c = static_cast<Capture*>(arg);
  const Dwarf_Word bp = c->regs.bp, sp = c->regs.sp;
  if (!dwfl_thread_state_registers(thread, kDwarfRbp, 1, &bp)) return false;
  if (!dwfl_thread_state_registers(thread, kDwarfRsp, 1, &sp)) return false;
  dwfl_thread_state_register_pc(thread, c->regs.ip);
  return true;
}

const Dwfl_Thread_Callbacks kThreadCallbacks = {cb_next_thread,           cb_get_thread, cb_memory_read,
                                                cb_set_initial_registers, nullptr,       nullptr};

// libdwfl callbacks that only look on this machine. libdw's standard find_debuginfo ends by asking
// the debuginfod servers in $DEBUGINFOD_URLS (Debian's libdebuginfod-common sets it for login
// shells), which would download debug info for every new binary on the poller thread. Here: the
// GNU build-id under the local debug directories (/usr/lib/debug/.build-id/xx/yyyy.debug) only.
// ELF files are always reported with an fd, so find_elf never has anything to find.
int local_find_elf(Dwfl_Module*, void**, const char*, Dwarf_Addr, char**, Elf**) { return -1; }
int local_find_debuginfo(Dwfl_Module* mod, void** userdata, const char* modname, Dwarf_Addr base, const char* file_name,
                         const char* debuglink_file, GElf_Word debuglink_crc, char** debuginfo_file_name) {
  return dwfl_build_id_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file, debuglink_crc,
                                      debuginfo_file_name);
}

const Dwfl_Callbacks kDwflCallbacks = {local_find_elf, local_find_debuginfo, nullptr, nullptr};

struct Walk {
  std::vector<uint64_t>* out;
  size_t max_frames;
  bool hit_max = false;
};

int frame_cb(Dwfl_Frame* state, void* arg) {
  Walk* w = static_cast<Walk*>(arg);
  Dwarf_Addr pc = 0;
  bool activation = false;
  if (!dwfl_frame_pc(state, &pc, &activation)) return DWARF_CB_ABORT;
  if (w->out->size() >= w->max_frames) {
    w->hit_max = true;
    return DWARF_CB_ABORT;
  }
  w->out->push_back(pc);
  return DWARF_CB_OK;
}

}  // namespace

struct Unwinder::Impl {
  Symbolizer& sym;
  struct Session {
    Dwfl* dwfl = nullptr;
    uint64_t generation = 0;
    uint64_t last_used = 0;
    std::unique_ptr<Capture> capture;  // the dwfl_arg: stable address for the session's lifetime
    ~Session() {
      if (dwfl) dwfl_end(dwfl);
    }
  };
  // Each session holds one fd per ELF of its process: a few dozen. Bounded, least recently used
  // evicted (a rebuild costs about a millisecond: the ELFs stay open in the Symbolizer).
  static constexpr size_t kMaxSessions = 32;
  std::unordered_map<uint32_t, std::unique_ptr<Session>> sessions;
  uint64_t tick = 0;
  Stats stats;

  explicit Impl(Symbolizer& s) : sym(s) {}

  Session* session(uint32_t pid) {
    uint64_t gen = 0;
    const std::vector<LoadedModule>* mods = sym.modules(pid, &gen);
    if (mods == nullptr || mods->empty()) return nullptr;
    auto it = sessions.find(pid);
    if (it != sessions.end() && it->second->generation == gen) {
      it->second->last_used = ++tick;
      return it->second.get();
    }
    if (it != sessions.end()) sessions.erase(it);
    while (sessions.size() >= kMaxSessions) {
      auto victim = sessions.begin();
      for (auto j = sessions.begin(); j != sessions.end(); ++j)
        if (j->second->last_used < victim->second->last_used) victim = j;
      sessions.erase(victim);
    }
    auto s = std::make_unique<Session>();
    s->generation = gen;
    s->last_used = ++tick;
    s->capture = std::make_unique<Capture>();
    s->dwfl = dwfl_begin(&kDwflCallbacks);
    if (s->dwfl == nullptr) return nullptr;
    dwfl_report_begin(s->dwfl);
    for (const LoadedModule& m : *mods) {
      const int fd = dup(m.fd);
      if (fd < 0) continue;
      const size_t slash = m.path.rfind('/');
      const std::string name = slash == std::string::npos ? m.path : m.path.substr(slash + 1);
      if (dwfl_report_elf(s->dwfl, name.c_str(), m.path.c_str(), fd, m.bias, true) == nullptr) close(fd);
    }
    dwfl_report_end(s->dwfl, nullptr, nullptr);
    if (!dwfl_attach_state(s->dwfl, nullptr, static_cast<pid_t>(pid), &kThreadCallbacks, s->capture.get()))
      return nullptr;
    Session* raw = s.get();
    sessions[pid] = std::move(s);
    return raw;
  }
};

Unwinder::Unwinder(Symbolizer& s) : impl_(std::make_unique<Impl>(s)) {}
Unwinder::~Unwinder() = default;

std::vector<uint64_t> Unwinder::unwind(uint32_t pid, const UserRegs& regs, std::span<const uint8_t> stack,
                                       size_t max_frames, bool& truncated) {
  truncated = false;
  std::vector<uint64_t> out;
  ++impl_->stats.calls;
  if (max_frames == 0 || regs.ip == 0) return out;
  // A library dlopen()ed after the snapshot (PyTorch loads its CUDA libraries lazily): have its
  // mapping before the walk needs its CFI.
  impl_->sym.ensure_mapped(pid, regs.ip);
  for (int attempt = 0;; ++attempt) {
    out.clear();
    Impl::Session* s = impl_->session(pid);
    if (s == nullptr) {
      impl_->sessions.erase(pid);  // the process is gone and was never (or no longer) noted
      out.push_back(regs.ip);
      ++impl_->stats.failed;
      ++impl_->stats.frames;
      truncated = max_frames == 1;
      return out;
    }
    Capture& c = *s->capture;
    c.sym = &impl_->sym;
    c.pid = pid;
    c.regs = regs;
    c.stack = stack;
    c.ran_off = false;
    c.stack_region_end = 0;
    if (const std::vector<MapEntry>* maps = impl_->sym.maps(pid)) {
      for (const MapEntry& m : *maps)
        if (regs.sp >= m.start && regs.sp < m.end) {
          c.stack_region_end = m.end;
          break;
        }
    }
    Walk w{&out, max_frames};
    const int rc = dwfl_getthread_frames(s->dwfl, static_cast<pid_t>(pid), frame_cb, &w);
    c.stack = {};
    if (out.empty()) out.push_back(regs.ip);  // the walk failed before the first frame
    truncated = w.hit_max || c.ran_off;
    // The walk stopped at a return address outside every known mapping: once, re-read the maps
    // (rate-limited) and walk again with the new module.
    if (!truncated && rc != 0 && attempt == 0 && out.size() >= 2) {
      const uint64_t last = out.back() - 1;
      uint64_t gen_before = 0, gen_after = 0;
      impl_->sym.modules(pid, &gen_before);
      const std::vector<MapEntry>* maps = impl_->sym.maps(pid);
      bool known = false;
      for (size_t i = 0; maps && i < maps->size() && !known; ++i)
        known = last >= (*maps)[i].start && last < (*maps)[i].end;
      if (!known && impl_->sym.ensure_mapped(pid, last)) {
        impl_->sym.modules(pid, &gen_after);
        if (gen_after != gen_before) continue;
      }
    }
    if (rc != 0 && !truncated && out.size() <= 1) ++impl_->stats.failed;
    if (truncated) ++impl_->stats.truncated;
    impl_->stats.frames += out.size();
    return out;
  }
}

std::vector<uint64_t> Unwinder::unwind_fp(const UserRegs& regs, std::span<const uint8_t> stack, size_t max_frames) {
  std::vector<uint64_t> out;
  if (max_frames == 0 || regs.ip == 0) return out;
  out.push_back(regs.ip);
  uint64_t bp = regs.bp;
  const uint64_t sp = regs.sp, n = stack.size();
  while (out.size() < max_frames) {
    if (bp < sp || n < 16 || bp - sp > n - 16) break;
    uint64_t next_bp = 0, ret = 0;
    std::memcpy(&next_bp, stack.data() + (bp - sp), 8);
    std::memcpy(&ret, stack.data() + (bp - sp) + 8, 8);
    if (ret == 0) break;
    out.push_back(ret);
    if (next_bp <= bp) break;
    bp = next_bp;
  }
  return out;
}

Unwinder::Stats Unwinder::stats() const { return impl_->stats; }

}  // namespace ingero::bpf
