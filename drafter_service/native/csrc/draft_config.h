// The drafting algorithm's knobs (DraftConfig) and the checks of a config and of a
// call's budgets.
#pragma once

#include <cstdint>
#include <vector>

namespace drafter {

// Every knob of the drafting algorithm. Defaults follow the SSSD paper where
// it gives a value; the Python DraftConfig documents each field.
struct DraftConfig {
  int32_t input_max_prefix = 4;            // P: input suffixes of length 1..P are matched
  int32_t input_max_depth = 16;            // longest path kept in a request's input trie
  int32_t datastore_max_prefix = 4;        // longest context suffix looked up in the datastore
  int32_t datastore_min_prefix = 1;        // shortest context suffix looked up
  int32_t datastore_samples = 100;         // continuations sampled per prefix, split over sub-indices
  int32_t datastore_max_continuation = 8;  // tokens taken after each sampled match
  int32_t datastore_min_tree_nodes = 100;  // stop shortening the prefix once the tree has this many
  double input_weight = 0.6;               // scale of input-trie probabilities
  double input_child_discount_base = 0.6;  // per-level discount of input paths: base + per_match * m
  double input_child_discount_per_match = 0.1;
  double datastore_weight = 1.0;           // scale of datastore probabilities
  double datastore_child_discount = 1.0;   // per-level discount of datastore paths
  int32_t max_budget = 256;                // largest accepted draft budget
  // The recent tier (recent_tier.h): continuations from the other requests in flight.
  int32_t recent_samples = 16;     // continuations taken per draft; 0: no recent tier
  int32_t recent_min_match = 2;    // K: tokens a match needs (the index's key)
  int32_t recent_max_match = 32;   // longest match measured
  int32_t recent_candidates = 64;  // matches weighed per draft, newest first
  int32_t recent_held_tokens = 262144;  // stored generations not yet folded, held at most
  // Shrinkage of conditional probabilities: count(child) / (count(node) + k).
  // Small counts (deep nodes, rare prefixes) are over-confident; 0 = the paper.
  double input_smoothing = 0.0;
  double datastore_smoothing = 2.0;
  // A learned node score: node_score[0] + sum of node_score[1 + f] * ScoreFeature f is
  // the logit of P(node accepted | its parent accepted). Empty: the hand-set score.
  std::vector<double> node_score;
};

// Throws std::invalid_argument naming the first field out of range.
void validate(const DraftConfig& config);

// Throws std::invalid_argument naming the first of budgets[0, n) outside
// [0, config.max_budget] (and its index when n > 1). The native core's one budget
// check, run by both of its entry points (Drafter::draft_batch and the bindings'
// draft_context) before any state changes. It is not what keeps memory safe:
// fuse() and retrieve_sub_indices() never index by the budget (<= 0 drafts
// nothing; a large one is bounded by the candidates found). It keeps a call's
// work under max_budget and is the library API's error; behind the service,
// which refuses bad budgets at its own boundary, it never fires.
void check_budgets(const int32_t* budgets, int64_t n, const DraftConfig& config);

// Throws std::invalid_argument naming the first of tokens[0, n) outside [0, vocab_size).
void check_tokens(const int32_t* tokens, int64_t n, int32_t vocab_size);

}  // namespace drafter
