#include "recent_tier.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace drafter {

namespace {

constexpr int64_t kMaxPosition = std::numeric_limits<uint32_t>::max() - 1;

uint64_t mix(uint64_t h, int32_t token) {
  h = (h ^ static_cast<uint32_t>(token)) * 0xFF51AFD7ED558CCDULL;
  return h ^ (h >> 33);
}

constexpr uint64_t kSeed = 0x9E3779B97F4A7C15ULL;

}  // namespace

uint32_t RecentTier::key_of(const int32_t* last) const {
  uint64_t h = kSeed;
  for (const int32_t* t = last - k_; t != last; ++t) h = mix(h, *t);
  return static_cast<uint32_t>(h >> 32);
}

void RecentTier::Chain::insert(uint32_t stream, uint32_t pos, uint32_t key) {
  if (entries.size() >= kMaxPosition) {
    throw std::length_error("recent tier: more than 2^32 - 2 entries");
  }
  if (2 * (entries.size() + 1) > heads.size()) rechain(heads.size() * 2);
  const size_t bucket = key & (heads.size() - 1);
  entries.push_back({stream, pos, key, heads[bucket]});
  heads[bucket] = static_cast<uint32_t>(entries.size());
}

void RecentTier::Chain::rechain(size_t buckets) {
  heads.assign(buckets, 0);
  const size_t mask = heads.size() - 1;
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = entries[i];
    e.next = heads[e.key & mask];
    heads[e.key & mask] = static_cast<uint32_t>(i + 1);
  }
}

void RecentTier::Chain::compact(const std::vector<Stream>& streams,
                                const std::vector<uint32_t>& renumbered) {
  size_t out = 0;
  for (const Entry& e : entries) {
    if (streams[e.stream].tokens == nullptr) continue;
    entries[out++] = {renumbered[e.stream], e.pos, e.key, 0};
  }
  entries.resize(out);
  entries.shrink_to_fit();
  size_t buckets = kMinBuckets;
  while (buckets < 2 * entries.size()) buckets *= 2;
  rechain(buckets);
}

void RecentTier::compact() {
  std::vector<uint32_t> renumbered(streams_.size(), 0);
  std::vector<Stream> kept;
  for (size_t s = 0; s < streams_.size(); ++s) {
    if (streams_[s].tokens == nullptr) continue;
    renumbered[s] = static_cast<uint32_t>(kept.size());
    kept.push_back(streams_[s]);
  }
  for (auto& [handle, s] : stream_of_) s = renumbered[s];
  for (auto& [position, held] : held_) held.stream = renumbered[held.stream];
  main_.compact(streams_, renumbered);
  siblings_.compact(streams_, renumbered);
  streams_ = std::move(kept);
  removed_entries_ = 0;
}

void RecentTier::add(int64_t handle, const std::vector<int32_t>* tokens, int32_t group) {
  uint64_t prompt = kSeed;
  for (const int32_t t : *tokens) prompt = mix(prompt, t);
  prompt |= 1;  // never 0 (none)
  const uint32_t s = add_stream(tokens, group, prompt);
  stream_of_.emplace(handle, s);
  ++prompts_[prompt];
  index_stream(s);
}

uint32_t RecentTier::add_stream(const std::vector<int32_t>* tokens, int32_t group,
                                uint64_t prompt) {
  if (streams_.size() >= kMaxPosition) compact();
  const auto prompt_len = static_cast<int64_t>(tokens->size());
  streams_.push_back({tokens, k_, group, prompt, std::max<int64_t>(prompt_len, 1), 0});
  return static_cast<uint32_t>(streams_.size() - 1);
}

void RecentTier::index(int64_t handle) {
  const auto found = stream_of_.find(handle);
  if (found != stream_of_.end()) index_stream(found->second);  // else: not shared
}

void RecentTier::index_stream(uint32_t s) {
  Stream& stream = streams_[s];
  const std::vector<int32_t>& tokens = *stream.tokens;
  const int64_t last = std::min<int64_t>(static_cast<int64_t>(tokens.size()), kMaxPosition);
  // Each chain gets the positions from its counter through `last`, the counter past them.
  for (int64_t& p = stream.indexed; p <= last; ++p, ++stream.entries) {
    main_.insert(s, static_cast<uint32_t>(p), key_of(tokens.data() + p));
  }
  if (stream.prompt == 0 || k_ == 1) return;  // K = 1: the main chain holds every match
  for (int64_t& p = stream.sibling_indexed; p <= last; ++p, ++stream.entries) {
    siblings_.insert(s, static_cast<uint32_t>(p),
                     static_cast<uint32_t>(mix(stream.prompt, tokens[p - 1]) >> 32));
  }
}

void RecentTier::remove(int64_t handle) {
  auto it = stream_of_.find(handle);
  if (it == stream_of_.end()) return;
  const uint32_t s = it->second;
  stream_of_.erase(it);
  const auto prompt = prompts_.find(streams_[s].prompt);
  if (--prompt->second == 0) prompts_.erase(prompt);
  remove_stream(s);
}

