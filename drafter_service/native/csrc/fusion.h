// Fusion of every source's candidates into one draft tree (SSSD Algorithm 3): the records
// it builds a draft from, shared with node scoring (the ScoreFeature columns of its
// candidates, the draft it produces and its working records), its inputs and fuse().
#pragma once

#include <cstdint>
#include <vector>

#include "draft_config.h"
#include "input_trie.h"
#include "retrieval.h"

namespace drafter {

// What fusion knows about a candidate when it offers it: the evidence of every source
// behind its path, its siblings, and whether the request's own context holds it. These
// are the inputs of the learned node score (DraftConfig::node_score) and what explain
// reports. For each source, "count" is the candidate's own count there (samples or
// input occurrences through it) and "parent" the count its conditional probability is
// taken over (the input member with the longest match speaks for the input trie);
// present, log_cond = log(count) - log(parent), log(1 + count) and log(1 + parent) are
// all 0 where the source does not offer it. "Hand" is the hand-set SSSD score.
enum ScoreFeature : int32_t {
  kFeatDepth = 0,       // 1 = child of the root
  kFeatLogSiblings,     // log(candidates offered under the same draft parent, itself included)
  kFeatLogOverBest,     // log(hand score / the best sibling's hand score), <= 0
  kFeatLogHandCond,     // log(hand score / the draft parent's hand score)
  kFeatInputPresent,
  kFeatInputLogCond,
  kFeatInputLogCount,
  kFeatInputLogParent,
  kFeatBasePresent,     // the datastore (a split datastore's base)
  kFeatBaseLogCond,
  kFeatBaseLogCount,
  kFeatBaseLogParent,
  kFeatLivePresent,     // a split datastore's live part
  kFeatLiveLogCond,
  kFeatLiveLogCount,
  kFeatLiveLogParent,
  kFeatInputMatch,      // longest context suffix an input member continues (0: none)
  kFeatInputMembers,    // input matches (of different lengths) behind the candidate
  kFeatBasePrefix,      // longest context suffix the datastore tree was sampled for
  kFeatLivePrefix,      // the same for the live tree
  kFeatUnigramSeen,     // 1 if the request's input trie holds the token,
  kFeatBigramSeen,      // the token after the one before it (its parent, or the context's
  kFeatTrigramSeen,     // last token), the token after the two before it
  kFeatRecentPresent,   // the recent tier (the other requests in flight)
  kFeatRecentLogCond,
  kFeatRecentLogCount,
  kFeatRecentLogParent,
  kFeatRecentPrefix,    // longest context suffix the recent tier's matches share
  kScoreFeatures
};

// A draft tree in breadth-first order: parents[i] < i, -1 = child of the root.
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;
  std::vector<float> scores;
  // kScoreFeatures values per node, row-major in ScoreFeature order; filled only when
  // fuse() is asked to explain (tools and offline training), else empty.
  std::vector<double> features;
};

namespace fusion {

// kLive: a split datastore's live part; kRecent: the recent tier (the requests in flight).
enum class Source : uint8_t { kDatastore, kInput, kLive, kRecent };

// One source's node standing behind a draft node (or candidate): the same
// path, as seen by that source.
struct Member {
  int32_t node;          // node in the source tree
  Source source;
  double score;          // this source's score of the path
  double denominator;    // count(node) (count(u) - 1 for an input match root), before smoothing
  double multiplier;     // a child's score = count(child) / (denominator + smoothing) * multiplier
  double discount;       // per-level discount of this source
  double parent_count;   // the count this member's own score was taken over
  int32_t match;         // input: length of the context suffix the path continues; else 0
};

// A child waiting in the queue: draft parent + token, backed by members[begin, end).
struct Candidate {
  double score;   // the queue's key: the learned path probability, or the hand score (score_group)
  uint64_t seq;   // push order; breaks score ties (earlier first)
  int32_t token;
  int32_t draft_parent;  // internal index, 0 = root
  int32_t begin, end;    // range in the member pool
  double hand;           // hand-set SSSD score: the most confident member's
  double log_hand;       // its log (-100 for 0), set with the features
  int32_t features;      // row in the feature pool (explain only), else -1
  // Input-trie node of [token before, token] when the n-gram features looked it up
  // (-1: absent), else kNotLookedUp; a chosen node reuses it.
  int32_t bigram;
};
constexpr int32_t kNotLookedUp = -2;

struct DraftNode {
  int32_t token;
  int32_t parent;  // internal index; 0 is the root
  int32_t depth;   // 1 for children of the root
  double score;    // what the draft reports: as Candidate::score
  double log_hand; // as Candidate's: what its children's hand conditional is taken over
  // Input-trie nodes of [token] and [token before, token] (-1: absent, or not needed):
  // where its children's n-grams start.
  int32_t unigram, bigram;
  int32_t features;  // as Candidate's
};

// Child of a member, gathered before grouping by token: the member it becomes.
struct Offer {
  int32_t token;
  int32_t order;  // position among the offers of one expansion (ties by token keep it)
  Member member;
};

}  // namespace fusion

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
