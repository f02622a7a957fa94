// Fusion of every source's candidates into one draft tree (SSSD Algorithm 3).
#pragma once

#include <cstdint>
#include <vector>

#include "candidate_tree.h"
#include "draft_config.h"
#include "fusion_records.h"
#include "input_trie.h"

namespace drafter {

// What one fuse() call drafts from (an aggregate: {config, budget, ...}). The config and
// the budget are required; each source is optional (null: absent).
struct FusionInputs {
  const DraftConfig& config;
  int32_t budget;  // at most this many draft nodes; <= 0 drafts nothing
  // The input source: the request's trie over the context, whose suffix nodes (the
  // context's last m tokens, m = input_max_prefix..1) offer their children, from the
  // longest suffix to the shortest. The trie also answers the n-gram features.
  const InputTrie* trie = nullptr;
  const CandidateTree* datastore_tree = nullptr;  // the datastore, or a split one's base
  const CandidateTree* live_tree = nullptr;       // a split datastore's live sub-indices
  const CandidateTree* recent_tree = nullptr;     // the recent tier's continuations
  // out.features: every node's ScoreFeature values (the same tree).
  bool explain = false;
};

// Reusable buffers of fuse(), so that drafting allocates nothing in steady state.
// Contents are meaningless between calls.
struct FusionScratch {
  std::vector<int32_t> children;        // one member's children, before the cap
  std::vector<fusion::Member> members;  // members of every candidate pushed
  std::vector<fusion::Offer> offers;    // children of one expansion
  std::vector<fusion::DraftNode> nodes; // the draft being built; [0] is the root
  std::vector<fusion::Candidate> heap;  // the priority queue
  std::vector<double> feature_pool;     // kScoreFeatures per candidate (explain only)
  std::vector<double> group_features;   // kScoreFeatures per candidate of one expansion
  std::vector<fusion::Candidate> group; // the candidates of one expansion, before pushing
  std::vector<int32_t> depth_start;     // the output step's counting sort by depth,
  std::vector<int32_t> order;           // the nodes in breadth-first order,
  std::vector<int32_t> remap;           // and each one's row there
};

// Merges the input-trie matches and the datastore trees into at most `in.budget`
// draft nodes with a priority queue (SSSD Algorithm 3). Deterministic. A candidate's
// score is its path's hand-set SSSD score, or with config.node_score the product of
// the learned probabilities along its path (node_score.h).
void fuse(const FusionInputs& in, FusionScratch& scratch, Draft& out);

}  // namespace drafter
