// Symbolizer implementation: /proc/PID/maps snapshots, a build-id keyed cache of open ELF files
// with sorted symbol tables (libelf), source lines from DWARF (libdwfl, offline, lazily) and
// /proc/kallsyms for kernel addresses. See symbolizer.h for the contract.
#include "bpf/symbolizer.h"

#include <cxxabi.h>
#include <elfutils/libdwelf.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>

namespace ingero::bpf {

std::string demangle(const char* name) {
  if (name == nullptr) return {};
  if (name[0] != '_' || name[1] != 'Z') return name;
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) {
    std::free(out);
    return name;
  }
  std::string s(out);
  std::free(out);
  return s;
}

namespace {

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

std::string basename_of(const std::string& path) {
  std::string p = path;
  const std::string deleted = " (deleted)";
  if (p.size() > deleted.size() && p.compare(p.size() - deleted.size(), deleted.size(), deleted) == 0)
    p.resize(p.size() - deleted.size());
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}

struct Symbol {
  uint64_t addr, size;
  const char* name;  // mangled, in the ELF's string table (valid while the Elf stays open)
  int rank;          // lower is preferred among aliases at one address
};

struct Segment {  // a PT_LOAD
  uint64_t vaddr, offset, filesz, memsz;
};

struct Resolved {
  std::string function, file;
  uint64_t offset = 0;
  uint32_t line = 0;
  bool found = false;
};

// One ELF file, kept open for the life of the cache entry.
struct ElfFile {
  int fd = -1;
  Elf* elf = nullptr;
  std::string path;      // a path it was opened from (for messages and debuglink lookup)
  std::string module;    // basename
  std::string build_id;  // hex, "" when absent
  std::vector<Segment> loads;
  uint64_t first_load_vaddr = 0;
  bool syms_loaded = false;
  std::vector<Symbol> syms;  // sorted by addr
  int debug_fd = -1;         // a separate debug file's symbols (kept open: syms point into it)
  Elf* debug_elf = nullptr;
  bool dwarf_tried = false;
  Dwfl* dwfl = nullptr;  // offline, for source lines; null when no DWARF
  Dwfl_Module* dwmod = nullptr;
  std::unordered_map<uint64_t, Resolved> memo;  // vaddr -> result (bounded)
  uint64_t last_used = 0;

  ~ElfFile() {
    if (dwfl) dwfl_end(dwfl);
    if (debug_elf) elf_end(debug_elf);
    if (debug_fd >= 0) close(debug_fd);
    if (elf) elf_end(elf);
    if (fd >= 0) close(fd);
  }

