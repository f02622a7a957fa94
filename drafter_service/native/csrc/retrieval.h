// Retrieval: the datastore's candidates for one context, a CandidateTree of sampled
// continuations (SSSD Algorithm 2). (The input's are the suffix nodes of the request's
// input trie, which fusion reads itself: fusion.h.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "candidate_tree.h"
#include "draft_config.h"
#include "sub_index.h"

namespace drafter {

// An immutable set of sub-indices, shared by every drafting call that loaded it.
struct Datastore {
  std::vector<std::shared_ptr<const SubIndex>> sub_indices;  // oldest first; all same vocab
  // sub_indices[0, base_count) are the base (pinned corpora) and the rest the live
  // (learned) data. With both present, each is its own source with its own samples
  // and candidate tree, so a large base cannot outvote fresh live data; 0 (or all):
  // one source.
  size_t base_count = 0;
  bool split() const { return base_count > 0 && base_count < sub_indices.size(); }
  int64_t num_tokens() const;
  int64_t resident_bytes() const;
};

// A suffix array row chosen for sampling, before its continuation is read.
struct SampledRow {
  int64_t row;  // row of sub-index `sub`'s suffix array, inside the prefix's range
  size_t sub;   // index into Datastore::sub_indices
};

// Reusable buffers of retrieve_sub_indices; contents are meaningless between calls.
struct RetrievalScratch {
  std::vector<SaRange> ranges;          // per sub-index and prefix length
  std::vector<SampledRow> sample_rows;  // rows sampled for one prefix length
  std::vector<Sample> samples;          // continuations sampled for one prefix length
};

// Fills `tree` with continuations of the context's suffixes found in
// datastore.sub_indices[begin, end), longest first, until it holds
// datastore_min_tree_nodes non-root nodes (SSSD Algorithm 2). Continuations are
// capped at min(datastore_max_continuation, max_len) tokens.
void retrieve_sub_indices(const Datastore& datastore, size_t begin, size_t end,
                          const int32_t* context, int64_t context_len, const DraftConfig& config,
                          int32_t max_len, RetrievalScratch& scratch, CandidateTree& tree);

}  // namespace drafter
