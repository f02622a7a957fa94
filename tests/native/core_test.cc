// GoogleTest tests of the native core (drafter_service/native/csrc) under AddressSanitizer +
// UndefinedBehaviorSanitizer: built by CMake with DRAFTER_NATIVE_TESTS=ON and run by
// tests/test_native_sanitized.py.
//
// Only what needs the sanitizers or threads is here: the suffix array construction on
// adversarial texts, sub-index search bounds, the input trie's growth, candidate-tree
// batches, retrieval and fusion run over random inputs for their memory safety and
// structural invariants, the errors bad input raises, and the multi-threaded Drafter.
// Whether retrieval and fusion compute what docs/algorithm.md says is checked once, in
// Python, against the reference tests/reference.py (tests/test_draft_reference.py and the
// other property tests). Random cases use fixed-seed std::mt19937 generators, so a run is
// repeatable.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "drafter.h"
#include "input_trie.h"
#include "sub_index.h"

namespace {

using drafter::BatchDrafts;
using drafter::CandidateTree;
using drafter::Datastore;
using drafter::Draft;
using drafter::DraftConfig;
using drafter::Drafter;
using drafter::DraftScratch;
using drafter::InputTrie;
using drafter::SaRange;
using drafter::SubIndex;

using Tokens = std::vector<int32_t>;

// ---------------------------------------------------------------------------
// Random inputs.

int32_t uniform(std::mt19937& rng, int32_t lo, int32_t hi) {  // inclusive
  return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
}

bool coin(std::mt19937& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// A random symbol in [0, alphabet) or, with probability sep_p, the separator.
int32_t symbol(std::mt19937& rng, int32_t alphabet, double sep_p) {
  return coin(rng, sep_p) ? -1 : uniform(rng, 0, alphabet - 1);
}

// Texts for the suffix-array tests: random, runs, periodic, Fibonacci and
// Thue-Morse words (the last ones force SA-IS to recurse several levels).
// Tokens lie in [offset, offset + alphabet) or are -1; the caller passes
// vocab >= offset + alphabet.
Tokens random_text(std::mt19937& rng, int32_t max_len, int32_t alphabet, int32_t offset) {
  const int32_t len = uniform(rng, 0, max_len);
  const double sep_p = std::vector<double>{0.0, 0.0, 0.05, 0.2, 0.5}[uniform(rng, 0, 4)];
  Tokens t;
  t.reserve(static_cast<size_t>(len));
  auto sym = [&] {
    const int32_t s = symbol(rng, alphabet, sep_p);
    return s < 0 ? s : s + offset;
  };
  switch (uniform(rng, 0, 6)) {
    case 0:  // uniform
      while (static_cast<int32_t>(t.size()) < len) t.push_back(sym());
      break;
    case 1: {  // one symbol repeated
      const int32_t s = sym();
      t.assign(static_cast<size_t>(len), s);
      break;
    }
    case 2: {  // periodic, sometimes with one mutation
      Tokens base(static_cast<size_t>(uniform(rng, 1, 9)));
      for (auto& b : base) b = sym();
      for (int32_t i = 0; i < len; ++i) t.push_back(base[static_cast<size_t>(i) % base.size()]);
      if (len > 0 && coin(rng, 0.3)) t[static_cast<size_t>(uniform(rng, 0, len - 1))] = sym();
      break;
    }
    case 3:  // runs of random length
      while (static_cast<int32_t>(t.size()) < len) {
        const int32_t s = sym();
        for (int32_t r = uniform(rng, 1, 20); r > 0 && static_cast<int32_t>(t.size()) < len; --r) {
          t.push_back(s);
        }
      }
      break;
    case 4: {  // Fibonacci word over two random symbols
      const int32_t a = sym(), b = sym();
      Tokens x{a}, y{a, b};
      while (static_cast<int32_t>(y.size()) < len) {
        Tokens z = y;
        z.insert(z.end(), x.begin(), x.end());
        x = std::move(y);
        y = std::move(z);
      }
      t.assign(y.begin(), y.begin() + std::min<int64_t>(len, static_cast<int64_t>(y.size())));
      break;
    }
    case 5: {  // Thue-Morse word over two random symbols
      const int32_t a = sym(), b = sym();
      for (int32_t i = 0; i < len; ++i) t.push_back(__builtin_popcount(static_cast<unsigned>(i)) % 2 ? b : a);
      break;
    }
    default:  // concatenation of copies of earlier pieces (repeats at many distances)
      while (static_cast<int32_t>(t.size()) < len) {
        if (t.size() > 4 && coin(rng, 0.6)) {
          const auto from = static_cast<size_t>(uniform(rng, 0, static_cast<int32_t>(t.size()) - 1));
          const size_t take = std::min<size_t>(static_cast<size_t>(uniform(rng, 1, 30)),
                                               t.size() - from);
          for (size_t k = 0; k < take && static_cast<int32_t>(t.size()) < len; ++k) {
            t.push_back(t[from + k]);
          }
        } else {
          t.push_back(sym());
        }
      }
      break;
  }
  return t;
}

// "Natural" token streams: a sparse Markov chain (each token has a few likely
// successors) mixed with uniform noise, so that n-grams repeat like in text.
class MarkovSource {
 public:
  MarkovSource(int32_t vocab, uint32_t seed) : vocab_(vocab), rng_(seed), next_(static_cast<size_t>(vocab)) {
    for (auto& succ : next_) {
      succ.resize(4);
      for (auto& s : succ) s = uniform(rng_, 0, vocab - 1);
    }
  }
  int32_t next(std::mt19937& rng, int32_t prev) const {
    if (prev < 0 || coin(rng, 0.15)) return uniform(rng, 0, vocab_ - 1);
    return next_[static_cast<size_t>(prev)][static_cast<size_t>(uniform(rng, 0, 3))];
  }
  Tokens stream(std::mt19937& rng, int32_t len, int32_t prev = -1) const {
    Tokens t;
    t.reserve(static_cast<size_t>(len));
    for (int32_t i = 0; i < len; ++i) {
      prev = next(rng, prev);
      t.push_back(prev);
    }
    return t;
  }
  // Documents joined by the separator.
  Tokens documents(std::mt19937& rng, int32_t num_docs, int32_t max_doc_len) const {
    Tokens t;
    for (int32_t d = 0; d < num_docs; ++d) {
      if (d > 0) t.push_back(drafter::kSeparator);
      Tokens doc = stream(rng, uniform(rng, 0, max_doc_len));
      t.insert(t.end(), doc.begin(), doc.end());
    }
    return t;
  }

 private:
  int32_t vocab_;
  std::mt19937 rng_;
  std::vector<Tokens> next_;
};

// ---------------------------------------------------------------------------
// Checks.

// O(n) verification of a suffix array (Burkhardt and Kärkkäinen): a permutation whose
// adjacent rows are ordered by (first token, rank of the rest), an empty rest smallest.
// Complete: exactly the correct suffix array passes.
bool verify_suffix_array(const Tokens& t, const Tokens& sa) {
  const auto n = static_cast<int64_t>(t.size());
  if (static_cast<int64_t>(sa.size()) != n) return false;
  Tokens rank(t.size(), -1);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t p = sa[static_cast<size_t>(r)];
    if (p < 0 || p >= n || rank[static_cast<size_t>(p)] != -1) return false;
    rank[static_cast<size_t>(p)] = static_cast<int32_t>(r);
  }
  for (int64_t r = 0; r + 1 < n; ++r) {
    const int64_t a = sa[static_cast<size_t>(r)], b = sa[static_cast<size_t>(r) + 1];
    if (t[static_cast<size_t>(a)] != t[static_cast<size_t>(b)]) {
      if (t[static_cast<size_t>(a)] > t[static_cast<size_t>(b)]) return false;
      continue;
    }
    if (a + 1 == n) continue;
    if (b + 1 == n) return false;
    if (rank[static_cast<size_t>(a) + 1] >= rank[static_cast<size_t>(b) + 1]) return false;
  }
  return true;
}

bool occurs_at(const Tokens& text, int64_t pos, const int32_t* pat, int64_t len) {
  if (pos < 0 || pos + len > static_cast<int64_t>(text.size())) return false;
  return std::equal(pat, pat + len, text.begin() + pos);
}

// Path -> count of a tree; the empty path is the root. Counts are compared as
// doubles (exact for these sizes) whatever integer or floating type the tree uses.
using PathCounts = std::map<Tokens, double>;

PathCounts dump_tree(const CandidateTree& tree) {
  PathCounts out;
  Tokens path;
  std::function<void(int32_t)> walk = [&](int32_t node) {
    out[path] = static_cast<double>(tree.count(node));
    for (int32_t c = tree.first_child(node); c != -1; c = tree.next_sibling(c)) {
      path.push_back(tree.token(c));
      walk(c);
      path.pop_back();
    }
  };
  walk(CandidateTree::kRoot);
  return out;
}

// Structural invariants of a candidate tree: every allocated node reachable once, no
// token twice among siblings, no child counted more often than its parent.
std::string tree_problem(const CandidateTree& tree) {
  int64_t reachable = 0;
  std::string problem;
  std::function<void(int32_t)> walk = [&](int32_t node) {
    ++reachable;
    std::set<int32_t> tokens;
    for (int32_t c = tree.first_child(node); c != -1; c = tree.next_sibling(c)) {
      if (!tokens.insert(tree.token(c)).second) problem = "duplicate sibling token";
      if (tree.token(c) < 0) problem = "a separator became a node";
      if (tree.count(c) > tree.count(node) || tree.count(c) < 1) problem = "bad count";
      walk(c);
    }
  };
  walk(CandidateTree::kRoot);
  if (reachable != static_cast<int64_t>(tree.num_nodes())) problem = "unreachable nodes";
  return problem;
}

// Structural invariants of any draft; returns "" or what is wrong.
std::string draft_problem(const Draft& d, int32_t budget, int32_t vocab, bool monotone_scores) {
  const size_t n = d.tokens.size();
  if (d.parents.size() != n || d.scores.size() != n) return "array sizes differ";
  if (static_cast<int64_t>(n) > std::max(budget, 0)) return "more nodes than the budget";
  std::vector<int32_t> depth(n, 0);
  std::set<std::pair<int32_t, int32_t>> edges;
  for (size_t i = 0; i < n; ++i) {
    const int32_t p = d.parents[i];
    if (p < -1 || p >= static_cast<int32_t>(i)) return "parents[" + std::to_string(i) + "] not < i";
    if (d.tokens[i] < 0 || d.tokens[i] >= vocab) return "token out of range at " + std::to_string(i);
    depth[i] = p < 0 ? 1 : depth[static_cast<size_t>(p)] + 1;
    if (i > 0 && depth[i] < depth[i - 1]) return "not breadth-first at " + std::to_string(i);
    if (!edges.insert({p, d.tokens[i]}).second) return "duplicate sibling at " + std::to_string(i);
    if (!std::isfinite(d.scores[i]) || d.scores[i] < 0.0f) return "bad score at " + std::to_string(i);
    if (monotone_scores && p >= 0 && d.scores[i] > d.scores[static_cast<size_t>(p)]) {
      return "child scores above its parent at " + std::to_string(i);
    }
  }
  return "";
}

// Same tree, scores bit for bit (so that "deterministic" means exactly the same floats).
bool same_draft(const Draft& a, const Draft& b) {
  return a.tokens == b.tokens && a.parents == b.parents && a.scores.size() == b.scores.size() &&
         (a.scores.empty() ||
          std::memcmp(a.scores.data(), b.scores.data(), a.scores.size() * sizeof(float)) == 0);
}

bool same_batch(const BatchDrafts& a, const BatchDrafts& b) {
  return a.tokens == b.tokens && a.parents == b.parents && a.offsets == b.offsets &&
         a.scores.size() == b.scores.size() &&
         (a.scores.empty() ||
          std::memcmp(a.scores.data(), b.scores.data(), a.scores.size() * sizeof(float)) == 0);
}

Draft slice(const BatchDrafts& b, size_t i) {
  Draft d;
  const auto lo = static_cast<std::ptrdiff_t>(b.offsets[i]);
  const auto hi = static_cast<std::ptrdiff_t>(b.offsets[i + 1]);
  d.tokens.assign(b.tokens.begin() + lo, b.tokens.begin() + hi);
  d.parents.assign(b.parents.begin() + lo, b.parents.begin() + hi);
  d.scores.assign(b.scores.begin() + lo, b.scores.begin() + hi);
  return d;
}

// Node reached from the root of `trie` by `path`, or -1.
int32_t walk_trie(const InputTrie& trie, const int32_t* path, int64_t len) {
  int32_t node = InputTrie::kRoot;
  for (int64_t k = 0; k < len && node != -1; ++k) {
    int32_t c = trie.first_child(node);
    while (c != -1 && trie.token(c) != path[k]) c = trie.next_sibling(c);
    node = c;
  }
  return node;
}

DraftConfig random_config(std::mt19937& rng) {
  DraftConfig c;
  c.input_max_prefix = uniform(rng, 1, 5);
  c.input_max_depth = uniform(rng, c.input_max_prefix, 10);
  c.datastore_min_prefix = uniform(rng, 1, 3);
  c.datastore_max_prefix = uniform(rng, c.datastore_min_prefix, 6);
  c.datastore_samples = uniform(rng, 1, 60);
  c.datastore_max_continuation = uniform(rng, 1, 8);
  c.datastore_min_tree_nodes = uniform(rng, 0, 40);
  c.input_weight = uniform(rng, 0, 30) / 10.0;
  c.input_child_discount_base = uniform(rng, 0, 20) / 10.0;
  c.input_child_discount_per_match = uniform(rng, 0, 10) / 10.0;
  c.datastore_weight = uniform(rng, 0, 30) / 10.0;
  c.datastore_child_discount = uniform(rng, 0, 20) / 10.0;
  if (coin(rng, 0.5)) {
    c.input_smoothing = uniform(rng, 0, 8) / 4.0;
    c.datastore_smoothing = uniform(rng, 0, 8) / 4.0;
  }
  if (coin(rng, 0.3)) {  // a learned node score: any finite weights
    c.node_score.resize(static_cast<size_t>(drafter::kScoreFeatures) + 1);
    for (double& w : c.node_score) w = uniform(rng, -40, 40) / 10.0;
  }
  return c;
}

// Scores fall along a path: a learned score multiplies probabilities; the hand-set one
// probabilities by weights and discounts, here when those are at most 1.
bool scores_monotone(const DraftConfig& c) {
  return !c.node_score.empty() ||
         (c.input_weight <= 1.0 && c.datastore_weight <= 1.0 && c.datastore_child_discount <= 1.0 &&
          c.input_child_discount_base + c.input_child_discount_per_match * c.input_max_prefix <= 1.0);
}

// ---------------------------------------------------------------------------
// Suffix arrays.

TEST(SuffixArray, EveryShortText) {
  // Every text over {-1, 0, 1} up to length 7 and over {0, 1} up to length 12.
  for (const int32_t alphabet : {3, 2}) {
    const int32_t max_len = alphabet == 3 ? 7 : 12;
    const int32_t low = alphabet == 3 ? -1 : 0;
    for (int32_t len = 0; len <= max_len; ++len) {
      int64_t combos = 1;
      for (int32_t i = 0; i < len; ++i) combos *= alphabet;
      for (int64_t code = 0; code < combos; ++code) {
        Tokens t(static_cast<size_t>(len));
        int64_t x = code;
        for (auto& v : t) {
          v = static_cast<int32_t>(x % alphabet) + low;
          x /= alphabet;
        }
        ASSERT_TRUE(verify_suffix_array(t, drafter::build_suffix_array(t.data(), len, 2)))
            << ::testing::PrintToString(t);
      }
    }
  }
}

TEST(SuffixArray, RandomTextsOfEveryShape) {
  // Lengths 0..300, alphabets 1..6 with separators, some far from token 0 or in a
  // vocabulary larger than the alphabet.
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 1500; ++iter) {
    const int32_t alphabet = uniform(rng, 1, 6);
    const int32_t offset = coin(rng, 0.2) ? uniform(rng, 0, 1000) : 0;
    const int32_t vocab = offset + alphabet + (coin(rng, 0.3) ? uniform(rng, 0, 50) : 0);
    const Tokens t = random_text(rng, 300, alphabet, offset);
    const Tokens sa = drafter::build_suffix_array(t.data(), static_cast<int64_t>(t.size()), vocab);
    ASSERT_TRUE(verify_suffix_array(t, sa)) << "vocab " << vocab << " text "
                                            << ::testing::PrintToString(t);
  }
}