  // Process address -> ELF vaddr, given the mapping's start and file offset.
  bool file_off_to_vaddr(uint64_t file_off, uint64_t& vaddr) const {
    for (const Segment& s : loads) {
      if (file_off >= s.offset && file_off < s.offset + std::max(s.filesz, s.memsz)) {
        vaddr = s.vaddr + (file_off - s.offset);
        return true;
      }
    }
    return false;
  }
};

void add_symbols(Elf* elf, std::vector<Symbol>& out) {
  for_each_elf_symbol(elf, [&](const char* name, uint64_t value, uint64_t size, unsigned char info) {
    const int type = GELF_ST_TYPE(info);
    if (type != STT_FUNC && type != STT_GNU_IFUNC) return;
    if (value == 0 || name[0] == '\0') return;
    const int bind = GELF_ST_BIND(info);
    // Prefer global names, then weak, then local; among those, names without a leading '_'.
    int rank = bind == STB_GLOBAL ? 0 : bind == STB_WEAK ? 2 : 4;
    if (name[0] == '_') rank += 1;
    out.push_back(Symbol{value, size, name, rank});
  });
}

void load_symbols(ElfFile& f) {
  if (f.syms_loaded) return;
  f.syms_loaded = true;
  add_symbols(f.elf, f.syms);
  // A separate debug file by build-id (Debian's *-dbgsym packages) adds .symtab when stripped.
  if (f.build_id.size() > 2) {
    const std::string dbg = "/usr/lib/debug/.build-id/" + f.build_id.substr(0, 2) + "/" + f.build_id.substr(2) +
                            ".debug";
    const int dfd = open(dbg.c_str(), O_RDONLY | O_CLOEXEC);
    if (dfd >= 0) {
      if (Elf* de = elf_begin(dfd, ELF_C_READ_MMAP, nullptr)) {
        add_symbols(de, f.syms);
        f.debug_elf = de;
        f.debug_fd = dfd;
      } else {
        close(dfd);
      }
    }
  }
  std::sort(f.syms.begin(), f.syms.end(), [](const Symbol& a, const Symbol& b) {
    if (a.addr != b.addr) return a.addr < b.addr;
    if (a.rank != b.rank) return a.rank < b.rank;
    return std::strcmp(a.name, b.name) < 0;
  });
  // One entry per address (the preferred alias), keeping the largest size seen.
  std::vector<Symbol> uniq;
  uniq.reserve(f.syms.size());
  for (Symbol& s : f.syms) {
    if (!uniq.empty() && uniq.back().addr == s.addr) {
      uniq.back().size = std::max(uniq.back().size, s.size);
      continue;
    }
    uniq.push_back(s);
  }
  f.syms.swap(uniq);
}

const Symbol* find_symbol(const ElfFile& f, uint64_t vaddr) {
  auto it = std::upper_bound(f.syms.begin(), f.syms.end(), vaddr,
                             [](uint64_t v, const Symbol& s) { return v < s.addr; });
  // Walk back over a few candidates: a small symbol can sit inside a bigger one's range.
  for (int k = 0; k < 4 && it != f.syms.begin(); ++k) {
    --it;
    if (vaddr < it->addr + std::max<uint64_t>(it->size, 1)) return &*it;
    if (it->size == 0 && k == 0) {
      // Size unknown (hand-written assembly): accept up to the next symbol.
      return &*it;
    }
  }
  return nullptr;
}

void ensure_dwarf(ElfFile& f) {
  if (f.dwarf_tried) return;
  f.dwarf_tried = true;
  static const Dwfl_Callbacks cb = {local_find_elf, local_find_debuginfo, dwfl_offline_section_address, nullptr};
  Dwfl* d = dwfl_begin(&cb);
  if (d == nullptr) return;
  const int fd = dup(f.fd);
  Dwfl_Module* m = fd >= 0 ? dwfl_report_offline(d, f.module.c_str(), f.path.c_str(), fd) : nullptr;
  if (m == nullptr) {
    if (fd >= 0 && m == nullptr) close(fd);
    dwfl_end(d);
    return;
  }
  dwfl_report_end(d, nullptr, nullptr);
  Dwarf_Addr bias = 0;
  if (dwfl_module_getdwarf(m, &bias) == nullptr) {  // no DWARF: symbols only
    dwfl_end(d);
    return;
  }
  f.dwfl = d;
  f.dwmod = m;
}

Resolved resolve(ElfFile& f, uint64_t vaddr) {
  if (auto it = f.memo.find(vaddr); it != f.memo.end()) return it->second;
  load_symbols(f);
  Resolved r;
  if (const Symbol* s = find_symbol(f, vaddr)) {
    r.function = demangle(s->name);          // lazily: only symbols that appear in a stack
    const size_t at = r.function.find('@');  // "name@VERSION" from some toolchains
    if (at != std::string::npos && at > 0) r.function.resize(at);
    r.offset = vaddr - s->addr;
    r.found = true;
  }
  ensure_dwarf(f);
  if (f.dwmod != nullptr) {
    Dwarf_Addr bias = 0;
    dwfl_module_getelf(f.dwmod, &bias);
    if (Dwfl_Line* l = dwfl_module_getsrc(f.dwmod, vaddr + bias)) {
      int line = 0;
      const char* src = dwfl_lineinfo(l, nullptr, &line, nullptr, nullptr, nullptr);
      if (src != nullptr && line > 0) {
        r.file = src;
        r.line = static_cast<uint32_t>(line);
      }
    }
  }
  if (f.memo.size() > 65536) f.memo.clear();
  f.memo.emplace(vaddr, r);
  return r;
}

struct ProcSnapshot {
  std::vector<MapEntry> maps;                  // sorted by start
  std::vector<std::shared_ptr<ElfFile>> elfs;  // parallel to maps; null when not an ELF we keep
  std::vector<LoadedModule> modules;
  uint64_t generation = 0;
  uint64_t last_miss_reread_ns = 0;  // rate limit of re-reads caused by unknown addresses
};

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// At most one re-read of a pid's maps per this interval because of an unknown address (garbage
// addresses from a failed walk must not turn into a maps read per stack).
constexpr uint64_t kMissRereadIntervalNs = 100'000'000;

bool parse_maps(uint32_t pid, std::vector<MapEntry>& out) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/maps", pid);
  FILE* fp = std::fopen(path, "re");
  if (fp == nullptr) return false;
  char line[4096 + 256];
  while (std::fgets(line, sizeof line, fp) != nullptr) {
    unsigned long long start = 0, end = 0, off = 0, ino = 0;
    unsigned maj = 0, min = 0;
    char perms[8] = {0};
    int consumed = 0;
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &off, &maj, &min, &ino, &consumed) <
        7)
      continue;
    MapEntry e;
    e.start = start;
    e.end = end;
    e.offset = off;
    e.exec = perms[2] == 'x';
    e.dev = (static_cast<uint64_t>(maj) << 32) | min;
    e.ino = ino;
    std::string p = line + consumed;
    while (!p.empty() && (p.back() == '\n' || p.back() == ' ')) p.pop_back();
    e.path = std::move(p);
    out.push_back(std::move(e));
  }
  std::fclose(fp);
  std::sort(out.begin(), out.end(), [](const MapEntry& a, const MapEntry& b) { return a.start < b.start; });
  return true;
}

}  // namespace

