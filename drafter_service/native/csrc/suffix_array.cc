// SA-IS (Nong, Zhang & Chan, 2009): induced sorting of LMS substrings, with
// recursion on the reduced string when LMS substrings are not all distinct.
#include "sub_index.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace drafter {
namespace {

using Index = int32_t;

// Type of each position: S-type (true) if its suffix is smaller than the next
// one, L-type (false) otherwise. The last symbol (the unique sentinel) is S.
struct SuffixTypes {
  SuffixTypes(const Index* s, Index n) : bits(n) {
    bits[n - 1] = 1;
    for (Index i = n - 2; i >= 0; --i) {
      bits[i] = s[i] < s[i + 1] || (s[i] == s[i + 1] && bits[i + 1]);
    }
  }
  bool is_s(Index i) const { return bits[i] != 0; }
  // Leftmost S: an S position whose left neighbour is L.
  bool is_lms(Index i) const { return i > 0 && bits[i] && !bits[i - 1]; }
  std::vector<uint8_t> bits;
};

void bucket_bounds(const Index* s, Index n, Index k, std::vector<Index>& bkt, bool ends) {
  std::fill(bkt.begin(), bkt.end(), 0);
  for (Index i = 0; i < n; ++i) ++bkt[s[i]];
  Index sum = 0;
  for (Index c = 0; c < k; ++c) {
    sum += bkt[c];
    bkt[c] = ends ? sum : sum - bkt[c];
  }
}

void induce(const Index* s, Index* sa, Index n, Index k, const SuffixTypes& t,
            std::vector<Index>& bkt) {
  // L-type suffixes, scanning left to right from bucket heads.
  bucket_bounds(s, n, k, bkt, false);
  for (Index i = 0; i < n; ++i) {
    const Index j = sa[i] - 1;
    if (sa[i] > 0 && !t.is_s(j)) sa[bkt[s[j]]++] = j;
  }
  // S-type suffixes, scanning right to left from bucket tails.
  bucket_bounds(s, n, k, bkt, true);
  for (Index i = n - 1; i >= 0; --i) {
    const Index j = sa[i] - 1;
    if (sa[i] > 0 && t.is_s(j)) sa[--bkt[s[j]]] = j;
  }
}

// s[n-1] must be the unique smallest symbol (0); all symbols lie in [0, k).
void sais(const Index* s, Index* sa, Index n, Index k) {
  if (n == 1) {
    sa[0] = 0;
    return;
  }
  const SuffixTypes t(s, n);
  std::vector<Index> bkt(k);

  // Stage 1: sort LMS substrings by induced sorting from LMS positions.
  bucket_bounds(s, n, k, bkt, true);
  std::fill(sa, sa + n, -1);
  for (Index i = 1; i < n; ++i) {
    if (t.is_lms(i)) sa[--bkt[s[i]]] = i;
  }
  induce(s, sa, n, k, t, bkt);

  // Compact the sorted LMS positions into sa[0, n1).
  Index n1 = 0;
  for (Index i = 0; i < n; ++i) {
    if (t.is_lms(sa[i])) sa[n1++] = sa[i];
  }

  // Name LMS substrings: equal substrings (same symbols and types up to the
  // next LMS position) get equal names. Names are stored at sa[n1 + pos/2];
  // two LMS positions are at least two apart, so slots never collide.
  std::fill(sa + n1, sa + n, -1);
  Index name = 0;
  Index prev = -1;
  for (Index i = 0; i < n1; ++i) {
    const Index pos = sa[i];
    bool diff = false;
    for (Index d = 0; d < n; ++d) {
      if (prev == -1 || s[pos + d] != s[prev + d] || t.is_s(pos + d) != t.is_s(prev + d)) {
        diff = true;
        break;
      }
      if (d > 0 && (t.is_lms(pos + d) || t.is_lms(prev + d))) break;
    }
    if (diff) {
      ++name;
      prev = pos;
    }
    sa[n1 + pos / 2] = name - 1;
  }
  for (Index i = n - 1, j = n - 1; i >= n1; --i) {
    if (sa[i] >= 0) sa[j--] = sa[i];
  }

  // Stage 2: suffix array of the reduced string s1 = sa[n - n1, n).
  Index* s1 = sa + n - n1;
  Index* sa1 = sa;
  if (name < n1) {
    sais(s1, sa1, n1, name);
  } else {
    for (Index i = 0; i < n1; ++i) sa1[s1[i]] = i;
  }

  // Stage 3: place LMS suffixes in their final order, then induce the rest.
  bucket_bounds(s, n, k, bkt, true);
  for (Index i = 1, j = 0; i < n; ++i) {
    if (t.is_lms(i)) s1[j++] = i;  // s1 now maps reduced index -> text position
  }
  for (Index i = 0; i < n1; ++i) sa1[i] = s1[sa1[i]];
  std::fill(sa + n1, sa + n, -1);
  for (Index i = n1 - 1; i >= 0; --i) {
    const Index j = sa[i];
    sa[i] = -1;
    sa[--bkt[s[j]]] = j;
  }
  induce(s, sa, n, k, t, bkt);
}

}  // namespace

void check_text(const int32_t* text, int64_t n, int32_t vocab_size, const char* what) {
  const std::string prefix = std::string(what) + ": ";
  if (n < 0 || n >= (int64_t{1} << 31) - 2) {
    throw std::invalid_argument(prefix + "text length " + std::to_string(n) +
                                " is outside [0, 2^31 - 2)");
  }
  if (vocab_size <= 0 || vocab_size > (1 << 30)) {
    throw std::invalid_argument(prefix + "vocab_size " + std::to_string(vocab_size) +
                                " is outside (0, 2^30]");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (text[i] < kSeparator || text[i] >= vocab_size) {
      throw std::invalid_argument(prefix + "token " + std::to_string(text[i]) + " at position " +
                                  std::to_string(i) + " is outside [-1, " +
                                  std::to_string(vocab_size) + ")");
    }
  }
}

std::vector<int32_t> build_suffix_array(const int32_t* text, int64_t n, int32_t vocab_size) {
  check_text(text, n, vocab_size, "suffix array");
  if (n == 0) return {};
  // Shift symbols so that the appended sentinel (0) is unique and smallest:
  // separator -1 -> 1, token t -> t + 2.
  const Index len = static_cast<Index>(n) + 1;
  std::vector<Index> s(len);
  for (int64_t i = 0; i < n; ++i) s[i] = text[i] + 2;
  s[n] = 0;
  std::vector<Index> sa(len);
  sais(s.data(), sa.data(), len, vocab_size + 2);
  // sa[0] is the sentinel suffix; drop it.
  sa.erase(sa.begin());
  return sa;
}

}  // namespace drafter
