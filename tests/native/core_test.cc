// Standalone tests of the native core (drafter_service/native/csrc), built by CMake
// with DRAFTER_NATIVE_TESTS=ON under AddressSanitizer + UndefinedBehaviorSanitizer.
//
// No framework: the CHECK macros below record passes and failures (failures
// are printed with file, line and context), the last line of output is
// "N passed, M failed", and the exit status is non-zero when anything failed.
// Random cases use fixed-seed std::mt19937 generators, so a run is repeatable.
// The reference for every check is a brute-force reimplementation of
// docs/algorithm.md written independently of the core's data structures.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "draft.h"
#include "drafter.h"
#include "input_trie.h"
#include "sub_index.h"
#include "suffix_array.h"

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
// Minimal check framework.

std::atomic<int64_t> g_passed{0};
std::atomic<int64_t> g_failed{0};
std::mutex g_print_mu;
constexpr int64_t kMaxReported = 40;

void record_pass() { g_passed.fetch_add(1, std::memory_order_relaxed); }

void record_failure(const char* file, int line, const std::string& what) {
  const int64_t k = g_failed.fetch_add(1);
  std::lock_guard<std::mutex> lock(g_print_mu);
  if (k < kMaxReported) {
    std::fprintf(stderr, "FAIL %s:%d: %s\n", file, line, what.c_str());
  } else if (k == kMaxReported) {
    std::fprintf(stderr, "(further failures are counted but not printed)\n");
  }
}

