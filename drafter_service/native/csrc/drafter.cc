#include "drafter.h"

#include <stdexcept>
#include <string>
#include <unordered_set>

namespace drafter {

namespace {

// Throws std::invalid_argument unless offsets[0, batch] split num_tokens tokens into
// batch non-decreasing runs and every budget is in range. Touches no state.
void check_batch(int64_t batch, int64_t num_tokens, const int64_t* offsets,
                 const int32_t* budgets, const DraftConfig& config) {
  if (batch < 0) throw std::invalid_argument("batch size " + std::to_string(batch) + " < 0");
  if (offsets[0] != 0 || offsets[batch] != num_tokens) {
    throw std::invalid_argument("offsets must start at 0 and end at the number of tokens (" +
                                std::to_string(num_tokens) + "), got " +
                                std::to_string(offsets[0]) + " and " +
                                std::to_string(offsets[batch]));
  }
  for (int64_t i = 0; i < batch; ++i) {
    if (offsets[i + 1] < offsets[i]) {
      throw std::invalid_argument("offsets must be non-decreasing: offsets[" +
                                  std::to_string(i + 1) + "] = " + std::to_string(offsets[i + 1]) +
                                  " < " + std::to_string(offsets[i]));
    }
  }
  check_budgets(budgets, batch, config);
}

// Concatenates per-request drafts into one batch answer (rows offsets[i]..offsets[i+1]).
BatchDrafts gather(const std::vector<Draft>& drafts) {
  BatchDrafts out;
  size_t total = 0;  // sized once: this runs at every batch step
  for (const Draft& d : drafts) total += d.tokens.size();
  out.tokens.reserve(total);
  out.parents.reserve(total);
  out.scores.reserve(total);
  out.offsets.reserve(drafts.size() + 1);
  out.offsets.push_back(0);
  for (const Draft& d : drafts) {
    out.tokens.insert(out.tokens.end(), d.tokens.begin(), d.tokens.end());
    out.parents.insert(out.parents.end(), d.parents.begin(), d.parents.end());
    out.scores.insert(out.scores.end(), d.scores.begin(), d.scores.end());
    out.offsets.push_back(out.tokens.size());
  }
  return out;
}

}  // namespace

Drafter::Drafter(const DraftConfig& config, int32_t vocab_size, int32_t num_threads)
    : config_(config),
      vocab_size_(vocab_size),
      datastore_(std::make_shared<const Datastore>()),
      pool_(num_threads) {
  validate(config_);
  if (config_.recent_samples > 0) tier_ = std::make_unique<RecentTier>(config_);
  if (vocab_size <= 0 || vocab_size > (1 << 30)) {
    throw std::invalid_argument("vocab_size " + std::to_string(vocab_size) +
                                " must be in [1, 2^30]");
  }
}

void Drafter::set_datastore(std::shared_ptr<const Datastore> datastore) {
  if (!datastore) throw std::invalid_argument("datastore must not be null");
  for (const auto& s : datastore->sub_indices) {
    if (s->vocab_size() != vocab_size_) {
      throw std::invalid_argument("datastore vocab_size " + std::to_string(s->vocab_size()) +
                                  " does not match the drafter's " +
                                  std::to_string(vocab_size_));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  datastore_ = std::move(datastore);
}

std::shared_ptr<const Datastore> Drafter::datastore() const {
  std::lock_guard<std::mutex> lock(mu_);
  return datastore_;
}

std::shared_ptr<RequestState> Drafter::find(int64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(handle);
  if (it == requests_.end()) {
    throw std::out_of_range("unknown request handle " + std::to_string(handle));
  }
  return it->second;
}

void Drafter::start(int64_t handle, const int32_t* tokens, int64_t n, bool shared,
                    int32_t group) {
  check_tokens(tokens, n, vocab_size_);
  if (group < 0) throw std::invalid_argument("recent-tier group " + std::to_string(group) + " < 0");
  auto state = std::make_shared<RequestState>(config_.input_max_depth);
  state->group = group;
  state->tokens.assign(tokens, tokens + n);
  for (int64_t i = 0; i < n; ++i) state->trie.append(tokens[i]);
  std::unique_lock<std::shared_mutex> tier_lock(tier_mu_, std::defer_lock);
  if (tier_) tier_lock.lock();
  const std::vector<int32_t>* stream = &state->tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!requests_.emplace(handle, std::move(state)).second) {
      throw std::invalid_argument("request handle " + std::to_string(handle) +
                                  " is already started");
    }
  }
  if (tier_ && shared) tier_->add(handle, stream, group);
}

void Drafter::add(int64_t handle, const int32_t* tokens, int64_t n) {
  check_tokens(tokens, n, vocab_size_);
  std::unique_lock<std::shared_mutex> tier_lock(tier_mu_, std::defer_lock);
  if (tier_) tier_lock.lock();
  auto state = find(handle);
  std::lock_guard<std::mutex> lock(state->mu);
  state->tokens.insert(state->tokens.end(), tokens, tokens + n);
  for (int64_t i = 0; i < n; ++i) state->trie.append(tokens[i]);
  if (tier_) tier_->index(handle);
}

bool Drafter::stop(int64_t handle) {
  std::unique_lock<std::shared_mutex> tier_lock(tier_mu_, std::defer_lock);
  if (tier_) tier_lock.lock();
  std::shared_ptr<RequestState> state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(handle);
    if (it == requests_.end()) return false;
    state = std::move(it->second);
    requests_.erase(it);
  }
  if (tier_) tier_->remove(handle);
  return true;  // freed here, or by the last call still drafting for it
}

