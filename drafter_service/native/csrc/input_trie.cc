#include "input_trie.h"

#include <algorithm>
#include <stdexcept>

namespace drafter {
namespace {

constexpr uint64_t kEmptyKey = ~uint64_t{0};

}  // namespace

InputTrie::InputTrie(int32_t max_depth) : max_depth_(max_depth) {
  nodes_.push_back({-1, 0, -1, -1});
  keys_.assign(64, kEmptyKey);
  values_.assign(64, -1);
  active_.reserve(max_depth);
  scratch_.reserve(max_depth);
}

int64_t InputTrie::resident_bytes() const {
  return sizeof(*this) + nodes_.capacity() * sizeof(Node) + keys_.capacity() * sizeof(uint64_t) +
         values_.capacity() * sizeof(int32_t) + seen_.capacity() * sizeof(uint64_t) +
         (active_.capacity() + scratch_.capacity()) * sizeof(int32_t);
}

int64_t InputTrie::append_headroom() const {
  const int64_t depth = max_depth_;
  const int64_t nodes_free = nodes_.capacity() - nodes_.size();
  // get_or_add_child grows the table before the insert that would pass half full.
  const int64_t slots_free = keys_.size() / 2 - used_;
  return std::max<int64_t>(0, std::min(nodes_free, slots_free) / depth);
}

int32_t InputTrie::suffix_node(int32_t len) const {
  if (len < 1 || len > static_cast<int32_t>(active_.size())) return -1;
  return active_[len - 1];
}

size_t InputTrie::find_slot(uint64_t key) const {
  const size_t mask = keys_.size() - 1;
  size_t s = slot_of(key);
  while (keys_[s] != key && keys_[s] != kEmptyKey) s = (s + 1) & mask;
  return s;
}

int32_t InputTrie::child(int32_t parent, int32_t token) const {
  return values_[find_slot(edge_key(parent, token))];  // an empty slot's value is -1
}

void InputTrie::grow_table() {
  std::vector<uint64_t> old_keys(keys_.size() * 2, kEmptyKey);
  std::vector<int32_t> old_values(values_.size() * 2, -1);
  old_keys.swap(keys_);
  old_values.swap(values_);
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_keys[i] == kEmptyKey) continue;
    const size_t s = find_slot(old_keys[i]);  // an empty one: the keys are distinct
    keys_[s] = old_keys[i];
    values_[s] = old_values[i];
  }
}

int32_t InputTrie::get_or_add_child(int32_t parent, int32_t token) {
  if (2 * (used_ + 1) > static_cast<int64_t>(keys_.size())) grow_table();
  const uint64_t key = edge_key(parent, token);
  const size_t s = find_slot(key);
  if (keys_[s] == key) return values_[s];
  if (nodes_.size() >= INT32_MAX) {
    throw std::length_error("input trie: more than 2^31 - 1 nodes");
  }
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back({token, 0, -1, nodes_[parent].first_child});
  nodes_[parent].first_child = id;
  keys_[s] = key;
  values_[s] = id;
  ++used_;
  return id;
}

void InputTrie::append(int32_t token) {
  // The suffixes ending at the new token are the old suffixes (up to length
  // max_depth - 1) extended by `token`, plus the one-token suffix.
  scratch_.clear();
  const uint32_t t = token;
  if (t < kBitmapTokens) {
    if (t / 64 >= seen_.size()) seen_.resize(t / 64 + 1, 0);
    seen_[t / 64] |= uint64_t{1} << (t % 64);
  }
  const size_t keep = std::min(active_.size(), static_cast<size_t>(max_depth_) - 1);
  // The suffixes' edges are independent lookups, each a likely cache miss: start them all.
  prefetch_child(kRoot, token);
  for (size_t k = 0; k < keep; ++k) prefetch_child(active_[k], token);
  auto extend = [&](int32_t parent) {  // one more occurrence of parent's path + token
    const int32_t node = get_or_add_child(parent, token);
    ++nodes_[node].count;
    scratch_.push_back(node);
  };
  extend(kRoot);
  for (size_t k = 0; k < keep; ++k) extend(active_[k]);
  active_.swap(scratch_);
}

}  // namespace drafter
