#include "draft.h"

#include <algorithm>
#include <queue>
#include <stdexcept>
#include <string>

namespace drafter {

namespace {

void require(bool ok, const char* field, double value, const char* rule) {
  if (!ok) {
    throw std::invalid_argument(std::string("draft config: ") + field + " = " +
                                std::to_string(value) + " " + rule);
  }
}

}  // namespace

void validate(const DraftConfig& c) {
  require(c.input_max_prefix >= 1 && c.input_max_prefix <= 64, "input_max_prefix",
          c.input_max_prefix, "must be in [1, 64]");
  require(c.input_max_depth >= c.input_max_prefix && c.input_max_depth <= 256,
          "input_max_depth", c.input_max_depth, "must be in [input_max_prefix, 256]");
  require(c.datastore_min_prefix >= 1, "datastore_min_prefix", c.datastore_min_prefix,
          "must be >= 1");
  require(c.datastore_max_prefix >= c.datastore_min_prefix && c.datastore_max_prefix <= 256,
          "datastore_max_prefix", c.datastore_max_prefix,
          "must be in [datastore_min_prefix, 256]");
  require(c.datastore_samples >= 1 && c.datastore_samples <= 100000, "datastore_samples",
          c.datastore_samples, "must be in [1, 100000]");
  require(c.datastore_max_continuation >= 1 && c.datastore_max_continuation <= 1024,
          "datastore_max_continuation", c.datastore_max_continuation, "must be in [1, 1024]");
  require(c.datastore_min_tree_nodes >= 0, "datastore_min_tree_nodes",
          c.datastore_min_tree_nodes, "must be >= 0");
  require(c.input_weight >= 0.0 && c.input_weight <= 1e6, "input_weight", c.input_weight,
          "must be in [0, 1e6]");
  require(c.input_child_discount_base >= 0.0 && c.input_child_discount_base <= 1e6,
          "input_child_discount_base", c.input_child_discount_base, "must be in [0, 1e6]");
  require(c.input_child_discount_per_match >= 0.0 && c.input_child_discount_per_match <= 1e6,
          "input_child_discount_per_match", c.input_child_discount_per_match,
          "must be in [0, 1e6]");
  require(c.datastore_weight >= 0.0 && c.datastore_weight <= 1e6, "datastore_weight",
          c.datastore_weight, "must be in [0, 1e6]");
  require(c.datastore_child_discount >= 0.0 && c.datastore_child_discount <= 1e6,
          "datastore_child_discount", c.datastore_child_discount, "must be in [0, 1e6]");
  require(c.max_budget >= 0 && c.max_budget <= 4096, "max_budget", c.max_budget,
          "must be in [0, 4096]");
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
  nodes_.clear();
  nodes_.push_back({-1, 0, -1, -1});
}

void CandidateTree::insert(const int32_t* tokens, int32_t len) {
  int32_t node = kRoot;
  ++nodes_[kRoot].count;
  for (int32_t i = 0; i < len; ++i) {
    // Samples of one range arrive in suffix order, so the wanted child is
    // usually the newest one: the list is scanned newest first.
    int32_t c = nodes_[static_cast<size_t>(node)].first_child;
    while (c != -1 && nodes_[static_cast<size_t>(c)].token != tokens[i]) {
      c = nodes_[static_cast<size_t>(c)].next_sibling;
    }
    if (c == -1) {
      c = static_cast<int32_t>(nodes_.size());
      nodes_.push_back({tokens[i], 0, -1, nodes_[static_cast<size_t>(node)].first_child});
      nodes_[static_cast<size_t>(node)].first_child = c;
    }
    ++nodes_[static_cast<size_t>(c)].count;
    node = c;
  }
}

void retrieve_datastore(const Datastore& datastore, const int32_t* context, int64_t context_len,
                        const DraftConfig& config, int32_t max_len, CandidateTree& tree) {
  tree.clear();
  if (datastore.sub_indices.empty() || context_len <= 0 || max_len <= 0) return;
  const int32_t cont_cap = std::min(config.datastore_max_continuation, max_len);
  const auto longest =
      static_cast<int32_t>(std::min<int64_t>(config.datastore_max_prefix, context_len));
  const size_t num_sub = datastore.sub_indices.size();
  std::vector<SaRange> ranges(num_sub);
  for (int32_t m = longest; m >= config.datastore_min_prefix; --m) {
    if (tree.num_nodes() - 1 >= config.datastore_min_tree_nodes) break;
    const int32_t* prefix = context + context_len - m;
    int64_t total = 0;
    for (size_t s = 0; s < num_sub; ++s) {
      ranges[s] = datastore.sub_indices[s]->find_range(prefix, m);
      total += ranges[s].size();
    }
    if (total == 0) continue;
    for (size_t s = 0; s < num_sub; ++s) {
      const int64_t found = ranges[s].size();
      if (found == 0) continue;
      const SubIndex& index = *datastore.sub_indices[s];
      // Interval sampling: the rows of a range are sorted by continuation, so
      // evenly spaced rows approximate the continuation distribution. The
      // sample budget is split over sub-indices in proportion to their matches.
      const int64_t samples =
          total <= config.datastore_samples
              ? found
              : std::max<int64_t>(1, config.datastore_samples * found / total);
      const int32_t* text = index.tokens();
      const int64_t n = index.num_tokens();
      for (int64_t k = 0; k < samples; ++k) {
        const int64_t row = ranges[s].begin + (k * found) / samples;
        const int64_t start = index.position(row) + m;
        int32_t len = 0;
        while (len < cont_cap && start + len < n && text[start + len] != kSeparator) ++len;
        tree.insert(text + start, len);
      }
    }
  }
}

namespace {

enum class Source : uint8_t { kDatastore, kInput };

// One candidate in the priority queue: a node of a source tree, to be placed
// under `draft_parent` in the draft (-1 = under the root).
struct Candidate {
  double score;        // product of discounted probabilities along the path
  uint64_t seq;        // push order; breaks score ties (earlier first)
  double child_discount;
  int32_t node;
  int32_t draft_parent;
  Source source;
};

struct WorseFirst {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.score < b.score || (a.score == b.score && a.seq > b.seq);
  }
};

// Uniform read access to the two kinds of source tree.
struct SourceView {
  const InputTrie* trie;
  const CandidateTree* tree;
  int32_t first_child(Source s, int32_t n) const {
    return s == Source::kInput ? trie->first_child(n) : tree->first_child(n);
  }
  int32_t next_sibling(Source s, int32_t n) const {
    return s == Source::kInput ? trie->next_sibling(n) : tree->next_sibling(n);
  }
  int32_t token(Source s, int32_t n) const {
    return s == Source::kInput ? trie->token(n) : tree->token(n);
  }
  double count(Source s, int32_t n) const {
    return s == Source::kInput ? trie->count(n) : tree->count(n);
  }
};

struct DraftNode {
  int32_t token;
  int32_t parent;        // internal index; 0 is the root
  int32_t depth;         // 1 for children of the root
  int32_t first_child;   // internal index or -1
  int32_t next_sibling;  // internal index or -1
  double score;          // score when first inserted (the highest, as pops are ordered)
};

}  // namespace

