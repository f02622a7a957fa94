#include "node_score.h"

#include <algorithm>
#include <cmath>

namespace drafter {

using fusion::Candidate;
using fusion::DraftNode;
using fusion::Member;
using fusion::Source;

namespace {

// log(n) of the integer counts the features are made of: a table of std::log's own
// values below kLogTable, std::log above (and for anything not a whole number).
// The table is built on first use (a function-local static of group_features: nothing
// runs at module load; std::log is not constexpr, and a table of literals would not be
// std::log's own values on every libm). group_features reaches it once per expansion,
// so the lookups inline without a guard check.
constexpr int32_t kLogTable = 4096;
struct LogTable {
  double of[kLogTable];
  LogTable() {
    of[0] = 0.0;
    for (int32_t i = 1; i < kLogTable; ++i) of[i] = std::log(double(i));
  }
  double log_count(double n) const {
    if (n >= 1.0 && n < kLogTable) {
      const auto i = static_cast<size_t>(n);
      if (static_cast<double>(i) == n) return of[i];
    }
    return std::log(n);
  }
};

// log of a hand-set score; a zero score (a source weighted 0) gets a finite floor.
constexpr double kLogFloor = -100.0;
double log_score(double s) { return s > 0.0 ? std::log(s) : kLogFloor; }

// One source's four ScoreFeature values (present, log_cond, log1p count, log1p parent)
// from `first` on.
void source_features(const LogTable& logs, double count, double parent, double* first) {
  if (count <= 0.0 || parent <= 0.0) return;  // left 0: the source does not offer it
  first[0] = 1.0;
  first[1] = logs.log_count(count) - logs.log_count(parent);
  first[2] = logs.log_count(count + 1.0);
  first[3] = logs.log_count(parent + 1.0);
}

// The member-backed ScoreFeature values of a candidate backed by members [begin, end):
// everything but the sibling, hand-score and n-gram columns, which need the whole
// expansion and the trie. A candidate's member holds its node's count as `denominator`.
void member_features(const LogTable& logs, const Member* begin, const Member* end,
                     int32_t depth, const FusionInputs& in, double* f) {
  std::fill(f, f + kScoreFeatures, 0.0);
  f[kFeatDepth] = depth;
  f[kFeatBasePrefix] = in.datastore_tree != nullptr ? in.datastore_tree->matched_prefix() : 0;
  f[kFeatLivePrefix] = in.live_tree != nullptr ? in.live_tree->matched_prefix() : 0;
  f[kFeatRecentPrefix] = in.recent_tree != nullptr ? in.recent_tree->matched_prefix() : 0;
  // Each source's four columns, from its present column on, in Source order; the input's
  // are its longest-match member's, written after the loop.
  constexpr int32_t kFirstColumn[] = {kFeatBasePresent, kFeatInputPresent, kFeatLivePresent,
                                      kFeatRecentPresent};
  double input_count = 0.0, input_parent = 0.0;
  for (const Member* m = begin; m != end; ++m) {
    if (m->source != Source::kInput) {
      const auto column = kFirstColumn[static_cast<size_t>(m->source)];
      source_features(logs, m->denominator, m->parent_count, f + column);
      continue;
    }
    f[kFeatInputMembers] += 1.0;
    if (m->match > f[kFeatInputMatch]) {
      f[kFeatInputMatch] = m->match;
      input_count = m->denominator;
      input_parent = m->parent_count;
    }
  }
  source_features(logs, input_count, input_parent, f + kFeatInputPresent);
}

// The n-gram columns. A candidate an input match offers extends a string the trie holds
// (the matched context suffix, the path, the token), and so every shorter n-gram that
// ends it: its unigram and bigram, and its trigram once that string has 3 tokens. Only
// the others are looked up (a trie lookup is a likely cache miss), and only while the
// shorter one is held: the trie holds every substring of an n-gram it holds. The bigram
// node found is kept in the candidate, for its children's trigrams if it is chosen.
void ngram_features(const InputTrie& trie, Candidate& c, const DraftNode& parent, double* f) {
  const double input_len = f[kFeatInputMatch] + f[kFeatDepth];  // 0 + depth: no input
  bool unigram = true, bigram = true;
  if (f[kFeatInputMatch] <= 0.0) {
    unigram = trie.holds(c.token);
    c.bigram = bigram_node(trie, parent, c.token);
    bigram = c.bigram >= 0;
  }
  f[kFeatUnigramSeen] = unigram ? 1.0 : 0.0;
  f[kFeatBigramSeen] = bigram ? 1.0 : 0.0;
  f[kFeatTrigramSeen] = (f[kFeatInputMatch] > 0.0 && input_len >= 3.0) ||
                                (bigram && parent.bigram >= 0 &&
                                 trie.child(parent.bigram, c.token) >= 0)
                            ? 1.0
                            : 0.0;
}

// P(accepted | parent accepted) under the learned node score: the logistic of
// w[0] + ((lane 0 + lane 1) + (lane 2 + lane 3)), where lane k sums w[1 + f] * x[f] over
// the features f = k (mod 4) in feature order, from 0. Four independent sums instead of
// one chain of kScoreFeatures additions; the reference adds in the same order.
double learned_probability(const std::vector<double>& weights, const double* x) {
  static_assert(kScoreFeatures % 4 == 0, "the lanes take the features four at a time");
  const double* w = weights.data() + 1;
  double lane0 = 0.0, lane1 = 0.0, lane2 = 0.0, lane3 = 0.0;  // registers, not an array
  for (int32_t f = 0; f < kScoreFeatures; f += 4) {
    lane0 += w[f] * x[f];
    lane1 += w[f + 1] * x[f + 1];
    lane2 += w[f + 2] * x[f + 2];
    lane3 += w[f + 3] * x[f + 3];
  }
  const double z = weights[0] + ((lane0 + lane1) + (lane2 + lane3));
  return 1.0 / (1.0 + std::exp(-z));
}

}  // namespace

void score_group(const std::vector<double>& weights, const DraftNode& parent, Candidate* group,
                 size_t n, const double* features) {
  if (weights.empty()) {
    for (size_t i = 0; i < n; ++i) group[i].score = group[i].hand;
    return;
  }
  // A path's learned score is the product of its nodes' probabilities, each <= 1,
  // so a node never outranks its parent and best-first yields a tree.
  for (size_t i = 0; i < n; ++i) {
    group[i].score =
        parent.score * learned_probability(weights, features + i * kScoreFeatures);
  }
}

void group_features(const FusionInputs& in, const Member* pool, const DraftNode& parent,
                    Candidate* group, size_t n, std::vector<double>& features) {
  if (in.trie != nullptr) {
    // The n-gram lookups below are likely cache misses (a request's trie is cold when
    // its draft starts): issue them for the whole group first, so they overlap. (Not a
    // function of their own: one that only prefetches has no effect the compiler must
    // keep, and GCC drops its call.)
    for (size_t i = 0; i < n; ++i) {
      in.trie->prefetch_holds(group[i].token);
      in.trie->prefetch_child(InputTrie::kRoot, group[i].token);
      if (parent.unigram >= 0) in.trie->prefetch_child(parent.unigram, group[i].token);
      if (parent.bigram >= 0) in.trie->prefetch_child(parent.bigram, group[i].token);
    }
  }
  features.resize(n * kScoreFeatures);
  static const LogTable logs;
  // The best sibling's log is the largest of the siblings' logs, and the parent's was
  // computed when it was a candidate: one log per candidate, none per expansion.
  double log_best = -HUGE_VAL;
  for (size_t i = 0; i < n; ++i) {
    Candidate& c = group[i];
    c.log_hand = log_score(c.hand);
    log_best = std::max(log_best, c.log_hand);
  }
  const double log_siblings = logs.log_count(static_cast<double>(n));
  for (size_t i = 0; i < n; ++i) {
    Candidate& c = group[i];
    double* f = features.data() + i * kScoreFeatures;
    member_features(logs, pool + c.begin, pool + c.end, parent.depth + 1, in, f);
    f[kFeatLogSiblings] = log_siblings;
    f[kFeatLogOverBest] = c.log_hand - log_best;
    f[kFeatLogHandCond] = c.log_hand - parent.log_hand;
    if (in.trie != nullptr) ngram_features(*in.trie, c, parent, f);
  }
}

}  // namespace drafter
