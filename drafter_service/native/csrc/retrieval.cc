#include "retrieval.h"

#include <algorithm>
#include <iterator>
#include <numeric>

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

int64_t Datastore::num_tokens() const {
  return std::accumulate(sub_indices.begin(), sub_indices.end(), int64_t{0},
                         [](int64_t n, const auto& s) { return n + s->num_tokens(); });
}

int64_t Datastore::resident_bytes() const {
  return std::accumulate(sub_indices.begin(), sub_indices.end(), int64_t{0},
                         [](int64_t n, const auto& s) { return n + s->resident_bytes(); });
}

namespace {

// The suffix-array ranges of one retrieval over sub-indices [begin, end): at(s, m) is
// the rows of sub-index s matching the context's last m tokens (m = 1..longest).
struct RangeTable {
  std::vector<SaRange>& ranges;
  size_t begin;
  int32_t longest;
  SaRange& at(size_t s, int32_t m) { return ranges[(s - begin) * longest + m - 1]; }
};

// Fills the ranges of sub-indices [begin, end). They are searched shortest first: a
// suffix that occurs nowhere in a sub-index has no longer suffix there either (an
// occurrence of the longer one contains it), so the longer searches, most of them
// misses, are skipped. The longest-first loop of retrieve_sub_indices reads them.
void find_ranges(const Datastore& datastore, size_t begin, size_t end, const int32_t* context,
                 int64_t context_len, RangeTable& ranges) {
  for (size_t s = begin; s < end; ++s) {
    const SubIndex& index = *datastore.sub_indices[s];
    for (int32_t m = 1; m <= ranges.longest; ++m) {
      const SaRange r = index.find_range(context + context_len - m, m);
      if (r.size() == 0) break;
      ranges.at(s, m) = r;
    }
  }
}

// The rows sampled for prefix length m, `total` matches over sub-indices [begin, end).
// Interval sampling: the rows of a range are sorted by continuation, so evenly
// spaced rows approximate the continuation distribution. The sample budget is
// split over sub-indices in proportion to their matches. Each row's suffix array
// entry is prefetched as it is chosen (see read_samples).
void sample_rows(const Datastore& datastore, size_t begin, size_t end, RangeTable& ranges,
                 int32_t m, int64_t total, const DraftConfig& config,
                 std::vector<SampledRow>& rows) {
  rows.clear();
  for (size_t s = begin; s < end; ++s) {
    const SaRange& range = ranges.at(s, m);
    const int64_t found = range.size();
    if (found == 0) continue;
    const int64_t count =
        total <= config.datastore_samples
            ? found
            : std::max<int64_t>(1, config.datastore_samples * found / total);
    const int32_t* sa = datastore.sub_indices[s]->suffix_array();
    for (int64_t k = 0; k < count; ++k) {
      rows.push_back({range.begin + (k * found) / count, s});
      __builtin_prefetch(sa + rows.back().row);
    }
  }
}

// The continuation after each sampled row's m-token match: up to cont_cap tokens,
// ending at a document separator or the end of the text.
void read_samples(const Datastore& datastore, const std::vector<SampledRow>& rows, int32_t m,
                  int32_t cont_cap, std::vector<Sample>& samples) {
  // Each sample is two dependent random reads (suffix array, then text), cache
  // misses on a large index. All are issued as prefetches first, over every
  // sub-index, so that the misses overlap instead of queueing one after another.
  // (Not a function of their own: one that only prefetches has no effect the
  // compiler must keep, and GCC drops its call.)
  for (const SampledRow& r : rows) {
    const SubIndex& index = *datastore.sub_indices[r.sub];
    const int64_t start = index.position(r.row) + m;
    // A continuation of up to cont_cap tokens may straddle two cache lines.
    const int64_t last = std::min(start + cont_cap - 1, index.num_tokens() - 1);
    __builtin_prefetch(index.tokens() + std::min(start, last));
    __builtin_prefetch(index.tokens() + last);
  }
  samples.clear();
  for (const SampledRow& r : rows) {
    const SubIndex& index = *datastore.sub_indices[r.sub];
    const int32_t* text = index.tokens();
    const int64_t n = index.num_tokens();
    const int64_t start = index.position(r.row) + m;
    int32_t len = 0;
    while (len < cont_cap && start + len < n && text[start + len] != kSeparator) ++len;
    samples.push_back({text + start, len});
  }
}

}  // namespace

void retrieve_sub_indices(const Datastore& datastore, size_t begin, size_t end,
                          const int32_t* context, int64_t context_len, const DraftConfig& config,
                          int32_t max_len, RetrievalScratch& scratch, CandidateTree& tree) {
  tree.clear();
  if (begin >= end || context_len <= 0 || max_len <= 0) return;
  const int32_t cont_cap = std::min(config.datastore_max_continuation, max_len);
  const auto longest =
      static_cast<int32_t>(std::min<int64_t>(config.datastore_max_prefix, context_len));
  scratch.ranges.assign((end - begin) * longest, SaRange{0, 0});
  RangeTable ranges{scratch.ranges, begin, longest};
  find_ranges(datastore, begin, end, context, context_len, ranges);
  for (int32_t m = longest; m >= config.datastore_min_prefix; --m) {
    if (tree.num_nodes() - 1 >= config.datastore_min_tree_nodes) break;
    int64_t total = 0;
    for (size_t s = begin; s < end; ++s) {
      total += ranges.at(s, m).size();
    }
    if (total == 0) continue;
    if (tree.matched_prefix() == 0) tree.set_matched_prefix(m);
    sample_rows(datastore, begin, end, ranges, m, total, config, scratch.sample_rows);
    read_samples(datastore, scratch.sample_rows, m, cont_cap, scratch.samples);
    tree.add(scratch.samples.data(), scratch.samples.size());
  }
}

}  // namespace drafter