void fuse(const InputTrie* trie, const CandidateTree* datastore_tree, const DraftConfig& config,
          int32_t budget, DraftScratch& scratch, Draft& out) {
  out.tokens.clear();
  out.parents.clear();
  out.scores.clear();
  if (budget <= 0) return;
  const SourceView view{trie, datastore_tree};
  std::priority_queue<Candidate, std::vector<Candidate>, WorseFirst> queue;
  uint64_t seq = 0;
  std::vector<int32_t>& kids = scratch.children;

  // Pushes the children of `node` with score = weight * count(child) / denominator.
  // Children are taken in ascending token order. Only the best `budget` can
  // ever be popped (each pop of a distinct child adds a draft node under the
  // same parent), so the rest are skipped; this keeps wide trie nodes cheap.
  auto push_children = [&](Source source, int32_t node, double denominator, double weight,
                           double child_discount, int32_t draft_parent) {
    if (denominator <= 0.0) return;
    kids.clear();
    for (int32_t c = view.first_child(source, node); c != -1; c = view.next_sibling(source, c)) {
      kids.push_back(c);
    }
    if (kids.empty()) return;
    auto score_of = [&](int32_t c) { return view.count(source, c) / denominator * weight; };
    if (kids.size() > static_cast<size_t>(budget)) {
      std::nth_element(kids.begin(), kids.begin() + budget, kids.end(),
                       [&](int32_t a, int32_t b) {
                         const double sa = score_of(a), sb = score_of(b);
                         return sa > sb || (sa == sb && view.token(source, a) <
                                                            view.token(source, b));
                       });
      kids.resize(static_cast<size_t>(budget));
    }
    std::sort(kids.begin(), kids.end(), [&](int32_t a, int32_t b) {
      return view.token(source, a) < view.token(source, b);
    });
    for (int32_t c : kids) {
      queue.push({score_of(c), seq++, child_discount, c, draft_parent, source});
    }
  };

  // Sources in a fixed order: the datastore tree, then input matches from the
  // longest suffix (P) to the shortest (1).
  if (datastore_tree != nullptr) {
    push_children(Source::kDatastore, CandidateTree::kRoot,
                  datastore_tree->count(CandidateTree::kRoot), config.datastore_weight,
                  config.datastore_child_discount, -1);
  }
  if (trie != nullptr) {
    for (int32_t m = config.input_max_prefix; m >= 1; --m) {
      const int32_t u = trie->suffix_node(m);
      if (u < 0) continue;
      // count(u) includes the occurrence at the very end of the input, which
      // has no continuation yet; leave it out of the denominator.
      const double denominator = static_cast<double>(trie->count(u)) - 1.0;
      push_children(Source::kInput, u, denominator, config.input_weight,
                    config.input_child_discount_base + config.input_child_discount_per_match * m,
                    -1);
    }
  }

  std::vector<DraftNode> nodes;
  nodes.reserve(static_cast<size_t>(budget) + 1);
  nodes.push_back({-1, -1, 0, -1, -1, 0.0});
  while (!queue.empty() && static_cast<int32_t>(nodes.size()) - 1 < budget) {
    const Candidate cand = queue.top();
    queue.pop();
    const int32_t parent = cand.draft_parent + 1;  // internal index
    const int32_t token = view.token(cand.source, cand.node);
    int32_t slot = nodes[static_cast<size_t>(parent)].first_child;
    while (slot != -1 && nodes[static_cast<size_t>(slot)].token != token) {
      slot = nodes[static_cast<size_t>(slot)].next_sibling;
    }
    if (slot == -1) {
      slot = static_cast<int32_t>(nodes.size());
      nodes.push_back({token, parent, nodes[static_cast<size_t>(parent)].depth + 1, -1,
                       nodes[static_cast<size_t>(parent)].first_child, cand.score});
      nodes[static_cast<size_t>(parent)].first_child = slot;
    }
    push_children(cand.source, cand.node, view.count(cand.source, cand.node),
                  cand.score * cand.child_discount, cand.child_discount, slot - 1);
  }

  // Breadth-first order: by depth, then by insertion (a parent is always
  // inserted before its children, so parents precede children).
  const auto num = static_cast<int32_t>(nodes.size()) - 1;
  std::vector<int32_t>& order = scratch.order;
  order.resize(static_cast<size_t>(num));
  for (int32_t i = 0; i < num; ++i) order[static_cast<size_t>(i)] = i + 1;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return nodes[static_cast<size_t>(a)].depth < nodes[static_cast<size_t>(b)].depth;
  });
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
}

}  // namespace drafter
