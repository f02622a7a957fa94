#include "retrieval.h"

#include <algorithm>

namespace drafter {

int64_t Datastore::num_tokens() const {
  int64_t n = 0;
  for (const auto& s : sub_indices) n += s->num_tokens();
  return n;
}

int64_t Datastore::resident_bytes() const {
  int64_t n = 0;
  for (const auto& s : sub_indices) n += s->resident_bytes();
  return n;
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