TEST(SuffixArray, LargeTexts) {
  std::mt19937 rng(54321);
  for (int iter = 0; iter < 4; ++iter) {
    Tokens t;
    if (iter == 0) {  // plain random text
      t.resize(100000);
      for (auto& v : t) v = symbol(rng, 4, 0.02);
    } else {  // any of the shapes above
      t = random_text(rng, 60000, uniform(rng, 1, 6), 0);
    }
    const Tokens sa = drafter::build_suffix_array(t.data(), static_cast<int64_t>(t.size()), 6);
    EXPECT_TRUE(verify_suffix_array(t, sa)) << "text of length " << t.size();
  }
}

TEST(SuffixArray, RejectsTokensOutsideTheVocabulary) {
  const Tokens ok{0, 1, -1, 2};
  EXPECT_TRUE(drafter::build_suffix_array(ok.data(), 0, 3).empty());
  EXPECT_EQ(drafter::build_suffix_array(ok.data(), 4, 3).size(), size_t{4});
  const Tokens below{0, -2, 1};
  EXPECT_THROW(drafter::build_suffix_array(below.data(), 3, 5), std::invalid_argument);
  const Tokens above{0, 5, 1};
  EXPECT_THROW(drafter::build_suffix_array(above.data(), 3, 5), std::invalid_argument);
  EXPECT_THROW(drafter::build_suffix_array(ok.data(), 4, 2), std::invalid_argument);  // 2 >= vocab
  EXPECT_THROW(drafter::build_suffix_array(ok.data(), 4, 0), std::invalid_argument);
  EXPECT_THROW(drafter::build_suffix_array(ok.data(), -1, 3), std::invalid_argument);
  EXPECT_THROW(SubIndex::build(above, 5), std::invalid_argument);
  EXPECT_THROW(SubIndex::build(below, 5), std::invalid_argument);
}

