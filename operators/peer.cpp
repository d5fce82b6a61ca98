#include "operators/peer.h"

#include <algorithm>
#include <cmath>

namespace ingero {
std::vector<PeerScore> evaluate_peers(const PeerNode& node, const std::vector<double>& values) {
  std::vector<double> valid;
  for (double v : values)
    if (v == v) valid.push_back(v);
  std::vector<PeerScore> out(values.size());
  if (valid.empty()) return out;
  const double med = median_of(valid);
  std::vector<double> dev;
  double mean_abs = 0;
  for (double v : valid) {
    dev.push_back(std::fabs(v - med));
    mean_abs += std::fabs(v - med);
  }
  mean_abs /= static_cast<double>(valid.size());
  const double mad = median_of(dev);
  for (size_t i = 0; i < values.size(); ++i) {
    auto& s = out[i];
    s.median = med;
    s.mad = mad;
    s.peers = valid.size();
    const double x = values[i];
    if (x != x) continue;
    if (mad > 0) s.z = 0.6745 * (x - med) / mad;
    else if (mean_abs > 0) s.z = (x - med) / (1.253314 * mean_abs);
    else s.z = 0;
    s.outlier = valid.size() >= node.min_peers && s.z > node.z && (x - med) > node.floor;
  }
  return out;
}

}  // namespace ingero