struct Symbolizer::Impl {
  std::map<std::string, std::shared_ptr<ElfFile>> elf_cache;  // by build-id or path|size|mtime
  std::unordered_map<uint32_t, ProcSnapshot> procs;
  uint64_t tick = 0, generation = 0;
  Stats stats;
  // kallsyms
  bool kallsyms_loaded = false;
  struct KSym {
    uint64_t addr;
    std::string name, module;
  };
  std::vector<KSym> ksyms;

  Impl() { elf_version(EV_CURRENT); }

  std::shared_ptr<ElfFile> open_elf(uint32_t pid, const MapEntry& m) {
    int fd = -1;
    char p[128];
    std::snprintf(p, sizeof p, "/proc/%u/map_files/%llx-%llx", pid, static_cast<unsigned long long>(m.start),
                  static_cast<unsigned long long>(m.end));
    fd = open(p, O_RDONLY | O_CLOEXEC);
    std::string clean = m.path;
    const std::string deleted = " (deleted)";
    if (clean.size() > deleted.size() && clean.compare(clean.size() - deleted.size(), deleted.size(), deleted) == 0)
      clean.resize(clean.size() - deleted.size());
    if (fd < 0) {
      const std::string viaroot = "/proc/" + std::to_string(pid) + "/root" + clean;
      fd = open(viaroot.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) fd = open(clean.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    return adopt_elf(fd, clean, basename_of(clean));
  }

  // Takes ownership of fd: the cached ElfFile for its content, or null when it is not an ELF.
  std::shared_ptr<ElfFile> adopt_elf(int fd, const std::string& clean, const std::string& module) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return nullptr;
    }
    Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
    if (elf == nullptr || elf_kind(elf) != ELF_K_ELF) {
      if (elf) elf_end(elf);
      close(fd);
      return nullptr;
    }
    std::string key;
    const void* bid = nullptr;
    const ssize_t n = dwelf_elf_gnu_build_id(elf, &bid);
    std::string build_id;
    if (n > 0 && bid != nullptr) build_id = hex(static_cast<const uint8_t*>(bid), static_cast<size_t>(n));
    key = !build_id.empty() ? "b:" + build_id
                            : "p:" + clean + "|" + std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec);
    if (auto it = elf_cache.find(key); it != elf_cache.end()) {
      elf_end(elf);
      close(fd);
      ++stats.cache_hits;
      it->second->last_used = ++tick;
      return it->second;
    }
    auto f = std::make_shared<ElfFile>();
    f->fd = fd;
    f->elf = elf;
    f->path = clean;
    f->module = module;
    f->build_id = build_id;
    size_t phnum = 0;
    if (elf_getphdrnum(elf, &phnum) == 0) {
      bool first = true;
      for (size_t i = 0; i < phnum; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr || ph.p_type != PT_LOAD) continue;
        f->loads.push_back(Segment{ph.p_vaddr, ph.p_offset, ph.p_filesz, ph.p_memsz});
        if (first) {
          f->first_load_vaddr = ph.p_vaddr;
          first = false;
        }
      }
    }
    f->last_used = ++tick;
    ++stats.elf_opened;
    elf_cache.emplace(key, f);
    evict();
    return f;
  }

  // The vDSO has no file: every process on this kernel maps the same image, so ours (copied into
  // a memfd once) stands for all of them. Samples taken in clock_gettime & co. then resolve and
  // unwind through it.
  std::shared_ptr<ElfFile> vdso;
  bool vdso_tried = false;
  std::shared_ptr<ElfFile> vdso_elf() {
    if (vdso_tried) return vdso;
    vdso_tried = true;
    const uint64_t base = getauxval(AT_SYSINFO_EHDR);
    if (base == 0) return nullptr;
    std::vector<MapEntry> self;
    if (!parse_maps(static_cast<uint32_t>(getpid()), self)) return nullptr;
    for (const MapEntry& m : self) {
      if (m.path != "[vdso]" || base < m.start || base >= m.end) continue;
      const int fd = memfd_create("ingero-vdso", MFD_CLOEXEC);
      if (fd < 0) return nullptr;
      const size_t n = m.end - base;
      if (write(fd, reinterpret_cast<const void*>(base), n) != static_cast<ssize_t>(n)) {
        close(fd);
        return nullptr;
      }
      vdso = adopt_elf(fd, "[vdso]", "[vdso]");
      break;
    }
    return vdso;
  }

  void evict() {
    while (elf_cache.size() > kMaxElfs) {
      auto victim = elf_cache.end();
      for (auto it = elf_cache.begin(); it != elf_cache.end(); ++it) {
        if (it->second.use_count() > 1) continue;  // still mapped by a known pid
        if (victim == elf_cache.end() || it->second->last_used < victim->second->last_used) victim = it;
      }
      if (victim == elf_cache.end()) return;
      elf_cache.erase(victim);
      ++stats.elf_evicted;
    }
  }

  bool snapshot(uint32_t pid) {
    std::vector<MapEntry> maps;
    if (!parse_maps(pid, maps)) return false;
    ProcSnapshot snap;
    // Files that have an executable mapping: those are the ELFs we keep (code, CFI, symbols).
    std::set<std::pair<uint64_t, uint64_t>> exec_files;
    for (const MapEntry& m : maps)
      if (m.exec && m.ino != 0 && !m.path.empty() && m.path[0] == '/') exec_files.insert({m.dev, m.ino});
    std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<ElfFile>> by_file;
    // A re-read keeps the files it already has open (same device and inode): only new ones open.
    if (auto old = procs.find(pid); old != procs.end()) {
      for (size_t i = 0; i < old->second.maps.size(); ++i)
        if (old->second.elfs[i] && old->second.maps[i].ino != 0)
          by_file.emplace(std::make_pair(old->second.maps[i].dev, old->second.maps[i].ino), old->second.elfs[i]);
      snap.last_miss_reread_ns = old->second.last_miss_reread_ns;
    }
    snap.elfs.resize(maps.size());
    for (size_t i = 0; i < maps.size(); ++i) {
      const MapEntry& m = maps[i];
      if (m.path == "[vdso]") {
        snap.elfs[i] = vdso_elf();
        continue;
      }
      const auto key = std::make_pair(m.dev, m.ino);
      if (!exec_files.count(key)) continue;
      auto it = by_file.find(key);
      if (it == by_file.end()) it = by_file.emplace(key, open_elf(pid, m)).first;
      snap.elfs[i] = it->second;
    }
    // Modules: one per file, bias from the mapping at the lowest address.
    std::map<ElfFile*, size_t> mod_index;
    for (size_t i = 0; i < maps.size(); ++i) {
      ElfFile* f = snap.elfs[i].get();
      if (f == nullptr) continue;
      const MapEntry& m = maps[i];
      auto it = mod_index.find(f);
      if (it == mod_index.end()) {
        uint64_t bias = 0;
        bool have_bias = false;
        for (const Segment& s : f->loads) {
          const uint64_t seg_page_off = s.offset & ~uint64_t{0xfff};
          if (m.offset >= seg_page_off && m.offset < s.offset + std::max<uint64_t>(s.filesz, 1)) {
            bias = m.start - m.offset + s.offset - s.vaddr;
            have_bias = true;
            break;
          }
        }
        if (!have_bias) continue;
        GElf_Ehdr eh;
        if (gelf_getehdr(f->elf, &eh) != nullptr && eh.e_type == ET_EXEC) bias = 0;
        LoadedModule lm;
        lm.path = f->path;
        lm.fd = f->fd;
        lm.bias = bias;
        lm.lo = m.start;
        lm.hi = m.end;
        mod_index.emplace(f, snap.modules.size());
        snap.modules.push_back(std::move(lm));
      } else {
        LoadedModule& lm = snap.modules[it->second];
        lm.lo = std::min(lm.lo, m.start);
        lm.hi = std::max(lm.hi, m.end);
      }
    }
    snap.maps = std::move(maps);
    snap.generation = ++generation;
    procs[pid] = std::move(snap);
    evict();
    return true;
  }

  ProcSnapshot* get(uint32_t pid, bool note_if_missing) {
    auto it = procs.find(pid);
    if (it != procs.end()) return &it->second;
    if (!note_if_missing || !snapshot(pid)) return nullptr;
    return &procs[pid];
  }

  // Re-reads the maps of a pid after an address missed, unless one such re-read happened in the
  // last kMissRereadIntervalNs. True when the snapshot was re-read.
  bool reread_on_miss(uint32_t pid) {
    auto it = procs.find(pid);
    const uint64_t now = now_ns();
    if (it != procs.end() && now - it->second.last_miss_reread_ns < kMissRereadIntervalNs) return false;
    if (!snapshot(pid)) return false;
    procs[pid].last_miss_reread_ns = now;
    ++stats.maps_rereads;
    return true;
  }

  static long find_map(const ProcSnapshot& s, uint64_t addr) {
    auto it = std::upper_bound(s.maps.begin(), s.maps.end(), addr,
                               [](uint64_t a, const MapEntry& m) { return a < m.start; });
    if (it == s.maps.begin()) return -1;
    --it;
    if (addr >= it->end) return -1;
    return it - s.maps.begin();
  }

  void load_kallsyms() {
    if (kallsyms_loaded) return;
    kallsyms_loaded = true;
    std::ifstream in("/proc/kallsyms");
    std::string line;
    while (std::getline(in, line)) {
      // "ffffffff81000000 T _stext" or "... t name\t[module]"
      const size_t sp1 = line.find(' ');
      if (sp1 == std::string::npos || sp1 + 3 > line.size()) continue;
      const char type = line[sp1 + 1];
      if (type != 't' && type != 'T' && type != 'w' && type != 'W') continue;
      const uint64_t addr = std::strtoull(line.substr(0, sp1).c_str(), nullptr, 16);
      if (addr == 0) continue;
      std::string rest = line.substr(sp1 + 3);
      std::string module;
      const size_t tab = rest.find('\t');
      if (tab != std::string::npos) {
        module = rest.substr(tab + 1);
        rest.resize(tab);
        if (module.size() >= 2 && module.front() == '[' && module.back() == ']')
          module = module.substr(1, module.size() - 2);
      }
      ksyms.push_back(KSym{addr, std::move(rest), std::move(module)});
    }
    std::sort(ksyms.begin(), ksyms.end(), [](const KSym& a, const KSym& b) { return a.addr < b.addr; });
  }
};

