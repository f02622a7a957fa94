// Per-request trie over prompt + committed tokens (SSSD §3.1.1, Algorithm 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace drafter {

// A trie of every substring of the input up to `max_depth` tokens long, with
// occurrence counts. Appending a token costs O(max_depth): the nodes of the
// suffixes ending at the previous token are each extended by one child.
// Memory is O(input length * max_depth) in the worst case (no repeats).
class InputTrie {
 public:
  static constexpr int32_t kRoot = 0;

  // max_depth >= 1: a validated config's input_max_depth (its callers validate it).
  explicit InputTrie(int32_t max_depth);

  void append(int32_t token);

  // Node of the suffix of the input of length `len` (1 <= len), or -1 when the
  // input is shorter than `len` or `len` exceeds max_depth. O(1).
  int32_t suffix_node(int32_t len) const;

  // Child of `parent` along `token`, or -1. O(1) expected.
  int32_t child(int32_t parent, int32_t token) const;
  // Starts loading what child(parent, token) reads first (its hash slot), so that several
  // lookups' cache misses overlap. No effect on results.
  void prefetch_child(int32_t parent, int32_t token) const {
    const size_t s = slot_of(edge_key(parent, token));
    __builtin_prefetch(keys_.data() + s);
    __builtin_prefetch(values_.data() + s);
  }
  // The same for holds(token).
  void prefetch_holds(int32_t token) const {
    const uint32_t t = token;
    if (t < kBitmapTokens && t / 64 < seen_.size()) __builtin_prefetch(seen_.data() + t / 64);
  }

  // Whether the input holds `token` (the root has a child along it). Reads a bitmap of
  // the tokens below kBitmapTokens (one bit per token id up to the largest appended:
  // 16 KiB for a 128k vocabulary), which stays in cache where a hash probe would miss;
  // larger tokens take the hash table.
  bool holds(int32_t token) const {
    const uint32_t t = token;
    if (t < kBitmapTokens) {
      const size_t word = t / 64;
      return word < seen_.size() && ((seen_[word] >> (t % 64)) & 1) != 0;
    }
    return child(kRoot, token) >= 0;
  }
  static constexpr uint32_t kBitmapTokens = uint32_t{1} << 20;

  int32_t token(int32_t node) const { return nodes_[node].token; }
  uint32_t count(int32_t node) const { return nodes_[node].count; }
  int32_t first_child(int32_t node) const { return nodes_[node].first_child; }
  int32_t next_sibling(int32_t node) const { return nodes_[node].next_sibling; }
  int64_t num_nodes() const { return nodes_.size(); }
  // Bytes this trie holds: every buffer's capacity and the object itself.
  int64_t resident_bytes() const;
  // How many more appends can run without allocating (every buffer has room for
  // max_depth new nodes per append), however the tokens repeat.
  int64_t append_headroom() const;

 private:
  struct Node {
    int32_t token;         // token on the edge from the parent; -1 for the root
    uint32_t count;        // occurrences of the path root..node in the input
    int32_t first_child;   // newest child, or -1; children form a singly linked list
    int32_t next_sibling;  // next older sibling, or -1
  };

  static uint64_t edge_key(int32_t parent, int32_t token) {
    const uint32_t high = parent, low = token;  // zero-extended below, not sign-extended
    return (uint64_t{high} << 32) | low;
  }
  // Home slot of `key` in the table: Fibonacci hashing (multiply by 2^64 / phi, keep
  // the high bits).
  size_t slot_of(uint64_t key) const {
    return ((key * 0x9E3779B97F4A7C15ull) >> (64 - __builtin_ctzll(keys_.size()))) &
           (keys_.size() - 1);
  }
  // The slot holding `key`, or the empty slot where it would go.
  size_t find_slot(uint64_t key) const;
  int32_t get_or_add_child(int32_t parent, int32_t token);
  void grow_table();

  int32_t max_depth_;   // longest path stored, >= 1
  std::vector<Node> nodes_;  // nodes_[0] is the root
  // Open-addressing hash table (linear probing) from (parent, token) to child.
  // Keys are parent << 32 | token; an empty slot holds kEmptyKey. Capacity is a
  // power of two kept at most half full.
  std::vector<uint64_t> keys_;
  std::vector<int32_t> values_;
  int64_t used_ = 0;
  // active_[k] is the node of the input suffix of length k + 1, for
  // k < min(input length, max_depth_).
  std::vector<int32_t> active_;
  std::vector<uint64_t> seen_;  // bit t: token t < kBitmapTokens was appended
  std::vector<int32_t> scratch_;
};

}  // namespace drafter