// ---------------------------------------------------------------------------
// Sub-index search.

// find_range's rows lie inside the suffix array and hold exactly the prefix's occurrences.
void expect_find_range(const SubIndex& index, const Tokens& t, const Tokens& prefix) {
  const SaRange r = index.find_range(prefix.data(), static_cast<int32_t>(prefix.size()));
  std::vector<int64_t> expected;
  for (int64_t i = 0; i + static_cast<int64_t>(prefix.size()) <= static_cast<int64_t>(t.size()); ++i) {
    if (occurs_at(t, i, prefix.data(), static_cast<int64_t>(prefix.size()))) expected.push_back(i);
  }
  ASSERT_TRUE(r.begin >= 0 && r.begin <= r.end && r.end <= index.num_tokens())
      << "[" << r.begin << ", " << r.end << ")";
  std::vector<int64_t> got;
  for (int64_t row = r.begin; row < r.end; ++row) got.push_back(index.position(row));
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, expected) << "prefix " << ::testing::PrintToString(prefix);
}

TEST(SubIndex, FindRangeHoldsExactlyTheOccurrences) {
  std::mt19937 rng(777);
  for (int iter = 0; iter < 120; ++iter) {
    const int32_t alphabet = uniform(rng, 1, 6);
    const int32_t vocab = alphabet + uniform(rng, 0, 3);
    const Tokens t = random_text(rng, 400, alphabet, 0);
    SCOPED_TRACE("text " + ::testing::PrintToString(t));
    const auto index = SubIndex::build(t, vocab);
    ASSERT_EQ(index->num_tokens(), static_cast<int64_t>(t.size()));
    ASSERT_TRUE(std::equal(t.begin(), t.end(), index->tokens()));
    EXPECT_GE(index->resident_bytes(), 8 * index->num_tokens());
    EXPECT_EQ(index->find_range(t.data(), 0).size(), 0);  // empty prefix: only emptiness matters
    for (int q = 0; q < 30; ++q) {
      Tokens prefix;
      const int32_t len = uniform(rng, 1, 8);
      if (!t.empty() && coin(rng, 0.6)) {
        // A substring of the text (it may continue across a separator).
        const int32_t from = uniform(rng, 0, static_cast<int32_t>(t.size()) - 1);
        for (int32_t k = 0; k < len && from + k < static_cast<int32_t>(t.size()); ++k) {
          prefix.push_back(t[static_cast<size_t>(from + k)]);
        }
        if (prefix[0] < 0) prefix[0] = uniform(rng, 0, vocab - 1);
      } else {
        for (int32_t k = 0; k < len; ++k) prefix.push_back(uniform(rng, 0, vocab - 1));
      }
      expect_find_range(*index, t, prefix);
    }
    // The same arrays wrapped (as a snapshot would be) answer the same.
    auto owner = std::make_shared<std::pair<Tokens, Tokens>>(
        t, Tokens(index->suffix_array(), index->suffix_array() + t.size()));
    const auto wrapped = SubIndex::wrap(owner->first.data(), owner->second.data(),
                                        static_cast<int64_t>(t.size()), vocab, owner);
    owner.reset();  // the index keeps its arrays alive
    for (int q = 0; q < 10 && !t.empty(); ++q) {
      const int32_t from = uniform(rng, 0, static_cast<int32_t>(t.size()) - 1);
      const Tokens prefix(t.begin() + from,
                          t.begin() + std::min<int32_t>(from + 3, static_cast<int32_t>(t.size())));
      if (prefix[0] >= 0) expect_find_range(*wrapped, t, prefix);
    }
  }
}

TEST(SubIndex, WrapValidatesItsArrays) {
  const Tokens text{0, 1, -1, 2, 1};
  const auto built = SubIndex::build(text, 3);
  const Tokens sa(built->suffix_array(), built->suffix_array() + text.size());
  EXPECT_NO_THROW(SubIndex::wrap(text.data(), sa.data(), 5, 3, nullptr));
  Tokens bad_text = text;
  bad_text[3] = 3;  // == vocab
  EXPECT_THROW(SubIndex::wrap(bad_text.data(), sa.data(), 5, 3, nullptr), std::invalid_argument);
  bad_text[3] = -2;
  EXPECT_THROW(SubIndex::wrap(bad_text.data(), sa.data(), 5, 3, nullptr), std::invalid_argument);
  Tokens bad_sa = sa;
  bad_sa[2] = 5;  // == n
  EXPECT_THROW(SubIndex::wrap(text.data(), bad_sa.data(), 5, 3, nullptr), std::invalid_argument);
  bad_sa[2] = -1;
  EXPECT_THROW(SubIndex::wrap(text.data(), bad_sa.data(), 5, 3, nullptr), std::invalid_argument);
  EXPECT_THROW(SubIndex::wrap(text.data(), sa.data(), 5, 0, nullptr), std::invalid_argument);
  EXPECT_THROW(SubIndex::wrap(text.data(), sa.data(), -1, 3, nullptr), std::invalid_argument);
  // An empty sub-index finds nothing.
  const auto empty = SubIndex::build({}, 3);
  const Tokens p{1};
  EXPECT_EQ(empty->find_range(p.data(), 1).size(), 0);
}

// ---------------------------------------------------------------------------
// Input trie.

