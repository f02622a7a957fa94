"""SSSD drafting: candidate trees from each request's own tokens and a suffix-array datastore.

Public API::

    from drafter_service import DraftConfig, Datastore, Drafter

    store = Datastore.from_documents(documents, vocab_size=128256)
    drafter = Drafter(vocab_size=128256, datastore=store)
    drafter.start("req-1", prompt_ids)
    batch = drafter.speculate(["req-1"], [[]], budgets=16)
    tree = batch.tree(0)        # tokens, parents (-1 = root), scores; breadth-first
    drafter.stop("req-1")
"""

from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.drafting.draft_config import DraftConfig
from drafter_service.drafting.drafter import DraftBatch, Drafter, DraftTree

__all__ = ["Datastore", "DraftBatch", "DraftConfig", "DraftTree", "Drafter", "SubIndex"]
