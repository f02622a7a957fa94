// Candidate retrieval from the datastore (SSSD Algorithm 2) and fusion of all
// sources into one draft tree (SSSD Algorithm 3).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "input_trie.h"
#include "sub_index.h"

namespace drafter {

// Every knob of the drafting algorithm. Defaults follow the SSSD paper where
// it gives a value; the Python DraftConfig documents each field.
struct DraftConfig {
  int32_t input_max_prefix = 4;            // P: input suffixes of length 1..P are matched
  int32_t input_max_depth = 16;            // longest path kept in a request's input trie
  int32_t datastore_max_prefix = 4;        // longest context suffix looked up in the datastore
  int32_t datastore_min_prefix = 1;        // shortest context suffix looked up
  int32_t datastore_samples = 100;         // continuations sampled per prefix, split over sub-indices
  int32_t datastore_max_continuation = 16; // tokens taken after each sampled match
  int32_t datastore_min_tree_nodes = 50;   // stop shortening the prefix once the tree has this many
  double input_weight = 0.6;               // scale of input-trie probabilities
  double input_child_discount_base = 0.6;  // per-level discount of input paths: base + per_match * m
  double input_child_discount_per_match = 0.1;
  double datastore_weight = 1.0;           // scale of datastore probabilities
  double datastore_child_discount = 1.0;   // per-level discount of datastore paths
  int32_t max_budget = 256;                // largest accepted draft budget
};

// Throws std::invalid_argument naming the first field out of range.
void validate(const DraftConfig& config);

// An immutable set of sub-indices, shared by every drafting call that loaded it.
struct Datastore {
  std::vector<std::shared_ptr<const SubIndex>> sub_indices;  // oldest first; all same vocab
  int64_t num_tokens() const;
  int64_t resident_bytes() const;
};

// Count-weighted tree of sampled continuations, rebuilt for every call.
class CandidateTree {
 public:
  static constexpr int32_t kRoot = 0;
  CandidateTree() { clear(); }
  void clear();
  // Adds one sampled continuation: counts +1 along its path (root included).
  void insert(const int32_t* tokens, int32_t len);
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }
  int32_t token(int32_t node) const { return nodes_[node].token; }
  uint32_t count(int32_t node) const { return nodes_[node].count; }
  int32_t first_child(int32_t node) const { return nodes_[node].first_child; }
  int32_t next_sibling(int32_t node) const { return nodes_[node].next_sibling; }

 private:
  struct Node {
    int32_t token;         // edge token from the parent; -1 for the root
    uint32_t count;        // sampled continuations passing through this node
    int32_t first_child;   // newest child or -1
    int32_t next_sibling;  // next older sibling or -1
  };
  std::vector<Node> nodes_;
};

// Fills `tree` with continuations of the context's suffixes, longest first,
// until it holds datastore_min_tree_nodes non-root nodes (SSSD Algorithm 2).
// Continuations are capped at min(datastore_max_continuation, max_len) tokens.
void retrieve_datastore(const Datastore& datastore, const int32_t* context, int64_t context_len,
                        const DraftConfig& config, int32_t max_len, CandidateTree& tree);

// A draft tree in breadth-first order: parents[i] < i, -1 = child of the root.
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;
  std::vector<float> scores;
};

// Reusable per-thread buffers so that drafting allocates nothing in steady state.
struct DraftScratch {
  CandidateTree datastore_tree;
  std::vector<int32_t> children;
  std::vector<int32_t> order;
  std::vector<int32_t> remap;
};

// Merges the input-trie matches and the datastore tree into at most `budget`
// draft nodes with a priority queue (SSSD Algorithm 3). Deterministic.
void fuse(const InputTrie* trie, const CandidateTree* datastore_tree, const DraftConfig& config,
          int32_t budget, DraftScratch& scratch, Draft& out);

}  // namespace drafter