// Appended chunk by chunk, the trie holds exactly the input's substrings up to its depth
// with their counts; suffix_node and holds agree with them.
TEST(InputTrie, GrowsToHoldEverySubstringWithItsCount) {
  std::mt19937 rng(4242);
  for (int iter = 0; iter < 120; ++iter) {
    const int32_t depth = uniform(rng, 1, 9);
    const int32_t alphabet = uniform(rng, 1, 5);
    // Some alphabets straddle the end of the trie's token bitmap (holds()).
    const int32_t offset = coin(rng, 0.15)  ? static_cast<int32_t>(InputTrie::kBitmapTokens) - 2
                           : coin(rng, 0.3) ? uniform(rng, 0, 100000)
                                            : 0;
    InputTrie trie(depth);
    Tokens input;
    const int32_t chunks = uniform(rng, 1, 6);
    for (int32_t ch = 0; ch < chunks; ++ch) {
      Tokens piece = random_text(rng, 60, alphabet, offset);
      for (auto& v : piece) v = v < 0 ? offset : v;  // the trie holds tokens only
      for (int32_t v : piece) {
        trie.append(v);
        input.push_back(v);
      }
      SCOPED_TRACE("depth " + std::to_string(depth) + " input " + ::testing::PrintToString(input));
      const auto n = static_cast<int64_t>(input.size());

      std::map<Tokens, int64_t> expected;  // every substring of length <= depth
      for (int64_t i = 0; i < n; ++i) {
        Tokens s;
        for (int64_t k = i; k < n && k - i < depth; ++k) {
          s.push_back(input[static_cast<size_t>(k)]);
          ++expected[s];
        }
      }
      for (const auto& [s, cnt] : expected) {
        const int32_t node = walk_trie(trie, s.data(), static_cast<int64_t>(s.size()));
        ASSERT_GE(node, 0) << ::testing::PrintToString(s);
        ASSERT_EQ(static_cast<int64_t>(trie.count(node)), cnt) << ::testing::PrintToString(s);
      }
      // ... and nothing else (no duplicate siblings either).
      int64_t nodes_seen = 0;
      bool dup = false;
      std::function<void(int32_t)> visit = [&](int32_t node) {
        std::set<int32_t> tokens;
        for (int32_t c = trie.first_child(node); c != -1; c = trie.next_sibling(c)) {
          ++nodes_seen;
          if (!tokens.insert(trie.token(c)).second) dup = true;
          visit(c);
        }
      };
      visit(InputTrie::kRoot);
      ASSERT_FALSE(dup);
      ASSERT_EQ(nodes_seen, static_cast<int64_t>(expected.size()));
      ASSERT_EQ(nodes_seen + 1, trie.num_nodes());
      // suffix_node(len) is the node of the last len tokens.
      EXPECT_EQ(trie.suffix_node(0), -1);
      EXPECT_EQ(trie.suffix_node(-3), -1);
      for (int32_t len = 1; len <= depth + 2; ++len) {
        const int32_t got = trie.suffix_node(len);
        if (len > depth || len > n) {
          EXPECT_EQ(got, -1) << "len " << len;
        } else {
          EXPECT_GT(got, 0) << "len " << len;
          EXPECT_EQ(got, walk_trie(trie, input.data() + n - len, len)) << "len " << len;
        }
      }
      // holds(t): the input has token t, as the root's child along t says.
      EXPECT_FALSE(trie.holds(-1));
      EXPECT_FALSE(trie.holds(INT32_MAX));
      for (int32_t t = offset - 1; t <= offset + alphabet + 1; ++t) {
        const bool has = std::find(input.begin(), input.end(), t) != input.end();
        EXPECT_EQ(trie.holds(t), has) << "token " << t;
        EXPECT_EQ(trie.child(InputTrie::kRoot, t) >= 0, has) << "token " << t;
      }
      EXPECT_GT(trie.resident_bytes(), 0);
    }
  }
}

// Natural-ish stream with verbatim repeats of earlier spans (like code or chat).
Tokens long_input(std::mt19937& rng, const MarkovSource& src, int32_t len) {
  Tokens input;
  input.reserve(static_cast<size_t>(len));
  while (static_cast<int32_t>(input.size()) < len) {
    if (input.size() > 1000 && coin(rng, 0.02)) {
      const auto from = static_cast<size_t>(uniform(rng, 0, static_cast<int32_t>(input.size()) - 200));
      const auto take = static_cast<size_t>(uniform(rng, 20, 200));
      for (size_t k = 0; k < take && static_cast<int32_t>(input.size()) < len; ++k) {
        input.push_back(input[from + k]);
      }
    } else {
      input.push_back(src.next(rng, input.empty() ? -1 : input.back()));
    }
  }
  return input;
}

constexpr int32_t kLargeLen = 128 * 1024;
constexpr int32_t kLargeVocab = 32000;

const MarkovSource& large_source() {
  static const MarkovSource src(kLargeVocab, 8);
  return src;
}

// 128k tokens, built once.
const Tokens& large_input() {
  static const Tokens input = [] {
    std::mt19937 rng(8);
    return long_input(rng, large_source(), kLargeLen);
  }();
  return input;
}

TEST(InputTrie, LargeInput) {
  constexpr int32_t kDepth = 16;
  std::mt19937 rng(8);
  const Tokens& input = large_input();
  const auto t0 = std::chrono::steady_clock::now();
  InputTrie trie(kDepth);
  for (int32_t v : input) trie.append(v);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
  std::printf("InputTrie(depth %d) over %d tokens: %" PRId64 " nodes, %.1f MiB resident, %.2f s\n",
              kDepth, kLargeLen, trie.num_nodes(),
              static_cast<double>(trie.resident_bytes()) / (1 << 20), took.count());
  EXPECT_LE(trie.num_nodes(), int64_t{kLargeLen} * kDepth + 1);
  EXPECT_GE(trie.resident_bytes(), trie.num_nodes() * 16);
  int64_t root_total = 0;
  for (int32_t c = trie.first_child(InputTrie::kRoot); c != -1; c = trie.next_sibling(c)) {
    root_total += trie.count(c);
  }
  EXPECT_EQ(root_total, int64_t{kLargeLen});
  for (int32_t len = 1; len <= kDepth; ++len) {
    const int32_t node = trie.suffix_node(len);
    EXPECT_GT(node, 0);
    EXPECT_EQ(node, walk_trie(trie, input.data() + kLargeLen - len, len));
  }
  // Counts of a few substrings against a scan.
  for (int q = 0; q < 20; ++q) {
    const int32_t len = uniform(rng, 1, kDepth);
    const int32_t from = uniform(rng, 0, kLargeLen - len);
    int64_t expected = 0;
    for (int64_t i = 0; i + len <= kLargeLen; ++i) expected += occurs_at(input, i, input.data() + from, len);
    const int32_t node = walk_trie(trie, input.data() + from, len);
    ASSERT_GT(node, 0);
    EXPECT_EQ(static_cast<int64_t>(trie.count(node)), expected) << "at " << from << " length " << len;
  }
}

// ---------------------------------------------------------------------------
// Candidate trees.

// Samples added to a CandidateTree in batches (sorted runs that interleave with the
// samples held, unsorted batches, duplicates, empty continuations) give the tree of
// all of them added at once, and its node count is the number of distinct paths.
TEST(CandidateTree, BatchesGiveTheTreeOfAllSamples) {
  std::mt19937 rng(31337);
  for (int iter = 0; iter < 500; ++iter) {
    const int32_t alphabet = uniform(rng, 1, 4);
    const int32_t max_len = uniform(rng, 0, 6);
    std::vector<Tokens> conts(static_cast<size_t>(uniform(rng, 0, 40)));
    for (Tokens& c : conts) {
      c.resize(static_cast<size_t>(uniform(rng, 0, max_len)));
      for (int32_t& v : c) v = uniform(rng, 0, alphabet - 1);
    }
    std::vector<drafter::Sample> all;
    for (const Tokens& c : conts) all.push_back({c.data(), static_cast<int32_t>(c.size())});
    CandidateTree whole;
    whole.add(all.data(), all.size());
    // The same samples in batches of random sizes, each sorted (as one suffix array
    // range delivers them) or shuffled; sometimes every batch sorts after the last.
    const auto sample_order = [](const drafter::Sample& a, const drafter::Sample& b) {
      return std::lexicographical_compare(a.tokens, a.tokens + a.len, b.tokens, b.tokens + b.len);
    };
    if (coin(rng, 0.3)) {
      std::sort(all.begin(), all.end(), sample_order);
    } else {
      std::shuffle(all.begin(), all.end(), rng);
    }
    CandidateTree batched;
    for (size_t at = 0; at < all.size();) {
      const size_t n = std::min(all.size() - at, static_cast<size_t>(uniform(rng, 1, 12)));
      std::vector<drafter::Sample> batch(all.begin() + static_cast<std::ptrdiff_t>(at),
                                         all.begin() + static_cast<std::ptrdiff_t>(at + n));
      if (coin(rng, 0.7)) std::sort(batch.begin(), batch.end(), sample_order);
      batched.add(batch.data(), batch.size());
      at += n;
    }
    PathCounts paths;
    paths[Tokens{}] = static_cast<double>(conts.size());
    for (const Tokens& c : conts) {
      for (size_t j = 1; j <= c.size(); ++j) paths[Tokens(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(j))] += 1;
    }
    SCOPED_TRACE("iter " + std::to_string(iter));
    ASSERT_EQ(dump_tree(whole), paths);
    ASSERT_EQ(dump_tree(batched), paths);
    ASSERT_EQ(static_cast<int64_t>(batched.num_nodes()), static_cast<int64_t>(paths.size()));
    ASSERT_EQ(static_cast<int64_t>(whole.num_nodes()), static_cast<int64_t>(paths.size()));
  }
}

// ---------------------------------------------------------------------------
// Retrieval and fusion over random inputs: memory safety, structure, determinism.

struct TestDatastore {
  std::vector<Tokens> texts;
  Datastore datastore;
};

TestDatastore make_datastore(std::mt19937& rng, const MarkovSource& src, int32_t num_sub,
                             int32_t max_docs, int32_t max_doc_len, int32_t vocab) {
  TestDatastore d;
  for (int32_t s = 0; s < num_sub; ++s) {
    Tokens t = src.documents(rng, uniform(rng, 1, max_docs), max_doc_len);
    d.datastore.sub_indices.push_back(SubIndex::build(t, vocab));
    d.texts.push_back(std::move(t));
  }
  return d;
}

