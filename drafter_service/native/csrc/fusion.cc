#include "fusion.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace drafter {

namespace {

using fusion::Candidate;
using fusion::DraftNode;
using fusion::Member;
using fusion::Offer;
using fusion::Source;
using fusion::kNotLookedUp;

// Node scoring: the ScoreFeature values of fusion's candidates, and their queue keys
// (the hand-set SSSD score, or the learned node score of DraftConfig::node_score).

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

// The trie node of [parent's token, token] (-1: absent), from the parent's unigram
// node; only a held token can end a bigram the trie holds.
int32_t bigram_node(const InputTrie& trie, const DraftNode& parent, int32_t token) {
  return parent.unigram >= 0 && trie.holds(token) ? trie.child(parent.unigram, token) : -1;
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
  const double* w = weights.data() + 1;
  double lane0 = 0.0, lane1 = 0.0, lane2 = 0.0, lane3 = 0.0;  // registers, not an array
  int32_t f = 0;
  for (; f + 4 <= kScoreFeatures; f += 4) {
    lane0 += w[f] * x[f];
    lane1 += w[f + 1] * x[f + 1];
    lane2 += w[f + 2] * x[f + 2];
    lane3 += w[f + 3] * x[f + 3];
  }
  if (f < kScoreFeatures) lane0 += w[f] * x[f];
  if (f + 1 < kScoreFeatures) lane1 += w[f + 1] * x[f + 1];
  if (f + 2 < kScoreFeatures) lane2 += w[f + 2] * x[f + 2];
  const double z = weights[0] + ((lane0 + lane1) + (lane2 + lane3));
  return 1.0 / (1.0 + std::exp(-z));
}

// How fusion ranks candidates: sets Candidate::score of one expansion's candidates,
// group[0, n) offered under `parent`. Without `weights` (DraftConfig::node_score empty)
// the hand-set SSSD score: a candidate's is its most confident member's (its hand
// score). With them the learned node score: a path's score is the product of its
// nodes' learned probabilities P(accepted | parent accepted), the logistic of `weights`
// over the node's ScoreFeature values, `features` (kScoreFeatures per candidate; read
// only by the learned score, and computed only where something reads them: it, or
// explain).
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

// The ScoreFeature values of the candidates of one expansion, group[0, n) under
// `parent` (members in pool), into `features` (kScoreFeatures per candidate): each
// one's members, then the columns that compare it with its siblings, then (with an
// input trie) the n-gram columns, whose trie lookups are prefetched for the whole
// group first. Sets each candidate's log_hand, and its bigram where the n-gram columns
// looked it up.
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

// Fusion itself: best-first over the candidates so scored.

constexpr auto worse_first = [](const Candidate& a, const Candidate& b) {
  return a.score < b.score || (a.score == b.score && a.seq > b.seq);
};

// One fuse() call: its inputs and the buffers its steps share. Best-first
// over candidates: each source's root offers its children; every chosen candidate
// becomes a draft node whose members offer theirs.
class Fusion {
 public:
  Fusion(const FusionInputs& in, FusionScratch& scratch)
      : in_(in),
        featured_(!in.config.node_score.empty() || in.explain),
        s_(scratch) {
    s_.members.clear();
    s_.offers.clear();
    s_.nodes.clear();
    s_.heap.clear();
    s_.feature_pool.clear();
  }

  // Leaves the draft in scratch.nodes, in the order the nodes were chosen.
  void run() {
    offer_roots();
    push_root();
    grow();
  }

 private:
  void offer_roots();
  void push_root();
  void grow();
  void offer_children(const Member& m, int32_t cap);
  template <typename Tree>  // InputTrie or CandidateTree: the member's source's
  void offer_children(const Tree& tree, const Member& m, int32_t cap);
  void push_offers(int32_t draft_parent);