void RecentTier::remove_stream(uint32_t s) {
  Stream& stream = streams_[s];
  removed_entries_ += stream.entries;
  stream.tokens = nullptr;
  const int64_t live_streams = static_cast<int64_t>(stream_of_.size() + held_.size());
  const bool many_streams = static_cast<int64_t>(streams_.size()) > 2 * live_streams + kMinBuckets;
  if (2 * removed_entries_ > num_entries() || many_streams) compact();
}

bool RecentTier::hold(int64_t position, const int32_t* tokens, int64_t n) {
  if (position <= released_through_ || held_.count(position) != 0 ||
      n > config_.recent_held_tokens) {
    return false;
  }
  while (held_tokens_ + n > config_.recent_held_tokens) release_oldest();  // folded soonest
  auto copy = std::make_unique<std::vector<int32_t>>(tokens, tokens + n);
  const uint32_t s = add_stream(copy.get(), 0, 0);
  held_.emplace(position, Held{std::move(copy), s});
  held_tokens_ += n;
  index_stream(s);
  return true;
}

void RecentTier::release_through(int64_t position) {
  released_through_ = std::max(released_through_, position);
  while (!held_.empty() && held_.begin()->first <= position) release_oldest();
}

void RecentTier::release_oldest() {
  auto oldest = held_.begin();
  held_tokens_ -= static_cast<int64_t>(oldest->second.tokens->size());
  const uint32_t s = oldest->second.stream;
  held_.erase(oldest);  // before remove_stream, which counts the streams left
  remove_stream(s);
}

void RecentTier::collect(const Chain& chain, uint32_t key, uint64_t prompt, int32_t min_match,
                         int32_t below, uint32_t own_stream, int32_t group,
                         const int32_t* context, int64_t context_len, int32_t cap,
                         std::vector<RecentScratch::Found>& found) const {
  const int32_t candidates = config_.recent_candidates;
  int32_t walked = 0, taken = 0;  // walked: live entries of this key seen, own included
  for (uint32_t e = chain.head(key); e != 0 && walked < 4 * candidates && taken < candidates;
       e = chain.entries[e - 1].next) {
    const Entry& entry = chain.entries[e - 1];
    if (entry.key != key) continue;
    const Stream& stream = streams_[entry.stream];
    const std::vector<int32_t>* tokens = stream.tokens;
    if (tokens == nullptr) continue;  // a stopped request's, not compacted yet
    const int32_t* text = tokens->data();
    if (prompt != 0 &&
        (stream.prompt != prompt || text[entry.pos - 1] != context[context_len - 1])) {
      continue;  // another prompt's, or another token's
    }
    if (stream.group != 0 && stream.group != group) {  // another client's: walked, unseen
      ++walked;
      continue;
    }
    const auto limit = static_cast<int32_t>(std::min<int64_t>(
        {config_.recent_max_match, static_cast<int64_t>(entry.pos), context_len}));
    int32_t match = 0;
    while (match < limit && text[entry.pos - 1 - match] == context[context_len - 1 - match]) {
      ++match;
    }
    if (match < min_match) continue;  // another key in the same bucket
    ++walked;
    const int64_t available = static_cast<int64_t>(tokens->size()) - entry.pos;
    if (entry.stream == own_stream || available <= 0 || match >= below) continue;
    found.push_back({match, e - 1, text + entry.pos,
                     static_cast<int32_t>(std::min<int64_t>(available, cap))});
    ++taken;
  }
}

void RecentTier::retrieve(int64_t own, int32_t group, const int32_t* context,
                          int64_t context_len, int32_t max_len, RecentScratch& scratch,
                          CandidateTree& tree) const {
  tree.clear();
  if (context_len < k_ || max_len <= 0 || num_entries() == 0) return;
  const auto own_it = stream_of_.find(own);
  const uint32_t own_stream =
      own_it == stream_of_.end() ? std::numeric_limits<uint32_t>::max() : own_it->second;
  const int32_t cap = std::min(config_.datastore_max_continuation, max_len);
  std::vector<RecentScratch::Found>& found = scratch.found;
  found.clear();
  collect(main_, key_of(context + context_len), 0, k_, std::numeric_limits<int32_t>::max(),
          own_stream, group, context, context_len, cap, found);
  if (own_it != stream_of_.end() && k_ > 1) {
    const uint64_t prompt = streams_[own_stream].prompt;
    const auto siblings = prompts_.find(prompt);
    if (siblings != prompts_.end() && siblings->second > 1) {  // else none to find
      const auto key = static_cast<uint32_t>(mix(prompt, context[context_len - 1]) >> 32);
      collect(siblings_, key, prompt, 1, k_, own_stream, group, context, context_len, cap,
              found);
    }
  }
  if (found.empty()) return;
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.match > b.match || (a.match == b.match && a.entry > b.entry);
  });
  if (static_cast<int32_t>(found.size()) > config_.recent_samples) {
    found.resize(config_.recent_samples);
  }
  scratch.samples.clear();
  for (const auto& f : found) scratch.samples.push_back({f.continuation, f.len});
  tree.add(scratch.samples.data(), scratch.samples.size());
  tree.set_matched_prefix(found.front().match);
}

}  // namespace drafter
