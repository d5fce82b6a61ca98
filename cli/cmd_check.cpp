// `ingero-pipeline check`: can live capture run here? Kernel, BTF, privileges, tracefs, BPF
// program loading, the CUDA libraries discovery finds, GPU and driver. Every failed check comes
// with a fix hint; `--json` for machines. Exit status 0 when live capture can run, 1 otherwise.
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bpf/discovery.h"
#include "cli/command.h"
#include "cli/common.h"
#ifdef INGERO_HAVE_BPF
#include "bpf/probes.h"
#endif

namespace ingero::cli {
namespace {

enum class Status { kOk, kWarn, kFail, kInfo };

struct Check {
  std::string name;
  Status status = Status::kOk;
  std::string detail;
  std::string hint;  // how to fix it (always set for kFail and kWarn)
};

const char* status_name(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kWarn: return "warn";
    case Status::kFail: return "fail";
    case Status::kInfo: return "info";
  }
  return "?";
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// Effective capabilities from /proc/self/status (CapEff, hex).
uint64_t effective_caps() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("CapEff:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  return 0;
}

std::vector<Check> run_checks(const std::vector<std::string>& cuda_libs) {
  std::vector<Check> out;

  utsname u{};
  ::uname(&u);
  {
    Check c{"kernel", Status::kOk, std::string(u.release), ""};
    int major = 0, minor = 0;
    std::sscanf(u.release, "%d.%d", &major, &minor);
    // BPF ring buffers need 5.8; tp_btf 5.5; bounded loops 5.3.
    if (major < 5 || (major == 5 && minor < 8)) {
      c.status = Status::kFail;
      c.detail += " (older than 5.8: no BPF ring buffer)";
      c.hint = "use a kernel >= 5.8 (Debian 12's 6.1 works)";
    }
    out.push_back(c);
  }
  {
    Check c{"btf", Status::kOk, "/sys/kernel/btf/vmlinux", ""};
    if (::access("/sys/kernel/btf/vmlinux", R_OK) != 0) {
      c.status = Status::kFail;
      c.detail = "no /sys/kernel/btf/vmlinux: CO-RE programs cannot be relocated";
      c.hint = "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (all major distributions since 2021)";
    }
    out.push_back(c);
  }
  const bool root = ::geteuid() == 0;
  {
    const uint64_t caps = effective_caps();
    const bool sys_admin = caps & (1ull << 21), perfmon = caps & (1ull << 38), bpf = caps & (1ull << 39);
    Check c{"privileges", Status::kOk, "", ""};
    if (root || sys_admin || (bpf && perfmon)) {
      c.detail = root ? "root" : (sys_admin ? "CAP_SYS_ADMIN" : "CAP_BPF + CAP_PERFMON");
    } else {
      c.status = Status::kFail;
      c.detail = "not root and without CAP_BPF + CAP_PERFMON";
      c.hint = "run with sudo, or: sudo setcap cap_bpf,cap_perfmon,cap_sys_resource+ep $(which ingero-pipeline)";
    }
    out.push_back(c);
  }
  {
    Check c{"tracefs", Status::kOk, "", ""};
    for (const char* p : {"/sys/kernel/tracing", "/sys/kernel/debug/tracing"})
      if (::access((std::string(p) + "/events").c_str(), R_OK) == 0) {
        c.detail = p;
        break;
      }
    if (c.detail.empty()) {
      // Only classic tracepoints and the socket syscalls need it; tp_btf works without.
      c.status = Status::kWarn;
      c.detail = "not mounted (socket send/recv syscalls and classic tracepoint fallbacks unavailable)";
      c.hint = "sudo mount -t tracefs nodev /sys/kernel/tracing";
    }
    out.push_back(c);
  }
#ifdef INGERO_HAVE_BPF
  {
    Check c{"bpf programs", Status::kOk, "", ""};
    if (!root && out[2].status == Status::kFail) {
      c.status = Status::kFail;
      c.detail = "not tried (no privileges)";
      c.hint = "fix the privileges check first";
    } else {
      bpf::ProbeOptions po;
      po.families.cuda = po.families.driver = po.families.graph = po.families.nccl = false;
      std::string err;
      auto probes = bpf::BpfProbes::open(
          po, [](const ip_record&) {}, err);
      if (!probes) {
        c.status = Status::kFail;
        c.detail = err;
        c.hint =
            "check `dmesg` and that the kernel has CONFIG_BPF_SYSCALL, CONFIG_BPF_EVENTS, "
            "CONFIG_UPROBE_EVENTS; INGERO_BPF_VERBOSE=1 prints libbpf's log";
      } else {
        size_t btf = 0, classic = 0;
        for (const auto& [name, kind] : probes->tracepoints()) (kind == "tp_btf" ? btf : classic)++;
        c.detail = "loaded; " + std::to_string(btf) + " tracepoints via tp_btf, " + std::to_string(classic) +
                   " classic";
        for (const auto& w : probes->warnings()) {
          c.status = Status::kWarn;
          c.detail += "; " + w;
          c.hint = "see docs/live-capture.md (probe families)";
        }
      }
    }
    out.push_back(c);
  }
#else
  out.push_back({"bpf programs", Status::kFail, "this binary was built without eBPF support",
                 "rebuild with -DINGERO_BUILD_BPF=ON and clang, bpftool, libbpf-dev installed"});
#endif
  {
    bpf::DiscoveryOptions d;
    d.explicit_paths = cuda_libs;
    bpf::LibraryDiscovery disc(d);
    const auto libs = disc.initial_scan();
    auto report = [&](bpf::LibKind k, const char* name, Status missing, const char* hint) {
      Check c{name, Status::kOk, "", ""};
      for (const auto& l : libs)
        if (l.kind == k) c.detail += (c.detail.empty() ? "" : ", ") + l.path + " (" + l.found_by + ")";
      if (c.detail.empty()) {
        c.status = missing;
        c.detail = "not found";
        c.hint = hint;
      }
      out.push_back(c);
    };
    report(bpf::LibKind::kCudart, "libcudart", Status::kWarn,
           "install the CUDA toolkit or the nvidia-cuda-runtime wheel, or pass --cuda-lib PATH; "
           "libraries loaded later by a process are picked up while tracing");
    report(bpf::LibKind::kCuda, "libcuda", Status::kWarn,
           "install the NVIDIA driver (libcuda ships with it); without it only runtime calls are seen");
    report(bpf::LibKind::kNccl, "libnccl", Status::kInfo,
           "only needed for multi-GPU collectives (pip install nvidia-nccl-cu12, or the NCCL package)");
  }
  {
    Check c{"gpu", Status::kInfo, "", ""};
    const std::string ver = first_line("/proc/driver/nvidia/version");
    if (!ver.empty()) {
      c.status = Status::kOk;
      c.detail = ver;
      if (::access("/dev/nvidia0", F_OK) != 0) {
        c.status = Status::kWarn;
        c.detail += "; but no /dev/nvidia0";
        c.hint = "load the driver's device nodes (nvidia-modprobe) or check the container's device mounts";
      }
    } else {
      c.detail =
          "no NVIDIA driver loaded (no /proc/driver/nvidia/version): CUDA calls fail fast, "
          "host API time is still traced";
      c.hint = "on a GPU host: install the NVIDIA driver";
    }
    out.push_back(c);
  }
  return out;
}

int run_check(bool json, const std::vector<std::string>& cuda_libs) {
  const auto checks = run_checks(cuda_libs);
  bool ok = true;
  for (const auto& c : checks) ok &= c.status != Status::kFail;
  if (json) {
    nlohmann::json j;
    j["ok"] = ok;
    j["checks"] = nlohmann::json::array();
    for (const auto& c : checks)
      j["checks"].push_back(
          {{"name", c.name}, {"status", status_name(c.status)}, {"detail", c.detail}, {"hint", c.hint}});
    std::cout << j.dump(2) << "\n";
  } else {
    const bool color = stdout_is_terminal();
    for (const auto& c : checks) {
      const char* tag = c.status == Status::kOk     ? "  ok"
                        : c.status == Status::kWarn ? "WARN"
                        : c.status == Status::kFail ? "FAIL"
                                                    : "info";
      const char* col = !color                      ? ""
                        : c.status == Status::kOk   ? "\x1b[32m"
                        : c.status == Status::kFail ? "\x1b[31m"
                        : c.status == Status::kWarn ? "\x1b[33m"
                                                    : "";
      std::printf("%s[%s]%s %-13s %s\n", col, tag, color ? "\x1b[0m" : "", c.name.c_str(), c.detail.c_str());
      if (c.status != Status::kOk && !c.hint.empty()) std::printf("       %-13s fix: %s\n", "", c.hint.c_str());
    }
    std::printf("\n%s\n", ok ? "Live capture can run here (`ingero-pipeline trace`)."
                             : "Live capture cannot run here until the failed checks are fixed.");
  }
  return ok ? kExitOk : kExitFindings;
}

Registrar reg{"check", 90, [](CLI::App& app, int& rc) {
                auto json = std::make_shared<bool>(false);
                auto libs = std::make_shared<std::vector<std::string>>();
                auto* cmd = app.add_subcommand(
                    "check",
                    "Can live capture run here? Checks the kernel, BTF, privileges, tracefs, BPF program\n"
                    "loading, the CUDA libraries found (processes, ld.so.cache, CUDA toolkit, Python wheels),\n"
                    "the GPU and driver; prints a fix for every failed check. Exit status 1 if one failed.");
                cmd->add_flag("--json", *json, "Machine-readable output");
                cmd->add_option("--cuda-lib", *libs, "Also consider this library file or directory");
                cmd->callback([json, libs, &rc] { rc = run_check(*json, *libs); });
              }};

}  // namespace
}  // namespace ingero::cli
