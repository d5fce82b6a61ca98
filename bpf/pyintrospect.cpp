// CPython introspection: offsets per minor version, finding and validating _PyRuntime in a live
// process, line-table and str decoding, and a user-space frame walk through /proc/PID/mem.
// See pyintrospect.h for the contract and docs/stacks.md for where the numbers come from.
#include "bpf/pyintrospect.h"
#include "bpf/symbolizer.h"

#include <elf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

namespace ingero::bpf {

namespace {

// Offsets measured with gdb on the DWARF of the pyenv builds 3.10.13, 3.11.7, 3.12.1, 3.13.0
// (x86-64); they agree with pyroscope's DWARF-generated tables for every patch release of those
// minors and, on 3.13, with the interpreter's own _Py_DebugOffsets (checked at attach).
constexpr PyOffsets kTable[] = {
    // 3.10: gilstate.autoTSSkey at 560+24; tstate->frame is a PyFrameObject*; f_lasti in code units.
    {.minor = 10,
     .runtime_tss = 584,
     .runtime_interp_head = 32,
     .interp_threads_head = 8,
     .tstate_interp = 16,
     .tstate_native_thread_id = 0,
     .tstate_next = 8,
     .tstate_thread_id = 176,
     .tstate_frame = 24,
     .cframe_current_frame = -1,
     .frame_code = 32,
     .frame_back = 24,
     .frame_instr = 96,
     .frame_owner = -1,
     .code_filename = 104,
     .code_name = 112,
     .code_qualname = 0,
     .code_firstlineno = 40,
     .code_linetable = 120,
     .code_bytecode = 48,
     .str_ascii_data = 48,
     .str_compact_data = 72,
     .str_state = 32,
     .bytes_data = 32,
     .bytes_size = 16},
    // 3.11: tstate->cframe->current_frame (_PyInterpreterFrame); prev_instr; co_code_adaptive inline.
    {.minor = 11,
     .runtime_tss = 592,
     .runtime_interp_head = 40,
     .interp_threads_head = 16,
     .tstate_interp = 16,
     .tstate_native_thread_id = 160,
     .tstate_next = 8,
     .tstate_thread_id = 152,
     .tstate_frame = 56,
     .cframe_current_frame = 8,
     .frame_code = 32,
     .frame_back = 48,
     .frame_instr = 56,
     .frame_owner = 69,
     .code_filename = 112,
     .code_name = 120,
     .code_qualname = 128,
     .code_firstlineno = 72,
     .code_linetable = 136,
     .code_bytecode = 184,
     .str_ascii_data = 48,
     .str_compact_data = 72,
     .str_state = 32,
     .bytes_data = 32,
     .bytes_size = 16},
    // 3.12: _PyRuntime.autoTSSkey; cframe->current_frame at 0; shim frames (owner 3).
    {.minor = 12,
     .runtime_tss = 1544,
     .runtime_interp_head = 40,
     .interp_threads_head = 72,
     .tstate_interp = 16,
     .tstate_native_thread_id = 144,
     .tstate_next = 8,
     .tstate_thread_id = 136,
     .tstate_frame = 56,
     .cframe_current_frame = 0,
     .frame_code = 0,
     .frame_back = 8,
     .frame_instr = 56,
     .frame_owner = 70,
     .code_filename = 112,
     .code_name = 120,
     .code_qualname = 128,
     .code_firstlineno = 68,
     .code_linetable = 136,
     .code_bytecode = 192,
     .str_ascii_data = 40,
     .str_compact_data = 56,
     .str_state = 32,
     .bytes_data = 32,
     .bytes_size = 16},
    // 3.13: tstate->current_frame; f_executable; instr_ptr; entry frames (owner 3, executable None).
    {.minor = 13,
     .runtime_tss = 2160,
     .runtime_interp_head = 632,
     .interp_threads_head = 7344,
     .tstate_interp = 16,
     .tstate_native_thread_id = 160,
     .tstate_next = 8,
     .tstate_thread_id = 152,
     .tstate_frame = 72,
     .cframe_current_frame = -1,
     .frame_code = 0,
     .frame_back = 8,
     .frame_instr = 56,
     .frame_owner = 70,
     .code_filename = 112,
     .code_name = 120,
     .code_qualname = 128,
     .code_firstlineno = 68,
     .code_linetable = 136,
     .code_bytecode = 200,
     .str_ascii_data = 40,
     .str_compact_data = 56,
     .str_state = 32,
     .bytes_data = 32,
     .bytes_size = 16},
};

constexpr int kFrameOwnedByCStack = 3;
constexpr uint32_t kStrLengthOffset = 16;  // PyASCIIObject.length (after ob_refcnt, ob_type)
constexpr uint32_t kObTypeOffset = 8;
constexpr size_t kMaxStringBytes = 1024;
constexpr size_t kMaxLineTable = 1 << 20;

// Reads another process's memory through /proc/PID/mem.
class Mem {
 public:
  explicit Mem(uint32_t pid) {
    char p[64];
    std::snprintf(p, sizeof p, "/proc/%u/mem", pid);
    fd_ = open(p, O_RDONLY | O_CLOEXEC);
    err_ = errno;
  }
  ~Mem() {
    if (fd_ >= 0) close(fd_);
  }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  bool ok() const { return fd_ >= 0; }
  int open_errno() const { return err_; }
  bool read(uint64_t addr, void* out, size_t n) const {
    if (fd_ < 0 || addr == 0) return false;
    return pread(fd_, out, n, static_cast<off_t>(addr)) == static_cast<ssize_t>(n);
  }
  // Reads up to n bytes, as many as are readable (a string near the end of a mapping).
  size_t read_some(uint64_t addr, void* out, size_t n) const {
    if (fd_ < 0 || addr == 0) return 0;
    const ssize_t r = pread(fd_, out, n, static_cast<off_t>(addr));
    if (r > 0) return static_cast<size_t>(r);
    // Retry a shorter read up to the page end.
    const size_t to_page = 4096 - (addr & 4095);
    if (to_page < n) {
      const ssize_t r2 = pread(fd_, out, to_page, static_cast<off_t>(addr));
      if (r2 > 0) return static_cast<size_t>(r2);
    }
    return 0;
  }
  template <typename T>
  bool get(uint64_t addr, T& v) const {
    return read(addr, &v, sizeof v);
  }
  uint64_t ptr(uint64_t addr) const {
    uint64_t v = 0;
    return get(addr, v) ? v : 0;
  }

