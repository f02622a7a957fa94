#include "recent_tier.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace drafter {

namespace {

constexpr size_t kMinBuckets = 1024;
constexpr int64_t kMaxPosition = std::numeric_limits<uint32_t>::max() - 1;

size_t buckets_for(size_t entries) {
  size_t n = kMinBuckets;
  while (n < 2 * entries) n *= 2;
  return n;
}

}  // namespace

RecentTier::RecentTier(const DraftConfig& config)
    : k_(config.recent_min_match),
      max_match_(config.recent_max_match),
      candidates_(config.recent_candidates),
      samples_(config.recent_samples),
      max_continuation_(config.datastore_max_continuation),
      max_held_tokens_(config.recent_held_tokens),
      heads_(kMinBuckets, 0) {}

uint32_t RecentTier::key_of(const int32_t* last) const {
  uint64_t h = 0x9E3779B97F4A7C15ULL;
  for (const int32_t* t = last - k_; t != last; ++t) {
    h = (h ^ static_cast<uint32_t>(*t)) * 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
  }
  return static_cast<uint32_t>(h >> 32);
}

void RecentTier::insert(uint32_t stream, uint32_t pos, uint32_t key) {
  if (entries_.size() >= kMaxPosition) {
    throw std::length_error("recent tier: more than 2^32 - 2 entries");
  }
  if (2 * (entries_.size() + 1) > heads_.size()) {
    heads_.assign(heads_.size() * 2, 0);
    rebuild(false);
  }
  const size_t bucket = key & (heads_.size() - 1);
  entries_.push_back({stream, pos, key, heads_[bucket]});
  heads_[bucket] = static_cast<uint32_t>(entries_.size());
}

void RecentTier::rebuild(bool drop_removed) {
  if (drop_removed) {
    std::vector<uint32_t> renumbered(streams_.size(), 0);
    std::vector<Stream> kept;
    for (size_t s = 0; s < streams_.size(); ++s) {
      if (streams_[s].tokens == nullptr) continue;
      renumbered[s] = static_cast<uint32_t>(kept.size());
      kept.push_back(streams_[s]);
    }
    for (auto& [handle, s] : stream_of_) s = renumbered[s];
    for (auto& [position, held] : held_) held.stream = renumbered[held.stream];
    size_t out = 0;
    for (const Entry& e : entries_) {
      if (streams_[e.stream].tokens == nullptr) continue;
      entries_[out++] = {renumbered[e.stream], e.pos, e.key, 0};
    }
    entries_.resize(out);
    entries_.shrink_to_fit();
    streams_ = std::move(kept);
    removed_entries_ = 0;
    heads_.assign(buckets_for(entries_.size()), 0);
  } else {
    std::fill(heads_.begin(), heads_.end(), 0);
  }
  const size_t mask = heads_.size() - 1;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    e.next = heads_[e.key & mask];
    heads_[e.key & mask] = static_cast<uint32_t>(i + 1);
  }
}

void RecentTier::add(int64_t handle, const std::vector<int32_t>* tokens, int32_t group) {
  if (stream_of_.count(handle) != 0) {
    throw std::invalid_argument("recent tier: request handle " + std::to_string(handle) +
                                " is already indexed");
  }
  const uint32_t s = add_stream(tokens, group);
  stream_of_.emplace(handle, s);
  index_stream(s);
}

uint32_t RecentTier::add_stream(const std::vector<int32_t>* tokens, int32_t group) {
  if (streams_.size() >= kMaxPosition) rebuild(true);
  streams_.push_back({tokens, k_, group});
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
  for (int64_t p = stream.indexed; p <= last; ++p) {
    insert(s, static_cast<uint32_t>(p), key_of(tokens.data() + p));
  }
  stream.indexed = std::max(stream.indexed, last + 1);
}

void RecentTier::remove(int64_t handle) {
  auto it = stream_of_.find(handle);
  if (it == stream_of_.end()) return;
  const uint32_t s = it->second;
  stream_of_.erase(it);
  remove_stream(s);
}

