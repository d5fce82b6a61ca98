// StackResolver: BPF stack records -> unwound, symbolized, deduplicated stacks. See
// stack_resolver.h.
#include "bpf/stack_resolver.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <span>
#include <unistd.h>

#include "bpf/pyintrospect.h"
#include "bpf/symbolizer.h"
#include "bpf/unwind.h"
#include "model/ops.h"

namespace ingero::bpf {
namespace {

constexpr size_t kMaxNative = 128;

void put_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x110000) {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += "\xef\xbf\xbd";  // U+FFFD
  }
}

ip_py_proc layout_of(const PyOffsets& o, int minor, uint64_t runtime) {
  ip_py_proc l{};
  l.runtime = runtime;
  l.minor = static_cast<uint32_t>(minor);
  l.key_off = o.runtime_tss + 4;  // Py_tss_t {int _is_initialized; pthread_key_t _key;}
  l.tss_base = kGlibcSpecificOffset;
  l.tstate_frame = o.tstate_frame;
  l.cframe_frame = o.cframe_current_frame;
  l.frame_code = o.frame_code;
  l.frame_back = o.frame_back;
  l.frame_instr = o.frame_instr;
  l.frame_owner = o.frame_owner;
  l.code_filename = o.code_filename;
  l.code_name = o.code_qualname ? o.code_qualname : o.code_name;
  l.code_firstlineno = o.code_firstlineno;
  l.code_linetable = o.code_linetable;
  l.code_bytecode = o.code_bytecode;
  l.str_state = o.str_state;
  l.str_ascii_data = o.str_ascii_data;
  l.str_compact_data = o.str_compact_data;
  l.bytes_size = o.bytes_size;
  l.bytes_data = o.bytes_data;
  return l;
}

ip_py_proc layout_of(const PyProcess& p) { return layout_of(p.off, p.minor, p.runtime_addr); }

// inspect_python's reasons that only mean "not started yet": BPF registers such a process itself
// once its interpreter runs (py_bins), and user space checks it again then (python_minor).
bool transient_refusal(const std::string& why) {
  return why.rfind("autoTSSkey is not initialized", 0) == 0 || why.rfind("interpreters.head is null", 0) == 0 ||
         why.rfind("the main interpreter has no thread state", 0) == 0;
}

// The process exited or is exiting (what inspect_python could not read of it then says nothing
// about its layout): /proc/PID/maps is gone, or empty (its memory is released before it becomes a
// zombie).
bool gone(uint32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  return !in || in.peek() == std::ifstream::traits_type::eof();
}

bool is_eval_frame(const StackFrame& f) {
  return f.kind == FrameKind::kNative && f.function == "_PyEval_EvalFrameDefault";
}

}  // namespace

std::string py_str_utf8(const char* data, size_t bytes, unsigned kind) {
  std::string out;
  if (kind == 1) {
    for (size_t i = 0; i < bytes; ++i) put_utf8(out, static_cast<uint8_t>(data[i]));
  } else if (kind == 2) {
    for (size_t i = 0; i + 2 <= bytes; i += 2) {
      uint16_t c;
      std::memcpy(&c, data + i, 2);
      put_utf8(out, c);
    }
  } else if (kind == 4) {
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
      uint32_t c;
      std::memcpy(&c, data + i, 4);
      put_utf8(out, c);
    }
  }
  return out;
}

StackResolver::StackResolver(BpfProbes& probes)
    : probes_(probes), sym_(std::make_unique<Symbolizer>()), unw_(std::make_unique<Unwinder>(*sym_)) {}

StackResolver::~StackResolver() = default;

void StackResolver::set_module(Source s, std::string module_basename) {
  module_[static_cast<int>(s)] = std::move(module_basename);
}

bool StackResolver::learn_binary(const std::string& exe, const std::string& libpython) {
  std::string why;
  const auto b = inspect_python_binary(exe, libpython, why);
  if (!b) return false;
  ip_py_bin_key k{};
  k.ino = b->ino;
  k.size = b->size;
  if (!learned_.insert({k.ino, k.size}).second) return true;
  ip_py_bin v{};
  v.layout = layout_of(b->off, b->minor, 0);
  v.text_vaddr = b->text_vaddr;
  v.got_vaddr = b->got_vaddr;
  v.runtime_off = b->runtime_off;
  v.interp_head = b->off.runtime_interp_head;
  v.tstate_interp = b->off.tstate_interp;
  if (!probes_.set_python_binary(k, v)) {
    learned_.erase({k.ino, k.size});
    return false;
  }
  ++stats_.python_bins;
  return true;
}

size_t StackResolver::learn_interpreters() {
  size_t n = 0;
  for (const std::string& exe : python_interpreter_candidates()) n += learn_binary(exe, "") ? 1 : 0;
  return n;
}

void StackResolver::refuse_python(uint32_t pid, const std::string& why) {
  // Written, not deleted: BPF must not register the process itself again (py_bins).
  ip_py_proc none{};
  probes_.set_python(pid, none);
  minor_.erase(pid);
  ++stats_.python_refused;
  warnings_.push_back("pid " + std::to_string(pid) + ": no Python frames (" + why + "); native stacks only");
}

