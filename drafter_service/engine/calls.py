"""What the engine is asked and answers, once the edge has checked a call: plain values,
no protocol messages."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from drafter_service.drafting.drafter import DraftBatch
from drafter_service.engine.catalog import Catalog


@dataclass(frozen=True, slots=True)
class CallLimits:
    """What a call is checked against: the service's catalog (tokenizer, datastores), limits."""

    catalog: Catalog
    max_requests_per_call: int
    max_tokens_per_request: int
    max_budget: int
    default_datastore: str


@dataclass(frozen=True, slots=True)
class DraftCall:
    """A validated Draft call, one list entry per request (lists, not an object per
    request: this is the per-step hot path)."""

    request_ids: list[str]
    known_lengths: list[int]
    tokens: npt.NDArray[np.int32]  # every request's new tokens, concatenated
    offsets: list[int]  # request i's new tokens are tokens[offsets[i] : offsets[i + 1]]
    budgets: list[int]
    datastores: list[str]  # resolved (never empty); used only when a request starts
    prompt_lengths: list[int]  # resolved: the whole context when the call said 0
    private: list[bool] = field(default_factory=list)  # do_not_store per request; [] = none
    client: str = ""  # the authenticated client's name ("": none)

    def new_tokens(self, i: int) -> npt.NDArray[np.int32]:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


@dataclass(frozen=True, slots=True)
class Finished:
    """One request of a Finish call, validated."""

    request_id: str
    store: bool  # FINISHED and not do_not_store
    final_tokens: npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class DraftAnswer:
    """The answer to a DraftCall, in its request order: per request, the tokens now held
    and where its tree is (a datastore of ``batches`` and the row in its batch), or None
    and 0 tokens for RESYNC. The batches are the native calls' as they came."""

    lengths: list[int]
    places: list[tuple[str, int] | None]
    batches: dict[str, DraftBatch]  # by datastore: each one that drafted