// CHECK_MSG evaluates `ctx` (a std::string expression) only on failure.
#define CHECK_MSG(cond, ctx)                                                       \
  do {                                                                             \
    if (cond) {                                                                    \
      record_pass();                                                               \
    } else {                                                                       \
      record_failure(__FILE__, __LINE__, std::string("CHECK(" #cond ") ") + (ctx)); \
    }                                                                              \
  } while (0)
#define CHECK(cond) CHECK_MSG(cond, std::string())

#define CHECK_EQ(a, b)                                                                  \
  do {                                                                                  \
    const auto va_ = (a);                                                               \
    const auto vb_ = (b);                                                               \
    if (va_ == vb_) {                                                                   \
      record_pass();                                                                    \
    } else {                                                                            \
      record_failure(__FILE__, __LINE__,                                                \
                     std::string("CHECK_EQ(" #a ", " #b "): ") + std::to_string(va_) + \
                         " != " + std::to_string(vb_));                                 \
    }                                                                                   \
  } while (0)

// Passes when `stmt` throws exactly `Type` (or a subclass).
#define CHECK_THROWS(stmt, Type)                                                           \
  do {                                                                                     \
    std::string got_ = "nothing";                                                          \
    bool ok_ = false;                                                                      \
    try {                                                                                  \
      stmt;                                                                                \
    } catch (const Type&) {                                                                \
      ok_ = true;                                                                          \
    } catch (const std::exception& e_) {                                                   \
      got_ = std::string("std::exception: ") + e_.what();                                  \
    } catch (...) {                                                                        \
      got_ = "a non-std exception";                                                        \
    }                                                                                      \
    if (ok_) {                                                                             \
      record_pass();                                                                       \
    } else {                                                                               \
      record_failure(__FILE__, __LINE__,                                                   \
                     "CHECK_THROWS(" #stmt ", " #Type "): threw " + got_);                 \
    }                                                                                      \
  } while (0)

#define CHECK_NO_THROW(stmt)                                                       \
  do {                                                                             \
    try {                                                                          \
      stmt;                                                                        \
      record_pass();                                                               \
    } catch (const std::exception& e_) {                                           \
      record_failure(__FILE__, __LINE__,                                           \
                     std::string("CHECK_NO_THROW(" #stmt "): ") + e_.what());      \
    } catch (...) {                                                                \
      record_failure(__FILE__, __LINE__, "CHECK_NO_THROW(" #stmt "): non-std");    \
    }                                                                              \
  } while (0)

std::string show(const Tokens& v, size_t limit = 48) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < limit; ++i) {
    if (i > 0) s += ",";
    s += std::to_string(v[i]);
  }
  if (v.size() > limit) s += ",...(" + std::to_string(v.size()) + " total)";
  return s + "]";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

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
// Brute-force references.

// Suffix order of the spec: signed token comparison, a proper prefix first.
bool suffix_less(const Tokens& t, int64_t a, int64_t b) {
  return std::lexicographical_compare(t.begin() + a, t.end(), t.begin() + b, t.end());
}

Tokens naive_suffix_array(const Tokens& t) {
  Tokens sa(t.size());
  for (size_t i = 0; i < sa.size(); ++i) sa[i] = static_cast<int32_t>(i);
  std::sort(sa.begin(), sa.end(), [&](int32_t a, int32_t b) { return suffix_less(t, a, b); });
  return sa;
}

// O(n) verification of a suffix array: a permutation whose adjacent rows are
// ordered by (first token, rank of the rest); an empty rest is smallest.
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

// Algorithm 2 of docs/algorithm.md over the raw texts: matches found by linear
// scan and ordered by naive suffix comparison (= their suffix-array rows).
PathCounts reference_retrieve(const std::vector<Tokens>& texts, const Tokens& ctx,
                              const DraftConfig& c, int32_t max_len) {
  PathCounts tree;
  tree[Tokens{}] = 0.0;
  if (texts.empty() || ctx.empty() || max_len <= 0) return tree;
  const int32_t cap = std::min(c.datastore_max_continuation, max_len);
  const auto longest = static_cast<int32_t>(
      std::min<int64_t>(c.datastore_max_prefix, static_cast<int64_t>(ctx.size())));
  for (int32_t m = longest; m >= c.datastore_min_prefix; --m) {
    if (static_cast<int64_t>(tree.size()) - 1 >= c.datastore_min_tree_nodes) break;
    const int32_t* prefix = ctx.data() + ctx.size() - static_cast<size_t>(m);
    std::vector<std::vector<int64_t>> rows(texts.size());
    int64_t total = 0;
    for (size_t s = 0; s < texts.size(); ++s) {
      const Tokens& t = texts[s];
      for (int64_t i = 0; i + m <= static_cast<int64_t>(t.size()); ++i) {
        if (occurs_at(t, i, prefix, m)) rows[s].push_back(i);
      }
      std::sort(rows[s].begin(), rows[s].end(),
                [&](int64_t a, int64_t b) { return suffix_less(t, a, b); });
      total += static_cast<int64_t>(rows[s].size());
    }
    if (total == 0) continue;
    for (size_t s = 0; s < texts.size(); ++s) {
      const auto f = static_cast<int64_t>(rows[s].size());
      if (f == 0) continue;
      const int64_t samples = total <= c.datastore_samples
                                  ? f
                                  : std::max<int64_t>(1, (c.datastore_samples * f) / total);
      const Tokens& t = texts[s];
      for (int64_t k = 0; k < samples; ++k) {
        const int64_t start = rows[s][static_cast<size_t>((k * f) / samples)] + m;
        Tokens path;
        tree[path] += 1.0;
        for (int64_t p = start; p < start + cap && p < static_cast<int64_t>(t.size()) &&
                                t[static_cast<size_t>(p)] != drafter::kSeparator;
             ++p) {
          path.push_back(t[static_cast<size_t>(p)]);
          tree[path] += 1.0;
        }
      }
    }
  }
  return tree;
}

// Algorithm 3 of docs/algorithm.md (merged nodes), offering every child (no
// budget pruning) and grouping offers by token in a std::map.
Draft reference_fuse(const InputTrie* trie, const CandidateTree* tree, const DraftConfig& c,
                     int32_t budget) {
  Draft out;
  if (budget <= 0) return out;
  struct Member {
    bool from_trie;
    int32_t node;
    double denominator, smoothing, multiplier, discount;
  };
  struct Cand {
    double score;
    uint64_t seq;
    int32_t token;
    int32_t draft_parent;  // internal index, 0 = draft root
    std::vector<Member> members;
  };
  auto worse = [](const Cand& a, const Cand& b) {
    return a.score < b.score || (a.score == b.score && a.seq > b.seq);
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
  uint64_t seq = 0;
  auto count = [&](bool from_trie, int32_t node) -> double {
    return static_cast<double>(from_trie ? trie->count(node) : tree->count(node));
  };
  auto expand = [&](const std::vector<Member>& members, int32_t draft_parent) {
    std::map<int32_t, std::pair<double, std::vector<Member>>> groups;  // token -> (max, members)
    for (const Member& m : members) {
      if (m.denominator <= 0.0) continue;
      auto visit = [&](int32_t x, int32_t tok) {
        const double s = count(m.from_trie, x) / (m.denominator + m.smoothing) * m.multiplier;
        auto& g = groups[tok];
        g.first = std::max(g.first, s);
        g.second.push_back({m.from_trie, x, count(m.from_trie, x), m.smoothing, s * m.discount,
                            m.discount});
      };
      if (m.from_trie) {
        for (int32_t x = trie->first_child(m.node); x != -1; x = trie->next_sibling(x)) {
          visit(x, trie->token(x));
        }
      } else {
        for (int32_t x = tree->first_child(m.node); x != -1; x = tree->next_sibling(x)) {
          visit(x, tree->token(x));
        }
      }
    }
    for (auto& [tok, g] : groups) queue.push({g.first, seq++, tok, draft_parent, g.second});
  };
  std::vector<Member> roots;
  if (tree != nullptr) {
    roots.push_back({false, CandidateTree::kRoot,
                     static_cast<double>(tree->count(CandidateTree::kRoot)), c.datastore_smoothing,
                     c.datastore_weight, c.datastore_child_discount});
  }
  if (trie != nullptr) {
    for (int32_t m = c.input_max_prefix; m >= 1; --m) {
      const int32_t u = trie->suffix_node(m);
      if (u < 0) continue;
      roots.push_back({true, u, static_cast<double>(trie->count(u)) - 1.0, c.input_smoothing,
                       c.input_weight,
                       c.input_child_discount_base + c.input_child_discount_per_match * m});
    }
  }
  struct Node {
    int32_t token, parent, depth;
    double score;
  };
  std::vector<Node> nodes{{-1, -1, 0, 0.0}};
  expand(roots, 0);
  while (!queue.empty() && static_cast<int32_t>(nodes.size()) - 1 < budget) {
    const Cand cand = queue.top();
    queue.pop();
    nodes.push_back({cand.token, cand.draft_parent,
                     nodes[static_cast<size_t>(cand.draft_parent)].depth + 1, cand.score});
    expand(cand.members, static_cast<int32_t>(nodes.size()) - 1);
  }
  std::vector<int32_t> order;
  for (int32_t i = 1; i < static_cast<int32_t>(nodes.size()); ++i) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return nodes[static_cast<size_t>(a)].depth < nodes[static_cast<size_t>(b)].depth;
  });
  std::vector<int32_t> pos(nodes.size(), -1);
  for (size_t i = 0; i < order.size(); ++i) pos[static_cast<size_t>(order[i])] = static_cast<int32_t>(i);
  for (int32_t idx : order) {
    const Node& n = nodes[static_cast<size_t>(idx)];
    out.tokens.push_back(n.token);
    out.parents.push_back(pos[static_cast<size_t>(n.parent)]);  // root -> -1
    out.scores.push_back(static_cast<float>(n.score));
  }
  return out;
}

bool same_draft(const Draft& a, const Draft& b) {
  if (a.tokens != b.tokens || a.parents != b.parents || a.scores.size() != b.scores.size()) {
    return false;
  }
  // Bitwise, so that "deterministic" means exactly the same floats.
  return a.scores.empty() ||
         std::memcmp(a.scores.data(), b.scores.data(), a.scores.size() * sizeof(float)) == 0;
}

bool same_batch(const BatchDrafts& a, const BatchDrafts& b) {
  if (a.tokens != b.tokens || a.parents != b.parents || a.offsets != b.offsets ||
      a.scores.size() != b.scores.size()) {
    return false;
  }
  return a.scores.empty() ||
         std::memcmp(a.scores.data(), b.scores.data(), a.scores.size() * sizeof(float)) == 0;
}

std::string describe(const Draft& d) {
  std::string s = "tokens=" + show(d.tokens) + " parents=" + show(d.parents) + " scores=[";
  for (size_t i = 0; i < d.scores.size() && i < 16; ++i) s += std::to_string(d.scores[i]) + ",";
  return s + "]";
}

Draft slice(const BatchDrafts& b, size_t i) {
  Draft d;
  const auto lo = static_cast<size_t>(b.offsets[i]), hi = static_cast<size_t>(b.offsets[i + 1]);
  d.tokens.assign(b.tokens.begin() + static_cast<std::ptrdiff_t>(lo), b.tokens.begin() + static_cast<std::ptrdiff_t>(hi));
  d.parents.assign(b.parents.begin() + static_cast<std::ptrdiff_t>(lo), b.parents.begin() + static_cast<std::ptrdiff_t>(hi));
  d.scores.assign(b.scores.begin() + static_cast<std::ptrdiff_t>(lo), b.scores.begin() + static_cast<std::ptrdiff_t>(hi));
  return d;
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

// Root-to-node token paths of the leaves (prefixes of a valid path are valid).
std::vector<Tokens> leaf_paths(const Draft& d) {
  const size_t n = d.tokens.size();
  std::vector<Tokens> paths(n);
  std::vector<bool> has_child(n, false);
  for (size_t i = 0; i < n; ++i) {
    const int32_t p = d.parents[i];
    if (p >= 0) {
      paths[i] = paths[static_cast<size_t>(p)];
      has_child[static_cast<size_t>(p)] = true;
    }
    paths[i].push_back(d.tokens[i]);
  }
  std::vector<Tokens> leaves;
  for (size_t i = 0; i < n; ++i) {
    if (!has_child[i]) leaves.push_back(paths[i]);
  }
  return leaves;
}

// A datastore path: right after an occurrence of some looked-up suffix of the
// context, inside one document (the path has no -1, so equality implies it).
bool datastore_path_ok(const std::vector<Tokens>& texts, const Tokens& ctx, const DraftConfig& c,
                       int32_t budget, const Tokens& path) {
  const auto len = static_cast<int64_t>(path.size());
  if (len > std::min(c.datastore_max_continuation, budget)) return false;
  const int64_t longest = std::min<int64_t>(c.datastore_max_prefix, static_cast<int64_t>(ctx.size()));
  for (int64_t m = c.datastore_min_prefix; m <= longest; ++m) {
    const int32_t* suffix = ctx.data() + ctx.size() - static_cast<size_t>(m);
    for (const Tokens& t : texts) {
      for (int64_t i = 0; i + m + len <= static_cast<int64_t>(t.size()); ++i) {
        if (occurs_at(t, i, suffix, m) && occurs_at(t, i + m, path.data(), len)) return true;
      }
    }
  }
  return false;
}

// An input path: after an earlier occurrence of a suffix of length m <= P of
// the input, within the trie depth.
bool input_path_ok(const Tokens& input, const DraftConfig& c, const Tokens& path) {
  const auto n = static_cast<int64_t>(input.size());
  const auto len = static_cast<int64_t>(path.size());
  for (int64_t m = 1; m <= std::min<int64_t>(c.input_max_prefix, n); ++m) {
    if (m + len > c.input_max_depth) break;
    const int32_t* suffix = input.data() + n - m;
    for (int64_t i = 0; i + m + len <= n; ++i) {
      if (occurs_at(input, i, suffix, m) && occurs_at(input, i + m, path.data(), len)) return true;
    }
  }
  return false;
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

// Algorithm 2 of the core, copied out of a scratch into `tree`.
void retrieve(const Datastore& ds, const int32_t* ctx, int64_t n, const DraftConfig& c,
              int32_t max_len, CandidateTree& tree) {
  DraftScratch scratch;
  drafter::retrieve_datastore(ds, ctx, n, c, max_len, scratch);
  tree = scratch.datastore_tree;
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
  if (coin(rng, 0.5)) {  // weights and discounts <= 1: scores fall along a path
    c.input_weight = uniform(rng, 0, 10) / 10.0;
    c.input_child_discount_base = uniform(rng, 0, 5) / 10.0;
    c.input_child_discount_per_match = uniform(rng, 0, 2) / 20.0;
    c.datastore_weight = uniform(rng, 0, 10) / 10.0;
    c.datastore_child_discount = uniform(rng, 0, 10) / 10.0;
  } else {
    c.input_weight = uniform(rng, 0, 30) / 10.0;
    c.input_child_discount_base = uniform(rng, 0, 20) / 10.0;
    c.input_child_discount_per_match = uniform(rng, 0, 10) / 10.0;
    c.datastore_weight = uniform(rng, 0, 30) / 10.0;
    c.datastore_child_discount = uniform(rng, 0, 20) / 10.0;
  }
  if (coin(rng, 0.5)) {
    c.input_smoothing = uniform(rng, 0, 8) / 4.0;
    c.datastore_smoothing = uniform(rng, 0, 8) / 4.0;
  }
  return c;
}

bool scores_monotone(const DraftConfig& c) {
  return c.input_weight <= 1.0 && c.datastore_weight <= 1.0 && c.datastore_child_discount <= 1.0 &&
         c.input_child_discount_base + c.input_child_discount_per_match * c.input_max_prefix <= 1.0;
}

// ---------------------------------------------------------------------------
// Suffix arrays.

void test_suffix_array() {
  // Exhaustive: every text over {-1, 0, 1} up to length 7 and over {0, 1} up to 12.
  for (int32_t alphabet : {3, 2}) {
    const int32_t max_len = alphabet == 3 ? 7 : 12;
    const int32_t low = alphabet == 3 ? -1 : 0;
    int64_t bad = 0, cases = 0;
    std::string first_bad;
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
        const Tokens sa = drafter::build_suffix_array(t.data(), len, 2);
        ++cases;
        if (sa != naive_suffix_array(t)) {
          if (bad++ == 0) first_bad = show(t);
        }
      }
    }
    CHECK_MSG(bad == 0, std::to_string(bad) + " of " + std::to_string(cases) +
                            " exhaustive texts wrong, first " + first_bad);
  }

  // Random texts of many shapes, lengths 0..300, alphabets 1..6 with separators.
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 5000; ++iter) {
    const int32_t alphabet = uniform(rng, 1, 6);
    const int32_t offset = coin(rng, 0.2) ? uniform(rng, 0, 1000) : 0;
    const int32_t vocab = offset + alphabet + (coin(rng, 0.3) ? uniform(rng, 0, 50) : 0);
    const Tokens t = random_text(rng, 300, alphabet, offset);
    const Tokens sa = drafter::build_suffix_array(t.data(), static_cast<int64_t>(t.size()), vocab);
    CHECK_MSG(sa == naive_suffix_array(t), "text " + show(t, 400) + " vocab " + std::to_string(vocab));
  }

  // Larger texts, verified in O(n) through ranks.
  for (int iter = 0; iter < 6; ++iter) {
    Tokens t;
    if (iter == 0) {  // plain random text
      t.resize(100000);
      for (auto& v : t) v = symbol(rng, 4, 0.02);
    } else {  // any of the shapes above
      t = random_text(rng, 60000, uniform(rng, 1, 6), 0);
    }
    const Tokens sa = drafter::build_suffix_array(t.data(), static_cast<int64_t>(t.size()), 6);
    CHECK_MSG(verify_suffix_array(t, sa), "large text of length " + std::to_string(t.size()));
  }

  // Input validation.
  const Tokens ok{0, 1, -1, 2};
  CHECK(drafter::build_suffix_array(ok.data(), 0, 3).empty());
  CHECK_EQ(drafter::build_suffix_array(ok.data(), 4, 3).size(), size_t{4});
  const Tokens below{0, -2, 1};
  CHECK_THROWS(drafter::build_suffix_array(below.data(), 3, 5), std::invalid_argument);
  const Tokens above{0, 5, 1};
  CHECK_THROWS(drafter::build_suffix_array(above.data(), 3, 5), std::invalid_argument);
  CHECK_THROWS(drafter::build_suffix_array(ok.data(), 4, 2), std::invalid_argument);  // 2 >= vocab
  CHECK_THROWS(drafter::build_suffix_array(ok.data(), 4, 0), std::invalid_argument);
  CHECK_THROWS(drafter::build_suffix_array(ok.data(), -1, 3), std::invalid_argument);
  CHECK_THROWS(SubIndex::build(above, 5), std::invalid_argument);
  CHECK_THROWS(SubIndex::build(below, 5), std::invalid_argument);
}

// ---------------------------------------------------------------------------
// Sub-index search.

void check_find_range(const SubIndex& index, const Tokens& t, const Tokens& prefix,
                      const char* what) {
  const SaRange r = index.find_range(prefix.data(), static_cast<int32_t>(prefix.size()));
  std::vector<int64_t> expected;
  for (int64_t i = 0; i + static_cast<int64_t>(prefix.size()) <= static_cast<int64_t>(t.size()); ++i) {
    if (occurs_at(t, i, prefix.data(), static_cast<int64_t>(prefix.size()))) expected.push_back(i);
  }
  bool ok = r.begin <= r.end && r.begin >= 0 && r.end <= index.num_tokens() &&
            r.size() == static_cast<int64_t>(expected.size());
  if (ok) {
    std::vector<int64_t> got;
    for (int64_t row = r.begin; row < r.end; ++row) got.push_back(index.position(row));
    std::sort(got.begin(), got.end());
    ok = got == expected;
  }
  CHECK_MSG(ok, std::string(what) + ": prefix " + show(prefix) + " in " + show(t, 200) + " -> [" +
                    std::to_string(r.begin) + ", " + std::to_string(r.end) + "), expected " +
                    std::to_string(expected.size()) + " matches");
}

void test_sub_index() {
  std::mt19937 rng(777);
  for (int iter = 0; iter < 600; ++iter) {
    const int32_t alphabet = uniform(rng, 1, 6);
    const int32_t vocab = alphabet + uniform(rng, 0, 3);
    const Tokens t = random_text(rng, 400, alphabet, 0);
    const auto index = SubIndex::build(t, vocab);
    CHECK_EQ(index->num_tokens(), static_cast<int64_t>(t.size()));
    CHECK(std::equal(t.begin(), t.end(), index->tokens()));
    CHECK(index->resident_bytes() >= 8 * index->num_tokens());
    // Empty prefix: only emptiness matters.
    CHECK(index->find_range(t.data(), 0).size() == 0);
    for (int q = 0; q < 40; ++q) {
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
      check_find_range(*index, t, prefix, "build");
    }
    // The same arrays wrapped (as a snapshot would be) answer the same.
    auto owner = std::make_shared<std::pair<Tokens, Tokens>>(
        t, Tokens(index->suffix_array(), index->suffix_array() + t.size()));
    const auto wrapped = SubIndex::wrap(owner->first.data(), owner->second.data(),
                                        static_cast<int64_t>(t.size()), vocab, owner);
    for (int q = 0; q < 10 && !t.empty(); ++q) {
      const int32_t from = uniform(rng, 0, static_cast<int32_t>(t.size()) - 1);
      Tokens prefix(t.begin() + from, t.begin() + std::min<int32_t>(from + 3, static_cast<int32_t>(t.size())));
      if (prefix[0] < 0) continue;
      check_find_range(*wrapped, t, prefix, "wrap");
    }
  }

  // wrap validates value ranges.
  const Tokens text{0, 1, -1, 2, 1};
  const auto built = SubIndex::build(text, 3);
  Tokens sa(built->suffix_array(), built->suffix_array() + text.size());
  CHECK_NO_THROW(SubIndex::wrap(text.data(), sa.data(), 5, 3, nullptr));
  Tokens bad_text = text;
  bad_text[3] = 3;  // == vocab
  CHECK_THROWS(SubIndex::wrap(bad_text.data(), sa.data(), 5, 3, nullptr), std::invalid_argument);
  bad_text[3] = -2;
  CHECK_THROWS(SubIndex::wrap(bad_text.data(), sa.data(), 5, 3, nullptr), std::invalid_argument);
  Tokens bad_sa = sa;
  bad_sa[2] = 5;  // == n
  CHECK_THROWS(SubIndex::wrap(text.data(), bad_sa.data(), 5, 3, nullptr), std::invalid_argument);
  bad_sa[2] = -1;
  CHECK_THROWS(SubIndex::wrap(text.data(), bad_sa.data(), 5, 3, nullptr), std::invalid_argument);
  CHECK_THROWS(SubIndex::wrap(text.data(), sa.data(), 5, 0, nullptr), std::invalid_argument);
  CHECK_THROWS(SubIndex::wrap(text.data(), sa.data(), -1, 3, nullptr), std::invalid_argument);
  // An empty sub-index finds nothing.
  const auto empty = SubIndex::build({}, 3);
  const Tokens p{1};
  CHECK(empty->find_range(p.data(), 1).size() == 0);
}

// ---------------------------------------------------------------------------
// Input trie.

void test_input_trie() {
  CHECK_THROWS(InputTrie(0), std::invalid_argument);
  std::mt19937 rng(4242);
  for (int iter = 0; iter < 500; ++iter) {
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
      CHECK_EQ(trie.num_tokens(), static_cast<int64_t>(input.size()));
      const auto n = static_cast<int64_t>(input.size());

      // Brute-force counts of every substring of length <= depth.
      std::map<Tokens, int64_t> expected;
      for (int64_t i = 0; i < n; ++i) {
        Tokens s;
        for (int64_t k = i; k < n && k - i < depth; ++k) {
          s.push_back(input[static_cast<size_t>(k)]);
          ++expected[s];
        }
      }
      // Walking each substring reaches a node with that count.
      int64_t wrong = 0;
      std::string first_wrong;
      for (const auto& [s, cnt] : expected) {
        const int32_t node = walk_trie(trie, s.data(), static_cast<int64_t>(s.size()));
        if (node < 0 || static_cast<int64_t>(trie.count(node)) != cnt) {
          if (wrong++ == 0) first_wrong = show(s) + " expected " + std::to_string(cnt);
        }
      }
      CHECK_MSG(wrong == 0, std::to_string(wrong) + " substrings miscounted, first " + first_wrong);
      // ... and the trie holds nothing else (no duplicate siblings either).
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
      CHECK_MSG(!dup && nodes_seen == static_cast<int64_t>(expected.size()) &&
                    nodes_seen + 1 == trie.num_nodes(),
                "trie has " + std::to_string(nodes_seen) + " reachable nodes, " +
                    std::to_string(trie.num_nodes()) + " allocated, expected " +
                    std::to_string(expected.size()));
      // suffix_node(len) is the node of the last len tokens.
      bool suffix_ok = trie.suffix_node(0) == -1 && trie.suffix_node(-3) == -1;
      for (int32_t len = 1; len <= depth + 2; ++len) {
        const int32_t got = trie.suffix_node(len);
        if (len > depth || len > n) {
          suffix_ok = suffix_ok && got == -1;
        } else {
          suffix_ok = suffix_ok && got == walk_trie(trie, input.data() + n - len, len) && got > 0;
        }
      }
      CHECK_MSG(suffix_ok, "suffix_node, depth " + std::to_string(depth) + " input " + show(input));
      // holds(t): the input has token t, as the root's child along t says.
      bool holds_ok = !trie.holds(-1) && !trie.holds(INT32_MAX);
      for (int32_t t = offset - 1; t <= offset + alphabet + 1; ++t) {
        const bool has = std::find(input.begin(), input.end(), t) != input.end();
        holds_ok = holds_ok && trie.holds(t) == has &&
                   (trie.child(InputTrie::kRoot, t) >= 0) == has;
      }
      CHECK_MSG(holds_ok, "holds, input " + show(input));
      CHECK(trie.resident_bytes() > 0);
    }
  }
}

// ---------------------------------------------------------------------------
// Datastore retrieval and fusion.

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

void test_retrieve_and_fuse() {
  std::mt19937 rng(99);
  int64_t nonempty_ds = 0, nonempty_mixed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int32_t vocab = uniform(rng, 2, 12);
    const MarkovSource src(vocab, static_cast<uint32_t>(iter));
    const TestDatastore ds =
        make_datastore(rng, src, uniform(rng, 0, 3), 6, 120, vocab);
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
    const std::string where = "iter " + std::to_string(iter) + " ctx " + show(ctx) +
                              " budget " + std::to_string(budget);

    // Algorithm 2 against the brute-force reference.
    CandidateTree tree;
    retrieve(ds.datastore, ctx.data(), static_cast<int64_t>(ctx.size()), config,
                                budget, tree);
    const PathCounts got_tree = dump_tree(tree);
    CHECK_MSG(got_tree == reference_retrieve(ds.texts, ctx, config, budget), where);
    CHECK_EQ(static_cast<int64_t>(got_tree.size()), static_cast<int64_t>(tree.num_nodes()));

    InputTrie trie(config.input_max_depth);
    for (int32_t v : ctx) trie.append(v);
    const bool monotone = scores_monotone(config);
    const CandidateTree* tree_ptr = ds.datastore.sub_indices.empty() ? nullptr : &tree;
    DraftScratch scratch;

    // Datastore only.
    Draft d1;
    drafter::FusionInputs datastore_only(config, budget);
    datastore_only.datastore_tree = tree_ptr;
    drafter::fuse(datastore_only, scratch.fusion, d1);
    std::string problem = draft_problem(d1, budget, vocab, monotone);
    CHECK_MSG(problem.empty(), problem + " (datastore only) " + where + " " + describe(d1));
    const Draft r1 = reference_fuse(nullptr, tree_ptr, config, budget);
    CHECK_MSG(same_draft(d1, r1), "datastore-only draft differs from the reference, " + where +
                                      "\n  got      " + describe(d1) + "\n  expected " + describe(r1));
    for (const Tokens& path : leaf_paths(d1)) {
      CHECK_MSG(datastore_path_ok(ds.texts, ctx, config, budget, path),
                "path " + show(path) + " not found after a context suffix, " + where);
    }
    if (!d1.tokens.empty()) ++nonempty_ds;

    // Input only.
    Draft d2;
    std::vector<drafter::InputMatch> matches;
    drafter::committed_matches(trie, config, matches);
    drafter::FusionInputs input_only(config, budget);
    input_only.trie = &trie;
    input_only.matches = &matches;
    drafter::fuse(input_only, scratch.fusion, d2);
    problem = draft_problem(d2, budget, vocab, monotone);
    CHECK_MSG(problem.empty(), problem + " (input only) " + where + " " + describe(d2));
    const Draft r2 = reference_fuse(&trie, nullptr, config, budget);
    CHECK_MSG(same_draft(d2, r2), "input-only draft differs from the reference, " + where +
                                      "\n  got      " + describe(d2) + "\n  expected " + describe(r2));
    for (const Tokens& path : leaf_paths(d2)) {
      CHECK_MSG(input_path_ok(ctx, config, path),
                "input path " + show(path) + " does not follow a suffix, " + where);
    }

    // Both sources via draft_one, twice with the same scratch and once fresh.
    Draft d3, d4, d5;
    drafter::draft_one(&trie, ctx.data(), static_cast<int64_t>(ctx.size()), &ds.datastore, config,
                       budget, scratch, d3);
    problem = draft_problem(d3, budget, vocab, monotone);
    CHECK_MSG(problem.empty(), problem + " (both) " + where + " " + describe(d3));
    const Draft r3 = reference_fuse(&trie, tree_ptr, config, budget);
    CHECK_MSG(same_draft(d3, r3), "draft differs from the reference, " + where + "\n  got      " +
                                      describe(d3) + "\n  expected " + describe(r3));
    // Every draft path is the path of some source node (merging keeps paths).
    for (const Tokens& path : leaf_paths(d3)) {
      CHECK_MSG(input_path_ok(ctx, config, path) ||
                    (tree_ptr != nullptr && datastore_path_ok(ds.texts, ctx, config, budget, path)),
                "path " + show(path) + " comes from no source, " + where);
    }
    drafter::draft_one(&trie, ctx.data(), static_cast<int64_t>(ctx.size()), &ds.datastore, config,
                       budget, scratch, d4);
    DraftScratch fresh;
    drafter::draft_one(&trie, ctx.data(), static_cast<int64_t>(ctx.size()), &ds.datastore, config,
                       budget, fresh, d5);
    CHECK_MSG(same_draft(d3, d4) && same_draft(d3, d5), "not deterministic, " + where);
    if (!d3.tokens.empty() && !d1.tokens.empty()) ++nonempty_mixed;
  }
  // The random cases must exercise something.
  CHECK_MSG(nonempty_ds > 600 && nonempty_mixed > 600,
            std::to_string(nonempty_ds) + " non-empty datastore drafts");

  // Wide nodes with small budgets: the core pushes only the `budget` best
  // children of a node; the reference pushes all of them.
  for (int iter = 0; iter < 300; ++iter) {
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
    c.input_max_depth = std::max(c.input_max_depth, c.input_max_prefix);
    Tokens doc = input;
    std::shuffle(doc.begin(), doc.end(), rng);
    Datastore ds;
    ds.sub_indices.push_back(SubIndex::build(doc, vocab));
    const int32_t budget = uniform(rng, 1, 6);
    DraftScratch scratch;
    Draft d;
    drafter::draft_one(&trie, input.data(), static_cast<int64_t>(input.size()), &ds, c, budget,
                       scratch, d);
    CandidateTree tree;
    retrieve(ds, input.data(), static_cast<int64_t>(input.size()), c, budget,
                                tree);
    const Draft r = reference_fuse(&trie, &tree, c, budget);
    CHECK_MSG(same_draft(d, r), "wide node, budget " + std::to_string(budget) + "\n  got      " +
                                    describe(d) + "\n  expected " + describe(r));
  }

  // Degenerate inputs.
  DraftConfig c;
  DraftScratch scratch;
  Draft d;
  d.tokens = {1};
  drafter::draft_one(nullptr, nullptr, 0, nullptr, c, 10, scratch, d);
  CHECK(d.tokens.empty() && d.parents.empty() && d.scores.empty());
  Datastore empty_ds;
  const Tokens ctx{1, 2, 3};
  drafter::draft_one(nullptr, ctx.data(), 3, &empty_ds, c, 10, scratch, d);
  CHECK(d.tokens.empty());
  CandidateTree tree;
  Datastore one;
  one.sub_indices.push_back(SubIndex::build({1, 2, 3, 4, -1, 2, 3, 5}, 8));
  retrieve(one, ctx.data(), 3, c, 0, tree);
  CHECK_EQ(tree.num_nodes(), 1);
  retrieve(one, ctx.data(), 0, c, 5, tree);
  CHECK_EQ(tree.num_nodes(), 1);
  retrieve(one, ctx.data(), 3, c, 5, tree);
  CHECK(tree.num_nodes() > 1);
  CHECK_THROWS(
      [] {
        DraftConfig bad;
        bad.input_max_depth = 2;  // < input_max_prefix
        drafter::validate(bad);
      }(),
      std::invalid_argument);
}

// Samples added to a CandidateTree in batches (sorted runs that interleave with the
// samples held, unsorted batches, duplicates, empty continuations) give the tree of
// all of them added at once, and its node count is the number of distinct paths.
void test_candidate_tree_batches() {
  std::mt19937 rng(31337);
  for (int iter = 0; iter < 2000; ++iter) {
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
    const std::string where = "iter " + std::to_string(iter);
    CHECK_MSG(dump_tree(whole) == paths, where);
    CHECK_MSG(dump_tree(batched) == paths, where);
    CHECK_EQ(static_cast<int64_t>(batched.num_nodes()), static_cast<int64_t>(paths.size()));
    CHECK_EQ(static_cast<int64_t>(whole.num_nodes()), static_cast<int64_t>(paths.size()));
  }
}

// ---------------------------------------------------------------------------
// Drafter.

// Sequential model of a Drafter: per-request trie + tokens, drafted with draft_one.
struct ShadowRequest {
  explicit ShadowRequest(int32_t depth) : trie(depth) {}
  InputTrie trie;
  Tokens tokens;
};

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

std::vector<Draft> run_shadow(std::map<int64_t, std::unique_ptr<ShadowRequest>>& shadow,
                              const Datastore& ds, const DraftConfig& c, const Step& s) {
  std::vector<Draft> out(s.handles.size());
  DraftScratch scratch;
  for (size_t i = 0; i < s.handles.size(); ++i) {
    ShadowRequest& r = *shadow.at(s.handles[i]);
    for (int64_t k = s.offsets[i]; k < s.offsets[i + 1]; ++k) {
      r.trie.append(s.new_tokens[static_cast<size_t>(k)]);
      r.tokens.push_back(s.new_tokens[static_cast<size_t>(k)]);
    }
    drafter::draft_one(&r.trie, r.tokens.data(), static_cast<int64_t>(r.tokens.size()), &ds, c,
                       s.budgets[i], scratch, out[i]);
  }
  return out;
}

constexpr int32_t kVocab = 64;

void test_drafter_basic(const std::shared_ptr<const Datastore>& ds, const MarkovSource& src,
                        bool learned = false) {
  DraftConfig config;  // paper defaults
  if (learned) {  // a learned node score: any finite weights
    config.node_score.resize(static_cast<size_t>(drafter::kScoreFeatures) + 1);
    for (size_t i = 0; i < config.node_score.size(); ++i) {
      config.node_score[i] = 0.1 * static_cast<double>(static_cast<int>(i % 5) - 2);
    }
  }
  CHECK_THROWS(Drafter(config, kVocab, 0), std::invalid_argument);
  CHECK_THROWS(Drafter(config, 0, 1), std::invalid_argument);
  {
    DraftConfig bad = config;
    bad.datastore_samples = 0;
    CHECK_THROWS(Drafter(bad, kVocab, 2), std::invalid_argument);
  }

  // 32 requests, 4 threads vs 1 thread vs the sequential model.
  Drafter one(config, kVocab, 1), four(config, kVocab, 4);
  CHECK_EQ(one.num_threads(), 1);
  CHECK_EQ(four.num_threads(), 4);
  one.set_datastore(ds);
  four.set_datastore(ds);
  CHECK(four.datastore() == ds);
  std::mt19937 rng(2024);
  std::map<int64_t, std::unique_ptr<ShadowRequest>> shadow;
  std::vector<int64_t> handles;
  for (int64_t h = 0; h < 32; ++h) {
    const int64_t handle = h * 7919 - 100;  // negative handles are fine too
    const Tokens prompt = src.stream(rng, h == 0 ? 0 : uniform(rng, 1, 300));
    one.start(handle, prompt.data(), static_cast<int64_t>(prompt.size()));
    four.start(handle, prompt.data(), static_cast<int64_t>(prompt.size()));
    auto r = std::make_unique<ShadowRequest>(config.input_max_depth);
    for (int32_t v : prompt) r->trie.append(v);
    r->tokens = prompt;
    shadow.emplace(handle, std::move(r));
    handles.push_back(handle);
    CHECK_EQ(four.num_tokens(handle), static_cast<int64_t>(prompt.size()));
  }
  CHECK_EQ(four.num_requests(), int64_t{32});
  int64_t drafted = 0;
  for (int step = 0; step < 16; ++step) {
    const Step s = random_step(rng, src, handles, config.max_budget);
    const BatchDrafts a = run_step(one, s);
    const BatchDrafts b = run_step(four, s);
    const std::vector<Draft> expected = run_shadow(shadow, *ds, config, s);
    CHECK_MSG(same_batch(a, b), "num_threads=4 differs from num_threads=1 at step " + std::to_string(step));
    bool model_ok = a.offsets.size() == s.handles.size() + 1;
    for (size_t i = 0; model_ok && i < s.handles.size(); ++i) {
      model_ok = same_draft(slice(a, i), expected[i]);
      const std::string problem = draft_problem(slice(b, i), s.budgets[i], kVocab, true);
      CHECK_MSG(problem.empty(), problem);
    }
    CHECK_MSG(model_ok, "draft_batch differs from draft_one at step " + std::to_string(step));
    drafted += static_cast<int64_t>(a.tokens.size());
  }
  CHECK(drafted > 1000);
  for (int64_t h : handles) {
    CHECK_EQ(four.num_tokens(h), static_cast<int64_t>(shadow.at(h)->tokens.size()));
    CHECK(four.request_bytes(h) > 0);
  }
  // add() then a step with no new tokens sees the added tokens.
  const Tokens extra = src.stream(rng, 10);
  one.add(handles[3], extra.data(), 10);
  four.add(handles[3], extra.data(), 10);
  for (int32_t v : extra) {
    shadow.at(handles[3])->trie.append(v);
    shadow.at(handles[3])->tokens.push_back(v);
  }
  {
    Step s;
    s.handles = {handles[3]};
    s.offsets = {0, 0};
    s.budgets = {64};
    const BatchDrafts b = run_step(four, s);
    CHECK(same_draft(slice(b, 0), run_shadow(shadow, *ds, config, s)[0]));
    CHECK(same_batch(b, run_step(one, s)));
  }
  // An empty batch.
  {
    const int64_t zero = 0;
    const BatchDrafts b = four.draft_batch(nullptr, 0, nullptr, 0, &zero, nullptr);
    CHECK(b.tokens.empty() && b.offsets.size() == 1 && b.offsets[0] == 0);
  }
  // Stop.
  CHECK(four.stop(handles[0]));
  CHECK(!four.stop(handles[0]));
  CHECK_EQ(four.num_requests(), int64_t{31});
  CHECK_THROWS(four.num_tokens(handles[0]), std::out_of_range);

  // set_datastore validation; replacing the datastore changes later drafts only.
  CHECK_THROWS(four.set_datastore(nullptr), std::invalid_argument);
  auto other_vocab = std::make_shared<Datastore>();
  other_vocab->sub_indices.push_back(SubIndex::build({1, 2, 3}, kVocab + 1));
  CHECK_THROWS(four.set_datastore(other_vocab), std::invalid_argument);
  CHECK(four.datastore() == ds);
  four.set_datastore(std::make_shared<Datastore>());
  {
    Step s;
    s.handles = {handles[5]};
    s.offsets = {0, 0};
    s.budgets = {32};
    const BatchDrafts b = run_step(four, s);
    Datastore none;
    CHECK(same_draft(slice(b, 0), run_shadow(shadow, none, config, s)[0]));
  }
}

void test_drafter_bad_input(const std::shared_ptr<const Datastore>& ds, const MarkovSource& src) {
  DraftConfig config;
  config.max_budget = 100;
  Drafter d(config, kVocab, 3);
  d.set_datastore(ds);
  std::mt19937 rng(31337);
  std::map<int64_t, std::unique_ptr<ShadowRequest>> shadow;
  std::vector<int64_t> handles{10, 20, 30, 40};
  for (int64_t h : handles) {
    const Tokens prompt = src.stream(rng, 50);
    d.start(h, prompt.data(), 50);
    auto r = std::make_unique<ShadowRequest>(config.input_max_depth);
    for (int32_t v : prompt) r->trie.append(v);
    r->tokens = prompt;
    shadow.emplace(h, std::move(r));
  }
  // After every rejected call: nothing changed and a valid step still works.
  auto state_ok = [&](const char* what) {
    bool ok = d.num_requests() == static_cast<int64_t>(handles.size());
    for (int64_t h : handles) {
      ok = ok && d.num_tokens(h) == static_cast<int64_t>(shadow.at(h)->tokens.size());
    }
    const Step s = random_step(rng, src, handles, config.max_budget);
    const BatchDrafts b = run_step(d, s);
    const std::vector<Draft> expected = run_shadow(shadow, *ds, config, s);
    for (size_t i = 0; i < s.handles.size(); ++i) ok = ok && same_draft(slice(b, i), expected[i]);
    CHECK_MSG(ok, std::string("state after ") + what);
  };
  state_ok("setup");

  const Tokens good{1, 2, 3};
  const Tokens bad_token{1, kVocab, 3};
  const Tokens negative{1, -1, 3};
  // Unknown handles.
  CHECK_THROWS(d.add(999, good.data(), 3), std::out_of_range);
  CHECK_THROWS(d.num_tokens(999), std::out_of_range);
  CHECK_THROWS(d.request_bytes(999), std::out_of_range);
  CHECK(!d.stop(999));
  // Each rejected batch call below: handles, new tokens, offsets, budgets.
  const Step unknown_handle{{10, 999}, good, {0, 2, 3}, {5, 5}};
  CHECK_THROWS(run_step(d, unknown_handle), std::out_of_range);
  state_ok("unknown handle");
  // Duplicate start keeps the existing request.
  CHECK_THROWS(d.start(20, good.data(), 3), std::invalid_argument);
  state_ok("duplicate start");
  // Tokens out of the vocabulary (start must not register the handle).
  CHECK_THROWS(d.start(50, bad_token.data(), 3), std::invalid_argument);
  CHECK_THROWS(d.start(51, negative.data(), 3), std::invalid_argument);
  CHECK_THROWS(d.num_tokens(50), std::out_of_range);
  CHECK_THROWS(d.add(10, bad_token.data(), 3), std::invalid_argument);
  CHECK_THROWS(d.add(10, negative.data(), 3), std::invalid_argument);
  const Step bad_tokens{{10, 20}, bad_token, {0, 1, 3}, {5, 5}};
  CHECK_THROWS(run_step(d, bad_tokens), std::invalid_argument);
  state_ok("bad tokens");
  // Duplicate handle in one batch.
  const Step duplicate{{10, 20, 10}, good, {0, 1, 2, 3}, {5, 5, 5}};
  CHECK_THROWS(run_step(d, duplicate), std::invalid_argument);
  state_ok("duplicate handle in a batch");
  // Offsets: decreasing, not starting at 0, not ending at the token count.
  for (const std::vector<int64_t>& offsets : {std::vector<int64_t>{0, 2, 1, 3},
                                              std::vector<int64_t>{1, 2, 3, 3},
                                              std::vector<int64_t>{0, 1, 2, 2}}) {
    const Step bad_offsets{{10, 20, 30}, good, offsets, {5, 5, 5}};
    CHECK_THROWS(run_step(d, bad_offsets), std::invalid_argument);
  }
  state_ok("bad offsets");
  // Budgets outside [0, max_budget].
  {
    const Step too_big{{10, 20}, good, {0, 1, 3}, {5, config.max_budget + 1}};
    CHECK_THROWS(run_step(d, too_big), std::invalid_argument);
    const Step negative_budget{{10, 20}, good, {0, 1, 3}, {-1, 5}};
    CHECK_THROWS(run_step(d, negative_budget), std::invalid_argument);
    const Step max_ok{{10, 20}, good, {0, 1, 3}, {config.max_budget, 0}};
    BatchDrafts b;
    CHECK_NO_THROW(b = run_step(d, max_ok));
    for (size_t i = 0; i < 2; ++i) {
      ShadowRequest& r = *shadow.at(max_ok.handles[i]);
      for (int64_t k = max_ok.offsets[i]; k < max_ok.offsets[i + 1]; ++k) {
        r.trie.append(good[static_cast<size_t>(k)]);
        r.tokens.push_back(good[static_cast<size_t>(k)]);
      }
    }
    CHECK(b.offsets.size() == 3 && b.offsets[2] == b.offsets[1]);  // budget 0: empty
  }
  state_ok("bad budgets");
  CHECK_THROWS(d.draft_batch(nullptr, -1, nullptr, 0, nullptr, nullptr), std::invalid_argument);
  state_ok("negative batch");
  // A stopped handle can be started again.
  CHECK(d.stop(40));
  CHECK_THROWS(d.add(40, good.data(), 3), std::out_of_range);
  CHECK_NO_THROW(d.start(40, good.data(), 3));
  shadow[40] = std::make_unique<ShadowRequest>(config.input_max_depth);
  for (int32_t v : good) {
    shadow[40]->trie.append(v);
    shadow[40]->tokens.push_back(v);
  }
  state_ok("restart");
}

// Several caller threads drafting on disjoint requests while others start,
// add, draft and stop their own handles and swap in an equivalent datastore.
void test_drafter_concurrent(const std::shared_ptr<const Datastore>& ds, const MarkovSource& src) {
  DraftConfig config;
  config.max_budget = 128;
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
      record_failure(__FILE__, __LINE__, std::string("caller thread: ") + e.what());
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
  for (int id = 0; id < kChurners; ++id) {
    threads.emplace_back([&, id] {
      try {
        std::mt19937 rng(static_cast<uint32_t>(5000 + id));
        for (int it = 0; it < kChurnIters || callers_done.load() < kCallers; ++it) {
          if (it > 10000) break;
          const int64_t h = 100000 + id * 100000 + it;
          const Tokens prompt = src.stream(rng, uniform(rng, 0, 100));
          shared.start(h, prompt.data(), static_cast<int64_t>(prompt.size()));
          const Tokens more = src.stream(rng, 5);
          shared.add(h, more.data(), 5);
          if (shared.num_tokens(h) != static_cast<int64_t>(prompt.size()) + 5) errors.fetch_add(1);
          if (shared.request_bytes(h) <= 0) errors.fetch_add(1);
          if (it % 3 == 0) {
            const std::vector<int64_t> hs{h};
            (void)run_step(shared, random_step(rng, src, hs, config.max_budget));
          }
          (void)shared.num_requests();
          if (!shared.stop(h) || shared.stop(h)) errors.fetch_add(1);
        }
      } catch (const std::exception& e) {
        record_failure(__FILE__, __LINE__, std::string("churn thread: ") + e.what());
        errors.fetch_add(1);
      }
    });
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
  CHECK_EQ(errors.load(), int64_t{0});
  CHECK_EQ(shared.num_requests(), int64_t{0});

  // Sequential replay on a fresh single-threaded drafter.
  Drafter sequential(config, kVocab, 1);
  sequential.set_datastore(ds);
  for (int id = 0; id < kCallers; ++id) {
    std::vector<BatchDrafts> expected;
    caller(sequential, id, expected);
    bool same = expected.size() == results[static_cast<size_t>(id)].size();
    for (size_t s = 0; same && s < expected.size(); ++s) {
      same = same_batch(expected[s], results[static_cast<size_t>(id)][s]);
    }
    CHECK_MSG(same, "concurrent caller " + std::to_string(id) + " differs from sequential");
  }
}

// Drafter::explain: the tree draft_batch gives, with drafter::kScoreFeatures values per
// node, every path's sources recorded (a node has a source, a source's count never exceeds
// its parent count); no state changes.
void test_drafter_explain(const std::shared_ptr<const Datastore>& ds, const MarkovSource& src) {
  DraftConfig config;
  Drafter four(config, kVocab, 4);
  four.set_datastore(ds);
  std::mt19937 rng(77);
  const int64_t h0 = 3, zero[2] = {0, 0};
  const Tokens prompt = src.stream(rng, uniform(rng, 1, 200));
  four.start(h0, prompt.data(), static_cast<int64_t>(prompt.size()));
  const int32_t budget = 16;
  for (const int32_t bud : {0, 1, 16, 256}) {
    const Draft explained = four.explain(h0, bud);
    const BatchDrafts drafted = four.draft_batch(&h0, 1, nullptr, 0, zero, &bud);
    CHECK(explained.tokens == drafted.tokens && explained.parents == drafted.parents &&
          explained.scores == drafted.scores);
    CHECK_EQ(explained.features.size(), explained.tokens.size() * drafter::kScoreFeatures);
    for (size_t i = 0; i < explained.tokens.size(); ++i) {
      const double* f = explained.features.data() + i * drafter::kScoreFeatures;
      CHECK(f[drafter::kFeatInputPresent] + f[drafter::kFeatBasePresent] +
                f[drafter::kFeatLivePresent] >= 1);
      CHECK(f[drafter::kFeatInputLogCond] <= 0 && f[drafter::kFeatBaseLogCond] <= 0);
      CHECK(f[drafter::kFeatDepth] >= 1 && f[drafter::kFeatLogSiblings] >= 0);
      CHECK(f[drafter::kFeatLogOverBest] <= 0);
    }
  }
  CHECK_THROWS(four.explain(99, budget), std::out_of_range);
  CHECK_THROWS(four.explain(h0, config.max_budget + 1), std::invalid_argument);
  CHECK_EQ(four.num_tokens(h0), static_cast<int64_t>(prompt.size()));
}

// ---------------------------------------------------------------------------
// Large input.

void test_large() {
  constexpr int32_t kLen = 128 * 1024;
  constexpr int32_t kDepth = 16;
  constexpr int32_t kBigVocab = 32000;
  std::mt19937 rng(8);
  const MarkovSource src(kBigVocab, 8);
  // Natural-ish stream with verbatim repeats of earlier spans (like code or chat).
  Tokens input;
  input.reserve(kLen);
  while (static_cast<int32_t>(input.size()) < kLen) {
    if (input.size() > 1000 && coin(rng, 0.02)) {
      const auto from = static_cast<size_t>(uniform(rng, 0, static_cast<int32_t>(input.size()) - 200));
      const size_t take = static_cast<size_t>(uniform(rng, 20, 200));
      for (size_t k = 0; k < take && static_cast<int32_t>(input.size()) < kLen; ++k) {
        input.push_back(input[from + k]);
      }
    } else {
      input.push_back(src.next(rng, input.empty() ? -1 : input.back()));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  InputTrie trie(kDepth);
  for (int32_t v : input) trie.append(v);
  const double trie_s = seconds_since(t0);
  CHECK_EQ(trie.num_tokens(), int64_t{kLen});
  CHECK(trie.num_nodes() <= int64_t{kLen} * kDepth + 1);
  int64_t root_total = 0;
  for (int32_t c = trie.first_child(InputTrie::kRoot); c != -1; c = trie.next_sibling(c)) {
    root_total += trie.count(c);
  }
  CHECK_EQ(root_total, int64_t{kLen});
  bool suffix_ok = true;
  for (int32_t len = 1; len <= kDepth; ++len) {
    const int32_t node = trie.suffix_node(len);
    suffix_ok = suffix_ok && node > 0 && node == walk_trie(trie, input.data() + kLen - len, len);
  }
  CHECK(suffix_ok);
  // Spot-check counts of a few substrings against a scan.
  for (int q = 0; q < 20; ++q) {
    const int32_t len = uniform(rng, 1, kDepth);
    const int32_t from = uniform(rng, 0, kLen - len);
    int64_t expected = 0;
    for (int64_t i = 0; i + len <= kLen; ++i) expected += occurs_at(input, i, input.data() + from, len);
    const int32_t node = walk_trie(trie, input.data() + from, len);
    CHECK_MSG(node > 0 && static_cast<int64_t>(trie.count(node)) == expected,
              "substring at " + std::to_string(from) + " length " + std::to_string(len));
  }
  std::printf("large: InputTrie(depth %d) over %d tokens: %" PRId64 " nodes, %.1f MiB resident, %.2f s\n",
              kDepth, kLen, trie.num_nodes(), static_cast<double>(trie.resident_bytes()) / (1 << 20),
              trie_s);
  CHECK(trie.resident_bytes() >= trie.num_nodes() * 16);

  // A draft over it with a 100k-token datastore, and the same prompt in a Drafter.
  const auto t1 = std::chrono::steady_clock::now();
  Tokens docs = src.documents(rng, 200, 1000);
  auto ds = std::make_shared<Datastore>();
  ds->sub_indices.push_back(SubIndex::build(docs, kBigVocab));
  const double sa_s = seconds_since(t1);
  CHECK_MSG(verify_suffix_array(docs, Tokens(ds->sub_indices[0]->suffix_array(),
                                             ds->sub_indices[0]->suffix_array() + docs.size())),
            "datastore suffix array");
  DraftConfig config;
  DraftScratch scratch;
  Draft d;
  drafter::draft_one(&trie, input.data(), kLen, ds.get(), config, 256, scratch, d);
  const std::string problem = draft_problem(d, 256, kBigVocab, true);
  CHECK_MSG(problem.empty(), problem);
  CHECK(!d.tokens.empty());
  Drafter big(config, kBigVocab, 2);
  big.set_datastore(ds);
  const auto t2 = std::chrono::steady_clock::now();
  big.start(1, input.data(), kLen);
  const int64_t bytes = big.request_bytes(1);
  const int64_t h = 1, zero_offsets[2] = {0, 0};
  const int32_t budget = 256;
  const BatchDrafts b = big.draft_batch(&h, 1, nullptr, 0, zero_offsets, &budget);
  CHECK(same_draft(slice(b, 0), d));
  std::printf("large: datastore of %zu tokens built in %.2f s; Drafter request of %d tokens: "
              "%.1f MiB (start + draft %.2f s)\n",
              docs.size(), sa_s, kLen, static_cast<double>(bytes) / (1 << 20), seconds_since(t2));
  CHECK(bytes >= trie.resident_bytes());
}

}  // namespace

int main() {
  const auto start = std::chrono::steady_clock::now();
  struct Section {
    const char* name;
    std::function<void()> run;
  };
  std::mt19937 rng(555);
  const MarkovSource src(kVocab, 555);
  auto ds = std::make_shared<Datastore>();
  for (int s = 0; s < 3; ++s) {
    ds->sub_indices.push_back(SubIndex::build(src.documents(rng, 40, 400), kVocab));
  }
  const std::shared_ptr<const Datastore> cds = ds;
  const std::vector<Section> sections{
      {"suffix_array", test_suffix_array},
      {"sub_index", test_sub_index},
      {"input_trie", test_input_trie},
      {"retrieve_and_fuse", test_retrieve_and_fuse},
      {"candidate_tree", test_candidate_tree_batches},
      {"drafter_basic", [&] { test_drafter_basic(cds, src); }},
      {"drafter_basic_learned", [&] { test_drafter_basic(cds, src, true); }},
      {"drafter_bad_input", [&] { test_drafter_bad_input(cds, src); }},
      {"drafter_concurrent", [&] { test_drafter_concurrent(cds, src); }},
      {"drafter_explain", [&] { test_drafter_explain(cds, src); }},
      {"large", test_large},
  };
  for (const Section& s : sections) {
    const int64_t failed_before = g_failed.load();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      s.run();
    } catch (const std::exception& e) {
      record_failure(__FILE__, __LINE__, std::string(s.name) + " threw: " + e.what());
    } catch (...) {
      record_failure(__FILE__, __LINE__, std::string(s.name) + " threw a non-std exception");
    }
    std::printf("%-20s %s  %.2f s\n", s.name, g_failed.load() == failed_before ? "ok  " : "FAIL",
                seconds_since(t0));
    std::fflush(stdout);
  }
  std::printf("total %.2f s\n", seconds_since(start));
  std::printf("%" PRId64 " passed, %" PRId64 " failed\n", g_passed.load(), g_failed.load());
  return g_failed.load() == 0 ? 0 : 1;
}
