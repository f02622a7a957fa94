// Drafting: one request's draft (draft_one: retrieval of every source's candidates,
// retrieval.h, SSSD Algorithm 2, and their fusion into one draft tree, fusion.h, SSSD
// Algorithm 3), and batched drafting over many requests (Drafter: request states, the
// datastore in use, and a worker pool; every public method is safe to call from several
// threads).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "draft_config.h"
#include "fusion.h"
#include "input_trie.h"
#include "recent_tier.h"
#include "retrieval.h"
#include "thread_pool.h"

namespace drafter {

// Reusable per-thread buffers so that drafting allocates nothing in steady
// state. Contents are meaningless between calls.
struct DraftScratch {
  CandidateTree datastore_tree;     // the whole datastore, or a split datastore's base
  CandidateTree live_tree;          // a split datastore's live sub-indices
  CandidateTree recent_tree;        // the recent tier's continuations
  RecentScratch recent;
  RetrievalScratch retrieval;
  FusionScratch fusion;
};

// Drafts for one request (without a Drafter: tests and tools; a Drafter drafts its
// requests with it): the input trie's suffix nodes (trie, over the context, may be
// null), the datastore's trees (may be null), `recent` (the recent tier's, may be null),
// fused. `explain`: with out.features.
void draft_one(const InputTrie* trie, const int32_t* context, int64_t context_len,
               const Datastore* datastore, const DraftConfig& config, int32_t budget,
               DraftScratch& scratch, Draft& out, bool explain = false,
               const CandidateTree* recent = nullptr);

// Everything the drafter holds for one request.
struct RequestState {
  explicit RequestState(int32_t max_depth) : trie(max_depth) {}
  std::mutex mu;                // serialises appends and drafts of this request
  InputTrie trie;               // prompt + committed tokens
  std::vector<int32_t> tokens;  // the same tokens in order (datastore lookups need the tail)
  int32_t group = 0;            // its recent-tier group (recent_tier.h)

  // Bytes held: the trie's buffers, the tokens' capacity, this object. Caller holds mu.
  int64_t bytes() const {
    return trie.resident_bytes() + tokens.capacity() * sizeof(int32_t) + sizeof(*this);
  }
  // Tokens that can still be appended without any allocation. Caller holds mu.
  int64_t headroom() const {
    return std::min(trie.append_headroom(),
                    static_cast<int64_t>(tokens.capacity() - tokens.size()));
  }
};

// Output of one batch call: every request's draft as the rows of one Draft (without
// features), request i's rows offsets[i]..offsets[i+1].
struct BatchDrafts : Draft {
  std::vector<int64_t> offsets;
  // Each request's state after its appends, for the service's memory accounting: the
  // bytes it holds (RequestState::bytes) and how many more tokens it can take without
  // allocating (RequestState::headroom).
  std::vector<int64_t> state_bytes;
  std::vector<int64_t> state_headroom;
};

class Drafter {
 public:
  Drafter(const DraftConfig& config, int32_t vocab_size, int32_t num_threads);

  int32_t num_threads() const { return pool_.num_threads(); }

  // Atomically replaces the datastore; calls in flight keep the old one.
  void set_datastore(std::shared_ptr<const Datastore> datastore);
  std::shared_ptr<const Datastore> datastore() const;

  // Creates a request's state from its prompt. Throws if the handle exists. `shared`:
  // whether its tokens join the recent tier (a request that opted out of storage does
  // not share them; it still drafts from the others'). `group`: its recent-tier group
  // (recent_tier.h; 0: its tokens are seen by every request, and it sees those of
  // group 0 only).
  void start(int64_t handle, const int32_t* tokens, int64_t n, bool shared = true,
             int32_t group = 0);
  // Appends committed tokens. Throws std::out_of_range for an unknown handle.
  void add(int64_t handle, const int32_t* tokens, int64_t n);
  // Frees a request's state; returns false if the handle was unknown.
  bool stop(int64_t handle);
  // With the recent tier: holds a copy of a stored generation the datastore in use does
  // not hold yet, `position` its ingest-log sequence number (RecentTier::hold); false
  // if not held (no tier among them). Checks the tokens like start.
  bool hold(int64_t position, const int32_t* tokens, int64_t n);
  // Releases the held generations at or below `position`: the datastore in use holds
  // them now (call it after set_datastore). Nothing without the tier.
  void release_through(int64_t position);
  // Generations held and their tokens (0, 0 without the tier).
  std::pair<int64_t, int64_t> held() const;
  int64_t num_tokens(int64_t handle) const;
  int64_t num_requests() const;
  int64_t request_bytes(int64_t handle) const;
  // A copy of the request's tokens (prompt and committed), in order.
  std::vector<int32_t> tokens(int64_t handle) const;

  // One decode step for a batch: appends new_tokens[offsets[i], offsets[i+1])
  // to request handles[i], then drafts up to budgets[i] nodes for it.
  // Validates everything before touching any state.
  BatchDrafts draft_batch(const int64_t* handles, int64_t batch, const int32_t* new_tokens,
                          int64_t num_new_tokens, const int64_t* offsets, const int32_t* budgets);

  // The draft request `handle` would get now at `budget`, with the ScoreFeature values
  // of every node (Draft::features): for tools and offline training. Changes no state.
  Draft explain(int64_t handle, int32_t budget);

 private:
  std::shared_ptr<RequestState> find(int64_t handle) const;
  // What a batch call works on: the states of handles[0, batch), taken after the batch's
  // offsets, budgets and tokens are checked. A handle appearing twice is
  // std::invalid_argument. Throws std::out_of_range for an unknown handle. Changes nothing.
  std::vector<std::shared_ptr<RequestState>> prepare(
      const int64_t* handles, int64_t batch, const int32_t* tokens, int64_t num_tokens,
      const int64_t* offsets, const int32_t* budgets) const;
  // What the service counts for a request: its state's bytes and, with the recent tier,
  // the tier's bound for its tokens (RecentTier::kBytesPerToken). Caller holds state.mu.
  int64_t held_bytes(const RequestState& state) const;
  // Drafts for one request from its state (caller holds state.mu, and the tier shared).
  void draft_state(int64_t handle, RequestState& state, const Datastore* datastore,
                   int32_t budget, DraftScratch& scratch, Draft& out, bool explain) const;

  const DraftConfig config_;
  const int32_t vocab_size_;
  // With config.recent_samples > 0: the recent tier over every request's tokens. Every
  // change to any request's tokens holds tier_mu_ exclusively (and indexes them), every
  // draft holds it shared, so a draft reads the other requests' tokens unchanging.
  // Lock order: tier_mu_, then mu_, then a RequestState's mu.
  std::unique_ptr<RecentTier> tier_;
  mutable std::shared_mutex tier_mu_;
  mutable std::mutex mu_;  // guards requests_ and datastore_
  std::unordered_map<int64_t, std::shared_ptr<RequestState>> requests_;
  std::shared_ptr<const Datastore> datastore_;  // never null
  ThreadPool pool_;
};

}  // namespace drafter
