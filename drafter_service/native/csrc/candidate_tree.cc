#include "candidate_tree.h"

#include <algorithm>
#include <iterator>

namespace drafter {

void CandidateTree::clear() {
  samples_.clear();
  nodes_.clear();
  nodes_.push_back({-1, kUnexpanded, -1, 0, 0, 0});
  num_nodes_ = 1;
  matched_prefix_ = 0;
}

namespace {

// Length of the common prefix of two samples.
int32_t common_prefix(const Sample& a, const Sample& b) {
  const int32_t limit = std::min(a.len, b.len);
  int32_t k = 0;
  while (k < limit && a.tokens[k] == b.tokens[k]) ++k;
  return k;
}

bool sample_less(const Sample& a, const Sample& b) {
  const int32_t k = common_prefix(a, b);
  if (k == a.len || k == b.len) return a.len < b.len;
  return a.tokens[k] < b.tokens[k];
}

}  // namespace

void CandidateTree::add(const Sample* samples, size_t n) {
  const size_t held = samples_.size();
  samples_.insert(samples_.end(), samples, samples + n);
  // One pass over samples_[from, end) checks their order and counts the distinct paths
  // they add to `nodes`: in sorted order a sample adds one node per token past its
  // common prefix with the previous one. -1 at the first that sorts before the previous.
  auto count_from = [&](size_t from, int64_t nodes) -> int64_t {
    for (size_t i = from; i < samples_.size(); ++i) {
      const Sample& cur = samples_[i];
      const Sample* prev = i == 0 ? nullptr : &samples_[i - 1];
      const int32_t k = prev == nullptr ? 0 : common_prefix(*prev, cur);
      if (prev != nullptr && k < prev->len && (k == cur.len || cur.tokens[k] < prev->tokens[k])) {
        return -1;
      }
      nodes += cur.len - k;  // 0 when equal to prev
    }
    return nodes;
  };
  int64_t nodes = count_from(held, num_nodes_);
  if (nodes < 0) {
    // The samples held are sorted, and so is each run of new ones from one suffix
    // array range: sort only the new samples, then merge (linear) with those held.
    const auto first_new = samples_.begin() + held;
    if (!std::is_sorted(first_new, samples_.end(), sample_less)) {
      std::sort(first_new, samples_.end(), sample_less);
    }
    merged_.clear();
    std::merge(samples_.begin(), first_new, first_new, samples_.end(), std::back_inserter(merged_),
               sample_less);
    samples_.swap(merged_);
    nodes = count_from(0, 1);
  }
  num_nodes_ = static_cast<int32_t>(nodes);
  nodes_.resize(1);
  nodes_[kRoot] = {-1, kUnexpanded, -1, 0, static_cast<int32_t>(samples_.size()), 0};
}

void CandidateTree::expand(int32_t node) const {
  const Node parent = nodes_[node];
  const int32_t d = parent.depth;
  int32_t i = parent.lo;
  // Samples ending exactly here are a prefix of the others: they sort first.
  while (i < parent.hi && samples_[i].len == d) ++i;
  int32_t first = -1, prev = -1;
  while (i < parent.hi) {
    const int32_t t = samples_[i].tokens[d];
    int32_t j = i + 1;
    while (j < parent.hi && samples_[j].tokens[d] == t) ++j;
    const auto id = static_cast<int32_t>(nodes_.size());
    nodes_.push_back({t, kUnexpanded, -1, i, j, d + 1});
    if (prev == -1) {
      first = id;
    } else {
      nodes_[prev].next_sibling = id;
    }
    prev = id;
    i = j;
  }
  nodes_[node].first_child = first;
}

}  // namespace drafter
