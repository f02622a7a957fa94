"""What the service remembers per request between calls, bounded by idle time, count and bytes.

The table is the service's view of each request: which datastore's drafter holds it
and how many tokens it holds. It is changed only on the event loop, when a call is
planned; the drafters catch up in call order (one worker thread per datastore), so
the table always describes the state after every queued call has run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drafter_service.service.prefetch import RequestTrees

STATE_BYTES_PER_TOKEN = 8
"""Memory a request state holds per context token: the drafter's copy of the context
(int32) and the service's history kept to store the generation (int32); measured,
an abandoned 1M-token request costs ~8 MB (issue 17). The byte budget counts this."""


@dataclass(slots=True)
class RequestState:
    """One request the service holds."""

    datastore: str  # fixed when the request starts
    length: int  # tokens the drafter holds (what the next known_length must be)
    prompt_length: int  # leading tokens that are the prompt (stored as such on finish)
    history: list[npt.NDArray[np.int32]] | None  # every token, in chunks; kept only for
    # a live datastore, which stores the generation when the request finishes
    last_used_s: float  # monotonic time of the last call that touched it
    trees: RequestTrees | None = None  # with pre-drafting: its tree and pre-drafts

    def append(self, tokens: npt.NDArray[np.int32]) -> None:
        self.length += len(tokens)
        if self.history is not None and len(tokens):
            self.history.append(tokens)


class RequestTable:
    """Request states in least-recently-used order, with a TTL, a count and a byte bound.

    Not thread-safe: used from the event loop only.
    """

    def __init__(self, ttl_s: float, max_states: int, max_bytes: int = 1 << 62) -> None:
        if ttl_s <= 0 or max_states < 1 or max_bytes < 1:
            raise ValueError(
                f"ttl_s {ttl_s}, max_states {max_states} and max_bytes {max_bytes} must be "
                "positive"
            )
        self.ttl_s = ttl_s
        self.max_states = max_states
        self.max_bytes = max_bytes
        self._states: OrderedDict[str, RequestState] = OrderedDict()  # oldest use first
        self._tokens = 0  # sum of the states' lengths
        self.evicted = {"ttl": 0, "count": 0, "bytes": 0}  # states dropped, by bound

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._states

    @property
    def bytes(self) -> int:
        """Memory the states hold (estimated: STATE_BYTES_PER_TOKEN per context token)."""
        return self._tokens * STATE_BYTES_PER_TOKEN

    def get(self, request_id: str) -> RequestState | None:
        return self._states.get(request_id)

    def put(self, request_id: str, state: RequestState) -> None:
        """Adds or replaces a state as the most recently used."""
        old = self._states.get(request_id)
        self._tokens += state.length - (old.length if old is not None else 0)
        self._states[request_id] = state
        self._states.move_to_end(request_id)

    def append(self, request_id: str, tokens: npt.NDArray[np.int32]) -> None:
        """Appends tokens to a held state (its bytes counted)."""
        self._states[request_id].append(tokens)
        self._tokens += len(tokens)

    def touch(self, request_id: str, now_s: float) -> None:
        self._states[request_id].last_used_s = now_s
        self._states.move_to_end(request_id)

    def pop(self, request_id: str) -> RequestState | None:
        state = self._states.pop(request_id, None)
        if state is not None:
            self._tokens -= state.length
        return state

    def expire(self, now_s: float) -> list[tuple[str, RequestState]]:
        """Removes and returns the states idle for longer than the TTL. States are in
        use order, so the idle ones are at the front: O(expired)."""
        expired = []
        while self._states:
            request_id, state = next(iter(self._states.items()))
            if now_s - state.last_used_s <= self.ttl_s:
                break
            expired.append((request_id, self._pop_oldest(request_id)))
        self.evicted["ttl"] += len(expired)
        return expired

    def trim(self, keep: Iterable[str] = ()) -> list[tuple[str, RequestState]]:
        """Removes and returns least recently used states beyond ``max_states`` or
        ``max_bytes``, never one in ``keep`` (the call in progress, which the caller
        checked fits the byte budget): the count may exceed its bound by the size of
        one call until the next one."""
        if len(self._states) <= self.max_states and self.bytes <= self.max_bytes:
            return []
        kept = set(keep)
        doomed: list[str] = []
        count, tokens = len(self._states), self._tokens
        max_tokens = self.max_bytes // STATE_BYTES_PER_TOKEN
        for request_id, state in self._states.items():  # oldest first
            if count <= self.max_states and tokens <= max_tokens:
                break
            if request_id in kept:
                continue
            self.evicted["count" if count > self.max_states else "bytes"] += 1
            doomed.append(request_id)
            count, tokens = count - 1, tokens - state.length
        return [(request_id, self._pop_oldest(request_id)) for request_id in doomed]

    def items(self) -> list[tuple[str, RequestState]]:
        return list(self._states.items())

    def _pop_oldest(self, request_id: str) -> RequestState:
        state = self._states.pop(request_id)
        self._tokens -= state.length
        return state
