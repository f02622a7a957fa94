#include "draft_config.h"

#include <cmath>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <string>

#include "fusion.h"

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
  require_in("recent_samples", c.recent_samples, 0, 4096);
  require_in("recent_min_match", c.recent_min_match, 1, 64);
  require(c.recent_max_match >= c.recent_min_match && c.recent_max_match <= 1024,
          "recent_max_match", c.recent_max_match, "must be in [recent_min_match, 1024]");
  require_in("recent_candidates", c.recent_candidates, 1, 100000);
  require_in("recent_held_tokens", c.recent_held_tokens, 0, 1 << 30);
  require_in("input_weight", c.input_weight, 0.0, 1e6);
  require_in("input_child_discount_base", c.input_child_discount_base, 0.0, 1e6);
  require_in("input_child_discount_per_match", c.input_child_discount_per_match, 0.0, 1e6);
  require_in("datastore_weight", c.datastore_weight, 0.0, 1e6);
  require_in("datastore_child_discount", c.datastore_child_discount, 0.0, 1e6);
  require_in("input_smoothing", c.input_smoothing, 0.0, 1e6);
  require_in("datastore_smoothing", c.datastore_smoothing, 0.0, 1e6);
  if (!c.node_score.empty()) {
    require(c.node_score.size() == kScoreFeatures + 1, "node_score length",
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

void check_tokens(const int32_t* tokens, int64_t n, int32_t vocab_size) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      throw std::invalid_argument("token id " + std::to_string(tokens[i]) + " at index " +
                                  std::to_string(i) + " is outside [0, " +
                                  std::to_string(vocab_size) + ")");
    }
  }
}

}  // namespace drafter