 private:
  int fd_ = -1;
  int err_ = 0;
};

struct Mapping {
  uint64_t start, end, offset;
  std::string path;
};

std::vector<Mapping> read_maps(uint32_t pid) {
  std::vector<Mapping> out;
  char p[64];
  std::snprintf(p, sizeof p, "/proc/%u/maps", pid);
  FILE* fp = std::fopen(p, "re");
  if (fp == nullptr) return out;
  char line[4352];
  while (std::fgets(line, sizeof line, fp) != nullptr) {
    unsigned long long s = 0, e = 0, off = 0, ino = 0;
    char perms[8];
    unsigned maj = 0, min = 0;
    int consumed = 0;
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &s, &e, perms, &off, &maj, &min, &ino, &consumed) < 7)
      continue;
    std::string path = line + consumed;
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    if (ino == 0 || path.empty() || path[0] != '/') continue;
    out.push_back(Mapping{s, e, off, std::move(path)});
  }
  std::fclose(fp);
  return out;
}

std::string base_name(const std::string& p) {
  const size_t s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// "libpython3.12.so.1.0" -> 12, "python3.10" -> 10; `t` set for a free-threaded name (3.13t).
int minor_from_name(const std::string& base, bool& freethreaded) {
  freethreaded = false;
  size_t at = base.find("python3.");
  if (at == std::string::npos) return -1;
  at += 8;
  int minor = 0, digits = 0;
  while (at < base.size() && base[at] >= '0' && base[at] <= '9' && digits < 3) {
    minor = minor * 10 + (base[at] - '0');
    ++at;
    ++digits;
  }
  if (digits == 0) return -1;
  if (at < base.size() && base[at] == 't') freethreaded = true;
  return minor;
}

struct ElfSyms {
  uint64_t runtime = 0, py_version = 0, code_type = 0, bytes_main = 0;
  bool have_runtime = false, have_version = false, have_code_type = false, have_bytes_main = false;
  std::vector<GElf_Phdr> loads;
};

bool elf_syms(int fd, ElfSyms& out) {
  elf_version(EV_CURRENT);
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (elf == nullptr) return false;
  if (elf_kind(elf) != ELF_K_ELF) {
    elf_end(elf);
    return false;
  }
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) == 0)
    for (size_t i = 0; i < phnum; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD) out.loads.push_back(ph);
    }
  for_each_elf_symbol(elf, [&](const char* name, uint64_t value, uint64_t, unsigned char) {
    if (!out.have_runtime && std::strcmp(name, "_PyRuntime") == 0) {
      out.runtime = value;
      out.have_runtime = true;
    } else if (!out.have_version && std::strcmp(name, "Py_Version") == 0) {
      out.py_version = value;
      out.have_version = true;
    } else if (!out.have_code_type && std::strcmp(name, "PyCode_Type") == 0) {
      out.code_type = value;
      out.have_code_type = true;
    } else if (!out.have_bytes_main && std::strcmp(name, "Py_BytesMain") == 0) {
      out.bytes_main = value;
      out.have_bytes_main = true;
    }
  });
  elf_end(elf);
  return true;
}

// Process address of ELF vaddr 0 for the file mapped by `maps` entries with this path.
bool load_bias(const std::vector<Mapping>& maps, const std::string& path, const ElfSyms& syms, uint64_t& bias) {
  for (const Mapping& m : maps) {
    if (m.path != path) continue;
    for (const GElf_Phdr& ph : syms.loads) {
      const uint64_t page_off = ph.p_offset & ~uint64_t{0xfff};
      if (m.offset >= page_off && m.offset < ph.p_offset + std::max<uint64_t>(ph.p_filesz, 1)) {
        bias = m.start - m.offset + ph.p_offset - ph.p_vaddr;
        return true;
      }
    }
  }
  return false;
}

