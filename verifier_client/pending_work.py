"""Finish, abort and ingest work: what to send (planned here, pure), batched into as few
calls as possible. Finishing a request depends on how sure the client is of its state:

* synced (its last answer was OK): ``Finish(FINISHED)`` with the tail committed since, so
  the drafter stores it by its own policy without the context crossing the wire again; if
  the drafter lost it meanwhile (lists it as unknown), the generation is ingested instead.
* unsure (never answered, RESYNC, last answer lost): the drafter may hold a stale context,
  so ``Finish(ABORTED)`` frees it and the client ingests the generation itself.
* never sent: the generation is ingested.

An ingested generation is its output plus the last PROMPT_CONTEXT_TOKENS prompt tokens,
what ``drafter serve`` stores by default (``--store output``): the service does not publish
its policy, and storing less is the safe side (prompts may be private). Nothing is stored
for a request that opted out (``store=False``) or generated nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.deltas import RequestState

__all__ = [
    "FinishWork",
    "IngestWork",
    "Work",
    "batch_messages",
    "plan_abort",
    "plan_finish",
    "reingest_unknown",
]

PROMPT_CONTEXT_TOKENS = 3  # prompt tokens kept before an ingested output

# Ingest calls carry at most this many tokens (4 bytes each on the wire, plus
# varint overhead), well under gRPC's default 4 MiB message limit.
MAX_INGEST_TOKENS_PER_CALL = 512 * 1024


@dataclass(frozen=True, slots=True)
class FinishWork:
    """One request to end on the drafter."""

    request_id: str
    aborted: bool  # ABORTED: free only; FINISHED: free and store
    do_not_store: bool
    final_tokens: Sequence[int]  # tail committed after the last answered step
    datastore: str = ""
    generation: Sequence[int] | None = None  # ingested instead if the drafter lost the request
    wait_durable: bool = False  # the Finish call answers once the generation is in the log


@dataclass(frozen=True, slots=True)
class IngestWork:
    """Token sequences to add to a datastore."""

    datastore: str
    sequences: Sequence[Sequence[int]]


Work = FinishWork | IngestWork


def plan_finish(
    state: RequestState, final_tokens: Sequence[int], store: bool, wait_durable: bool = False
) -> list[Work]:
    """The work that ends ``state``'s request (see the module docstring); ``wait_durable``:
    a Finish that stores it answers once it is in the ingest log (an Ingest always does)."""
    if state.refused:  # the drafter would reject its tokens (and the whole call with them)
        return plan_abort(state)
    generation = _generation(state, final_tokens) if store else None
    if state.known_length > 0:  # synced (0 while an answer is out too)
        tail = [*state.tokens[state.known_length :], *final_tokens]
        return [FinishWork(state.request_id, False, not store, tail, state.datastore, generation,
                           wait_durable)]  # fmt: skip
    work = plan_abort(state)  # frees what the drafter may hold of it
    if generation:
        work.append(IngestWork(state.datastore, [generation]))
    return work


def _generation(state: RequestState, final_tokens: Sequence[int]) -> list[int] | None:
    """Output plus the last PROMPT_CONTEXT_TOKENS prompt tokens; None without output."""
    if len(state.tokens) + len(final_tokens) <= state.prompt_length:
        return None
    start = max(0, state.prompt_length - PROMPT_CONTEXT_TOKENS)
    return [*state.tokens[start:], *final_tokens]


def plan_abort(state: RequestState) -> list[Work]:
    """The work that frees an aborted request (nothing if the drafter never saw it)."""
    return [FinishWork(state.request_id, True, True, ())] if state.sent else []


def batch_messages(
    work: Iterable[Work], max_per_call: int = 1024
) -> tuple[list[tuple[pb.FinishRequest, list[FinishWork]]], list[pb.IngestRequest]]:
    """Finish work in as few FinishRequests as the drafter's per-call limit allows
    (an id never twice in one call); Ingest work grouped by datastore, split at
    ``max_per_call`` sequences or MAX_INGEST_TOKENS_PER_CALL tokens."""
    finishes: list[tuple[pb.FinishRequest, list[FinishWork]]] = []
    by_datastore: dict[str, list[Sequence[int]]] = {}
    ids: set[str] = set()
    for item in work:
        if isinstance(item, IngestWork):
            by_datastore.setdefault(item.datastore, []).extend(item.sequences)
            continue
        if not finishes or len(ids) >= max_per_call or item.request_id in ids:
            finishes.append((pb.FinishRequest(), []))
            ids.clear()
        message, items = finishes[-1]
        done = message.requests.add()
        done.request_id = item.request_id
        done.reason = pb.FINISH_REASON_ABORTED if item.aborted else pb.FINISH_REASON_FINISHED
        done.do_not_store = item.do_not_store
        done.final_tokens.extend(item.final_tokens)
        message.wait_durable |= item.wait_durable
        items.append(item)
        ids.add(item.request_id)
    return finishes, _ingest_messages(by_datastore, max_per_call)


def _ingest_messages(
    by_datastore: dict[str, list[Sequence[int]]], max_per_call: int
) -> list[pb.IngestRequest]:
    messages: list[pb.IngestRequest] = []
    for datastore, sequences in by_datastore.items():
        message, size = pb.IngestRequest(datastore=datastore), 0
        for sequence in sequences:
            full = len(message.sequences) >= max_per_call
            if full or (size and size + len(sequence) > MAX_INGEST_TOKENS_PER_CALL):
                messages.append(message)
                message, size = pb.IngestRequest(datastore=datastore), 0
            message.sequences.add().tokens.extend(sequence)
            size += len(sequence)
        if len(message.sequences):
            messages.append(message)
    return messages


def reingest_unknown(response: pb.FinishResponse, sent: Sequence[FinishWork]) -> list[Work]:
    """Ingest work for finished generations the drafter did not hold (it lost them)."""
    unknown = set(response.unknown_request_ids)
    return [
        IngestWork(item.datastore, [item.generation])
        for item in sent
        if item.request_id in unknown and not item.aborted and item.generation
    ]
