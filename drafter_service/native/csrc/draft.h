// Drafting one request: retrieval of every source's candidates (retrieval.h, SSSD
// Algorithm 2) and their fusion into one draft tree (fusion.h, SSSD Algorithm 3),
// with the buffers a drafting thread reuses across calls.
#pragma once

#include <cstdint>
#include <vector>

#include "candidate_tree.h"
#include "draft_config.h"
#include "fusion.h"
#include "fusion_records.h"
#include "input_trie.h"
#include "recent_tier.h"
#include "retrieval.h"
#include "score_features.h"

namespace drafter {

// Reusable per-thread buffers so that drafting allocates nothing in steady
// state. Contents are meaningless between calls.
struct DraftScratch {
  CandidateTree datastore_tree;     // the whole datastore, or a split datastore's base
  CandidateTree live_tree;          // a split datastore's live sub-indices
  CandidateTree recent_tree;        // the recent tier's continuations
  RecentScratch recent;
  std::vector<InputMatch> matches;  // input-trie matches of the context, m = 1..P
  RetrievalScratch retrieval;
  FusionScratch fusion;
};

// Fills scratch.datastore_tree with continuations of the context's suffixes, longest first,
// until it holds datastore_min_tree_nodes non-root nodes (SSSD Algorithm 2).
// Continuations are capped at min(datastore_max_continuation, max_len) tokens.
inline void retrieve_datastore(const Datastore& datastore, const int32_t* context,
                               int64_t context_len, const DraftConfig& config, int32_t max_len,
                               DraftScratch& scratch) {
  retrieve_sub_indices(datastore, 0, datastore.sub_indices.size(), context, context_len, config,
                       max_len, scratch.retrieval, scratch.datastore_tree);
}

}  // namespace drafter