bool Drafter::hold(int64_t position, const int32_t* tokens, int64_t n) {
  check_tokens(tokens, n, vocab_size_);
  if (!tier_) return false;
  std::unique_lock<std::shared_mutex> tier_lock(tier_mu_);
  return tier_->hold(position, tokens, n);
}

void Drafter::release_through(int64_t position) {
  if (!tier_) return;
  std::unique_lock<std::shared_mutex> tier_lock(tier_mu_);
  tier_->release_through(position);
}

std::pair<int64_t, int64_t> Drafter::held() const {
  if (!tier_) return {0, 0};
  std::shared_lock<std::shared_mutex> tier_lock(tier_mu_);
  return {tier_->held_generations(), tier_->held_tokens()};
}

int64_t Drafter::num_tokens(int64_t handle) const {
  auto state = find(handle);
  std::lock_guard<std::mutex> lock(state->mu);
  return state->tokens.size();
}

int64_t Drafter::request_bytes(int64_t handle) const {
  auto state = find(handle);
  std::lock_guard<std::mutex> lock(state->mu);
  return held_bytes(*state);
}

int64_t Drafter::held_bytes(const RequestState& state) const {
  if (!tier_) return state.bytes();
  return state.bytes() + static_cast<int64_t>(state.tokens.size()) * RecentTier::kBytesPerToken;
}

std::vector<int32_t> Drafter::tokens(int64_t handle) const {
  auto state = find(handle);
  std::lock_guard<std::mutex> lock(state->mu);
  return state->tokens;
}

int64_t Drafter::num_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_.size();
}

void draft_one(const InputTrie* trie, const int32_t* context, int64_t context_len,
               const Datastore* datastore, const DraftConfig& config, int32_t budget,
               DraftScratch& scratch, Draft& out, bool explain, const CandidateTree* recent) {
  FusionInputs in{config, budget, trie, nullptr, nullptr, recent, explain};
  if (datastore != nullptr && !datastore->sub_indices.empty()) {
    // A split datastore's base and live parts are two sources, each with its own tree.
    const size_t all = datastore->sub_indices.size();
    const size_t base = datastore->split() ? datastore->base_count : all;
    retrieve_sub_indices(*datastore, 0, base, context, context_len, config, budget,
                         scratch.retrieval, scratch.datastore_tree);
    in.datastore_tree = &scratch.datastore_tree;
    if (base < all) {
      retrieve_sub_indices(*datastore, base, all, context, context_len, config, budget,
                           scratch.retrieval, scratch.live_tree);
      in.live_tree = &scratch.live_tree;
    }
  }
  fuse(in, scratch.fusion, out);
}

