// The ScoreFeature columns: what fusion knows about each candidate, the learned node
// score's inputs and what explain reports.
#pragma once

#include <cstdint>

namespace drafter {

// What fusion knows about a candidate when it offers it: the evidence of every source
// behind its path, its siblings, and whether the request's own context holds it. These
// are the inputs of the learned node score (DraftConfig::node_score) and what explain
// reports. For each source, "count" is the candidate's own count there (samples or
// input occurrences through it) and "parent" the count its conditional probability is
// taken over (the input member with the longest match speaks for the input trie);
// present, log_cond = log(count) - log(parent), log(1 + count) and log(1 + parent) are
// all 0 where the source does not offer it. "Hand" is the hand-set SSSD score.
enum ScoreFeature : int32_t {
  kFeatDepth = 0,       // 1 = child of the root
  kFeatLogSiblings,     // log(candidates offered under the same draft parent, itself included)
  kFeatLogOverBest,     // log(hand score / the best sibling's hand score), <= 0
  kFeatLogHandCond,     // log(hand score / the draft parent's hand score)
  kFeatInputPresent,
  kFeatInputLogCond,
  kFeatInputLogCount,
  kFeatInputLogParent,
  kFeatBasePresent,     // the datastore (a split datastore's base)
  kFeatBaseLogCond,
  kFeatBaseLogCount,
  kFeatBaseLogParent,
  kFeatLivePresent,     // a split datastore's live part
  kFeatLiveLogCond,
  kFeatLiveLogCount,
  kFeatLiveLogParent,
  kFeatInputMatch,      // longest context suffix an input member continues (0: none)
  kFeatInputMembers,    // input matches (of different lengths) behind the candidate
  kFeatBasePrefix,      // longest context suffix the datastore tree was sampled for
  kFeatLivePrefix,      // the same for the live tree
  kFeatUnigramSeen,     // 1 if the request's input trie holds the token,
  kFeatBigramSeen,      // the token after the one before it (its parent, or the context's
  kFeatTrigramSeen,     // last token), the token after the two before it
  kFeatRecentPresent,   // the recent tier (the other requests in flight)
  kFeatRecentLogCond,
  kFeatRecentLogCount,
  kFeatRecentLogParent,
  kFeatRecentPrefix,    // longest context suffix the recent tier's matches share
  kScoreFeatures
};

}  // namespace drafter
