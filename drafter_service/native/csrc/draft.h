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
  int32_t datastore_max_continuation = 8;  // tokens taken after each sampled match
  int32_t datastore_min_tree_nodes = 100;  // stop shortening the prefix once the tree has this many
  double input_weight = 0.6;               // scale of input-trie probabilities
  double input_child_discount_base = 0.6;  // per-level discount of input paths: base + per_match * m
  double input_child_discount_per_match = 0.1;
  double datastore_weight = 1.0;           // scale of datastore probabilities
  double datastore_child_discount = 1.0;   // per-level discount of datastore paths
  int32_t max_budget = 256;                // largest accepted draft budget
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
// fuse() and retrieve_datastore() never index by the budget (<= 0 drafts
// nothing; a large one is bounded by the candidates found). It keeps a call's
// work under max_budget and is the library API's error; behind the service,
// which refuses bad budgets at its own boundary, it never fires.
void check_budgets(const int32_t* budgets, int64_t n, const DraftConfig& config);

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

// One sampled continuation: tokens[0, len) of a sub-index text.
struct Sample {
  const int32_t* tokens;
  int32_t len;
};

// A suffix array row chosen for sampling, before its continuation is read.
struct SampledRow {
  int64_t row;  // row of sub-index `sub`'s suffix array, inside the prefix's range
  size_t sub;   // index into Datastore::sub_indices
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
  int32_t token(int32_t node) const { return nodes_[static_cast<size_t>(node)].token; }
  uint32_t count(int32_t node) const { return nodes_[static_cast<size_t>(node)].count; }
  // Materializes the node's children on first use (logically const).
  int32_t first_child(int32_t node) const;
  // Valid for a node handed out by first_child/next_sibling.
  int32_t next_sibling(int32_t node) const {
    return nodes_[static_cast<size_t>(node)].next_sibling;
  }

 private:
  struct Node {
    int32_t token;         // edge token from the parent; -1 for the root
    uint32_t count;        // samples through this node = hi - lo
    int32_t first_child;   // -1: none; kUnexpanded: not materialized yet
    int32_t next_sibling;  // next child of the same parent (greater token) or -1
    int32_t lo, hi;        // the node's samples: samples_[lo, hi)
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

// A draft tree in breadth-first order: parents[i] < i, -1 = child of the root.
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;
  std::vector<float> scores;
  // kScoreFeatures values per node, row-major in ScoreFeature order; filled only when
  // fuse() is asked to explain (tools and offline training), else empty.
  std::vector<double> features;
};

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
  kScoreFeatures
};

// Where the context's last m tokens occur in a request's input trie (m = 1..P, at
// index m - 1): the trie node of that m-gram and how many of its occurrences have a
// continuation in the trie (the denominator of its children's probabilities).
struct InputMatch {
  int32_t node;      // -1: the m-gram does not occur (with a continuation) in the trie
  double continued;  // occurrences followed by at least one more token, >= 0
};

// Records used inside fuse(); declared here so DraftScratch can own them.
namespace fusion {

enum class Source : uint8_t { kDatastore, kInput, kLive };  // kLive: a split datastore's live part

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
  double score;   // the queue's key: the learned path probability, or the hand score
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

// Child of a member, gathered before grouping by token.
struct Offer {
  int32_t token;
  int32_t node;
  double score;
  Source source;
  int32_t order;  // position among the offers of one expansion (ties by token keep it)
  double discount;
  double parent_count;
  int32_t match;
};

}  // namespace fusion

// Reusable per-thread buffers so that drafting allocates nothing in steady
// state. Contents are meaningless between calls.
struct DraftScratch {
  CandidateTree datastore_tree;         // the whole datastore, or a split one's base
  CandidateTree live_tree;              // a split datastore's live sub-indices
  std::vector<SaRange> ranges;          // per sub-index and prefix length
  std::vector<SampledRow> sample_rows;  // rows sampled for one prefix length
  std::vector<Sample> samples;          // continuations sampled for one prefix length
  std::vector<int32_t> children;
  std::vector<int32_t> order;
  std::vector<int32_t> remap;
  std::vector<int32_t> depth_start;     // counting sort of draft nodes by depth
  std::vector<InputMatch> matches;      // input-trie matches of the context, m = 1..P
  std::vector<fusion::Member> members;  // members of every candidate pushed
  std::vector<fusion::Offer> offers;    // children of one expansion
  std::vector<fusion::DraftNode> nodes; // the draft being built; [0] is the root
  std::vector<fusion::Candidate> heap;  // the priority queue
  std::vector<double> feature_pool;     // kScoreFeatures per candidate (explain only)
  std::vector<double> group_features;   // kScoreFeatures per candidate of one expansion
  std::vector<fusion::Candidate> group; // the candidates of one expansion, before pushing
};

// Fills scratch.datastore_tree with continuations of the context's suffixes, longest first,
// until it holds datastore_min_tree_nodes non-root nodes (SSSD Algorithm 2).
// Continuations are capped at min(datastore_max_continuation, max_len) tokens.
void retrieve_datastore(const Datastore& datastore, const int32_t* context, int64_t context_len,
                        const DraftConfig& config, int32_t max_len, DraftScratch& scratch);

// The same over datastore.sub_indices[begin, end) only, into `tree`.
void retrieve_sub_indices(const Datastore& datastore, size_t begin, size_t end,
                          const int32_t* context, int64_t context_len, const DraftConfig& config,
                          int32_t max_len, DraftScratch& scratch, CandidateTree& tree);


// The committed context's matches: the trie's own suffix nodes, leaving out the
// occurrence at the very end of the input, which has no continuation yet.
void committed_matches(const InputTrie& trie, const DraftConfig& config,
                       std::vector<InputMatch>& out);

// Merges the input-trie matches and the datastore tree into at most `budget`
// draft nodes with a priority queue (SSSD Algorithm 3). Deterministic. A candidate's
// score is its path's hand-set SSSD score, or with config.node_score the product of
// the learned probabilities along its path. `context[0, context_len)` ends the
// context (its last two tokens are read, for the n-gram features). With `explain`,
// out.features holds every node's ScoreFeature values (same tree).
void fuse(const InputTrie* trie, const std::vector<InputMatch>& matches,
          const CandidateTree* datastore_tree, const DraftConfig& config, int32_t budget,
          DraftScratch& scratch, Draft& out, const CandidateTree* live_tree,
          const int32_t* context, int64_t context_len, bool explain = false);
// Without a live tree.
void fuse(const InputTrie* trie, const std::vector<InputMatch>& matches,
          const CandidateTree* datastore_tree, const DraftConfig& config, int32_t budget,
          DraftScratch& scratch, Draft& out);

}  // namespace drafter
