// Node scoring: the ScoreFeature values of fusion's candidates, and their queue keys
// (the hand-set SSSD score, or the learned node score of DraftConfig::node_score).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fusion.h"
#include "input_trie.h"

namespace drafter {

// How fusion ranks candidates: sets Candidate::score of one expansion's candidates,
// group[0, n) offered under `parent`. Without `weights` (DraftConfig::node_score empty)
// the hand-set SSSD score: a candidate's is its most confident member's (its hand
// score). With them the learned node score: a path's score is the product of its
// nodes' learned probabilities P(accepted | parent accepted), the logistic of `weights`
// over the node's ScoreFeature values, `features` (kScoreFeatures per candidate; read
// only by the learned score, and computed only where something reads them: it, or
// explain).
void score_group(const std::vector<double>& weights, const fusion::DraftNode& parent,
                 fusion::Candidate* group, size_t n, const double* features);

// The ScoreFeature values of the candidates of one expansion, group[0, n) under
// `parent` (members in pool), into `features` (kScoreFeatures per candidate): each
// one's members, then the columns that compare it with its siblings, then (with an
// input trie) the n-gram columns, whose trie lookups are prefetched for the whole
// group first. Sets each candidate's log_hand, and its bigram where the n-gram columns
// looked it up.
void group_features(const FusionInputs& in, const fusion::Member* pool,
                    const fusion::DraftNode& parent, fusion::Candidate* group, size_t n,
                    std::vector<double>& features);

// The trie node of [parent's token, token] (-1: absent), from the parent's unigram
// node; only a held token can end a bigram the trie holds.
inline int32_t bigram_node(const InputTrie& trie, const fusion::DraftNode& parent,
                           int32_t token) {
  return parent.unigram >= 0 && trie.holds(token) ? trie.child(parent.unigram, token) : -1;
}

}  // namespace drafter
