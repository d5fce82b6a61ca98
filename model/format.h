// Human formatting shared by the engine's chain templates, reports and the CLI.
// Pure functions; never throw; NaN prints as "n/a".
#pragma once

#include <cstdint>
#include <string>

#include "model/expr.h"

namespace ingero {

std::string format_ns(double ns);        // 850ns, 73.2us, 25.80ms, 1.54s
std::string format_bytes(double bytes);  // 512 B, 2.0 MiB, 1.2 GiB
std::string format_count(double n);      // 3,676
std::string format_value(double v, Unit u);
std::string format_ms_fixed(double ns, int decimals);          // (1234567, 3) -> "1.235 ms"
std::string format_percent_fixed(double share, int decimals);  // (0.1234, 1) -> "12.3%"

}  // namespace ingero