// Random natural streams and configs (split datastores, learned scores): the datastore
// tree and every draft (datastore only, input only, both, explained) keep their
// invariants, and drafting again with the same scratch or a fresh one gives the same bytes.
TEST(Draft, RandomInputsKeepTheInvariants) {
  std::mt19937 rng(99);
  int64_t nonempty_datastore = 0, nonempty_input = 0;
  constexpr int kIters = 500;
  for (int iter = 0; iter < kIters; ++iter) {
    const int32_t vocab = uniform(rng, 2, 12);
    const MarkovSource src(vocab, static_cast<uint32_t>(iter));
    TestDatastore ds = make_datastore(rng, src, uniform(rng, 0, 3), 6, 120, vocab);
    ds.datastore.base_count = static_cast<size_t>(uniform(rng, 0, static_cast<int32_t>(ds.texts.size())));
    const DraftConfig config = random_config(rng);
    drafter::validate(config);
    // Context: a stream from the same source (often matches) or from a piece of a text.
    Tokens ctx = src.stream(rng, uniform(rng, 0, 40));
    if (!ds.texts.empty() && coin(rng, 0.3)) {
      const Tokens& t = ds.texts[0];
      const int32_t from = uniform(rng, 0, static_cast<int32_t>(t.size()));
      for (int32_t k = from; k < static_cast<int32_t>(t.size()) && t[static_cast<size_t>(k)] >= 0 &&
                             k - from < 30; ++k) {
        ctx.push_back(t[static_cast<size_t>(k)]);
      }
    }
    const int32_t budget = coin(rng, 0.1) ? 0 : uniform(rng, 1, coin(rng, 0.5) ? 4 : 40);
    SCOPED_TRACE("iter " + std::to_string(iter) + " budget " + std::to_string(budget) + " ctx " +
                 ::testing::PrintToString(ctx));
    const bool monotone = scores_monotone(config);
    const auto n = static_cast<int64_t>(ctx.size());

    DraftScratch scratch;
    drafter::retrieve_sub_indices(ds.datastore, 0, ds.datastore.sub_indices.size(), ctx.data(),
                                  n, config, budget, scratch.retrieval, scratch.datastore_tree);
    const CandidateTree tree = scratch.datastore_tree;
    ASSERT_EQ(tree_problem(tree), "");
    const CandidateTree* tree_ptr = ds.datastore.sub_indices.empty() ? nullptr : &tree;

    InputTrie trie(config.input_max_depth);
    for (int32_t v : ctx) trie.append(v);

    Draft datastore_only;
    drafter::FusionInputs from_datastore{config, budget};
    from_datastore.datastore_tree = tree_ptr;
    drafter::fuse(from_datastore, scratch.fusion, datastore_only);
    ASSERT_EQ(draft_problem(datastore_only, budget, vocab, monotone), "") << "datastore only";
    nonempty_datastore += !datastore_only.tokens.empty();

    Draft input_only;
    drafter::FusionInputs from_input{config, budget};
    from_input.trie = &trie;
    from_input.explain = coin(rng, 0.5);
    drafter::fuse(from_input, scratch.fusion, input_only);
    ASSERT_EQ(draft_problem(input_only, budget, vocab, monotone), "") << "input only";
    if (from_input.explain) {
      ASSERT_EQ(input_only.features.size(), input_only.tokens.size() * drafter::kScoreFeatures);
    }
    nonempty_input += !input_only.tokens.empty();

    // Both sources via draft_one, twice with the same scratch and once with a fresh one.
    Draft both, again, fresh_draft;
    drafter::draft_one(&trie, ctx.data(), n, &ds.datastore, config, budget, scratch, both);
    ASSERT_EQ(draft_problem(both, budget, vocab, monotone), "") << "both";
    drafter::draft_one(&trie, ctx.data(), n, &ds.datastore, config, budget, scratch, again);
    DraftScratch fresh;
    drafter::draft_one(&trie, ctx.data(), n, &ds.datastore, config, budget, fresh, fresh_draft);
    ASSERT_TRUE(same_draft(both, again) && same_draft(both, fresh_draft)) << "not deterministic";
  }
  // The random cases must exercise something.
  EXPECT_GT(nonempty_datastore, kIters / 5);
  EXPECT_GT(nonempty_input, kIters / 5);
}

// Wide nodes with small budgets: the core offers only a member's best children, as many
// as nodes remain to be chosen.
TEST(Draft, WideNodesWithSmallBudgets) {
  std::mt19937 rng(2718);
  for (int iter = 0; iter < 100; ++iter) {
    const int32_t vocab = 200;
    InputTrie trie(8);
    Tokens input;
    const int32_t hub = uniform(rng, 0, vocab - 1);
    for (int32_t k = 0; k < 300; ++k) {  // `hub` followed by many different tokens
      input.push_back(hub);
      input.push_back(coin(rng, 0.5) ? uniform(rng, 0, 5) : uniform(rng, 0, vocab - 1));
    }
    input.push_back(hub);
    for (int32_t v : input) trie.append(v);
    DraftConfig c = random_config(rng);
    c.input_max_depth = std::max(c.input_max_depth, 2);
    Tokens doc = input;
    std::shuffle(doc.begin(), doc.end(), rng);
    Datastore ds;
    ds.sub_indices.push_back(SubIndex::build(doc, vocab));
    const int32_t budget = uniform(rng, 1, 6);
    DraftScratch scratch;
    Draft d;
    drafter::draft_one(&trie, input.data(), static_cast<int64_t>(input.size()), &ds, c, budget,
                       scratch, d);
    ASSERT_EQ(draft_problem(d, budget, vocab, scores_monotone(c)), "") << "iter " << iter;
    ASSERT_EQ(static_cast<int32_t>(d.tokens.size()), budget) << "iter " << iter;
  }
}

TEST(Draft, DegenerateInputs) {
  DraftConfig c;
  DraftScratch scratch;
  Draft d;
  d.tokens = {1};  // the output is replaced, not appended to
  drafter::draft_one(nullptr, nullptr, 0, nullptr, c, 10, scratch, d);
  EXPECT_TRUE(d.tokens.empty() && d.parents.empty() && d.scores.empty());
  Datastore empty_ds;
  const Tokens ctx{1, 2, 3};
  drafter::draft_one(nullptr, ctx.data(), 3, &empty_ds, c, 10, scratch, d);
  EXPECT_TRUE(d.tokens.empty());
  Datastore one;
  one.sub_indices.push_back(SubIndex::build({1, 2, 3, 4, -1, 2, 3, 5}, 8));
  auto retrieve = [&](int64_t context_len, int32_t max_len) {
    drafter::retrieve_sub_indices(one, 0, 1, ctx.data(), context_len, c, max_len,
                                  scratch.retrieval, scratch.datastore_tree);
    return scratch.datastore_tree.num_nodes();
  };
  EXPECT_EQ(retrieve(3, 0), 1);  // max_len 0
  EXPECT_EQ(retrieve(0, 5), 1);  // empty context
  EXPECT_GT(retrieve(3, 5), 1);
  DraftConfig bad;
  bad.input_max_depth = 2;  // < input_max_prefix
  EXPECT_THROW(drafter::validate(bad), std::invalid_argument);
}

// A draft over the 128k-token input with a 100k-token datastore, alone and in a Drafter.
TEST(Draft, LargeInputAndDatastore) {
  std::mt19937 rng(9);
  const Tokens& input = large_input();
  InputTrie trie(DraftConfig{}.input_max_depth);
  for (int32_t v : input) trie.append(v);
  const Tokens docs = large_source().documents(rng, 200, 1000);
  auto ds = std::make_shared<Datastore>();
  ds->sub_indices.push_back(SubIndex::build(docs, kLargeVocab));
  EXPECT_TRUE(verify_suffix_array(docs, Tokens(ds->sub_indices[0]->suffix_array(),
                                               ds->sub_indices[0]->suffix_array() + docs.size())));
  const DraftConfig config;
  DraftScratch scratch;
  Draft d;
  drafter::draft_one(&trie, input.data(), kLargeLen, ds.get(), config, 256, scratch, d);
  EXPECT_EQ(draft_problem(d, 256, kLargeVocab, true), "");
  EXPECT_FALSE(d.tokens.empty());
  Drafter big(config, kLargeVocab, 2);
  big.set_datastore(ds);
  big.start(1, input.data(), kLargeLen);
  EXPECT_GE(big.request_bytes(1), trie.resident_bytes());
  const int64_t h = 1, zero_offsets[2] = {0, 0};
  const int32_t budget = 256;
  const BatchDrafts b = big.draft_batch(&h, 1, nullptr, 0, zero_offsets, &budget);
  EXPECT_TRUE(same_draft(slice(b, 0), d));
}

