#include "draft.h"

namespace drafter {

void retrieve_datastore(const Datastore& datastore, const int32_t* context, int64_t context_len,
                        const DraftConfig& config, int32_t max_len, DraftScratch& scratch) {
  retrieve_sub_indices(datastore, 0, datastore.sub_indices.size(), context, context_len, config,
                       max_len, scratch.retrieval, scratch.datastore_tree);
}

}  // namespace drafter
