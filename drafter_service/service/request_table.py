"""What the service remembers per request between calls, bounded by idle time and count.

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


@dataclass(slots=True)
class RequestState:
    """One request the service holds."""

    datastore: str  # fixed when the request starts
    length: int  # tokens the drafter holds (what the next known_length must be)
    prompt_length: int  # leading tokens that are the prompt (stored as such on finish)
    history: list[npt.NDArray[np.int32]] | None  # every token, in chunks; kept only for
    # a live datastore, which stores the generation when the request finishes
    last_used_s: float  # monotonic time of the last call that touched it

    def append(self, tokens: npt.NDArray[np.int32]) -> None:
        self.length += len(tokens)
        if self.history is not None and len(tokens):
            self.history.append(tokens)


class RequestTable:
    """Request states in least-recently-used order, with a TTL and a count bound.

    Not thread-safe: used from the event loop only.
    """

    def __init__(self, ttl_s: float, max_states: int) -> None:
        if ttl_s <= 0 or max_states < 1:
            raise ValueError(f"ttl_s {ttl_s} and max_states {max_states} must be positive")
        self.ttl_s = ttl_s
        self.max_states = max_states
        self._states: OrderedDict[str, RequestState] = OrderedDict()  # oldest use first

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._states

    def get(self, request_id: str) -> RequestState | None:
        return self._states.get(request_id)

    def put(self, request_id: str, state: RequestState) -> None:
        """Adds or replaces a state as the most recently used."""
        self._states[request_id] = state
        self._states.move_to_end(request_id)

    def touch(self, request_id: str, now_s: float) -> None:
        self._states[request_id].last_used_s = now_s
        self._states.move_to_end(request_id)

    def pop(self, request_id: str) -> RequestState | None:
        return self._states.pop(request_id, None)

    def expire(self, now_s: float) -> list[tuple[str, RequestState]]:
        """Removes and returns the states idle for longer than the TTL. States are in
        use order, so the idle ones are at the front: O(expired)."""
        expired = []
        while self._states:
            request_id, state = next(iter(self._states.items()))
            if now_s - state.last_used_s <= self.ttl_s:
                break
            expired.append((request_id, self._states.popitem(last=False)[1]))
        return expired

    def trim(self, keep: Iterable[str] = ()) -> list[tuple[str, RequestState]]:
        """Removes and returns least recently used states beyond ``max_states``, never
        one in ``keep`` (the call in progress): the table may exceed the bound by
        the size of one call until the next one."""
        excess = len(self._states) - self.max_states
        if excess <= 0:
            return []
        kept = set(keep)
        doomed: list[str] = []
        for request_id in self._states:  # oldest first; stops after `excess` (+ kept) keys
            if len(doomed) == excess:
                break
            if request_id not in kept:
                doomed.append(request_id)
        return [(request_id, self._states.pop(request_id)) for request_id in doomed]

    def items(self) -> list[tuple[str, RequestState]]:
        return list(self._states.items())