void StackResolver::note_process(uint32_t pid) {
  if (!pid || !noted_.insert(pid).second) return;
  sym_->note_process(pid);
  std::string why;
  if (auto py = inspect_python(pid, why)) {
    if (probes_.set_python(pid, layout_of(*py))) {
      minor_[pid] = py->minor;
      ++stats_.python_procs;
    }
    // Later processes of the same interpreter are registered by BPF at their first stack.
    char exe[4096];
    const ssize_t n = readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), exe, sizeof exe - 1);
    if (n > 0) learn_binary(std::string(exe, static_cast<size_t>(n)), py->module);
  } else if (why.rfind("not a CPython", 0) != 0 && !transient_refusal(why) && !gone(pid)) {
    // A Python process whose layout did not validate (or anything else inspect_python refused):
    // native stacks only, said once.
    refuse_python(pid, why);
  }
}

int StackResolver::python_minor(uint32_t pid) {
  if (const auto it = minor_.find(pid); it != minor_.end()) return it->second;
  ip_py_proc l{};
  if (!probes_.get_python(pid, l) || l.minor == 0) return -1;
  // BPF registered the process itself (py_bins) before user space validated it: validate now.
  std::string why;
  if (auto py = inspect_python(pid, why)) {
    if (py->runtime_addr != l.runtime) {
      refuse_python(pid, "BPF found _PyRuntime at another address than user space");
      return -1;
    }
    minor_[pid] = py->minor;
  } else if (transient_refusal(why) || gone(pid)) {
    // Exited (or finalizing): BPF's own checks at registration are all there is.
    minor_[pid] = static_cast<int>(l.minor);
  } else {
    refuse_python(pid, why);
    return -1;
  }
  ++stats_.python_procs;
  return minor_[pid];
}

void StackResolver::forget_process(uint32_t pid) {
  if (!noted_.erase(pid)) return;
  sym_->forget_process(pid);
  minor_.erase(pid);
  probes_.forget_python(pid);  // registered by user space, by BPF itself, or refused
  for (auto it = codes_.lower_bound({pid, 0}); it != codes_.end() && it->first.first == pid;) it = codes_.erase(it);
}

const StackResolver::Code& StackResolver::code(uint32_t pid, uint64_t addr) {
  Code& c = codes_[{pid, addr}];
  if (c.ok) return c;
  ip_py_code raw{};
  if (!probes_.read_code(pid, addr, raw)) return c;  // not read (yet): retried next time
  c.ok = true;
  c.firstlineno = raw.firstlineno;
  c.file = py_str_utf8(raw.file, std::min<size_t>(raw.file_len, sizeof(raw.file)), raw.file_kind);
  c.name = py_str_utf8(raw.name, std::min<size_t>(raw.name_len, sizeof(raw.name)), raw.name_kind);
  c.linetable.assign(raw.linetable, raw.linetable + std::min<size_t>(raw.linetable_len, sizeof(raw.linetable)));
  return c;
}

void StackResolver::add_python(const ip_stack_record& r, uint32_t pid, ParsedStack& st) {
  const uint32_t n = std::min<uint32_t>(r.n_py, IP_PY_MAX);
  if (n == 0) return;
  const int minor = python_minor(pid);
  if (minor < 0) return;
  std::vector<StackFrame> py;
  py.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    const Code& c = code(pid, r.py[i].code);
    StackFrame f;
    f.kind = FrameKind::kPython;
    if (!c.ok) {
      ++stats_.unknown_code;
      f.function = "<unknown>";
      py.push_back(std::move(f));
      continue;
    }
    f.file = c.file;
    f.function = c.name;
    uint32_t line = 0;
    if (r.py[i].lasti != UINT32_MAX) line = python_line(minor, c.linetable, c.firstlineno, r.py[i].lasti);
    f.line = line ? line : static_cast<uint32_t>(std::max(c.firstlineno, 0));
    py.push_back(std::move(f));
  }
  ++stats_.python_stacks;
  auto at = std::find_if(st.frames.begin(), st.frames.end(), is_eval_frame);
  st.frames.insert(at, py.begin(), py.end());
}

uint64_t StackResolver::finish(ParsedStack& st, const std::vector<uint64_t>& ips) {
  if (st.frames.empty()) {
    ++stats_.empty;
    return 0;
  }
  ++stats_.resolved;
  if (st.truncated) ++stats_.truncated;
  const uint64_t id = stack_content_hash(st);
  if (known_.insert(id).second) {
    ++stats_.unique;
    new_.emplace_back(id, encode_stack(st, ips));
  }
  return id;
}