Symbolizer::Symbolizer() : impl_(std::make_unique<Impl>()) {}
Symbolizer::~Symbolizer() = default;

bool Symbolizer::note_process(uint32_t pid) { return impl_->snapshot(pid); }

void Symbolizer::forget_process(uint32_t pid) {
  impl_->procs.erase(pid);
  impl_->evict();
}

const std::vector<MapEntry>* Symbolizer::maps(uint32_t pid) {
  ProcSnapshot* s = impl_->get(pid, true);
  return s ? &s->maps : nullptr;
}

const std::vector<LoadedModule>* Symbolizer::modules(uint32_t pid, uint64_t* generation) {
  ProcSnapshot* s = impl_->get(pid, true);
  if (s == nullptr) return nullptr;
  if (generation) *generation = s->generation;
  return &s->modules;
}

bool Symbolizer::read_mapped(uint32_t pid, uint64_t addr, void* out, size_t len) {
  ProcSnapshot* s = impl_->get(pid, false);
  if (s == nullptr) return false;
  const long i = Impl::find_map(*s, addr);
  if (i < 0 || !s->elfs[static_cast<size_t>(i)]) return false;
  const MapEntry& m = s->maps[static_cast<size_t>(i)];
  if (addr + len > m.end) return false;
  const uint64_t off = addr - m.start + m.offset;
  const ssize_t r = pread(s->elfs[static_cast<size_t>(i)]->fd, out, len, static_cast<off_t>(off));
  return r == static_cast<ssize_t>(len);
}