void RecentTier::remove_stream(uint32_t s) {
  Stream& stream = streams_[s];
  removed_entries_ += std::max<int64_t>(0, stream.indexed - k_);
  stream.tokens = nullptr;
  const int64_t live_streams = static_cast<int64_t>(stream_of_.size() + held_.size());
  const bool many_streams = static_cast<int64_t>(streams_.size()) > 2 * live_streams + kMinBuckets;
  if (2 * removed_entries_ > static_cast<int64_t>(entries_.size()) || many_streams) {
    rebuild(true);
  }
}

bool RecentTier::hold(int64_t position, const int32_t* tokens, int64_t n) {
  if (position <= released_through_ || held_.count(position) != 0 || n > max_held_tokens_) {
    return false;
  }
  while (held_tokens_ + n > max_held_tokens_) release_oldest();  // folded soonest
  auto copy = std::make_unique<std::vector<int32_t>>(tokens, tokens + n);
  const uint32_t s = add_stream(copy.get(), 0);
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

void RecentTier::retrieve(int64_t own, int32_t group, const int32_t* context,
                          int64_t context_len, int32_t max_len, RecentScratch& scratch,
                          CandidateTree& tree) const {
  tree.clear();
  if (context_len < k_ || max_len <= 0 || samples_ <= 0 || entries_.empty()) return;
  const auto own_it = stream_of_.find(own);
  const uint32_t own_stream =
      own_it == stream_of_.end() ? std::numeric_limits<uint32_t>::max() : own_it->second;
  const uint32_t key = key_of(context + context_len);
  const int32_t cap = std::min(max_continuation_, max_len);
  std::vector<RecentScratch::Found>& found = scratch.found;
  found.clear();
  int32_t walked = 0;  // live entries of this key seen, the request's own included
  for (uint32_t e = heads_[key & (heads_.size() - 1)];
       e != 0 && walked < 4 * candidates_ && static_cast<int32_t>(found.size()) < candidates_;
       e = entries_[e - 1].next) {
    const Entry& entry = entries_[e - 1];
    if (entry.key != key) continue;
    const Stream& stream = streams_[entry.stream];
    const std::vector<int32_t>* tokens = stream.tokens;
    if (tokens == nullptr) continue;  // a stopped request's, not compacted yet
    if (stream.group != 0 && stream.group != group) {  // another client's: walked, unseen
      ++walked;
      continue;
    }
    const int32_t* text = tokens->data();
    const auto limit = static_cast<int32_t>(
        std::min<int64_t>({max_match_, static_cast<int64_t>(entry.pos), context_len}));
    int32_t match = 0;
    while (match < limit && text[entry.pos - 1 - match] == context[context_len - 1 - match]) {
      ++match;
    }
    if (match < k_) continue;  // another key in the same bucket
    ++walked;
    const int64_t available = static_cast<int64_t>(tokens->size()) - entry.pos;
    if (entry.stream == own_stream || available <= 0) continue;
    found.push_back({match, e - 1, text + entry.pos,
                     static_cast<int32_t>(std::min<int64_t>(available, cap))});
  }
  if (found.empty()) return;
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.match > b.match || (a.match == b.match && a.entry > b.entry);
  });
  if (static_cast<int32_t>(found.size()) > samples_) found.resize(samples_);
  scratch.samples.clear();
  for (const auto& f : found) scratch.samples.push_back({f.continuation, f.len});
  tree.add(scratch.samples.data(), scratch.samples.size());
  tree.set_matched_prefix(found.front().match);
}

int64_t RecentTier::resident_bytes() const {
  return static_cast<int64_t>(entries_.capacity() * sizeof(Entry) +
                              heads_.capacity() * sizeof(uint32_t) +
                              streams_.capacity() * sizeof(Stream)) +
         static_cast<int64_t>(stream_of_.size() + held_.size()) * 48 + held_tokens_ * 4;
}

}  // namespace drafter