// ---------------------------------------------------------------------------
// Drafter.

constexpr int32_t kVocab = 64;

const MarkovSource& shared_source() {
  static const MarkovSource src(kVocab, 555);
  return src;
}

// Three sub-indices of 40 documents each, built once.
const std::shared_ptr<const Datastore>& shared_datastore() {
  static const std::shared_ptr<const Datastore> ds = [] {
    std::mt19937 rng(555);
    auto d = std::make_shared<Datastore>();
    for (int s = 0; s < 3; ++s) {
      d->sub_indices.push_back(SubIndex::build(shared_source().documents(rng, 40, 400), kVocab));
    }
    return d;
  }();
  return ds;
}

// Sequential model of a Drafter: per-request trie + tokens, drafted with draft_one.
struct ShadowRequest {
  explicit ShadowRequest(int32_t depth) : trie(depth) {}
  InputTrie trie;
  Tokens tokens;
  void append(const int32_t* t, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      trie.append(t[k]);
      tokens.push_back(t[k]);
    }
  }
};
using Shadow = std::map<int64_t, std::unique_ptr<ShadowRequest>>;

struct Step {
  std::vector<int64_t> handles;
  Tokens new_tokens;
  std::vector<int64_t> offsets;
  Tokens budgets;
};

Step random_step(std::mt19937& rng, const MarkovSource& src, const std::vector<int64_t>& handles,
                 int32_t max_budget) {
  Step s;
  s.handles = handles;
  std::shuffle(s.handles.begin(), s.handles.end(), rng);
  s.offsets.push_back(0);
  for (size_t i = 0; i < s.handles.size(); ++i) {
    const Tokens t = src.stream(rng, uniform(rng, 0, 5));
    s.new_tokens.insert(s.new_tokens.end(), t.begin(), t.end());
    s.offsets.push_back(static_cast<int64_t>(s.new_tokens.size()));
    s.budgets.push_back(coin(rng, 0.1) ? 0 : uniform(rng, 1, max_budget));
  }
  return s;
}

BatchDrafts run_step(Drafter& d, const Step& s) {
  return d.draft_batch(s.handles.data(), static_cast<int64_t>(s.handles.size()),
                       s.new_tokens.data(), static_cast<int64_t>(s.new_tokens.size()),
                       s.offsets.data(), s.budgets.data());
}

std::vector<Draft> run_shadow(Shadow& shadow, const Datastore& ds, const DraftConfig& c,
                              const Step& s) {
  std::vector<Draft> out(s.handles.size());
  DraftScratch scratch;
  for (size_t i = 0; i < s.handles.size(); ++i) {
    ShadowRequest& r = *shadow.at(s.handles[i]);
    r.append(s.new_tokens.data() + s.offsets[i], s.offsets[i + 1] - s.offsets[i]);
    drafter::draft_one(&r.trie, r.tokens.data(), static_cast<int64_t>(r.tokens.size()), &ds, c,
                       s.budgets[i], scratch, out[i]);
  }
  return out;
}

// 32 requests drafted by 4 threads, by 1 thread and by the sequential model, step by step;
// then add, an empty batch, stop, and set_datastore.
// `config` without the recent tier: the shadow model drafts each request alone.
void expect_threads_and_model_agree(DraftConfig config) {
  config.recent_samples = 0;
  const auto& ds = shared_datastore();
  const MarkovSource& src = shared_source();
  Drafter one(config, kVocab, 1), four(config, kVocab, 4);
  EXPECT_EQ(one.num_threads(), 1);
  EXPECT_EQ(four.num_threads(), 4);
  one.set_datastore(ds);
  four.set_datastore(ds);
  EXPECT_EQ(four.datastore(), ds);
  std::mt19937 rng(2024);
  Shadow shadow;
  std::vector<int64_t> handles;
  for (int64_t h = 0; h < 32; ++h) {
    const int64_t handle = h * 7919 - 100;  // negative handles are fine too
    const Tokens prompt = src.stream(rng, h == 0 ? 0 : uniform(rng, 1, 300));
    one.start(handle, prompt.data(), static_cast<int64_t>(prompt.size()));
    four.start(handle, prompt.data(), static_cast<int64_t>(prompt.size()));
    auto r = std::make_unique<ShadowRequest>(config.input_max_depth);
    r->append(prompt.data(), static_cast<int64_t>(prompt.size()));
    shadow.emplace(handle, std::move(r));
    handles.push_back(handle);
    EXPECT_EQ(four.num_tokens(handle), static_cast<int64_t>(prompt.size()));
  }
  EXPECT_EQ(four.num_requests(), int64_t{32});
  int64_t drafted = 0;
  for (int step = 0; step < 16; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Step s = random_step(rng, src, handles, config.max_budget);
    const BatchDrafts a = run_step(one, s);
    const BatchDrafts b = run_step(four, s);
    const std::vector<Draft> expected = run_shadow(shadow, *ds, config, s);
    ASSERT_TRUE(same_batch(a, b)) << "num_threads=4 differs from num_threads=1";
    ASSERT_EQ(a.offsets.size(), s.handles.size() + 1);
    for (size_t i = 0; i < s.handles.size(); ++i) {
      ASSERT_TRUE(same_draft(slice(a, i), expected[i])) << "draft_batch differs from draft_one";
      ASSERT_EQ(draft_problem(slice(b, i), s.budgets[i], kVocab, true), "");
    }
    drafted += static_cast<int64_t>(a.tokens.size());
  }
  EXPECT_GT(drafted, 1000);
  for (int64_t h : handles) {
    EXPECT_EQ(four.num_tokens(h), static_cast<int64_t>(shadow.at(h)->tokens.size()));
    EXPECT_GT(four.request_bytes(h), 0);
  }
  // add() then a step with no new tokens sees the added tokens.
  const Tokens extra = src.stream(rng, 10);
  one.add(handles[3], extra.data(), 10);
  four.add(handles[3], extra.data(), 10);
  shadow.at(handles[3])->append(extra.data(), 10);
  {
    const Step s{{handles[3]}, {}, {0, 0}, {64}};
    const BatchDrafts b = run_step(four, s);
    EXPECT_TRUE(same_draft(slice(b, 0), run_shadow(shadow, *ds, config, s)[0]));
    EXPECT_TRUE(same_batch(b, run_step(one, s)));
  }
  // An empty batch.
  {
    const int64_t zero = 0;
    const BatchDrafts b = four.draft_batch(nullptr, 0, nullptr, 0, &zero, nullptr);
    EXPECT_TRUE(b.tokens.empty() && b.offsets.size() == 1 && b.offsets[0] == 0);
  }
  // Stop.
  EXPECT_TRUE(four.stop(handles[0]));
  EXPECT_FALSE(four.stop(handles[0]));
  EXPECT_EQ(four.num_requests(), int64_t{31});
  EXPECT_THROW(four.num_tokens(handles[0]), std::out_of_range);

  // set_datastore validation; replacing the datastore changes later drafts only.
  EXPECT_THROW(four.set_datastore(nullptr), std::invalid_argument);
  auto other_vocab = std::make_shared<Datastore>();
  other_vocab->sub_indices.push_back(SubIndex::build({1, 2, 3}, kVocab + 1));
  EXPECT_THROW(four.set_datastore(other_vocab), std::invalid_argument);
  EXPECT_EQ(four.datastore(), ds);
  four.set_datastore(std::make_shared<Datastore>());
  {
    const Step s{{handles[5]}, {}, {0, 0}, {32}};
    const BatchDrafts b = run_step(four, s);
    const Datastore none;
    EXPECT_TRUE(same_draft(slice(b, 0), run_shadow(shadow, none, config, s)[0]));
  }
}

TEST(Drafter, RejectsBadConstruction) {
  const DraftConfig config;
  EXPECT_THROW(Drafter(config, kVocab, 0), std::invalid_argument);
  EXPECT_THROW(Drafter(config, 0, 1), std::invalid_argument);
  DraftConfig bad = config;
  bad.datastore_samples = 0;
  EXPECT_THROW(Drafter(bad, kVocab, 2), std::invalid_argument);
}

TEST(Drafter, ThreadsAndSequentialModelAgree) { expect_threads_and_model_agree(DraftConfig{}); }

