// Finds the CUDA runtime (libcudart), driver (libcuda) and NCCL (libnccl) shared objects to put
// uprobes on.
//
// Contract:
// - Sources, in order: `--cuda-lib PATH` (explicit), running processes' /proc/<pid>/maps, the
//   loader cache (`ldconfig -p`), CUDA toolkits ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda*), and
//   Python wheels (site-packages/nvidia/*/lib). Toolkit "stubs" directories are skipped (a stub
//   libcuda is never the one a program runs) unless named explicitly.
// - Files are identified by (device, inode): uprobes attach to the inode, so one attach covers
//   every process and every path (symlink, bind mount) that maps the file.
// - A library mapped by a process in another mount namespace is reached via /proc/<pid>/root.
// - poll() is bounded: each call reads the maps of at most `max_pids_per_poll` processes, new
//   pids first, then the rest round-robin, so a library dlopen()ed later (PyTorch loads CUDA
//   lazily) is found within a few polls whatever the process count.
// - Header-only and free of libbpf, so `ingero-pipeline check` can use it when BPF is not built.
// - Never throws: unreadable files and directories are skipped.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace ingero::bpf {

enum class LibKind : uint8_t { kCudart, kCuda, kNccl };

inline const char* lib_kind_name(LibKind k) {
  switch (k) {
    case LibKind::kCudart: return "libcudart";
    case LibKind::kCuda: return "libcuda";
    case LibKind::kNccl: return "libnccl";
  }
  return "?";
}

struct CudaLibrary {
  LibKind kind = LibKind::kCudart;
  std::string path;      // a path that opens the file from this mount namespace
  std::string found_by;  // "--cuda-lib", "maps of pid 123", "ld.so.cache", "toolkit", "wheel"
  uint64_t dev = 0, ino = 0;
};

// "libcudart.so.13" -> kCudart; "libcudart_static.a", "libcudart.so.13.0.96.bak" -> nullopt.
inline std::optional<LibKind> classify_library(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  auto is_so = [&](const std::string& stem) -> bool {
    const std::string head = stem + ".so";
    if (base.compare(0, head.size(), head) != 0) return false;
    // After ".so": nothing, or ".<digits>" groups only.
    for (size_t i = head.size(); i < base.size(); ++i) {
      const char c = base[i];
      if (c == '.') {
        if (i + 1 >= base.size() || !std::isdigit(static_cast<unsigned char>(base[i + 1]))) return false;
      } else if (!std::isdigit(static_cast<unsigned char>(c))) {
        return false;
      }
    }
    return true;
  };
  if (is_so("libcudart")) return LibKind::kCudart;
  if (is_so("libcuda")) return LibKind::kCuda;
  if (is_so("libnccl")) return LibKind::kNccl;
  return std::nullopt;
}

