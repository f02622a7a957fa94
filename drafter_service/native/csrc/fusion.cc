#include "fusion.h"
#include "node_score.h"

#include <algorithm>
#include <utility>

namespace drafter {

namespace {

using fusion::Candidate;
using fusion::DraftNode;
using fusion::Member;
using fusion::Offer;
using fusion::Source;
using fusion::kNotLookedUp;

// Fusion itself: best-first over the candidates node scoring (node_score.h) scored.

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
