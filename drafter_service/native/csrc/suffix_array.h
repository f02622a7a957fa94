// Suffix-array construction for integer alphabets (SA-IS).
#pragma once

#include <cstdint>
#include <vector>

namespace drafter {

// Builds the suffix array of `text` (length n < 2^31). Token values must lie in
// [-1, vocab_size); -1 is the document separator and sorts below every token.
// A suffix that is a proper prefix of another sorts first (end of text is the
// smallest symbol), which is exactly the order the binary search in
// SubIndex::find_range assumes. Linear time and about 9n bytes of extra memory.
std::vector<int32_t> build_suffix_array(const int32_t* text, int64_t n, int32_t vocab_size);

}  // namespace drafter
