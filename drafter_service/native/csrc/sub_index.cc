#include "sub_index.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace drafter {

SubIndex::SubIndex(const int32_t* tokens, const int32_t* suffix_array, int64_t n,
                   int32_t vocab_size, std::shared_ptr<const void> owner)
    : tokens_(tokens), sa_(suffix_array), n_(n), vocab_size_(vocab_size), owner_(std::move(owner)) {
  // Counting the first token of every suffix = counting every token: token t in
  // bucket_[t + 1], a separator in bucket_[kSeparator + 1] = bucket_[0]; then summed up.
  static_assert(kSeparator + 1 == 0);
  bucket_.assign(vocab_size_ + 1, 0);
  for (int64_t i = 0; i < n_; ++i) ++bucket_[tokens_[i] + 1];
  std::partial_sum(bucket_.begin(), bucket_.end(), bucket_.begin());
}

std::shared_ptr<const SubIndex> SubIndex::build(std::vector<int32_t> tokens, int32_t vocab_size) {
  struct Built {
    std::vector<int32_t> tokens;  // the text
    std::vector<int32_t> sa;      // its suffix array
  };
  auto built = std::make_shared<Built>();
  built->sa = build_suffix_array(tokens.data(), tokens.size(), vocab_size);
  built->tokens = std::move(tokens);
  std::shared_ptr<const SubIndex> index(new SubIndex(
      built->tokens.data(), built->sa.data(), built->tokens.size(), vocab_size, built));
#if defined(__GLIBC__)
  // SA-IS frees about 5 bytes per token of temporaries; glibc keeps freed
  // blocks this size in the heap, so a long-running process would stay that
  // much larger after every (re)build. Hand them back to the OS.
  malloc_trim(0);
#endif
  return index;
}

std::shared_ptr<const SubIndex> SubIndex::wrap(const int32_t* tokens, const int32_t* suffix_array,
                                               int64_t n, int32_t vocab_size,
                                               std::shared_ptr<const void> owner) {
  check_text(tokens, n, vocab_size, "sub-index");
  for (int64_t i = 0; i < n; ++i) {
    if (suffix_array[i] < 0 || suffix_array[i] >= n) {
      throw std::invalid_argument("sub-index: suffix array entry " +
                                  std::to_string(suffix_array[i]) + " at row " +
                                  std::to_string(i) + " is outside [0, " + std::to_string(n) +
                                  ")");
    }
  }
  return std::shared_ptr<const SubIndex>(
      new SubIndex(tokens, suffix_array, n, vocab_size, std::move(owner)));
}

int64_t SubIndex::resident_bytes() const {
  return 8 * n_ + bucket_.size() * sizeof(int32_t);
}

int SubIndex::compare_suffix(int64_t pos, const int32_t* prefix, int32_t len) const {
  for (int32_t k = 0; k < len; ++k) {
    if (pos + k >= n_) return -1;
    const int32_t a = tokens_[pos + k];
    if (a != prefix[k]) return a < prefix[k] ? -1 : 1;
  }
  return 0;
}

SaRange SubIndex::find_range(const int32_t* prefix, int32_t len) const {
  if (len <= 0 || n_ == 0) return {0, 0};
  const int32_t first = prefix[0];
  if (first < 0 || first >= vocab_size_) return {0, 0};
  int64_t lo = bucket_[first];
  int64_t hi = bucket_[first + 1];
  if (lo == hi || len == 1) return {lo, hi};
  // Every suffix in the bucket already matches prefix[0]; compare the rest.
  const int32_t* rest = prefix + 1;
  const int32_t rest_len = len - 1;
  // Narrow [a, b) until a row matches (none: empty range), then search the
  // lower bound left of it and the upper bound right of it: the levels above
  // the first match are shared, and a miss costs one search, not two.
  int64_t a = lo, b = hi, match = -1;
  while (a < b) {
    const int64_t mid = a + (b - a) / 2;
    const int c = compare_suffix(int64_t{sa_[mid]} + 1, rest, rest_len);
    if (c < 0) {
      a = mid + 1;
    } else if (c > 0) {
      b = mid;
    } else {
      match = mid;
      break;
    }
  }
  if (match < 0) return {a, a};
  // Then the first row in [a, match] whose suffix is >= prefix, and the first in
  // (match, b] whose suffix is > prefix (a row is its offset in sa_).
  const int32_t* lower = std::partition_point(sa_ + a, sa_ + match, [&](int32_t pos) {
    return compare_suffix(int64_t{pos} + 1, rest, rest_len) < 0;
  });
  const int32_t* upper = std::partition_point(sa_ + match + 1, sa_ + b, [&](int32_t pos) {
    return compare_suffix(int64_t{pos} + 1, rest, rest_len) <= 0;
  });
  return {lower - sa_, upper - sa_};
}

}  // namespace drafter
