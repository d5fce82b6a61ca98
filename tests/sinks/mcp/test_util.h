// Helpers shared by the MCP and SQL runner tests: locating the shared sample databases and
// fingerprinting a file so a test can prove it was not modified.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace mcp_test {

// Path of a shared sample database, or "" when the shared data is not present.
inline std::string sample_db(const std::string& name) {
  const std::string p = std::string(INGERO_SHARED_DATA) + "/" + name;
  return std::filesystem::exists(p) ? p : std::string();
}

// FNV-1a 64 over the whole file plus its size and mtime: changes if a single byte changes.
inline std::string file_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t h = 1469598103934665603ull;
  char buf[65536];
  uint64_t size = 0;
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h ^= static_cast<unsigned char>(buf[i]);
      h *= 1099511628211ull;
    }
    size += static_cast<uint64_t>(in.gcount());
  }
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  char out[96];
  std::snprintf(out, sizeof out, "%016llx/%llu/%lld", static_cast<unsigned long long>(h),
                static_cast<unsigned long long>(size), static_cast<long long>(mtime));
  return out;
}

}  // namespace mcp_test