  const FusionInputs& in_;
  const bool featured_;  // features are computed only where something reads them
  FusionScratch& s_;
  uint64_t seq_ = 0;
};

// Offers the children of one member, at most `cap` of them: the draft nodes still to
// be chosen. With the hand-set score a member's lower-ranked children could only be
// chosen after `cap` better ones, so the tree is the same; with a learned score the
// candidates are defined this way (docs/algorithm.md).
void Fusion::offer_children(const Member& m, int32_t cap) {
  if (m.source == Source::kInput) return offer_children(*in_.trie, m, cap);
  const CandidateTree* tree = m.source == Source::kLive     ? in_.live_tree
                              : m.source == Source::kRecent ? in_.recent_tree
                                                            : in_.datastore_tree;
  offer_children(*tree, m, cap);
}

template <typename Tree>
void Fusion::offer_children(const Tree& tree, const Member& m, int32_t cap) {
  const double smoothing =
      m.source == Source::kInput ? in_.config.input_smoothing : in_.config.datastore_smoothing;
  const double denominator = m.denominator + smoothing;
  if (m.denominator <= 0.0 || cap <= 0) return;
  std::vector<int32_t>& kids = s_.children;
  kids.clear();
  for (int32_t c = tree.first_child(m.node); c != -1; c = tree.next_sibling(c)) {
    kids.push_back(c);
  }
  auto score_of = [&](int32_t c) { return tree.count(c) / denominator * m.multiplier; };
  if (kids.size() > static_cast<size_t>(cap)) {
    std::nth_element(kids.begin(), kids.begin() + cap, kids.end(), [&](int32_t a, int32_t b) {
      const double sa = score_of(a), sb = score_of(b);
      return sa > sb || (sa == sb && tree.token(a) < tree.token(b));
    });
    kids.resize(cap);
  }
  std::vector<Offer>& offers = s_.offers;
  for (int32_t c : kids) {
    const double score = score_of(c);
    offers.push_back({tree.token(c), static_cast<int32_t>(offers.size()),
                      {c, m.source, score, static_cast<double>(tree.count(c)),
                       score * m.discount, m.discount, m.denominator, m.match}});
  }
}

// Roots of the sources, in a fixed order: the datastore tree (a split datastore's
// base), its live tree, the recent tier's, then input matches from the longest suffix
// (P) to the shortest (1).
void Fusion::offer_roots() {
  // A root without samples (count 0) offers nothing: offer_children needs a denominator.
  const std::pair<const CandidateTree*, Source> trees[] = {
      {in_.datastore_tree, Source::kDatastore},
      {in_.live_tree, Source::kLive},
      {in_.recent_tree, Source::kRecent}};
  for (const auto& [tree, source] : trees) {
    if (tree == nullptr) continue;
    offer_children({CandidateTree::kRoot, source, 1.0,
                    static_cast<double>(tree->count(CandidateTree::kRoot)),
                    in_.config.datastore_weight, in_.config.datastore_child_discount, 0.0, 0},
                   in_.budget);
  }
  if (in_.trie == nullptr) return;
  for (int32_t m = in_.config.input_max_prefix; m >= 1; --m) {
    // The trie node of the context's last m tokens (-1: the input is shorter), and the
    // occurrences of that m-gram with a continuation, the denominator of its children's
    // probabilities: all but the one at the very end of the input.
    const int32_t node = in_.trie->suffix_node(m);
    if (node < 0) continue;
    const double continued = in_.trie->count(node) - 1.0;
    const double discount =
        in_.config.input_child_discount_base + in_.config.input_child_discount_per_match * m;
    offer_children({node, Source::kInput, 1.0, continued, in_.config.input_weight, discount,
                    0.0, m},
                   in_.budget);
  }
}

// The root: the context's last token (and the two last) start the n-grams, the trie's
// suffix nodes of length 1 and 2 (the trie is over the context).
void Fusion::push_root() {
  const bool ngrams = featured_ && in_.trie != nullptr;
  const int32_t unigram = ngrams ? in_.trie->suffix_node(1) : -1;
  const int32_t bigram = ngrams ? in_.trie->suffix_node(2) : -1;
  s_.nodes.push_back({-1, -1, 0, 1.0, 0.0, unigram, bigram, -1});  // log(hand 1) = 0
  push_offers(0);
}

// Best-first: every candidate is a distinct (parent, token), so each pop adds
// one draft node. With scores non-increasing along paths this selects the
// `budget` nodes of highest score that form a tree.
void Fusion::grow() {
  std::vector<DraftNode>& nodes = s_.nodes;
  std::vector<Candidate>& heap = s_.heap;  // max-heap under worse_first
  while (!heap.empty() && static_cast<int32_t>(nodes.size()) - 1 < in_.budget) {
    std::pop_heap(heap.begin(), heap.end(), worse_first);
    const Candidate cand = heap.back();
    heap.pop_back();
    const auto slot = static_cast<int32_t>(nodes.size());
    const DraftNode& parent = nodes[cand.draft_parent];
    // The trie nodes of its unigram and bigram, where its children's n-grams start: the
    // bigram its features looked up, if they did.
    int32_t unigram = -1, bigram = -1;
    if (featured_ && in_.trie != nullptr) {
      const InputTrie& trie = *in_.trie;
      unigram = trie.holds(cand.token) ? trie.child(InputTrie::kRoot, cand.token) : -1;
      bigram = cand.bigram != kNotLookedUp ? cand.bigram : bigram_node(trie, parent, cand.token);
    }
    nodes.push_back({cand.token, cand.draft_parent, parent.depth + 1, cand.score, cand.log_hand,
                     unigram, bigram, cand.features});
    // The draft nodes still to be chosen; the last node's children could never be.
    const int32_t remaining = in_.budget - slot;
    if (remaining <= 0) break;
    for (int32_t k = cand.begin; k < cand.end; ++k) {
      offer_children(s_.members[k], remaining);
    }
    push_offers(slot);
  }
}

// Groups the offers by token into candidates under `draft_parent` (their members into
// the pool, in the order in which sources offered; the hand score is the most confident
// member's), scores them and pushes them in ascending token order; to explain, each
// one's features into the feature pool.
void Fusion::push_offers(int32_t draft_parent) {
  std::vector<Offer>& offers = s_.offers;
  std::vector<Member>& pool = s_.members;
  std::vector<Candidate>& group = s_.group;
  std::sort(offers.begin(), offers.end(), [](const Offer& a, const Offer& b) {
    return a.token < b.token || (a.token == b.token && a.order < b.order);
  });
  group.clear();
  for (size_t i = 0; i < offers.size();) {
    const auto begin = static_cast<int32_t>(pool.size());
    double hand = 0.0;
    const int32_t token = offers[i].token;
    for (; i < offers.size() && offers[i].token == token; ++i) {
      hand = std::max(hand, offers[i].member.score);  // the most confident source decides
      pool.push_back(offers[i].member);
    }
    group.push_back({0.0, 0, token, draft_parent, begin, static_cast<int32_t>(pool.size()),
                     hand, 0.0, -1, kNotLookedUp});
  }
  offers.clear();
  const DraftNode parent = s_.nodes[draft_parent];
  if (featured_) {
    group_features(in_, pool.data(), parent, group.data(), group.size(), s_.group_features);
  }
  score_group(in_.config.node_score, parent, group.data(), group.size(),
              featured_ ? s_.group_features.data() : nullptr);
  for (size_t i = 0; i < group.size(); ++i) {
    Candidate c = group[i];
    if (in_.explain) {
      const double* f = s_.group_features.data() + i * kScoreFeatures;
      c.features = static_cast<int32_t>(s_.feature_pool.size() / kScoreFeatures);
      s_.feature_pool.insert(s_.feature_pool.end(), f, f + kScoreFeatures);
    }
    c.seq = seq_++;
    s_.heap.push_back(c);
    std::push_heap(s_.heap.begin(), s_.heap.end(), worse_first);
  }
}

// Fusion's output step: the draft nodes in scratch.nodes ([0] is the root; a parent
// precedes its children) appended to `out` in breadth-first order: by depth, then by
// position in nodes. To explain, out.features gets each node's kScoreFeatures values
// (its row DraftNode::features of scratch.feature_pool).
void write_breadth_first(FusionScratch& scratch, bool explain, Draft& out) {
  constexpr size_t kRow = kScoreFeatures;  // row offsets are computed in size_t
  const std::vector<DraftNode>& nodes = scratch.nodes;
  const auto num = static_cast<int32_t>(nodes.size()) - 1;
  // A counting sort: depths are in [1, num].
  std::vector<int32_t>& start = scratch.depth_start;
  start.assign(num + 2, 0);
  for (int32_t i = 1; i <= num; ++i) ++start[nodes[i].depth + 1];
  for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
  std::vector<int32_t>& order = scratch.order;
  order.resize(num);
  for (int32_t i = 1; i <= num; ++i) {
    order[start[nodes[i].depth]++] = i;
  }
  std::vector<int32_t>& remap = scratch.remap;
  remap.assign(num + 1, -1);
  for (int32_t i = 0; i < num; ++i) remap[order[i]] = i;
  out.tokens.reserve(num);
  for (int32_t i = 0; i < num; ++i) {
    const DraftNode& d = nodes[order[i]];
    out.tokens.push_back(d.token);
    out.parents.push_back(remap[d.parent]);  // root (0) maps to -1
    out.scores.push_back(static_cast<float>(d.score));
  }
  if (explain) {
    out.features.resize(num * kRow);
    for (int32_t i = 0; i < num; ++i) {
      const double* row = scratch.feature_pool.data() + nodes[order[i]].features * kRow;
      std::copy_n(row, kRow, out.features.data() + i * kRow);
    }
  }
}

}  // namespace

void fuse(const FusionInputs& in, FusionScratch& scratch, Draft& out) {
  out = Draft{};
  if (in.budget <= 0) return;
  Fusion(in, scratch).run();
  write_breadth_first(scratch, in.explain, out);
}

}  // namespace drafter