uint64_t StackResolver::resolve(const ip_stack_record& r, size_t len) {
  const uint32_t pid = r.rec.pid;
  if (!noted(pid)) note_process(pid);
  ParsedStack st;
  std::vector<uint64_t> all_ips;

  if (r.kind == IP_STK_OFFCPU && (r.rec.flags & IP_REC_STACKIDS))
    add_kernel_from_id(static_cast<uint32_t>(r.rec.arg2), st, all_ips);  // where it slept
  if ((r.flags & IP_STKF_KSTACK) && r.n_kern > 0) {
    std::vector<uint64_t> k(r.kern, r.kern + std::min<uint32_t>(r.n_kern, IP_KSTACK_MAX));
    for (auto& f : sym_->symbolize_kernel(k)) st.frames.push_back(std::move(f));
    all_ips.insert(all_ips.end(), k.begin(), k.end());
  }

  if (r.kind == IP_STK_CALL) {
    // The probed function returned before the capture: name it first.
    StackFrame callee;
    callee.kind = FrameKind::kNative;
    const OpInfo* oi = find_op(static_cast<Source>(r.rec.source), r.rec.op);
    callee.function = oi ? std::string(oi->alias.empty() ? oi->name : oi->alias)
                         : op_name(static_cast<Source>(r.rec.source), r.rec.op);
    Source s = static_cast<Source>(r.rec.source);
    if (s == Source::kGraph) s = Source::kCuda;
    if (auto it = module_.find(static_cast<int>(s)); it != module_.end()) callee.module = it->second;
    st.frames.push_back(std::move(callee));
  }

  if (r.flags & IP_STKF_USER_REGS) {
    const size_t head = offsetof(ip_stack_record, ustack);
    const size_t win = len > head ? std::min<size_t>(len - head, r.ustack_len) : 0;
    UserRegs regs;
    regs.ip = r.ip;
    regs.sp = r.sp;
    regs.bp = r.bp;
    bool trunc = false;
    std::vector<uint64_t> ips = unw_->unwind(pid, regs, std::span<const uint8_t>(r.ustack, win), kMaxNative, trunc);
    // The frame-pointer stack is the cross-check: used when it saw further (FP-built code).
    const uint32_t nfp = std::min<uint32_t>(r.n_fp, IP_FP_MAX);
    if (nfp > ips.size()) {
      ips.assign(r.fp, r.fp + nfp);
      trunc = nfp == IP_FP_MAX;
    }
    if (!ips.empty()) {
      // A uretprobe's ip is a return address into the caller; a sample's is exact.
      auto frames = sym_->symbolize_user(pid, ips, r.kind != IP_STK_CALL);
      for (auto& f : frames) st.frames.push_back(std::move(f));
      all_ips.insert(all_ips.end(), ips.begin(), ips.end());
    }
    st.truncated |= trunc;
  }
  if (r.flags & IP_STKF_PY) add_python(r, pid, st);
  if (r.flags & IP_STKF_PY_TRUNC) st.truncated = true;
  return finish(st, all_ips);
}

void StackResolver::add_kernel_from_id(uint32_t kstack_id1, ParsedStack& st, std::vector<uint64_t>& all_ips) {
  std::vector<uint64_t> ips;
  if (kstack_id1 && probes_.read_stack_id(kstack_id1 - 1, ips) && !ips.empty()) {
    auto frames = sym_->symbolize_kernel(ips);
    // The capture's own frames (our tracepoint program and the trampoline that ran it) are not
    // where the thread waited.
    size_t skip = 0;
    while (skip < frames.size() &&
           (frames[skip].function.rfind("bpf_prog_", 0) == 0 || frames[skip].function.rfind("bpf_trace_run", 0) == 0 ||
            frames[skip].function.rfind("__bpf_trace_", 0) == 0 || frames[skip].function.rfind("__traceiter_", 0) == 0))
      ++skip;
    for (size_t i = skip; i < frames.size(); ++i) st.frames.push_back(std::move(frames[i]));
    all_ips.insert(all_ips.end(), ips.begin() + static_cast<long>(skip), ips.end());
  }
}

uint64_t StackResolver::resolve_offcpu(uint32_t pid, uint32_t kstack_id1, uint32_t ustack_id1) {
  if (!noted(pid)) note_process(pid);
  ParsedStack st;
  std::vector<uint64_t> all_ips, ips;
  add_kernel_from_id(kstack_id1, st, all_ips);
  if (ustack_id1 && probes_.read_stack_id(ustack_id1 - 1, ips) && !ips.empty()) {
    // The first is the user ip at kernel entry (exact), then return addresses from a
    // frame-pointer walk, which turns to garbage at the first library built without frame
    // pointers: keep frames while they resolve to a symbol at a plausible offset.
    auto frames = sym_->symbolize_user(pid, ips, true);
    for (size_t i = 0; i < frames.size(); ++i) {
      if (i > 0 && (frames[i].function.empty() || frames[i].offset > (1u << 16))) {
        st.truncated = true;
        break;
      }
      all_ips.push_back(ips[i]);
      st.frames.push_back(std::move(frames[i]));
    }
  }
  return finish(st, all_ips);
}

}  // namespace ingero::bpf