bool Symbolizer::ensure_mapped(uint32_t pid, uint64_t addr) {
  ProcSnapshot* s = impl_->get(pid, true);
  if (s != nullptr && Impl::find_map(*s, addr) >= 0) return true;
  if (!impl_->reread_on_miss(pid)) return false;
  return Impl::find_map(impl_->procs[pid], addr) >= 0;
}

std::string Symbolizer::build_id_at(uint32_t pid, uint64_t addr) {
  ProcSnapshot* s = impl_->get(pid, true);
  if (s == nullptr) return {};
  const long i = Impl::find_map(*s, addr);
  if (i < 0 || !s->elfs[static_cast<size_t>(i)]) return {};
  return s->elfs[static_cast<size_t>(i)]->build_id;
}

std::vector<StackFrame> Symbolizer::symbolize_user(uint32_t pid, std::span<const uint64_t> ips, bool first_is_exact) {
  std::vector<StackFrame> out(ips.size());
  ProcSnapshot* s = impl_->get(pid, true);
  bool reread = false;
  for (size_t k = 0; k < ips.size(); ++k) {
    StackFrame& fr = out[k];
    fr.kind = FrameKind::kNative;
    fr.ip = ips[k];
    const uint64_t look = (k == 0 && first_is_exact) || ips[k] == 0 ? ips[k] : ips[k] - 1;
    long i = s ? Impl::find_map(*s, look) : -1;
    if (i < 0 && !reread) {  // unknown address: maybe dlopen()ed after the snapshot
      reread = true;
      if (impl_->reread_on_miss(pid)) {
        s = &impl_->procs[pid];
        i = Impl::find_map(*s, look);
      }
    }
    if (i < 0) {
      ++impl_->stats.unresolved;
      continue;
    }
    const MapEntry& m = s->maps[static_cast<size_t>(i)];
    ElfFile* f = s->elfs[static_cast<size_t>(i)].get();
    fr.module = f ? f->module : basename_of(m.path);
    uint64_t vaddr = 0;
    if (f == nullptr || !f->file_off_to_vaddr(look - m.start + m.offset, vaddr)) {
      ++impl_->stats.unresolved;
      continue;
    }
    f->last_used = ++impl_->tick;
    const Resolved r = resolve(*f, vaddr);
    if (!r.found) {
      // No symbol (a stripped library's local function): keep the module-relative address, which
      // is the same in every process and run (addr2line -e MODULE ADDR), not the ASLR'd one.
      fr.ip = vaddr + (ips[k] - look);
      ++impl_->stats.unresolved;
      continue;
    }
    fr.function = r.function;
    // The offset is of the ip itself (what a reader adds to the symbol), not of the lookup address.
    fr.offset = r.offset + (ips[k] - look);
    fr.file = r.file;
    fr.line = r.line;
    fr.ip = 0;
  }
  return out;
}

