#include "breadth_first.h"

#include <algorithm>

#include "score_features.h"

namespace drafter {

using fusion::DraftNode;

// A feature row's length, as a size_t: row offsets are computed in size_t.
constexpr size_t kRow = kScoreFeatures;

void write_breadth_first(const std::vector<DraftNode>& nodes,
                         const std::vector<double>* feature_pool, BreadthFirstScratch& scratch,
                         Draft& out) {
  // Breadth-first order: by depth, then by insertion (a parent is always
  // inserted before its children, so parents precede children).
  const auto num = static_cast<int32_t>(nodes.size()) - 1;
  // A counting sort: depths are in [1, num].
  std::vector<int32_t>& start = scratch.depth_start;
  start.assign(num + 2, 0);
  for (int32_t i = 1; i <= num; ++i) ++start[nodes[i].depth + 1];
  for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
  std::vector<int32_t>& order = scratch.order;
  order.resize(num);
  for (int32_t i = 1; i <= num; ++i) {
    order[start[nodes[i].depth]++] = i;
  }
  std::vector<int32_t>& remap = scratch.remap;
  remap.assign(num + 1, -1);
  for (int32_t i = 0; i < num; ++i) remap[order[i]] = i;
  out.tokens.reserve(num);
  for (int32_t i = 0; i < num; ++i) {
    const DraftNode& d = nodes[order[i]];
    out.tokens.push_back(d.token);
    out.parents.push_back(remap[d.parent]);  // root (0) maps to -1
    out.scores.push_back(static_cast<float>(d.score));
  }
  if (feature_pool != nullptr) {
    out.features.resize(num * kRow);
    for (int32_t i = 0; i < num; ++i) {
      const DraftNode& d = nodes[order[i]];
      std::copy_n(feature_pool->data() + d.features * kRow, kRow, out.features.data() + i * kRow);
    }
  }
}

}  // namespace drafter
