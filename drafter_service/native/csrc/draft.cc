#include "draft.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>

namespace drafter {

namespace {

std::string num(double v) {
  std::ostringstream out;
  out << std::setprecision(12) << v;
  return out.str();
}

void require(bool ok, const char* field, double value, const char* rule) {
  if (!ok) {
    throw std::invalid_argument(std::string("draft config: ") + field + " = " + num(value) +
                                " " + rule);
  }
}

// value in [lo, hi]; NaN fails.
void require_in(const char* field, double value, double lo, double hi) {
  require(value >= lo && value <= hi, field, value,
          ("must be in [" + num(lo) + ", " + num(hi) + "]").c_str());
}

}  // namespace

void validate(const DraftConfig& c) {
  require_in("input_max_prefix", c.input_max_prefix, 1, 64);
  require(c.input_max_depth >= c.input_max_prefix && c.input_max_depth <= 256,
          "input_max_depth", c.input_max_depth, "must be in [input_max_prefix, 256]");
  require_in("datastore_min_prefix", c.datastore_min_prefix, 1, 256);
  require(c.datastore_max_prefix >= c.datastore_min_prefix && c.datastore_max_prefix <= 256,
          "datastore_max_prefix", c.datastore_max_prefix,
          "must be in [datastore_min_prefix, 256]");
  require_in("datastore_samples", c.datastore_samples, 1, 100000);
  require_in("datastore_max_continuation", c.datastore_max_continuation, 1, 1024);
  require_in("datastore_min_tree_nodes", c.datastore_min_tree_nodes, 0, 1e9);
  require_in("max_budget", c.max_budget, 0, 4096);
  require_in("input_weight", c.input_weight, 0.0, 1e6);
  require_in("input_child_discount_base", c.input_child_discount_base, 0.0, 1e6);
  require_in("input_child_discount_per_match", c.input_child_discount_per_match, 0.0, 1e6);
  require_in("datastore_weight", c.datastore_weight, 0.0, 1e6);
  require_in("datastore_child_discount", c.datastore_child_discount, 0.0, 1e6);
  require_in("input_smoothing", c.input_smoothing, 0.0, 1e6);
  require_in("datastore_smoothing", c.datastore_smoothing, 0.0, 1e6);
  if (!c.node_score.empty()) {
    require(c.node_score.size() == static_cast<size_t>(kScoreFeatures) + 1, "node_score length",
            static_cast<double>(c.node_score.size()),
            ("must be 0 (the hand-set score) or " + std::to_string(kScoreFeatures + 1) +
             " (a bias and a weight per feature)").c_str());
    for (size_t i = 0; i < c.node_score.size(); ++i) {
      require(std::isfinite(c.node_score[i]),
              ("node_score[" + std::to_string(i) + "]").c_str(), c.node_score[i],
              "must be finite");
    }
  }
}

void check_budgets(const int32_t* budgets, int64_t n, const DraftConfig& config) {
  for (int64_t i = 0; i < n; ++i) {
    if (budgets[i] < 0 || budgets[i] > config.max_budget) {
      throw std::invalid_argument("budget " + std::to_string(budgets[i]) +
                                  (n > 1 ? " of request " + std::to_string(i) : "") +
                                  " is outside [0, " + std::to_string(config.max_budget) + "]");
    }
  }
}

int64_t Datastore::num_tokens() const {
  int64_t n = 0;
  for (const auto& s : sub_indices) n += s->num_tokens();
  return n;
}

int64_t Datastore::resident_bytes() const {
  int64_t n = 0;
  for (const auto& s : sub_indices) n += s->resident_bytes();
  return n;
}

void CandidateTree::clear() {
  samples_.clear();
  nodes_.clear();
  nodes_.push_back({-1, 0, kUnexpanded, -1, 0, 0, 0});
  num_nodes_ = 1;
  matched_prefix_ = 0;
}

namespace {

// Length of the common prefix of two samples.
int32_t common_prefix(const Sample& a, const Sample& b) {
  const int32_t limit = std::min(a.len, b.len);
  int32_t k = 0;
  while (k < limit && a.tokens[k] == b.tokens[k]) ++k;
  return k;
}

bool sample_less(const Sample& a, const Sample& b) {
  const int32_t k = common_prefix(a, b);
  if (k == a.len || k == b.len) return a.len < b.len;
  return a.tokens[k] < b.tokens[k];
}

}  // namespace

void CandidateTree::add(const Sample* samples, size_t n) {
  const size_t held = samples_.size();
  samples_.insert(samples_.end(), samples, samples + n);
  // One pass over the new samples checks their order and counts the distinct paths
  // they add: in sorted order a sample adds one node per token past its common prefix
  // with the previous one (the last one held, for the first new sample).
  bool sorted = true;
  int64_t nodes = num_nodes_;
  for (size_t i = held; i < samples_.size(); ++i) {
    const Sample& cur = samples_[i];
    if (i == 0) {
      nodes += cur.len;
      continue;
    }
    const Sample& prev = samples_[i - 1];
    const int32_t k = common_prefix(prev, cur);
    if (k < cur.len && (k == prev.len || prev.tokens[k] < cur.tokens[k])) {
      nodes += cur.len - k;
    } else if (k < cur.len || k < prev.len) {  // cur sorts before prev
      sorted = false;
      break;
    }  // else equal to prev: no new node
  }
  if (!sorted) {
    // The samples held are sorted, and so is each run of new ones from one suffix
    // array range: sort only the new samples, then merge (linear) with those held.
    const auto first_new = samples_.begin() + static_cast<std::ptrdiff_t>(held);
    if (!std::is_sorted(first_new, samples_.end(), sample_less)) {
      std::sort(first_new, samples_.end(), sample_less);
    }
    merged_.clear();
    std::merge(samples_.begin(), first_new, first_new, samples_.end(), std::back_inserter(merged_),
               sample_less);
    samples_.swap(merged_);
    nodes = 1;
    for (size_t i = 0; i < samples_.size(); ++i) {
      nodes += samples_[i].len - (i == 0 ? 0 : common_prefix(samples_[i - 1], samples_[i]));
    }
  }
  num_nodes_ = static_cast<int32_t>(nodes);
  nodes_.resize(1);
  nodes_[kRoot] = {-1, static_cast<uint32_t>(samples_.size()), kUnexpanded, -1, 0,
                   static_cast<int32_t>(samples_.size()), 0};
}

int32_t CandidateTree::first_child(int32_t node) const {
  if (nodes_[static_cast<size_t>(node)].first_child == kUnexpanded) expand(node);
  return nodes_[static_cast<size_t>(node)].first_child;
}

void CandidateTree::expand(int32_t node) const {
  const Node parent = nodes_[static_cast<size_t>(node)];
  const int32_t d = parent.depth;
  int32_t i = parent.lo;
  // Samples ending exactly here are a prefix of the others: they sort first.
  while (i < parent.hi && samples_[static_cast<size_t>(i)].len == d) ++i;
  int32_t first = -1, prev = -1;
  while (i < parent.hi) {
    const int32_t t = samples_[static_cast<size_t>(i)].tokens[d];
    int32_t j = i + 1;
    while (j < parent.hi && samples_[static_cast<size_t>(j)].tokens[d] == t) ++j;
    const auto id = static_cast<int32_t>(nodes_.size());
    nodes_.push_back({t, static_cast<uint32_t>(j - i), kUnexpanded, -1, i, j, d + 1});
    if (prev == -1) {
      first = id;
    } else {
      nodes_[static_cast<size_t>(prev)].next_sibling = id;
    }
    prev = id;
    i = j;
  }
  nodes_[static_cast<size_t>(node)].first_child = first;
}

void retrieve_datastore(const Datastore& datastore, const int32_t* context, int64_t context_len,
                        const DraftConfig& config, int32_t max_len, DraftScratch& scratch) {
  retrieve_sub_indices(datastore, 0, datastore.sub_indices.size(), context, context_len, config,
                       max_len, scratch, scratch.datastore_tree);
}

void retrieve_sub_indices(const Datastore& datastore, size_t begin, size_t end,
                          const int32_t* context, int64_t context_len, const DraftConfig& config,
                          int32_t max_len, DraftScratch& scratch, CandidateTree& tree) {
  tree.clear();
  end = std::min(end, datastore.sub_indices.size());
  if (begin >= end || context_len <= 0 || max_len <= 0) return;
  const int32_t cont_cap = std::min(config.datastore_max_continuation, max_len);
  const auto longest =
      static_cast<int32_t>(std::min<int64_t>(config.datastore_max_prefix, context_len));
  // range_of(s, m): the rows of sub-index s (in [begin, end)) matching the last m tokens.
  // They are searched shortest first: a suffix that occurs nowhere in a sub-index has
  // no longer suffix there either (an occurrence of the longer one contains it), so the
  // longer searches, most of them misses, are skipped. The longest-first loop below
  // reads them.
  const auto stride = static_cast<size_t>(longest);
  std::vector<SaRange>& ranges = scratch.ranges;
  ranges.assign((end - begin) * stride, SaRange{0, 0});
  auto range_of = [&](size_t s, int32_t m) -> SaRange& {
    return ranges[(s - begin) * stride + static_cast<size_t>(m) - 1];
  };
  for (size_t s = begin; s < end; ++s) {
    const SubIndex& index = *datastore.sub_indices[s];
    for (int32_t m = 1; m <= longest; ++m) {
      const SaRange r = index.find_range(context + context_len - m, m);
      if (r.size() == 0) break;
      range_of(s, m) = r;
    }
  }
  std::vector<SampledRow>& rows = scratch.sample_rows;
  std::vector<Sample>& samples = scratch.samples;
  for (int32_t m = longest; m >= config.datastore_min_prefix; --m) {
    if (tree.num_nodes() - 1 >= config.datastore_min_tree_nodes) break;
    int64_t total = 0;
    for (size_t s = begin; s < end; ++s) {
      total += range_of(s, m).size();
    }
    if (total == 0) continue;
    if (tree.matched_prefix() == 0) tree.set_matched_prefix(m);
    // Interval sampling: the rows of a range are sorted by continuation, so evenly
    // spaced rows approximate the continuation distribution. The sample budget is
    // split over sub-indices in proportion to their matches.
    rows.clear();
    for (size_t s = begin; s < end; ++s) {
      const SaRange& range = range_of(s, m);
      const int64_t found = range.size();
      if (found == 0) continue;
      const int64_t count =
          total <= config.datastore_samples
              ? found
              : std::max<int64_t>(1, config.datastore_samples * found / total);
      const int32_t* sa = datastore.sub_indices[s]->suffix_array();
      for (int64_t k = 0; k < count; ++k) {
        rows.push_back({range.begin + (k * found) / count, s});
        __builtin_prefetch(sa + rows.back().row);
      }
    }
    // Each sample is two dependent random reads (suffix array, then text), cache
    // misses on a large index. All are issued as prefetches first, over every
    // sub-index, so that the misses overlap instead of queueing one after another.
    for (const SampledRow& r : rows) {
      const SubIndex& index = *datastore.sub_indices[r.sub];
      const int64_t start = index.position(r.row) + m;
      // A continuation of up to cont_cap tokens may straddle two cache lines.
      const int64_t last = std::min(start + cont_cap - 1, index.num_tokens() - 1);
      __builtin_prefetch(index.tokens() + std::min(start, last));
      __builtin_prefetch(index.tokens() + last);
    }
    samples.clear();
    for (const SampledRow& r : rows) {
      const SubIndex& index = *datastore.sub_indices[r.sub];
      const int32_t* text = index.tokens();
      const int64_t n = index.num_tokens();
      const int64_t start = index.position(r.row) + m;
      int32_t len = 0;
      while (len < cont_cap && start + len < n && text[start + len] != kSeparator) ++len;
      samples.push_back({text + start, len});
    }
    tree.add(samples.data(), samples.size());
  }
}

namespace {

using fusion::Candidate;
using fusion::DraftNode;
using fusion::Member;
using fusion::Offer;
using fusion::Source;
using fusion::kNotLookedUp;

// Uniform read access to the kinds of source tree.
struct SourceView {
  const InputTrie* trie;
  const CandidateTree* tree;
  const CandidateTree* live;
  const CandidateTree& of(Source s) const { return s == Source::kLive ? *live : *tree; }
  int32_t first_child(Source s, int32_t n) const {
    return s == Source::kInput ? trie->first_child(n) : of(s).first_child(n);
  }
  int32_t next_sibling(Source s, int32_t n) const {
    return s == Source::kInput ? trie->next_sibling(n) : of(s).next_sibling(n);
  }
  int32_t token(Source s, int32_t n) const {
    return s == Source::kInput ? trie->token(n) : of(s).token(n);
  }
  double count(Source s, int32_t n) const {
    return static_cast<double>(s == Source::kInput ? trie->count(n) : of(s).count(n));
  }
};

// log(n) of the integer counts the features are made of: a table of std::log's own
// values below kLogTable, std::log above (and for anything not a whole number).
// The table is built on first use (a function-local static: nothing runs at module
// load; std::log is not constexpr, and a table of literals would not be std::log's
// own values on every libm).
constexpr int32_t kLogTable = 4096;
struct LogTable {
  double of[kLogTable];
  LogTable() {
    of[0] = 0.0;
    for (int32_t i = 1; i < kLogTable; ++i) of[i] = std::log(double(i));
  }
};
const LogTable& log_table() {
  static const LogTable table;
  return table;
}
inline double log_count(double n) {
  if (n >= 1.0 && n < kLogTable) {
    const auto i = static_cast<size_t>(n);
    if (static_cast<double>(i) == n) return log_table().of[i];
  }
  return std::log(n);
}

// log of a hand-set score; a zero score (a source weighted 0) gets a finite floor.
constexpr double kLogFloor = -100.0;
double log_score(double s) { return s > 0.0 ? std::log(s) : kLogFloor; }

// One source's four ScoreFeature values (present, log_cond, log1p count, log1p parent)
// from `first` on.
void source_features(double count, double parent, double* first) {
  if (count <= 0.0 || parent <= 0.0) return;  // left 0: the source does not offer it
  first[0] = 1.0;
  first[1] = log_count(count) - log_count(parent);
  first[2] = log_count(count + 1.0);
  first[3] = log_count(parent + 1.0);
}

// The member-backed ScoreFeature values of a candidate backed by members [begin, end):
// everything but the sibling, hand-score and n-gram columns, which need the whole
// expansion and the trie. A candidate's member holds its node's count as `denominator`.
void member_features(const Member* begin, const Member* end, int32_t depth,
                     const SourceView& view, double* f) {
  std::fill(f, f + kScoreFeatures, 0.0);
  f[kFeatDepth] = depth;
  f[kFeatBasePrefix] = view.tree != nullptr ? view.tree->matched_prefix() : 0;
  f[kFeatLivePrefix] = view.live != nullptr ? view.live->matched_prefix() : 0;
  double input_count = 0.0, input_parent = 0.0;
  for (const Member* m = begin; m != end; ++m) {
    const double count = m->denominator;
    switch (m->source) {
      case Source::kInput:
        f[kFeatInputMembers] += 1.0;
        if (m->match > f[kFeatInputMatch]) {
          f[kFeatInputMatch] = m->match;
          input_count = count;
          input_parent = m->parent_count;
        }
        break;
      case Source::kDatastore:
        source_features(count, m->parent_count, f + kFeatBasePresent);
        break;
      case Source::kLive:
        source_features(count, m->parent_count, f + kFeatLivePresent);
        break;
    }
  }
  source_features(input_count, input_parent, f + kFeatInputPresent);
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

struct WorseFirst {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.score < b.score || (a.score == b.score && a.seq > b.seq);
  }
};

}  // namespace

void committed_matches(const InputTrie& trie, const DraftConfig& config,
                       std::vector<InputMatch>& out) {
  out.assign(static_cast<size_t>(config.input_max_prefix), InputMatch{-1, 0.0});
  for (int32_t m = 1; m <= config.input_max_prefix; ++m) {
    const int32_t u = trie.suffix_node(m);
    if (u < 0) continue;
    // count(u) includes the occurrence at the very end of the input, which
    // has no continuation yet; leave it out of the denominator.
    out[static_cast<size_t>(m) - 1] = {u, static_cast<double>(trie.count(u)) - 1.0};
  }
}

void fuse(const InputTrie* trie, const std::vector<InputMatch>& matches,
          const CandidateTree* datastore_tree, const DraftConfig& config, int32_t budget,
          DraftScratch& scratch, Draft& out) {
  fuse(trie, matches, datastore_tree, config, budget, scratch, out, nullptr, nullptr, 0);
}

void fuse(const InputTrie* trie, const std::vector<InputMatch>& matches,
          const CandidateTree* datastore_tree, const DraftConfig& config, int32_t budget,
          DraftScratch& scratch, Draft& out, const CandidateTree* live_tree,
          const int32_t* context, int64_t context_len, bool explain) {
  out.tokens.clear();
  out.features.clear();
  out.parents.clear();
  out.scores.clear();
  if (budget <= 0) return;
  const SourceView view{trie, datastore_tree, live_tree};
  const bool learned = !config.node_score.empty();
  // Features are computed only where something reads them.
  const bool featured = learned || explain;
  std::vector<Member>& pool = scratch.members;
  std::vector<Offer>& offers = scratch.offers;
  std::vector<DraftNode>& nodes = scratch.nodes;
  std::vector<Candidate>& heap = scratch.heap;  // max-heap under WorseFirst
  std::vector<Candidate>& group = scratch.group;
  std::vector<double>& group_features = scratch.group_features;
  std::vector<double>& feature_pool = scratch.feature_pool;
  pool.clear();
  offers.clear();
  nodes.clear();
  heap.clear();
  feature_pool.clear();
  uint64_t seq = 0;
  std::vector<int32_t>& kids = scratch.children;

  // Offers the children of one member, at most `cap` of them: the draft nodes still to
  // be chosen. With the hand-set score a member's lower-ranked children could only be
  // chosen after `cap` better ones, so the tree is the same; with a learned score the
  // candidates are defined this way (docs/algorithm.md).
  auto offer_children = [&](const Member& m, int32_t cap) {
    const double smoothing =
        m.source == Source::kInput ? config.input_smoothing : config.datastore_smoothing;
    const double denominator = m.denominator + smoothing;
    if (m.denominator <= 0.0 || cap <= 0) return;
    kids.clear();
    for (int32_t c = view.first_child(m.source, m.node); c != -1;
         c = view.next_sibling(m.source, c)) {
      kids.push_back(c);
    }
    auto score_of = [&](int32_t c) { return view.count(m.source, c) / denominator * m.multiplier; };
    if (kids.size() > static_cast<size_t>(cap)) {
      std::nth_element(kids.begin(), kids.begin() + cap, kids.end(), [&](int32_t a, int32_t b) {
        const double sa = score_of(a), sb = score_of(b);
        return sa > sb || (sa == sb && view.token(m.source, a) < view.token(m.source, b));
      });
      kids.resize(static_cast<size_t>(cap));
    }
    for (int32_t c : kids) {
      offers.push_back({view.token(m.source, c), c, score_of(c), m.source,
                        static_cast<int32_t>(offers.size()), m.discount, m.denominator, m.match});
    }
  };

  // The trie node of [parent's token, token] (-1: absent), from the parent's unigram
  // node; only a held token can end a bigram the trie holds.
  auto bigram_node = [&](const DraftNode& parent, int32_t token) {
    return parent.unigram >= 0 && trie->holds(token) ? trie->child(parent.unigram, token) : -1;
  };

  // The n-gram columns. A candidate an input match offers extends a string the trie holds
  // (the matched context suffix, the path, the token), and so every shorter n-gram that
  // ends it: its unigram and bigram, and its trigram once that string has 3 tokens. Only
  // the others are looked up (a trie lookup is a likely cache miss), and only while the
  // shorter one is held: the trie holds every substring of an n-gram it holds. The bigram
  // node found is kept in the candidate, for its children's trigrams if it is chosen.
  auto ngram_features = [&](Candidate& c, const DraftNode& parent, double* f) {
    const double input_len = f[kFeatInputMatch] + f[kFeatDepth];  // 0 + depth: no input
    bool unigram = true, bigram = true;
    if (f[kFeatInputMatch] <= 0.0) {
      unigram = trie->holds(c.token);
      c.bigram = bigram_node(parent, c.token);
      bigram = c.bigram >= 0;
    }
    f[kFeatUnigramSeen] = unigram ? 1.0 : 0.0;
    f[kFeatBigramSeen] = bigram ? 1.0 : 0.0;
    f[kFeatTrigramSeen] = (f[kFeatInputMatch] > 0.0 && input_len >= 3.0) ||
                                  (bigram && parent.bigram >= 0 &&
                                   trie->child(parent.bigram, c.token) >= 0)
                              ? 1.0
                              : 0.0;
  };

  // The ScoreFeature values of the expansion's candidates (group), into group_features:
  // each one's members, then the columns that compare it with its siblings.
  auto group_score_features = [&](const DraftNode& parent) {
    const size_t n = group.size();
    group_features.resize(n * kScoreFeatures);
    // The best sibling's log is the largest of the siblings' logs, and the parent's was
    // computed when it was a candidate: one log per candidate, none per expansion.
    double log_best = -HUGE_VAL;
    for (Candidate& c : group) {
      c.log_hand = log_score(c.hand);
      log_best = std::max(log_best, c.log_hand);
    }
    const double log_siblings = log_count(static_cast<double>(n));
    for (size_t i = 0; i < n; ++i) {
      Candidate& c = group[i];
      double* f = group_features.data() + i * kScoreFeatures;
      member_features(pool.data() + c.begin, pool.data() + c.end, parent.depth + 1, view, f);
      f[kFeatLogSiblings] = log_siblings;
      f[kFeatLogOverBest] = c.log_hand - log_best;
      f[kFeatLogHandCond] = c.log_hand - parent.log_hand;
      if (trie != nullptr) ngram_features(c, parent, f);
    }
  };

  // Groups the offers by token into candidates under `draft_parent`, pushed in
  // ascending token order; members keep the order in which sources offered.
  auto push_offers = [&](int32_t draft_parent) {
    std::sort(offers.begin(), offers.end(), [](const Offer& a, const Offer& b) {
      return a.token < b.token || (a.token == b.token && a.order < b.order);
    });
    const DraftNode parent = nodes[static_cast<size_t>(draft_parent)];
    group.clear();
    for (size_t i = 0; i < offers.size();) {
      const auto begin = static_cast<int32_t>(pool.size());
      double hand = 0.0;
      const int32_t token = offers[i].token;
      for (; i < offers.size() && offers[i].token == token; ++i) {
        const Offer& o = offers[i];
        hand = std::max(hand, o.score);  // the most confident source decides
        pool.push_back({o.node, o.source, o.score, view.count(o.source, o.node),
                        o.score * o.discount, o.discount, o.parent_count, o.match});
      }
      group.push_back({hand, 0, token, draft_parent, begin, static_cast<int32_t>(pool.size()),
                       hand, 0.0, -1, kNotLookedUp});
    }
    offers.clear();
    if (featured && trie != nullptr) {
      // The n-gram lookups below are likely cache misses (a request's trie is cold when
      // its draft starts): issue them for the whole group first, so they overlap.
      for (const Candidate& c : group) {
        trie->prefetch_holds(c.token);
        trie->prefetch_child(InputTrie::kRoot, c.token);
        if (parent.unigram >= 0) trie->prefetch_child(parent.unigram, c.token);
        if (parent.bigram >= 0) trie->prefetch_child(parent.bigram, c.token);
      }
    }
    if (featured) group_score_features(parent);
    for (size_t i = 0; i < group.size(); ++i) {
      Candidate c = group[i];
      const double* f = featured ? group_features.data() + i * kScoreFeatures : nullptr;
      // A path's learned score is the product of its nodes' probabilities, each <= 1,
      // so a node never outranks its parent and best-first yields a tree.
      if (learned) c.score = parent.score * learned_probability(config.node_score, f);
      if (explain) {
        c.features = static_cast<int32_t>(feature_pool.size() / kScoreFeatures);
        feature_pool.insert(feature_pool.end(), f, f + kScoreFeatures);
      }
      c.seq = seq++;
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), WorseFirst{});
    }
  };

  // Roots of the sources, in a fixed order: the datastore tree (a split datastore's
  // base), its live tree, then input matches from the longest suffix (P) to the
  // shortest (1).
  if (datastore_tree != nullptr) {
    offer_children({CandidateTree::kRoot, Source::kDatastore, 1.0,
                    static_cast<double>(datastore_tree->count(CandidateTree::kRoot)),
                    config.datastore_weight, config.datastore_child_discount, 0.0, 0},
                   budget);
  }
  if (live_tree != nullptr) {
    offer_children({CandidateTree::kRoot, Source::kLive, 1.0,
                    static_cast<double>(live_tree->count(CandidateTree::kRoot)),
                    config.datastore_weight, config.datastore_child_discount, 0.0, 0},
                   budget);
  }
  if (trie != nullptr) {
    for (auto m = static_cast<int32_t>(matches.size()); m >= 1; --m) {
      const InputMatch& match = matches[static_cast<size_t>(m) - 1];
      if (match.node < 0) continue;
      offer_children({match.node, Source::kInput, 1.0, match.continued, config.input_weight,
                      config.input_child_discount_base + config.input_child_discount_per_match * m,
                      0.0, m},
                     budget);
    }
  }
  // The root: the context's last token (and the two last) start the n-grams.
  int32_t root_unigram = -1, root_bigram = -1;
  if (featured && trie != nullptr && context != nullptr && context_len >= 1) {
    root_unigram = trie->find(context + context_len - 1, 1);
    if (context_len >= 2) root_bigram = trie->find(context + context_len - 2, 2);
  }
  nodes.push_back({-1, -1, 0, 1.0, 0.0, root_unigram, root_bigram, -1});  // log(hand 1) = 0
  push_offers(0);

  // Best-first: every candidate is a distinct (parent, token), so each pop adds
  // one draft node. With scores non-increasing along paths this selects the
  // `budget` nodes of highest score that form a tree.
  while (!heap.empty() && static_cast<int32_t>(nodes.size()) - 1 < budget) {
    std::pop_heap(heap.begin(), heap.end(), WorseFirst{});
    const Candidate cand = heap.back();
    heap.pop_back();
    const auto slot = static_cast<int32_t>(nodes.size());
    const DraftNode& parent = nodes[static_cast<size_t>(cand.draft_parent)];
    // The trie nodes of its unigram and bigram, where its children's n-grams start.
    int32_t unigram = -1, bigram = -1;
    if (featured && trie != nullptr) {
      unigram = trie->holds(cand.token) ? trie->child(InputTrie::kRoot, cand.token) : -1;
      bigram = cand.bigram != kNotLookedUp ? cand.bigram : bigram_node(parent, cand.token);
    }
    nodes.push_back({cand.token, cand.draft_parent, parent.depth + 1, cand.score, cand.log_hand,
                     unigram, bigram, cand.features});
    // The draft nodes still to be chosen; the last node's children could never be.
    const int32_t remaining = budget - slot;
    if (remaining <= 0) break;
    for (int32_t k = cand.begin; k < cand.end; ++k) {
      offer_children(pool[static_cast<size_t>(k)], remaining);
    }
    push_offers(slot);
  }

  // Breadth-first order: by depth, then by insertion (a parent is always
  // inserted before its children, so parents precede children).
  const auto num = static_cast<int32_t>(nodes.size()) - 1;
  // A counting sort: depths are in [1, num].
  std::vector<int32_t>& start = scratch.depth_start;
  start.assign(static_cast<size_t>(num) + 2, 0);
  for (int32_t i = 1; i <= num; ++i) ++start[static_cast<size_t>(nodes[static_cast<size_t>(i)].depth) + 1];
  for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
  std::vector<int32_t>& order = scratch.order;
  order.resize(static_cast<size_t>(num));
  for (int32_t i = 1; i <= num; ++i) {
    order[static_cast<size_t>(start[static_cast<size_t>(nodes[static_cast<size_t>(i)].depth)]++)] = i;
  }
  std::vector<int32_t>& remap = scratch.remap;
  remap.assign(static_cast<size_t>(num) + 1, -1);
  for (int32_t i = 0; i < num; ++i) remap[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;
  out.tokens.reserve(static_cast<size_t>(num));
  for (int32_t i = 0; i < num; ++i) {
    const DraftNode& d = nodes[static_cast<size_t>(order[static_cast<size_t>(i)])];
    out.tokens.push_back(d.token);
    out.parents.push_back(remap[static_cast<size_t>(d.parent)]);  // root (0) maps to -1
    out.scores.push_back(static_cast<float>(d.score));
  }
  if (explain) {
    out.features.resize(static_cast<size_t>(num) * kScoreFeatures);
    for (int32_t i = 0; i < num; ++i) {
      const DraftNode& d = nodes[static_cast<size_t>(order[static_cast<size_t>(i)])];
      std::copy_n(feature_pool.data() + static_cast<size_t>(d.features) * kScoreFeatures,
                  kScoreFeatures, out.features.data() + static_cast<size_t>(i) * kScoreFeatures);
    }
  }
}

}  // namespace drafter