TEST(Drafter, ThreadsAndSequentialModelAgreeWithALearnedScore) {
  DraftConfig config;
  config.node_score.resize(static_cast<size_t>(drafter::kScoreFeatures) + 1);
  for (size_t i = 0; i < config.node_score.size(); ++i) {
    config.node_score[i] = 0.1 * static_cast<double>(static_cast<int>(i % 5) - 2);
  }
  expect_threads_and_model_agree(config);
}

// Every rejected call (unknown or duplicate handles, tokens outside the vocabulary, bad
// offsets, budgets outside [0, max_budget]) throws and changes nothing: the requests keep
// their tokens and a valid step still gives the model's drafts.
TEST(Drafter, BadInputIsRejectedAndChangesNothing) {
  const auto& ds = shared_datastore();
  const MarkovSource& src = shared_source();
  DraftConfig config;
  config.max_budget = 100;
  config.recent_samples = 0;  // the shadow model drafts each request alone
  Drafter d(config, kVocab, 3);
  d.set_datastore(ds);
  std::mt19937 rng(31337);
  Shadow shadow;
  const std::vector<int64_t> handles{10, 20, 30, 40};
  for (int64_t h : handles) {
    const Tokens prompt = src.stream(rng, 50);
    d.start(h, prompt.data(), 50);
    shadow.emplace(h, std::make_unique<ShadowRequest>(config.input_max_depth));
    shadow.at(h)->append(prompt.data(), 50);
  }
  auto expect_unchanged = [&](const char* after) {
    SCOPED_TRACE(std::string("after ") + after);
    EXPECT_EQ(d.num_requests(), static_cast<int64_t>(handles.size()));
    for (int64_t h : handles) {
      EXPECT_EQ(d.num_tokens(h), static_cast<int64_t>(shadow.at(h)->tokens.size()));
    }
    const Step s = random_step(rng, src, handles, config.max_budget);
    const BatchDrafts b = run_step(d, s);
    const std::vector<Draft> expected = run_shadow(shadow, *ds, config, s);
    for (size_t i = 0; i < s.handles.size(); ++i) EXPECT_TRUE(same_draft(slice(b, i), expected[i]));
  };
  expect_unchanged("setup");

  const Tokens good{1, 2, 3};
  const Tokens bad_token{1, kVocab, 3};
  const Tokens negative{1, -1, 3};
  // Unknown handles.
  EXPECT_THROW(d.add(999, good.data(), 3), std::out_of_range);
  EXPECT_THROW(d.num_tokens(999), std::out_of_range);
  EXPECT_THROW(d.request_bytes(999), std::out_of_range);
  EXPECT_FALSE(d.stop(999));
  EXPECT_THROW(run_step(d, Step{{10, 999}, good, {0, 2, 3}, {5, 5}}), std::out_of_range);
  expect_unchanged("unknown handle");
  // Duplicate start keeps the existing request.
  EXPECT_THROW(d.start(20, good.data(), 3), std::invalid_argument);
  expect_unchanged("duplicate start");
  // Tokens out of the vocabulary (start must not register the handle).
  EXPECT_THROW(d.start(50, bad_token.data(), 3), std::invalid_argument);
  EXPECT_THROW(d.start(51, negative.data(), 3), std::invalid_argument);
  EXPECT_THROW(d.num_tokens(50), std::out_of_range);
  EXPECT_THROW(d.add(10, bad_token.data(), 3), std::invalid_argument);
  EXPECT_THROW(d.add(10, negative.data(), 3), std::invalid_argument);
  EXPECT_THROW(run_step(d, Step{{10, 20}, bad_token, {0, 1, 3}, {5, 5}}), std::invalid_argument);
  expect_unchanged("bad tokens");
  // Duplicate handle in one batch.
  EXPECT_THROW(run_step(d, Step{{10, 20, 10}, good, {0, 1, 2, 3}, {5, 5, 5}}),
               std::invalid_argument);
  expect_unchanged("duplicate handle in a batch");
  // Offsets: decreasing, not starting at 0, not ending at the token count.
  for (const std::vector<int64_t>& offsets : {std::vector<int64_t>{0, 2, 1, 3},
                                              std::vector<int64_t>{1, 2, 3, 3},
                                              std::vector<int64_t>{0, 1, 2, 2}}) {
    EXPECT_THROW(run_step(d, Step{{10, 20, 30}, good, offsets, {5, 5, 5}}), std::invalid_argument)
        << ::testing::PrintToString(offsets);
  }
  expect_unchanged("bad offsets");
  // Budgets outside [0, max_budget].
  EXPECT_THROW(run_step(d, Step{{10, 20}, good, {0, 1, 3}, {5, config.max_budget + 1}}),
               std::invalid_argument);
  EXPECT_THROW(run_step(d, Step{{10, 20}, good, {0, 1, 3}, {-1, 5}}), std::invalid_argument);
  {
    const Step max_ok{{10, 20}, good, {0, 1, 3}, {config.max_budget, 0}};
    BatchDrafts b;
    EXPECT_NO_THROW(b = run_step(d, max_ok));
    shadow.at(10)->append(good.data(), 1);
    shadow.at(20)->append(good.data() + 1, 2);
    EXPECT_TRUE(b.offsets.size() == 3 && b.offsets[2] == b.offsets[1]);  // budget 0: empty
  }
  expect_unchanged("bad budgets");
  EXPECT_THROW(d.draft_batch(nullptr, -1, nullptr, 0, nullptr, nullptr), std::invalid_argument);
  expect_unchanged("negative batch");
  // A stopped handle can be started again.
  EXPECT_TRUE(d.stop(40));
  EXPECT_THROW(d.add(40, good.data(), 3), std::out_of_range);
  EXPECT_NO_THROW(d.start(40, good.data(), 3));
  shadow[40] = std::make_unique<ShadowRequest>(config.input_max_depth);
  shadow[40]->append(good.data(), 3);
  expect_unchanged("restart");
}

// A churner thread of the concurrency tests: starts, grows, now and then drafts, and stops
// requests of its own (handles apart from every caller's), at least min_iters of them and
// on until the callers are done (at most max_iters); each failed check counts in errors.
struct Churn {
  uint32_t seed;
  int min_iters, max_iters;
  int32_t max_prompt, grow, draft_every, max_budget;