// One line of /proc/<pid>/maps: "addr perms offset dev inode   path". Returns the path and
// inode, or nullopt for anonymous mappings.
inline std::optional<std::pair<std::string, uint64_t>> parse_maps_line(const std::string& line) {
  std::istringstream in(line);
  std::string addr, perms, offset, dev;
  uint64_t inode = 0;
  if (!(in >> addr >> perms >> offset >> dev >> inode)) return std::nullopt;
  std::string path;
  std::getline(in, path);
  const size_t start = path.find_first_not_of(' ');
  if (start == std::string::npos || inode == 0) return std::nullopt;
  path = path.substr(start);
  if (path.empty() || path[0] != '/') return std::nullopt;
  const std::string deleted = " (deleted)";
  if (path.size() > deleted.size() && path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
    return std::nullopt;  // replaced on disk: the inode we could open is not the mapped one
  return std::make_pair(path, inode);
}

// `ldconfig -p` line: "\tlibcudart.so.13 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudart.so.13"
inline std::optional<std::string> parse_ldconfig_line(const std::string& line) {
  const size_t arrow = line.find(" => ");
  if (arrow == std::string::npos) return std::nullopt;
  std::string path = line.substr(arrow + 4);
  while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
  if (path.empty() || path[0] != '/') return std::nullopt;
  return path;
}

struct DiscoveryOptions {
  std::vector<std::string> explicit_paths;  // --cuda-lib (files or directories)
  std::string proc_root = "/proc";
  bool use_maps = true, use_ldcache = true, use_toolkit = true, use_wheels = true;
  std::vector<std::string> toolkit_roots;  // empty: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda*
  std::vector<std::string> python_roots;   // empty: the usual site-packages parents
  size_t max_pids_per_poll = 256;
};

class LibraryDiscovery {
 public:
  explicit LibraryDiscovery(DiscoveryOptions opts = {}) : opts_(std::move(opts)) {}

  // Everything findable now. Later calls to poll() return only libraries not returned before.
  std::vector<CudaLibrary> initial_scan() {
    std::vector<CudaLibrary> out;
    for (const auto& p : opts_.explicit_paths) add_path_or_dir(p, "--cuda-lib", true, out);
    if (opts_.use_maps) scan_all_maps(out);
    if (opts_.use_ldcache) scan_ldcache(out);
    if (opts_.use_toolkit)
      for (const auto& root : toolkit_roots())
        for (const char* sub : {"/lib64", "/lib", "/targets/x86_64-linux/lib", "/compat"})
          add_dir(root + sub, "toolkit " + root, out);
    if (opts_.use_wheels)
      for (const auto& dir : wheel_dirs()) add_dir(dir, "wheel", out);
    return out;
  }

  // New libraries mapped by processes since the last call (bounded cost, see the contract).
  std::vector<CudaLibrary> poll() {
    std::vector<CudaLibrary> out;
    if (!opts_.use_maps) return out;
    std::vector<uint32_t> pids = list_pids();
    std::vector<uint32_t> fresh, old;
    for (uint32_t p : pids) (seen_pids_.count(p) ? old : fresh).push_back(p);
    size_t budget = opts_.max_pids_per_poll;
    for (uint32_t p : fresh) {
      if (budget == 0) break;
      --budget;
      seen_pids_.insert(p);
      scan_maps(p, out);
    }
    if (!old.empty()) {
      for (size_t n = 0; n < old.size() && budget > 0; ++n, --budget) scan_maps(old[(cursor_ + n) % old.size()], out);
      cursor_ = (cursor_ + opts_.max_pids_per_poll) % old.size();
    }
    // Forget pids that went away so the set stays as large as /proc.
    std::set<uint32_t> alive(pids.begin(), pids.end());
    for (auto it = seen_pids_.begin(); it != seen_pids_.end();)
      it = alive.count(*it) ? std::next(it) : seen_pids_.erase(it);
    return out;
  }

  // Mapped by `pid` right now (used to learn which libraries a traced process uses).
  std::vector<CudaLibrary> scan_pid(uint32_t pid) {
    std::vector<CudaLibrary> out;
    scan_maps(pid, out, /*force=*/true);
    return out;
  }

  const std::vector<CudaLibrary>& known() const { return known_; }

 private:
  bool remember(CudaLibrary lib, std::vector<CudaLibrary>& out, bool force = false) {
    struct stat st {};
    if (::stat(lib.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    lib.dev = st.st_dev;
    lib.ino = st.st_ino;
    for (const auto& k : known_)
      if (k.dev == lib.dev && k.ino == lib.ino) {
        if (force) out.push_back(k);
        return false;
      }
    known_.push_back(lib);
    out.push_back(std::move(lib));
    return true;
  }

  void add_path_or_dir(const std::string& p, const std::string& how, bool allow_stubs, std::vector<CudaLibrary>& out) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
      add_dir(p, how, out, allow_stubs);
      return;
    }
    // An explicit file is taken even if its name is unusual; its kind comes from the name or,
    // failing that, from the symbols (left to the loader: default to the runtime).
    auto kind = classify_library(p);
    remember({kind.value_or(LibKind::kCudart), p, how}, out);
  }

  void add_dir(const std::string& dir, const std::string& how, std::vector<CudaLibrary>& out,
               bool allow_stubs = false) {
    if (!allow_stubs && dir.find("/stubs") != std::string::npos) return;
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& n : names)
      if (auto kind = classify_library(n)) remember({*kind, std::string(dir).append("/").append(n), how}, out);
  }

  void scan_all_maps(std::vector<CudaLibrary>& out) {
    for (uint32_t p : list_pids()) {
      seen_pids_.insert(p);
      scan_maps(p, out);
    }
  }

  void scan_maps(uint32_t pid, std::vector<CudaLibrary>& out, bool force = false) {
    const std::string base = opts_.proc_root + "/" + std::to_string(pid);
    std::ifstream in(base + "/maps");
    if (!in) return;
    std::string line;
    std::set<std::string> done;
    while (std::getline(in, line)) {
      auto entry = parse_maps_line(line);
      if (!entry || !classify_library(entry->first) || !done.insert(entry->first).second) continue;
      // Prefer the path as we see it; if it is another file here (container), go through the
      // process's root.
      std::string path = entry->first;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || st.st_ino != entry->second) path = base + "/root" + entry->first;
      remember({*classify_library(entry->first), path, "maps of pid " + std::to_string(pid)}, out, force);
    }
  }

  void scan_ldcache(std::vector<CudaLibrary>& out) {
    FILE* f = ::popen("ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null", "r");
    if (!f) return;
    char buf[4096];
    while (std::fgets(buf, sizeof(buf), f))
      if (auto p = parse_ldconfig_line(buf))
        if (classify_library(*p) && p->find("/stubs/") == std::string::npos)
          remember({*classify_library(*p), *p, "ld.so.cache"}, out);
    ::pclose(f);
  }

  std::vector<std::string> toolkit_roots() const {
    if (!opts_.toolkit_roots.empty()) return opts_.toolkit_roots;
    std::vector<std::string> roots;
    for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
      if (const char* v = std::getenv(env); v && *v) roots.emplace_back(v);
    roots.emplace_back("/usr/local/cuda");
    if (DIR* d = ::opendir("/usr/local")) {
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d))
        if (std::strncmp(e->d_name, "cuda-", 5) == 0) names.emplace_back(e->d_name);
      ::closedir(d);
      std::sort(names.begin(), names.end());
      for (const auto& n : names) roots.push_back("/usr/local/" + n);
    }
    return roots;
  }

  std::vector<std::string> wheel_dirs() const {
    std::vector<std::string> parents = opts_.python_roots;
    if (parents.empty()) {
      for (const char* p : {"/usr/lib", "/usr/local/lib", "/opt/conda/lib", "/root/.local/lib"})
        parents.emplace_back(p);
      if (const char* venv = std::getenv("VIRTUAL_ENV"); venv && *venv) parents.push_back(std::string(venv) + "/lib");
      if (const char* conda = std::getenv("CONDA_PREFIX"); conda && *conda)
        parents.push_back(std::string(conda) + "/lib");
      if (DIR* d = ::opendir("/home")) {
        while (dirent* e = ::readdir(d))
          if (e->d_name[0] != '.') parents.push_back(std::string("/home/") + e->d_name + "/.local/lib");
        ::closedir(d);
      }
    }
    std::vector<std::string> dirs;
    for (const auto& parent : parents) {
      // parent/python3.X/{site,dist}-packages/nvidia/<pkg>/lib
      for (const auto& py : list_dir(parent, "python3"))
        for (const char* sp : {"/site-packages", "/dist-packages"}) {
          const std::string nv = std::string(parent).append("/").append(py).append(sp).append("/nvidia");
          for (const auto& pkg : list_dir(nv, ""))
            dirs.push_back(std::string(nv).append("/").append(pkg).append("/lib"));
        }
    }
    return dirs;
  }

  static std::vector<std::string> list_dir(const std::string& dir, const char* prefix) {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir.c_str());
    if (!d) return out;
    const size_t n = std::strlen(prefix);
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.' && std::strncmp(e->d_name, prefix, n) == 0) out.emplace_back(e->d_name);
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }

  std::vector<uint32_t> list_pids() const {
    std::vector<uint32_t> pids;
    DIR* d = ::opendir(opts_.proc_root.c_str());
    if (!d) return pids;
    while (dirent* e = ::readdir(d)) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(e->d_name, &end, 10);
      if (end && *end == 0 && e->d_name[0] != 0) pids.push_back(static_cast<uint32_t>(v));
    }
    ::closedir(d);
    std::sort(pids.begin(), pids.end());
    return pids;
  }

  DiscoveryOptions opts_;
  std::vector<CudaLibrary> known_;
  std::set<uint32_t> seen_pids_;
  size_t cursor_ = 0;
};

}  // namespace ingero::bpf