// The 3.13 _Py_DebugOffsets (`dbg`: the first 352 bytes of _PyRuntime) against the table.
bool debug_offsets_match(const uint8_t* dbg, const PyOffsets& o, std::string& why) {
  const PyOffsets* off = &o;
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, dbg + at, 8);
    return v;
  };
  const struct {
    size_t at;
    uint64_t want;
    const char* what;
  } checks[] = {
      {40, off->runtime_interp_head, "interpreters_head"},
      {72, off->interp_threads_head, "threads_head"},
      {168, off->tstate_next, "tstate.next"},
      {176, off->tstate_interp, "tstate.interp"},
      {184, off->tstate_frame, "tstate.current_frame"},
      {192, off->tstate_thread_id, "tstate.thread_id"},
      {200, off->tstate_native_thread_id, "tstate.native_thread_id"},
      {232, off->frame_back, "frame.previous"},
      {240, off->frame_code, "frame.executable"},
      {248, off->frame_instr, "frame.instr_ptr"},
      {264, static_cast<uint64_t>(off->frame_owner), "frame.owner"},
      {280, off->code_filename, "code.filename"},
      {288, off->code_name, "code.name"},
      {296, off->code_qualname, "code.qualname"},
      {304, off->code_linetable, "code.linetable"},
      {312, off->code_firstlineno, "code.firstlineno"},
      {344, off->code_bytecode, "code.co_code_adaptive"},
  };
  for (const auto& c : checks)
    if (u64(c.at) != c.want) {
      why = std::string("_Py_DebugOffsets.") + c.what + " = " + std::to_string(u64(c.at)) + ", table says " +
            std::to_string(c.want);
      return false;
    }
  return true;
}

std::string read_str(const Mem& mem, const PyOffsets& off, uint64_t addr) {
  if (addr == 0) return {};
  uint8_t buf[kMaxStringBytes + 128];
  const size_t n = mem.read_some(addr, buf, sizeof buf);
  return py_string(off, std::span<const uint8_t>(buf, n));
}

// The varint of the 3.11+ location table: 6-bit groups, low first, bit 6 = more follow.
bool read_varint(std::span<const uint8_t> t, size_t& pos, uint32_t& v) {
  v = 0;
  unsigned shift = 0;
  while (pos < t.size()) {
    const uint8_t b = t[pos++];
    if (shift < 32) v |= static_cast<uint32_t>(b & 63) << shift;
    shift += 6;
    if (!(b & 64)) return true;
  }
  return false;
}

bool read_svarint(std::span<const uint8_t> t, size_t& pos, int32_t& v) {
  uint32_t u = 0;
  if (!read_varint(t, pos, u)) return false;
  v = (u & 1) ? -static_cast<int32_t>(u >> 1) : static_cast<int32_t>(u >> 1);
  return true;
}

}  // namespace

const PyOffsets* py_offsets_for(int minor) {
  for (const PyOffsets& o : kTable)
    if (o.minor == minor) return &o;
  return nullptr;
}

uint32_t python_line(int minor, std::span<const uint8_t> t, int firstlineno, uint32_t lasti_bytes) {
  if (minor == 10) {
    // 3.10: (byte delta u8, line delta s8) pairs; a line delta of -128 means "no line".
    int64_t line = firstlineno;
    uint64_t addr = 0;
    for (size_t i = 0; i + 1 < t.size(); i += 2) {
      const uint64_t end = addr + t[i];
      const int8_t ld = static_cast<int8_t>(t[i + 1]);
      int64_t cur = -1;
      if (ld != -128) {
        line += ld;
        cur = line;
      }
      if (lasti_bytes >= addr && lasti_bytes < end) return cur > 0 ? static_cast<uint32_t>(cur) : 0;
      addr = end;
    }
    return 0;
  }
  if (minor < 11) return 0;
  // 3.11+: entries of (1 code:4 len-1:3) then code-specific bytes; addresses in code units.
  const uint64_t target = lasti_bytes / 2;
  int64_t line = firstlineno;
  uint64_t addr = 0;
  size_t pos = 0;
  while (pos < t.size()) {
    const uint8_t b = t[pos++];
    if (!(b & 0x80)) return 0;  // not at an entry start: malformed
    const int code = (b >> 3) & 15;
    const uint64_t len = (b & 7) + 1u;
    int64_t cur = -1;
    if (code == 15) {
      // no location
    } else if (code == 14) {  // long form
      int32_t d = 0;
      uint32_t skip = 0;
      if (!read_svarint(t, pos, d) || !read_varint(t, pos, skip) || !read_varint(t, pos, skip) ||
          !read_varint(t, pos, skip))
        return 0;
      line += d;
      cur = line;
    } else if (code == 13) {  // no column
      int32_t d = 0;
      if (!read_svarint(t, pos, d)) return 0;
      line += d;
      cur = line;
    } else if (code >= 10) {  // one-line form: line delta code-10, then start and end column
      line += code - 10;
      cur = line;
      pos += 2;
    } else {  // short form: same line, one column byte
      cur = line;
      pos += 1;
    }
    if (target >= addr && target < addr + len) return cur > 0 ? static_cast<uint32_t>(cur) : 0;
    addr += len;
  }
  return 0;
}