std::vector<std::shared_ptr<RequestState>> Drafter::prepare(
    const int64_t* handles, int64_t batch, const int32_t* tokens, int64_t num_tokens,
    const int64_t* offsets, const int32_t* budgets) const {
  check_batch(batch, num_tokens, offsets, budgets, config_);
  check_tokens(tokens, num_tokens, vocab_size_);
  std::vector<std::shared_ptr<RequestState>> states(batch);
  std::unordered_set<int64_t> seen;
  for (int64_t i = 0; i < batch; ++i) {
    if (!seen.insert(handles[i]).second) {
      throw std::invalid_argument("request handle " + std::to_string(handles[i]) +
                                  " appears twice in one batch");
    }
    states[i] = find(handles[i]);
  }
  return states;
}

void Drafter::draft_state(int64_t handle, RequestState& state, const Datastore* datastore,
                          int32_t budget, DraftScratch& scratch, Draft& out,
                          bool explain) const {
  const CandidateTree* recent = nullptr;
  if (tier_) {
    tier_->retrieve(handle, state.group, state.tokens.data(), state.tokens.size(), budget,
                    scratch.recent, scratch.recent_tree);
    recent = &scratch.recent_tree;
  }
  draft_one(&state.trie, state.tokens.data(), state.tokens.size(), datastore, config_, budget,
            scratch, out, explain, recent);
}

BatchDrafts Drafter::draft_batch(const int64_t* handles, int64_t batch, const int32_t* new_tokens,
                                 int64_t num_new_tokens, const int64_t* offsets,
                                 const int32_t* budgets) {
  // With the tier, the appends change what other requests' drafts read: exclusively.
  std::unique_lock<std::shared_mutex> appending(tier_mu_, std::defer_lock);
  if (tier_) appending.lock();
  const auto states = prepare(handles, batch, new_tokens, num_new_tokens, offsets, budgets);
  const std::shared_ptr<const Datastore> datastore = this->datastore();
  std::vector<Draft> drafts(batch);
  std::vector<int64_t> bytes(batch), headroom(batch);
  // Appends row i's tokens to its request (caller holds its mu) and reports what it holds;
  // with the tier no headroom, since its tokens grow the shared tier.
  auto append_row = [&](int64_t i) {
    RequestState& state = *states[i];
    for (int64_t k = offsets[i]; k < offsets[i + 1]; ++k) {
      state.tokens.push_back(new_tokens[k]);
      state.trie.append(new_tokens[k]);
    }
    bytes[i] = held_bytes(state);
    headroom[i] = tier_ ? 0 : state.headroom();
  };
  if (tier_) {  // every request's appends, then their indexing, before any draft
    pool_.parallel_for(batch, [&](int64_t i) {
      std::lock_guard<std::mutex> lock(states[i]->mu);
      append_row(i);
    });
    for (int64_t i = 0; i < batch; ++i) {
      if (offsets[i + 1] > offsets[i]) tier_->index(handles[i]);
    }
    appending.unlock();
  }
  std::shared_lock<std::shared_mutex> drafting(tier_mu_, std::defer_lock);
  if (tier_) drafting.lock();
  pool_.parallel_for(batch, [&](int64_t i) {
    thread_local DraftScratch scratch;
    RequestState& state = *states[i];
    std::lock_guard<std::mutex> lock(state.mu);
    if (!tier_) append_row(i);  // without the tier a request's appends and draft are one step
    draft_state(handles[i], state, datastore.get(), budgets[i], scratch, drafts[i], false);
  });

  BatchDrafts out = gather(drafts);
  out.state_bytes = std::move(bytes);
  out.state_headroom = std::move(headroom);
  return out;
}

Draft Drafter::explain(int64_t handle, int32_t budget) {
  check_budgets(&budget, 1, config_);
  auto state = find(handle);
  const std::shared_ptr<const Datastore> datastore = this->datastore();
  DraftScratch scratch;
  Draft out;
  std::shared_lock<std::shared_mutex> tier_lock(tier_mu_, std::defer_lock);
  if (tier_) tier_lock.lock();
  std::lock_guard<std::mutex> lock(state->mu);
  draft_state(handle, *state, datastore.get(), budget, scratch, out, /*explain=*/true);
  return out;
}

}  // namespace drafter
