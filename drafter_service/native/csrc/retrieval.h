// Retrieval: a source's candidates for one context as a CandidateTree, the
// count-weighted tree of the continuations sampled for it, and the datastore's (SSSD
// Algorithm 2). (The input's are the suffix nodes of the request's input trie, which
// fusion reads itself: fusion.h.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "draft_config.h"
#include "sub_index.h"

namespace drafter {

// One sampled continuation: tokens[0, len) of a sub-index text.
struct Sample {
  const int32_t* tokens;
  int32_t len;
};

// Count-weighted tree of sampled continuations, rebuilt for every call: the
// count of a node is the number of samples whose path passes through it (the
// root counts every sample, empty ones too).
//
// Stored implicitly: the samples are kept in lexicographic order, so the
// samples below a node at depth d are one contiguous range sharing their first
// d tokens, and a node's children are the runs of equal tokens at position d
// of that range. Nodes are materialized when their parent's children are
// first asked for, so a call pays for the few nodes fusion visits, not for the
// hundreds of single-sample tails it never reaches. Node ids are stable once
// handed out; children are listed in ascending token order.
class CandidateTree {
 public:
  static constexpr int32_t kRoot = 0;
  CandidateTree() { clear(); }
  void clear();
  // Adds sampled continuations (any order). A batch that sorts after every sample
  // held is counted in one pass; otherwise it is sorted (each run of rows from one
  // suffix array range arrives sorted) and merged with the samples held.
  void add(const Sample* samples, size_t n);
  // Nodes of the whole tree, root included, materialized or not.
  int32_t num_nodes() const { return num_nodes_; }
  // Longest context suffix whose matches were sampled (0: none); set by retrieval.
  int32_t matched_prefix() const { return matched_prefix_; }
  void set_matched_prefix(int32_t m) { matched_prefix_ = m; }
  int32_t token(int32_t node) const { return nodes_[node].token; }
  uint32_t count(int32_t node) const { return nodes_[node].hi - nodes_[node].lo; }
  // Materializes the node's children on first use (logically const). Inline: fusion
  // asks for every member's children, and the check is all a materialized node costs.
  int32_t first_child(int32_t node) const {
    if (nodes_[node].first_child == kUnexpanded) expand(node);
    return nodes_[node].first_child;
  }
  // Valid for a node handed out by first_child/next_sibling.
  int32_t next_sibling(int32_t node) const { return nodes_[node].next_sibling; }

 private:
  struct Node {
    int32_t token;         // edge token from the parent; -1 for the root
    int32_t first_child;   // -1: none; kUnexpanded: not materialized yet
    int32_t next_sibling;  // next child of the same parent (greater token) or -1
    int32_t lo, hi;        // the node's samples: samples_[lo, hi), its count hi - lo
    int32_t depth;         // tokens on the path from the root
  };
  static constexpr int32_t kUnexpanded = -2;
  void expand(int32_t node) const;

  std::vector<Sample> samples_;  // sorted lexicographically (a prefix before its extensions)
  std::vector<Sample> merged_;   // add()'s merge buffer; meaningless between calls
  mutable std::vector<Node> nodes_;  // [0] is the root; grows as nodes are materialized
  int32_t num_nodes_ = 1;
  int32_t matched_prefix_ = 0;
};

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