std::string py_string(const PyOffsets& off, std::span<const uint8_t> obj) {
  if (obj.size() < off.str_state + 4 || obj.size() < kStrLengthOffset + 8) return {};
  uint32_t state = 0;
  int64_t length = 0;
  std::memcpy(&state, obj.data() + off.str_state, 4);
  std::memcpy(&length, obj.data() + kStrLengthOffset, 8);
  const uint32_t kind = (state >> 2) & 7;
  const bool compact = (state >> 5) & 1;
  const bool ascii = (state >> 6) & 1;
  if (!compact || length < 0 || length > (1 << 20)) return {};
  std::string out;
  if (ascii) {
    if (kind != 1 || obj.size() <= off.str_ascii_data) return {};
    const size_t n = std::min<size_t>(static_cast<size_t>(length), obj.size() - off.str_ascii_data);
    out.assign(reinterpret_cast<const char*>(obj.data() + off.str_ascii_data), n);
    for (char c : out)
      if (static_cast<unsigned char>(c) >= 0x80) return {};  // not ASCII: not a str we understand
    return out;
  }
  if (kind != 1 && kind != 2 && kind != 4) return {};
  if (obj.size() <= off.str_compact_data) return {};
  const size_t avail = (obj.size() - off.str_compact_data) / kind;
  const size_t n = std::min<size_t>(static_cast<size_t>(length), avail);
  const uint8_t* d = obj.data() + off.str_compact_data;
  for (size_t i = 0; i < n; ++i) {
    uint32_t cp = 0;
    if (kind == 1) {
      cp = d[i];
    } else if (kind == 2) {
      uint16_t v;
      std::memcpy(&v, d + 2 * i, 2);
      cp = v;
    } else {
      std::memcpy(&cp, d + 4 * i, 4);
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 63)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 63)));
      out.push_back(static_cast<char>(0x80 | (cp & 63)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 63)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 63)));
      out.push_back(static_cast<char>(0x80 | (cp & 63)));
    }
  }
  return out;
}

uint32_t py_lasti_bytes(int minor, uint64_t code_addr, uint64_t instr, const PyOffsets& off) {
  if (minor == 10) {
    const int32_t lasti = static_cast<int32_t>(static_cast<uint32_t>(instr));
    return lasti < 0 ? 0 : static_cast<uint32_t>(lasti) * 2;
  }
  const uint64_t base = code_addr + off.code_bytecode;
  if (instr < base || instr - base > UINT32_MAX) return UINT32_MAX;
  return static_cast<uint32_t>(instr - base);
}