std::vector<StackFrame> Symbolizer::symbolize_kernel(std::span<const uint64_t> ips) {
  impl_->load_kallsyms();
  std::vector<StackFrame> out(ips.size());
  const auto& ks = impl_->ksyms;
  for (size_t k = 0; k < ips.size(); ++k) {
    StackFrame& fr = out[k];
    fr.kind = FrameKind::kKernel;
    fr.ip = ips[k];
    auto it = std::upper_bound(ks.begin(), ks.end(), ips[k],
                               [](uint64_t a, const Impl::KSym& s) { return a < s.addr; });
    if (it == ks.begin() || ips[k] == 0) {
      ++impl_->stats.unresolved;
      continue;
    }
    --it;
    if (ips[k] - it->addr > (1u << 20)) {  // far past the last symbol: not a text address
      ++impl_->stats.unresolved;
      continue;
    }
    fr.function = it->name;
    fr.module = it->module;
    fr.offset = ips[k] - it->addr;
    fr.ip = 0;
  }
  return out;
}

Symbolizer::Stats Symbolizer::stats() const { return impl_->stats; }

void for_each_elf_symbol(::Elf* elf, const std::function<void(const char*, uint64_t, uint64_t, unsigned char)>& fn) {
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) continue;
    if (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || sh.sh_entsize == 0) continue;
    const size_t n = sh.sh_size / sh.sh_entsize;
    for (size_t i = 0; i < n; ++i) {
      GElf_Sym sym;
      if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr || sym.st_shndx == SHN_UNDEF) continue;
      const char* name = elf_strptr(elf, sh.sh_link, sym.st_name);
      if (name == nullptr) continue;
      fn(name, sym.st_value, sym.st_size, sym.st_info);
    }
  }
}

}  // namespace ingero::bpf