  void run(Drafter& d, const MarkovSource& src, int id, const std::atomic<int>& callers_done,
           int callers, std::atomic<int64_t>& errors) const {
    try {
      std::mt19937 rng(seed + static_cast<uint32_t>(id));
      for (int it = 0; it < min_iters || callers_done.load() < callers; ++it) {
        if (it > max_iters) break;
        const int64_t h = 100000 + id * 100000 + it;
        const Tokens prompt = src.stream(rng, uniform(rng, 0, max_prompt));
        d.start(h, prompt.data(), static_cast<int64_t>(prompt.size()));
        const Tokens more = src.stream(rng, grow);
        d.add(h, more.data(), grow);
        if (d.num_tokens(h) != static_cast<int64_t>(prompt.size()) + grow) errors.fetch_add(1);
        if (d.request_bytes(h) <= 0) errors.fetch_add(1);
        if (it % draft_every == 0) (void)run_step(d, random_step(rng, src, {h}, max_budget));
        (void)d.num_requests();
        if (!d.stop(h) || d.stop(h)) errors.fetch_add(1);
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "churn thread: " << e.what();
      errors.fetch_add(1);
    }
  }
};

// Several caller threads drafting on disjoint requests while others start, add, draft
// and stop their own handles and one swaps in an equal datastore; then each caller's
// drafts are replayed on a fresh single-threaded drafter.
TEST(Drafter, ConcurrentCallersChurnAndDatastoreSwaps) {
  const auto& ds = shared_datastore();
  const MarkovSource& src = shared_source();
  DraftConfig config;
  config.max_budget = 128;
  config.recent_samples = 0;  // each caller's drafts are compared with a drafter of its own
  constexpr int kCallers = 4, kPerCaller = 8, kSteps = 16, kChurners = 2, kChurnIters = 60;
  Drafter shared(config, kVocab, 4);
  shared.set_datastore(ds);
  std::vector<std::vector<BatchDrafts>> results(kCallers);
  std::atomic<int64_t> errors{0};
  std::atomic<int> callers_done{0};

  auto caller = [&](Drafter& d, int id, std::vector<BatchDrafts>& out) {
    try {
      std::mt19937 rng(static_cast<uint32_t>(1000 + id));
      std::vector<int64_t> handles;
      for (int k = 0; k < kPerCaller; ++k) {
        const int64_t h = id * 100 + k;
        const Tokens prompt = src.stream(rng, uniform(rng, 0, 200));
        d.start(h, prompt.data(), static_cast<int64_t>(prompt.size()));
        handles.push_back(h);
      }
      for (int step = 0; step < kSteps; ++step) {
        out.push_back(run_step(d, random_step(rng, src, handles, config.max_budget)));
      }
      for (int64_t h : handles) {
        if (!d.stop(h)) errors.fetch_add(1);
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "caller thread: " << e.what();
      errors.fetch_add(1);
    }
  };

  std::vector<std::thread> threads;
  for (int id = 0; id < kCallers; ++id) {
    threads.emplace_back([&, id] {
      caller(shared, id, results[static_cast<size_t>(id)]);
      callers_done.fetch_add(1);
    });
  }
  const Churn churn{5000, kChurnIters, 10000, 100, 5, 3, config.max_budget};
  for (int id = 0; id < kChurners; ++id) {
    threads.emplace_back([&, id] { churn.run(shared, src, id, callers_done, kCallers, errors); });
  }
  threads.emplace_back([&] {  // swaps in equal datastores while calls are in flight
    for (int it = 0; it < 200 && callers_done.load() < kCallers; ++it) {
      auto copy = std::make_shared<Datastore>(*ds);
      shared.set_datastore(copy);
      if (shared.datastore()->num_tokens() != ds->num_tokens()) errors.fetch_add(1);
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), int64_t{0});
  EXPECT_EQ(shared.num_requests(), int64_t{0});

  Drafter sequential(config, kVocab, 1);
  sequential.set_datastore(ds);
  for (int id = 0; id < kCallers; ++id) {
    std::vector<BatchDrafts> expected;
    caller(sequential, id, expected);
    const auto& got = results[static_cast<size_t>(id)];
    ASSERT_EQ(expected.size(), got.size()) << "caller " << id;
    for (size_t s = 0; s < expected.size(); ++s) {
      EXPECT_TRUE(same_batch(expected[s], got[s])) << "caller " << id << " step " << s;
    }
  }
}

// The recent tier under threads: callers step requests of shared prompts (siblings draft
// from each other) while churners start, grow and stop requests, far more than live at
// once, so the tier compacts repeatedly under the callers' feet. Every draft keeps the
// invariants; siblings get drafts from the tier; nothing is left once all stop.
TEST(Drafter, RecentTierUnderConcurrentCallersAndChurn) {
  const MarkovSource& src = shared_source();
  DraftConfig config;
  config.max_budget = 64;
  config.recent_samples = 8;
  config.recent_min_match = 2;  // entries and sibling entries
  config.recent_candidates = 16;
  config.recent_held_tokens = 400;  // small: holding releases the oldest as it goes
  Drafter shared(config, kVocab, 4);
  shared.set_datastore(shared_datastore());
  constexpr int kCallers = 4, kPerCaller = 6, kSteps = 24, kChurners = 2;
  std::mt19937 prompts_rng(9);
  std::vector<Tokens> prompts;
  for (int k = 0; k < kPerCaller; ++k) prompts.push_back(src.stream(prompts_rng, 40));
  std::atomic<int64_t> errors{0}, recent_nodes{0};
  std::atomic<int> callers_done{0};
  std::vector<std::thread> threads;
  for (int id = 0; id < kCallers; ++id) {
    threads.emplace_back([&, id] {
      try {
        std::mt19937 rng(static_cast<uint32_t>(300 + id));
        std::vector<int64_t> handles;
        for (int k = 0; k < kPerCaller; ++k) {
          handles.push_back(id * 100 + k);
          const Tokens& p = prompts[static_cast<size_t>(k)];  // the same prompts: siblings
          shared.start(handles.back(), p.data(), static_cast<int64_t>(p.size()));
        }
        for (int step = 0; step < kSteps; ++step) {
          const Step s = random_step(rng, src, handles, config.max_budget);
          const BatchDrafts out = run_step(shared, s);
          for (size_t i = 0; i < s.handles.size(); ++i) {
            Draft d;
            const auto lo = static_cast<size_t>(out.offsets[i]);
            const auto hi = static_cast<size_t>(out.offsets[i + 1]);
            d.tokens.assign(out.tokens.begin() + lo, out.tokens.begin() + hi);
            d.parents.assign(out.parents.begin() + lo, out.parents.begin() + hi);
            d.scores.assign(out.scores.begin() + lo, out.scores.begin() + hi);
            const std::string problem = draft_problem(d, s.budgets[i], kVocab, false);
            if (!problem.empty()) {
              ADD_FAILURE() << "caller " << id << " step " << step << ": " << problem;
              errors.fetch_add(1);
            }
            if (out.state_headroom[i] != 0) errors.fetch_add(1);
          }
          const int64_t asked = handles[static_cast<size_t>(step) % handles.size()];
          const Draft explained = shared.explain(asked, 32);
          for (size_t n = 0; n < explained.tokens.size(); ++n) {
            if (explained.features[n * drafter::kScoreFeatures + drafter::kFeatRecentPresent] > 0) {
              recent_nodes.fetch_add(1);
            }
          }
        }
        for (int64_t h : handles) {
          if (!shared.stop(h)) errors.fetch_add(1);
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "caller thread: " << e.what();
        errors.fetch_add(1);
      }
      callers_done.fetch_add(1);
    });
  }
  const Churn churn{700, 400, 20000, 60, 3, 4, config.max_budget};
  for (int id = 0; id < kChurners; ++id) {
    threads.emplace_back([&, id] { churn.run(shared, src, id, callers_done, kCallers, errors); });
  }
  threads.emplace_back([&] {  // stored generations held, then released as if folded
    try {
      std::mt19937 rng(901);
      for (int64_t position = 1; callers_done.load() < kCallers && position < 20000; ++position) {
        const Tokens doc = src.stream(rng, uniform(rng, 0, 120));
        shared.hold(position, doc.data(), static_cast<int64_t>(doc.size()));
        if (position % 3 == 0) shared.release_through(position - uniform(rng, 0, 4));
        if (shared.held().second > config.recent_held_tokens) errors.fetch_add(1);
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "holding thread: " << e.what();
      errors.fetch_add(1);
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), int64_t{0});
  EXPECT_GT(recent_nodes.load(), int64_t{0}) << "no draft node came from the recent tier";
  EXPECT_EQ(shared.num_requests(), int64_t{0});
  shared.release_through(std::numeric_limits<int64_t>::max());
  EXPECT_EQ(shared.held(), (std::pair<int64_t, int64_t>{0, 0}));
}

// Drafter::explain: the tree draft_batch gives, with drafter::kScoreFeatures values per
// node (a node has a source, a source's count never exceeds its parent count); no state
// changes.
TEST(Drafter, ExplainIsTheDraftedTreeWithItsFeatures) {
  const MarkovSource& src = shared_source();
  const DraftConfig config;
  Drafter four(config, kVocab, 4);
  four.set_datastore(shared_datastore());
  std::mt19937 rng(77);
  const int64_t h0 = 3, zero[2] = {0, 0};
  const Tokens prompt = src.stream(rng, uniform(rng, 1, 200));
  four.start(h0, prompt.data(), static_cast<int64_t>(prompt.size()));
  for (const int32_t budget : {0, 1, 16, 256}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    const Draft explained = four.explain(h0, budget);
    const BatchDrafts drafted = four.draft_batch(&h0, 1, nullptr, 0, zero, &budget);
    EXPECT_EQ(explained.tokens, drafted.tokens);
    EXPECT_EQ(explained.parents, drafted.parents);
    EXPECT_EQ(explained.scores, drafted.scores);
    ASSERT_EQ(explained.features.size(), explained.tokens.size() * drafter::kScoreFeatures);
    for (size_t i = 0; i < explained.tokens.size(); ++i) {
      const double* f = explained.features.data() + i * drafter::kScoreFeatures;
      EXPECT_GE(f[drafter::kFeatInputPresent] + f[drafter::kFeatBasePresent] +
                    f[drafter::kFeatLivePresent], 1);
      EXPECT_LE(f[drafter::kFeatInputLogCond], 0);
      EXPECT_LE(f[drafter::kFeatBaseLogCond], 0);
      EXPECT_GE(f[drafter::kFeatDepth], 1);
      EXPECT_GE(f[drafter::kFeatLogSiblings], 0);
      EXPECT_LE(f[drafter::kFeatLogOverBest], 0);
    }
  }
  EXPECT_THROW(four.explain(99, 16), std::out_of_range);
  EXPECT_THROW(four.explain(h0, config.max_budget + 1), std::invalid_argument);
  EXPECT_EQ(four.num_tokens(h0), static_cast<int64_t>(prompt.size()));
}

}  // namespace