std::optional<PyProcess> inspect_python(uint32_t pid, std::string& why) {
  const std::vector<Mapping> maps = read_maps(pid);
  if (maps.empty()) {
    why = "cannot read /proc/" + std::to_string(pid) + "/maps";
    return std::nullopt;
  }
  // The thread-specific data layout BPF reads is glibc's; musl's differs.
  for (const Mapping& m : maps) {
    const std::string b = base_name(m.path);
    if (b.rfind("ld-musl-", 0) == 0 || b.rfind("libc.musl-", 0) == 0) {
      why = "musl libc: its thread-specific data layout is not supported";
      return std::nullopt;
    }
  }
  // Candidates: a libpython3.X mapping, else the executable (static libpython, e.g. Debian's).
  std::vector<std::string> candidates;
  for (const Mapping& m : maps) {
    const std::string b = base_name(m.path);
    if (b.rfind("libpython3.", 0) == 0 && std::find(candidates.begin(), candidates.end(), m.path) == candidates.end())
      candidates.push_back(m.path);
  }
  char exe[4096];
  const std::string exe_link = "/proc/" + std::to_string(pid) + "/exe";
  const ssize_t el = readlink(exe_link.c_str(), exe, sizeof exe - 1);
  if (el > 0) {
    exe[el] = '\0';
    candidates.emplace_back(exe);
  }
  for (const std::string& path : candidates) {
    bool ft = false;
    const int name_minor = minor_from_name(base_name(path), ft);
    if (ft) {
      why = "free-threaded CPython build (" + base_name(path) + ") is not supported";
      return std::nullopt;
    }
    // Open the file as the process sees it (its mount namespace).
    int fd = open(("/proc/" + std::to_string(pid) + "/root" + path).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ElfSyms syms;
    const bool ok = elf_syms(fd, syms);
    close(fd);
    if (!ok || !syms.have_runtime) continue;
    uint64_t bias = 0;
    if (!load_bias(maps, path, syms, bias)) {
      why = "cannot compute the load address of " + path;
      return std::nullopt;
    }
    Mem mem(pid);
    if (!mem.ok()) {
      why = "cannot open /proc/" + std::to_string(pid) + "/mem: " + std::strerror(mem.open_errno()) +
            " (needs root or ptrace rights)";
      return std::nullopt;
    }
    PyProcess p;
    p.pid = pid;
    p.module = path;
    p.runtime_addr = syms.runtime + bias;
    p.code_type_addr = syms.have_code_type ? syms.code_type + bias : 0;
    int minor = -1;
    if (syms.have_version) {
      uint32_t v = 0;
      if (!mem.get(syms.py_version + bias, v)) {
        why = "cannot read Py_Version from the process";
        return std::nullopt;
      }
      if ((v >> 24) != 3) {
        why = "Py_Version is not 3.x";
        return std::nullopt;
      }
      minor = static_cast<int>((v >> 16) & 0xff);
      p.version = "3." + std::to_string(minor) + "." + std::to_string((v >> 8) & 0xff);
    } else {
      minor = name_minor;
      if (minor >= 11) {
        why = "Py_Version missing in a CPython 3." + std::to_string(minor) + " build";
        return std::nullopt;
      }
      p.version = minor >= 0 ? "3." + std::to_string(minor) : "";
    }
    const PyOffsets* off = py_offsets_for(minor);
    if (off == nullptr) {
      why = minor < 0 ? "cannot tell the CPython version of " + path
                      : "CPython 3." + std::to_string(minor) + " is not supported (3.10-3.13)";
      return std::nullopt;
    }
    p.minor = minor;
    p.off = *off;
    // Validation, one read at a time: any mismatch refuses the process.
    int32_t tss[2] = {0, 0};
    if (!mem.read(p.runtime_addr + off->runtime_tss, tss, sizeof tss)) {
      why = "cannot read _PyRuntime";
      return std::nullopt;
    }
    if (tss[0] != 1) {
      why = "autoTSSkey is not initialized (layout mismatch or interpreter not started)";
      return std::nullopt;
    }
    if (static_cast<uint32_t>(tss[1]) >= kGlibcSpecificFastKeys) {
      why = "autoTSSkey " + std::to_string(tss[1]) + " >= 32: not in glibc's first block";
      return std::nullopt;
    }
    p.tss_key = static_cast<uint32_t>(tss[1]);
    const uint64_t head = mem.ptr(p.runtime_addr + off->runtime_interp_head);
    if (head == 0) {
      why = "interpreters.head is null";
      return std::nullopt;
    }
    const uint64_t ts = mem.ptr(head + off->interp_threads_head);
    if (ts == 0) {
      why = "the main interpreter has no thread state (layout mismatch?)";
      return std::nullopt;
    }
    if (mem.ptr(ts + off->tstate_interp) != head) {
      why = "tstate->interp != interpreters.head: layout mismatch";
      return std::nullopt;
    }
    p.interp_head = head;
    // The glibc TSS layout BPF relies on: tstate->thread_id is the thread's pthread_self(), which
    // is its fsbase with glibc, so the slot *(thread_id + 0x310 + 16*key + 8) of some live thread
    // (the main one at least) must point back at its thread state. Checked without stopping it.
    {
      bool tss_ok = false;
      uint64_t t = ts;
      for (int n = 0; t != 0 && n < 64 && !tss_ok; ++n) {
        const uint64_t self = mem.ptr(t + off->tstate_thread_id);
        if (self != 0 && mem.ptr(self + kGlibcSpecificOffset + 16ull * p.tss_key + 8) == t) tss_ok = true;
        t = mem.ptr(t + off->tstate_next);
      }
      if (!tss_ok) {
        why =
            "no thread state is reachable through the glibc TSS slot (pthread_self + 0x310 + "
            "16*key + 8): unknown libc layout";
        return std::nullopt;
      }
    }
    if (minor >= 13) {
      // _Py_DebugOffsets at _PyRuntime+0: the interpreter's own description of its layout.
      uint8_t dbg[352];
      if (!mem.read(p.runtime_addr, dbg, sizeof dbg) || std::memcmp(dbg, "xdebugpy", 8) != 0) {
        why = "_Py_DebugOffsets cookie missing";
        return std::nullopt;
      }
      auto u64 = [&](size_t o) {
        uint64_t v;
        std::memcpy(&v, dbg + o, 8);
        return v;
      };
      if (u64(16) != 0) {
        why = "free-threaded CPython build is not supported";
        return std::nullopt;
      }
      if (!debug_offsets_match(dbg, *off, why)) return std::nullopt;
    }
    return p;
  }
  why = "not a CPython process (no _PyRuntime in libpython or the executable)";
  return std::nullopt;
}

std::optional<uint64_t> thread_fsbase(uint32_t pid, uint32_t tid, std::string& why) {
  (void)pid;
  const pid_t t = static_cast<pid_t>(tid);
  if (ptrace(PTRACE_SEIZE, t, nullptr, nullptr) != 0) {
    why = std::string("PTRACE_SEIZE failed: ") + std::strerror(errno);
    return std::nullopt;
  }
  std::optional<uint64_t> out;
  if (ptrace(PTRACE_INTERRUPT, t, nullptr, nullptr) == 0) {
    int st = 0;
    if (waitpid(t, &st, __WALL) == t && WIFSTOPPED(st)) {
      struct user_regs_struct regs;
      if (ptrace(PTRACE_GETREGS, t, nullptr, &regs) == 0) out = regs.fs_base;
      else why = std::string("PTRACE_GETREGS failed: ") + std::strerror(errno);
    } else {
      why = "the thread did not stop";
    }
  } else {
    why = std::string("PTRACE_INTERRUPT failed: ") + std::strerror(errno);
  }
  ptrace(PTRACE_DETACH, t, nullptr, nullptr);
  return out;
}

uint64_t py_tstate_via_tss(const PyProcess& p, uint64_t fsbase) {
  if (fsbase == 0 || p.tss_key >= kGlibcSpecificFastKeys) return 0;
  Mem mem(p.pid);
  return mem.ptr(fsbase + kGlibcSpecificOffset + 16ull * p.tss_key + 8);
}

std::vector<uint64_t> py_thread_states(const PyProcess& p, size_t max, std::string& why) {
  std::vector<uint64_t> out;
  Mem mem(p.pid);
  if (!mem.ok()) {
    why = "cannot open /proc/PID/mem";
    return out;
  }
  const uint64_t head = mem.ptr(p.runtime_addr + p.off.runtime_interp_head);
  uint64_t ts = head ? mem.ptr(head + p.off.interp_threads_head) : 0;
  if (ts == 0) {
    why = "cannot read the interpreter's thread list";
    return out;
  }
  while (ts != 0 && out.size() < max) {
    out.push_back(ts);
    ts = mem.ptr(ts + p.off.tstate_next);
  }
  return out;
}

std::vector<StackFrame> py_walk_tstate(const PyProcess& p, uint64_t tstate, size_t max_frames, bool& truncated,
                                       std::string& why) {
  truncated = false;
  std::vector<StackFrame> out;
  Mem mem(p.pid);
  if (!mem.ok()) {
    why = "cannot open /proc/PID/mem";
    return out;
  }
  const PyOffsets& o = p.off;
  uint64_t frame = mem.ptr(tstate + o.tstate_frame);
  if (o.cframe_current_frame >= 0) frame = frame ? mem.ptr(frame + static_cast<uint32_t>(o.cframe_current_frame)) : 0;
  size_t visited = 0;
  while (frame != 0) {
    if (out.size() >= max_frames || ++visited > 4 * max_frames) {
      truncated = true;
      break;
    }
    const uint64_t code = mem.ptr(frame + o.frame_code);
    const uint64_t back = mem.ptr(frame + o.frame_back);
    bool skip = false;
    if (o.frame_owner >= 0) {
      uint8_t owner = 0;
      if (mem.get(frame + static_cast<uint32_t>(o.frame_owner), owner) && owner == kFrameOwnedByCStack) skip = true;
    }
    if (!skip && p.code_type_addr != 0 && (code == 0 || mem.ptr(code + kObTypeOffset) != p.code_type_addr))
      skip = true;  // not a code object (3.13 entry frame: Py_None)
    if (!skip) {
      uint8_t hdr[256];
      const size_t need = std::max(
                              {o.code_filename, o.code_name, o.code_qualname, o.code_linetable, o.code_firstlineno}) +
                          8u;
      if (need > sizeof hdr || !mem.read(code, hdr, need)) {
        why = "cannot read a code object";
        break;
      }
      auto ptr_at = [&](uint32_t at) {
        uint64_t v;
        std::memcpy(&v, hdr + at, 8);
        return v;
      };
      int32_t first = 0;
      std::memcpy(&first, hdr + o.code_firstlineno, 4);
      StackFrame f;
      f.kind = FrameKind::kPython;
      f.file = read_str(mem, o, ptr_at(o.code_filename));
      f.function = read_str(mem, o, ptr_at(o.code_qualname ? o.code_qualname : o.code_name));
      uint64_t instr = 0;
      if (p.minor == 10) {
        int32_t lasti = 0;
        mem.get(frame + o.frame_instr, lasti);
        instr = static_cast<uint32_t>(lasti);
      } else {
        instr = mem.ptr(frame + o.frame_instr);
      }
      const uint32_t lb = py_lasti_bytes(p.minor, code, instr, o);
      uint32_t line = 0;
      if (lb != UINT32_MAX) {
        const uint64_t lt = ptr_at(o.code_linetable);
        int64_t size = 0;
        if (lt != 0 && mem.get(lt + o.bytes_size, size) && size >= 0 && static_cast<size_t>(size) <= kMaxLineTable) {
          std::vector<uint8_t> table(static_cast<size_t>(size));
          if (table.empty() || mem.read(lt + o.bytes_data, table.data(), table.size()))
            line = python_line(p.minor, table, first, lb);
        }
      }
      // A frame that has not started executing reports its def line, as CPython does.
      f.line = lb == UINT32_MAX ? (first > 0 ? static_cast<uint32_t>(first) : 0) : line;
      out.push_back(std::move(f));
    }
    frame = back;
  }
  return out;
}

std::vector<StackFrame> py_walk_thread(const PyProcess& p, uint32_t tid, std::string& why) {
  uint64_t tstate = 0;
  if (p.minor >= 11) {
    std::string w;
    Mem mem(p.pid);
    for (uint64_t ts : py_thread_states(p, 4096, w)) {
      uint64_t ntid = 0;
      if (mem.get(ts + p.off.tstate_native_thread_id, ntid) && ntid == tid) {
        tstate = ts;
        break;
      }
    }
  }
  if (tstate == 0) {
    std::string w;
    const auto fs = thread_fsbase(p.pid, tid, w);
    if (!fs) {
      why = "no thread state found for tid " + std::to_string(tid) + " (" + w + ")";
      return {};
    }
    tstate = py_tstate_via_tss(p, *fs);
    if (tstate == 0) {
      why = "thread " + std::to_string(tid) + " has no Python thread state";
      return {};
    }
  }
  bool truncated = false;
  return py_walk_tstate(p, tstate, 256, truncated, why);
}

}  // namespace ingero::bpf

