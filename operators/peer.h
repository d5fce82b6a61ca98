// Peer statistics: which members of a peer group are outliers in one window.
//
// Contract: evaluate(values) takes one value per peer (e.g. per rank) of the same window and
// returns, per peer, the group median, the MAD (median absolute deviation), and the modified
// z-score 0.6745 * (x - median) / MAD. When MAD is 0 (most peers identical) the fallback scale is
// 1.253314 * mean absolute deviation; when that is 0 too, z is 0 (no outlier). A peer is an
// outlier when z > node.z AND x - median > node.floor (an absolute floor so jitter never fires),
// and the group has at least min_peers members. Only slow outliers (x above the median) count.
// NaN values are left out of the group. Stateless between windows.
#pragma once

#include <vector>

#include "model/median.h"  // median_of, used with the peer scores
#include "model/plan.h"

namespace ingero {

struct PeerScore {
  double median = 0, mad = 0, z = 0;
  bool outlier = false;
  size_t peers = 0;
};

std::vector<PeerScore> evaluate_peers(const PeerNode& node, const std::vector<double>& values);

}  // namespace ingero
