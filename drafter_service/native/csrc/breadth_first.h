// Fusion's output step: the draft nodes, in the order they were chosen, written out
// as a Draft in breadth-first order (and, to explain, with their features).
#pragma once

#include <cstdint>
#include <vector>

#include "fusion_records.h"

namespace drafter {

// Reusable buffers of write_breadth_first; contents are meaningless between calls.
struct BreadthFirstScratch {
  std::vector<int32_t> depth_start;  // counting sort of draft nodes by depth
  std::vector<int32_t> order;
  std::vector<int32_t> remap;
};

// Appends nodes[1, size) (nodes[0] is the root; a parent precedes its children) to
// `out` in breadth-first order: by depth, then by position in `nodes`. With
// `feature_pool`, out.features gets each node's kScoreFeatures values (its row
// DraftNode::features of the pool).
void write_breadth_first(const std::vector<fusion::DraftNode>& nodes,
                         const std::vector<double>* feature_pool, BreadthFirstScratch& scratch,
                         Draft& out);

}  // namespace drafter