namespace ingero::bpf {
namespace {

// What an interpreter's ELF file says about itself, read from the file alone (no process).
struct ElfFileInfo {
  ElfSyms syms;
  std::string needed_libpython;  // DT_NEEDED libpython3.X.so...
  std::string runpath;           // DT_RUNPATH, else DT_RPATH
  uint64_t bytes_main_got = 0;   // r_offset of the relocation the executable calls Py_BytesMain through
};

bool elf_file_info(int fd, ElfFileInfo& out) {
  if (!elf_syms(fd, out.syms)) return false;
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (elf == nullptr) return false;
  std::string rpath;
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || sh.sh_entsize == 0) continue;
    const size_t n = sh.sh_size / sh.sh_entsize;
    if (sh.sh_type == SHT_DYNAMIC) {
      for (size_t i = 0; i < n; ++i) {
        GElf_Dyn d;
        if (gelf_getdyn(data, static_cast<int>(i), &d) == nullptr) continue;
        if (d.d_tag != DT_NEEDED && d.d_tag != DT_RUNPATH && d.d_tag != DT_RPATH) continue;
        const char* s = elf_strptr(elf, sh.sh_link, d.d_un.d_val);
        if (s == nullptr) continue;
        if (d.d_tag == DT_NEEDED && std::strncmp(s, "libpython3.", 11) == 0) out.needed_libpython = s;
        if (d.d_tag == DT_RUNPATH) out.runpath = s;
        if (d.d_tag == DT_RPATH) rpath = s;
      }
    } else if (sh.sh_type == SHT_RELA && out.bytes_main_got == 0) {
      Elf_Scn* symscn = elf_getscn(elf, sh.sh_link);
      GElf_Shdr symsh;
      if (symscn == nullptr || gelf_getshdr(symscn, &symsh) == nullptr) continue;
      Elf_Data* symdata = elf_getdata(symscn, nullptr);
      if (symdata == nullptr) continue;
      for (size_t i = 0; i < n; ++i) {
        GElf_Rela r;
        GElf_Sym sym;
        if (gelf_getrela(data, static_cast<int>(i), &r) == nullptr) continue;
        const auto idx = static_cast<int>(GELF_R_SYM(r.r_info));
        if (idx == 0 || gelf_getsym(symdata, idx, &sym) == nullptr) continue;
        const char* name = elf_strptr(elf, symsh.sh_link, sym.st_name);
        if (name != nullptr && std::strcmp(name, "Py_BytesMain") == 0) {
          out.bytes_main_got = r.r_offset;
          break;
        }
      }
    }
  }
  if (out.runpath.empty()) out.runpath = rpath;
  elf_end(elf);
  return true;
}

