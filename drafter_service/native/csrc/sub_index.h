// One immutable suffix-array sub-index of the datastore (SSSD §3.1.2), and the
// suffix-array construction it builds with (SA-IS, suffix_array.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace drafter {

inline constexpr int32_t kSeparator = -1;

// Builds the suffix array of `text` (length n < 2^31). Token values must lie in
// [-1, vocab_size); -1 is the document separator and sorts below every token.
// A suffix that is a proper prefix of another sorts first (end of text is the
// smallest symbol), which is exactly the order the binary search in
// SubIndex::find_range assumes. Linear time and about 9n bytes of extra memory.
std::vector<int32_t> build_suffix_array(const int32_t* text, int64_t n, int32_t vocab_size);

// Throws std::invalid_argument (its message starting with `what`) unless text[0, n) is a
// sub-index's text: n in [0, 2^31 - 2), vocab_size in (0, 2^30], values in [-1, vocab_size).
void check_text(const int32_t* text, int64_t n, int32_t vocab_size, const char* what);

// Half-open range [begin, end) of suffix-array rows whose suffixes start with a
// given prefix.
struct SaRange {
  int64_t begin = 0;  // first matching row
  int64_t end = 0;    // one past the last matching row; end >= begin
  int64_t size() const { return end - begin; }
};

class SubIndex {
 public:
  // Builds the suffix array over `tokens` (copied). Documents are separated by
  // kSeparator; every other value must lie in [0, vocab_size).
  static std::shared_ptr<const SubIndex> build(std::vector<int32_t> tokens, int32_t vocab_size);

  // Wraps arrays that already hold a text and its suffix array (a snapshot).
  // `owner` keeps the memory alive. Checks sizes and value ranges in O(n);
  // the suffix order itself is trusted (snapshots carry checksums).
  static std::shared_ptr<const SubIndex> wrap(const int32_t* tokens, const int32_t* suffix_array,
                                              int64_t n, int32_t vocab_size,
                                              std::shared_ptr<const void> owner);

  int64_t num_tokens() const { return n_; }
  int32_t vocab_size() const { return vocab_size_; }
  const int32_t* tokens() const { return tokens_; }
  const int32_t* suffix_array() const { return sa_; }
  // Bytes this sub-index keeps resident: text + suffix array + first-token table.
  int64_t resident_bytes() const;

  // Rows whose suffix starts with prefix[0, len). Two binary searches inside
  // the bucket of prefix[0]: O(len * log(bucket size)).
  SaRange find_range(const int32_t* prefix, int32_t len) const;

  // Text position where the suffix in row `row` starts.
  int64_t position(int64_t row) const { return sa_[row]; }

 private:
  // Over arrays `owner` keeps alive; builds the first-token table.
  SubIndex(const int32_t* tokens, const int32_t* suffix_array, int64_t n, int32_t vocab_size,
           std::shared_ptr<const void> owner);
  // -1 / 0 / +1: how the first `len` tokens of the suffix at `pos` compare to
  // `prefix`. A suffix that ends (text end) before `len` tokens sorts lower.
  int compare_suffix(int64_t pos, const int32_t* prefix, int32_t len) const;

  const int32_t* tokens_;  // n_ values in [-1, vocab_size_); -1 separates documents
  const int32_t* sa_;      // permutation of [0, n_) in suffix order
  int64_t n_;              // number of text positions (tokens + separators)
  int32_t vocab_size_;     // exclusive upper bound of token ids
  // bucket_[t] .. bucket_[t + 1]: rows whose suffix starts with token t.
  // Size vocab_size_ + 1; rows before bucket_[0] start with a separator.
  std::vector<int32_t> bucket_;
  std::shared_ptr<const void> owner_;  // keeps tokens_ and sa_ alive (built here or wrapped)
};

}  // namespace drafter
