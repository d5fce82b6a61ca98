#include "model/format.h"

#include <cmath>
#include <cstdio>

namespace ingero {

std::string format_ns(double ns) {
  if (ns != ns) return "n/a";
  char buf[48];
  const double a = std::fabs(ns);
  if (a < 1e3) std::snprintf(buf, sizeof buf, "%.0fns", ns);
  else if (a < 1e6) std::snprintf(buf, sizeof buf, "%.1fus", ns / 1e3);
  else if (a < 1e9) std::snprintf(buf, sizeof buf, "%.2fms", ns / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2fs", ns / 1e9);
  return buf;
}

std::string format_bytes(double b) {
  if (b != b) return "n/a";
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, kUnits[u]);
  return buf;
}

std::string format_count(double n) {
  if (n != n) return "n/a";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.0f", std::fabs(n));
  std::string digits = buf, out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

std::string format_value(double v, Unit u) {
  if (v != v) return "n/a";
  char buf[48];
  switch (u) {
    case Unit::kNs: return format_ns(v);
    case Unit::kBytes: return format_bytes(v);
    case Unit::kCount: return format_count(v);
    case Unit::kPercent: std::snprintf(buf, sizeof buf, "%.0f%%", v * 100); return buf;
    case Unit::kRatio: std::snprintf(buf, sizeof buf, v >= 100 ? "%.0fx" : "%.1fx", v); return buf;
    case Unit::kPerSecond: std::snprintf(buf, sizeof buf, "%.0f/s", v); return buf;
    case Unit::kBool: return v != 0 ? "true" : "false";
    case Unit::kNone: break;
  }
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  }
  return buf;
}

std::string format_ms_fixed(double ns, int decimals) {
  char b[48];
  std::snprintf(b, sizeof b, "%.*f ms", decimals, ns / 1e6);
  return b;
}

std::string format_percent_fixed(double share, int decimals) {
  char b[48];
  std::snprintf(b, sizeof b, "%.*f%%", decimals, share * 100);
  return b;
}

}  // namespace ingero