// Bytes of the file at an ELF vaddr (initialised data only).
bool file_read_vaddr(int fd, const std::vector<GElf_Phdr>& loads, uint64_t vaddr, void* out, size_t n) {
  for (const GElf_Phdr& ph : loads)
    if (vaddr >= ph.p_vaddr && vaddr + n <= ph.p_vaddr + ph.p_filesz)
      return pread(fd, out, n, static_cast<off_t>(ph.p_offset + vaddr - ph.p_vaddr)) == static_cast<ssize_t>(n);
  return false;
}

std::string dir_name(const std::string& p) {
  const size_t s = p.rfind('/');
  return s == std::string::npos ? std::string(".") : p.substr(0, s);
}

}  // namespace

std::optional<PyBinary> inspect_python_binary(const std::string& exe, const std::string& libpython_hint,
                                              std::string& why) {
  struct stat st {};
  if (stat(exe.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "cannot stat " + exe;
    return std::nullopt;
  }
  bool ft = false;
  if (minor_from_name(base_name(exe), ft) >= 0 && ft) {
    why = "free-threaded CPython build (" + base_name(exe) + ") is not supported";
    return std::nullopt;
  }
  const int efd = open(exe.c_str(), O_RDONLY | O_CLOEXEC);
  if (efd < 0) {
    why = "cannot open " + exe;
    return std::nullopt;
  }
  ElfFileInfo ex;
  const bool ex_ok = elf_file_info(efd, ex);
  close(efd);
  if (!ex_ok) {
    why = exe + " is not an ELF file";
    return std::nullopt;
  }
  PyBinary b;
  b.exe = exe;
  b.ino = st.st_ino;
  b.size = static_cast<uint64_t>(st.st_size);
  bool have_text = false;
  for (const GElf_Phdr& ph : ex.syms.loads)
    if ((ph.p_flags & PF_X) != 0 && (!have_text || ph.p_vaddr < b.text_vaddr)) {
      b.text_vaddr = ph.p_vaddr;
      have_text = true;
    }
  if (!have_text) {
    why = exe + " has no executable segment";
    return std::nullopt;
  }
  ElfSyms mod;  // the ELF holding _PyRuntime
  if (ex.syms.have_runtime) {
    b.module = exe;
    mod = ex.syms;
    b.runtime_off = static_cast<int64_t>(ex.syms.runtime);
  } else {
    if (ex.bytes_main_got == 0 || (libpython_hint.empty() && ex.needed_libpython.empty())) {
      why = "not a CPython executable (no _PyRuntime, no libpython through Py_BytesMain)";
      return std::nullopt;
    }
    std::vector<std::string> tries;
    if (!libpython_hint.empty()) tries.push_back(libpython_hint);
    if (!ex.needed_libpython.empty()) {
      std::string rp = ex.runpath;
      for (size_t at; (at = rp.find("$ORIGIN")) != std::string::npos;) rp.replace(at, 7, dir_name(exe));
      for (size_t b0 = 0; b0 <= rp.size() && !rp.empty();) {
        const size_t e = rp.find(':', b0);
        const std::string d = rp.substr(b0, e == std::string::npos ? std::string::npos : e - b0);
        if (!d.empty()) tries.push_back(d + "/" + ex.needed_libpython);
        if (e == std::string::npos) break;
        b0 = e + 1;
      }
      tries.push_back(dir_name(exe) + "/../lib/" + ex.needed_libpython);
      for (const char* d : {"/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib"})
        tries.push_back(std::string(d) + "/" + ex.needed_libpython);
    }
    for (const std::string& lib : tries) {
      const int lfd = open(lib.c_str(), O_RDONLY | O_CLOEXEC);
      if (lfd < 0) continue;
      ElfSyms ls;
      const bool ok = elf_syms(lfd, ls);
      close(lfd);
      if (!ok || !ls.have_runtime || !ls.have_bytes_main) continue;
      b.module = lib;
      mod = ls;
      break;
    }
    if (b.module.empty()) {
      why = "libpython of " + exe + " not found (" + ex.needed_libpython + ")";
      return std::nullopt;
    }
    if (minor_from_name(base_name(b.module), ft) >= 0 && ft) {
      why = "free-threaded CPython build (" + base_name(b.module) + ") is not supported";
      return std::nullopt;
    }
    b.got_vaddr = ex.bytes_main_got;
    b.runtime_off = static_cast<int64_t>(mod.runtime) - static_cast<int64_t>(mod.bytes_main);
  }
  const int mfd = open(b.module.c_str(), O_RDONLY | O_CLOEXEC);
  if (mfd < 0) {
    why = "cannot open " + b.module;
    return std::nullopt;
  }
  int minor = -1;
  if (mod.have_version) {
    uint32_t v = 0;
    if (!file_read_vaddr(mfd, mod.loads, mod.py_version, &v, sizeof v) || (v >> 24) != 3) {
      close(mfd);
      why = "cannot read Py_Version from " + b.module;
      return std::nullopt;
    }
    minor = static_cast<int>((v >> 16) & 0xff);
    b.version = "3." + std::to_string(minor) + "." + std::to_string((v >> 8) & 0xff);
  } else {
    minor = minor_from_name(base_name(b.module), ft);
    if (minor < 0) minor = minor_from_name(base_name(exe), ft);
    if (minor >= 11) minor = -1;  // 3.11+ always has Py_Version
    b.version = minor >= 0 ? "3." + std::to_string(minor) : "";
  }
  const PyOffsets* off = py_offsets_for(minor);
  if (off == nullptr) {
    close(mfd);
    why = minor < 0 ? "cannot tell the CPython version of " + b.module
                    : "CPython 3." + std::to_string(minor) + " is not supported (3.10-3.13)";
    return std::nullopt;
  }
  if (minor >= 13) {
    uint8_t dbg[352];
    const bool ok = file_read_vaddr(mfd, mod.loads, mod.runtime, dbg, sizeof dbg);
    if (!ok || std::memcmp(dbg, "xdebugpy", 8) != 0) {
      close(mfd);
      why = "_Py_DebugOffsets cookie missing in " + b.module;
      return std::nullopt;
    }
    uint64_t free_threaded = 0;
    std::memcpy(&free_threaded, dbg + 16, 8);
    if (free_threaded != 0 || !debug_offsets_match(dbg, *off, why)) {
      close(mfd);
      if (free_threaded != 0) why = "free-threaded CPython build is not supported";
      return std::nullopt;
    }
  }
  close(mfd);
  b.minor = minor;
  b.off = *off;
  return b;
}

std::vector<std::string> python_interpreter_candidates() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    const std::string p = path;
    for (size_t b = 0;;) {
      const size_t e = p.find(':', b);
      const std::string d = p.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if (!d.empty() && d[0] == '/') dirs.push_back(d);
      if (e == std::string::npos) break;
      b = e + 1;
    }
  }
  for (const char* d : {"/usr/bin", "/usr/local/bin", "/opt/conda/bin"}) dirs.emplace_back(d);
  std::vector<std::string> roots;
  if (const char* r = std::getenv("PYENV_ROOT")) roots.emplace_back(r);
  if (const char* h = std::getenv("HOME")) roots.push_back(std::string(h) + "/.pyenv");
  roots.emplace_back("/root/.pyenv");
  for (const std::string& r : roots) {
    std::error_code ec;
    for (const auto& v : std::filesystem::directory_iterator(r + "/versions", ec))
      dirs.push_back(v.path().string() + "/bin");
  }
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& d : dirs) {
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(d, ec)) {
      const std::string n = f.path().filename().string();
      // python3 and python3.N only (not python3-config, python3.12-gdb.py, ...).
      bool ok = n == "python3";
      if (!ok && n.rfind("python3.", 0) == 0 && n.size() > 8) {
        ok = true;
        for (size_t i = 8; i < n.size(); ++i) ok = ok && n[i] >= '0' && n[i] <= '9';
      }
      if (!ok) continue;
      std::error_code ec2;
      const auto real = std::filesystem::canonical(f.path(), ec2);
      if (ec2 || !std::filesystem::is_regular_file(real, ec2)) continue;
      if (seen.insert(real.string()).second) out.push_back(real.string());
    }
  }
  return out;
}

}  // namespace ingero::bpf
