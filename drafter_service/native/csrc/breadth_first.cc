#include "breadth_first.h"

#include <algorithm>

#include "score_features.h"

namespace drafter {

using fusion::DraftNode;

void write_breadth_first(const std::vector<DraftNode>& nodes,
                         const std::vector<double>* feature_pool, BreadthFirstScratch& scratch,
                         Draft& out) {
  // Breadth-first order: by depth, then by insertion (a parent is always
  // inserted before its children, so parents precede children).
  const auto num = static_cast<int32_t>(nodes.size()) - 1;
  // A counting sort: depths are in [1, num].
  std::vector<int32_t>& start = scratch.depth_start;
  start.assign(static_cast<size_t>(num) + 2, 0);
  for (int32_t i = 1; i <= num; ++i) ++start[static_cast<size_t>(nodes[static_cast<size_t>(i)].depth) + 1];
  for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
  std::vector<int32_t>& order = scratch.order;
  order.resize(static_cast<size_t>(num));
  for (int32_t i = 1; i <= num; ++i) {
    order[static_cast<size_t>(start[static_cast<size_t>(nodes[static_cast<size_t>(i)].depth)]++)] = i;
  }
  std::vector<int32_t>& remap = scratch.remap;
  remap.assign(static_cast<size_t>(num) + 1, -1);
  for (int32_t i = 0; i < num; ++i) remap[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;
  out.tokens.reserve(static_cast<size_t>(num));
  for (int32_t i = 0; i < num; ++i) {
    const DraftNode& d = nodes[static_cast<size_t>(order[static_cast<size_t>(i)])];
    out.tokens.push_back(d.token);
    out.parents.push_back(remap[static_cast<size_t>(d.parent)]);  // root (0) maps to -1
    out.scores.push_back(static_cast<float>(d.score));
  }
  if (feature_pool != nullptr) {
    out.features.resize(static_cast<size_t>(num) * kScoreFeatures);
    for (int32_t i = 0; i < num; ++i) {
      const DraftNode& d = nodes[static_cast<size_t>(order[static_cast<size_t>(i)])];
      std::copy_n(feature_pool->data() + static_cast<size_t>(d.features) * kScoreFeatures,
                  kScoreFeatures, out.features.data() + static_cast<size_t>(i) * kScoreFeatures);
    }
  }
}

}  // namespace drafter
