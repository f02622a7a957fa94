// The recent tier: an index over the tokens of the requests one Drafter holds (its
// requests in flight, siblings included) and of held generations (stored generations the
// live datastore has not folded into a sub-index yet: copied in when stored and released
// once folded, so that one is drafted from at the next step; at most recent_held_tokens
// of them, the oldest released first past that), drafted from as a source of its own.
// docs/algorithm.md ("The recent tier") defines what it implements: its entries (every
// position p >= K = recent_min_match of a stream, keyed by the K tokens before it; with
// K > 1 every output position of a request also a sibling entry, keyed by its prompt and
// the token before it), its lookup (the newest entries of the context's last K tokens,
// then its siblings' matches shorter than K; the recent_samples longest kept, the newer
// first among equal lengths) and its groups (a stream of group 0 is seen by every
// request, one of group g > 0 by requests of group g only).
//
// Not thread-safe: the Drafter mutates it and the streams it reads under an exclusive
// lock, and drafts from it under a shared one (drafter.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "draft_config.h"
#include "retrieval.h"

namespace drafter {

// Reusable buffers of RecentTier::retrieve; contents are meaningless between calls.
struct RecentScratch {
  struct Found {
    int32_t match;   // tokens the match with the context extends back (< K: a sibling's)
    uint32_t entry;  // the entry's index in its chain: larger is newer
    const int32_t* continuation;
    int32_t len;
  };
  std::vector<Found> found;
  std::vector<Sample> samples;
};

class RecentTier {
 public:
  // What one indexed token may cost the tier at most, in bytes: two entries (16 each; a
  // request's output token has a sibling entry too) with a vector's slack (x2) and the
  // entries of stopped streams not compacted yet (x2), and their share of the bucket
  // tables (4 bytes, at most 4 slots per entry, the same x2).
  static constexpr int64_t kBytesPerToken = 2 * (16 * 2 * 2 + 4 * 4 * 2);

  // `config` is validated, with recent_samples > 0 (the Drafter makes a tier only then).
  explicit RecentTier(const DraftConfig& config)
      : config_(config), k_(config.recent_min_match) {}

  // Starts indexing the stream of request `handle`, not indexed yet (the Drafter starts a
  // handle once), of group `group` (see the file comment); the tokens it holds now are its
  // prompt. `tokens` must stay valid until remove(handle) and change only by appends, each
  // followed by index(handle).
  void add(int64_t handle, const std::vector<int32_t>* tokens, int32_t group = 0);
  // Enters the positions the stream's tokens appended since the last call complete
  // (nothing for a request the tier does not index).
  void index(int64_t handle);
  // Forgets the stream (its entries are skipped, then compacted away).
  void remove(int64_t handle);
  // Holds a copy of a stored generation, `position` its ingest-log sequence number.
  // Returns false, holding nothing, for a position at or below one released already
  // (folded before it arrived), one held already, or more tokens than recent_held_tokens;
  // releases the oldest held ones as far as needed to stay within it.
  bool hold(int64_t position, const int32_t* tokens, int64_t n);
  // Releases every held generation at or below `position` (folded into a sub-index).
  void release_through(int64_t position);
  // Fills `tree` with the continuations of other streams after the context's last K
  // tokens (see the file comment), each capped at min(datastore_max_continuation,
  // max_len) tokens, and sets its matched prefix to the longest match (0: none).
  // `own`: the request drafting, whose own stream is never matched; `group`: its group,
  // which decides the streams it sees.
  void retrieve(int64_t own, int32_t group, const int32_t* context, int64_t context_len,
                int32_t max_len, RecentScratch& scratch, CandidateTree& tree) const;

  int64_t num_entries() const {
    return static_cast<int64_t>(main_.entries.size() + siblings_.entries.size());
  }
  int64_t held_generations() const { return static_cast<int64_t>(held_.size()); }
  int64_t held_tokens() const { return held_tokens_; }

 private:
  struct Stream {
    const std::vector<int32_t>* tokens;  // null once removed
    int64_t indexed;  // tokens whose position after them has been considered
    int32_t group;    // 0: seen by every request; g > 0: by requests of group g only
    uint64_t prompt;  // hash of a request's prompt (0: a held generation, none)
    int64_t sibling_indexed;  // the same as indexed, for sibling entries
    int64_t entries;  // entries made for it, in both chains
  };
  struct Held {
    std::unique_ptr<std::vector<int32_t>> tokens;  // the copy its stream reads
    uint32_t stream;
  };
  struct Entry {
    uint32_t stream;  // index into streams_
    uint32_t pos;     // the continuation starts at tokens[pos]
    uint32_t key;     // hash of tokens[pos - K, pos) (a sibling entry: of prompt, tokens[pos - 1])
    uint32_t next;    // the next older entry of the same bucket, + 1 (0: none)
  };
  static constexpr int64_t kMinBuckets = 1024;  // of a chain (a power of 2)
  // Entries, oldest first, chained per bucket of their key.
  struct Chain {
    std::vector<Entry> entries;
    // Per bucket: its newest entry + 1 (0: none); kMinBuckets buckets at first.
    std::vector<uint32_t> heads = std::vector<uint32_t>(kMinBuckets, 0);
    void insert(uint32_t stream, uint32_t pos, uint32_t key);
    void rechain(size_t buckets);  // over that many buckets (a power of 2)
    // Drops the entries of removed streams, renumbers the others' streams, rechains.
    void compact(const std::vector<Stream>& streams, const std::vector<uint32_t>& renumbered);
    uint32_t head(uint32_t key) const { return heads[key & (heads.size() - 1)]; }
  };
  uint32_t key_of(const int32_t* last) const;  // of the K tokens ending at last[-1]
  void compact();  // drops removed streams and their entries
  uint32_t add_stream(const std::vector<int32_t>* tokens, int32_t group, uint64_t prompt);
  void index_stream(uint32_t s);  // enters the positions its new tokens complete
  void remove_stream(uint32_t s);
  void release_oldest();  // of held_, which is not empty
  // Walks `chain`'s entries of `key` from the newest (see the file comment) and appends
  // to `found` those of other streams `group` sees that have a continuation and a match
  // of at least `min_match` and less than `below` tokens. `prompt` (not 0): the sibling
  // entries of that prompt, keyed by the context's last token.
  void collect(const Chain& chain, uint32_t key, uint64_t prompt, int32_t min_match,
               int32_t below, uint32_t own_stream, int32_t group, const int32_t* context,
               int64_t context_len, int32_t cap, std::vector<RecentScratch::Found>& found) const;

  const DraftConfig config_;  // its recent_* knobs and datastore_max_continuation
  const int32_t k_;           // recent_min_match
  std::vector<Stream> streams_;
  std::unordered_map<int64_t, uint32_t> stream_of_;  // handle -> index into streams_
  Chain main_;      // every position p >= K of every stream
  Chain siblings_;  // every output position of every request (only with K > 1)
  std::unordered_map<uint64_t, int32_t> prompts_;  // prompt hash -> requests of that prompt
  int64_t removed_entries_ = 0; // entries of removed streams still in the chains
  std::map<int64_t, Held> held_;  // ingest-log position -> held generation, oldest first
  int64_t held_tokens_ = 0;
  int64_t released_through_ = -1;  // the newest position release_through was given
};

}  // namespace drafter
