"""What the service remembers per request between calls, bounded by idle time, count and bytes.

Per request: which datastore's drafter holds it, its length, and its bytes (measured after
each call's native work; until then, a bound on what the planned work can add). Changed on
the event loop when a call is planned: it describes the state after every queued call.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from drafter_service.native import _core

NODE_BYTES_MAX = 80
"""Most bytes of capacity one input-trie node costs: 16 in the node array, which at most
doubles past its size, and 12 in the hash table, kept between a quarter and a half full
(native ``InputTrie``)."""
RECENT_BYTES_PER_TOKEN: int = _core.RECENT_BYTES_PER_TOKEN
"""What the native core counts a request's token for the recent tier (its entry and table
slot with their slack: ``RecentTier::kBytesPerToken``), when the tier is on."""
PYTHON_STATE_BYTES = 640
"""What the service's own objects cost per request (this HeldRequest, its id string,
the table's and the drafter's dict entries), measured with tracemalloc."""


@dataclass(frozen=True, slots=True)
class StateCost:
    """What a request's state can cost: the bounds the service reserves before a call's
    native work runs (its real cost is known only after: repetitive text shares trie
    nodes, so a token costs 12-640 bytes)."""

    max_depth: int  # DraftConfig.input_max_depth: trie nodes a token adds, at most
    vocab_size: int
    recent_bytes: int = 0  # what the recent tier counts a token (RECENT_BYTES_PER_TOKEN), if on

    @property
    def fixed(self) -> int:
        """Per request, however short: the trie's first table and buffers, its bitmap of
        token ids seen (one bit per id, up to twice that in capacity), our objects."""
        bitmap = 2 * 8 * (self.vocab_size // 64 + 1)
        return 2048 + bitmap + PYTHON_STATE_BYTES

    def worst(self, tokens: int) -> int:
        """At most what a state of ``tokens`` tokens holds, whatever they are: every token
        a new trie node at each depth, every buffer at its most slack (tokens at 2 x 4
        bytes)."""
        return self.fixed + tokens * (self.max_depth * NODE_BYTES_MAX + 8 + self.recent_bytes)


@dataclass(slots=True)
class HeldRequest:
    """One request the service holds."""

    datastore: str  # fixed when the request starts
    length: int  # tokens the drafter holds (what the next known_length must be)
    prompt_length: int  # leading tokens that are the prompt (stored as such on finish)
    last_used_s: float  # monotonic time of the last call that touched it
    bytes: int = 0  # memory it is counted for: as measured after its last native work,
    # plus what is reserved for the work planned since
    reserved: int = 0  # the part of `bytes` reserved for work planned and not yet run
    headroom: int = 0  # tokens it takes without allocating (as of its last native work)
    pending: int = 0  # planned native work (calls) not yet run


class RequestTable:
    """Request states in least-recently-used order, with a TTL, a count and a byte bound
    (positive: the settings check them). Not thread-safe: used from the event loop only."""

    def __init__(
        self,
        ttl_s: float,
        max_states: int,
        max_bytes: int = 1 << 62,
        cost: StateCost = StateCost(max_depth=16, vocab_size=128256),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_states = max_states
        self.max_bytes = max_bytes
        self._states: OrderedDict[str, HeldRequest] = OrderedDict()  # oldest use first
        self.cost = cost
        # Memory the states hold (the sum of their bytes): measured after their last native
        # work, plus what is reserved for work planned since.
        self.bytes = 0
        self.evicted = {"ttl": 0, "count": 0, "bytes": 0}  # states dropped, by bound
        self.clock = clock  # what ``now_s`` arguments are read from (monotonic seconds)

    def __len__(self) -> int:
        return len(self._states)

    def get(self, request_id: str) -> HeldRequest | None:
        return self._states.get(request_id)

    def start(
        self, request_id: str, datastore: str, length: int, prompt_length: int, now_s: float
    ) -> tuple[HeldRequest, int]:
        """Holds a new state of ``length`` tokens (replacing any other under that id) as the
        most recently used; returns it and the bytes reserved for its native start."""
        self.pop(request_id)
        reserved = self.cost.worst(length)
        state = HeldRequest(datastore, length, prompt_length, now_s, reserved, reserved,
                             pending=1)  # fmt: skip
        self._states[request_id] = state
        self.bytes += reserved
        return state, reserved

    def growth(self, state: HeldRequest, tokens: int) -> int:
        """Bytes ``tokens`` more tokens may add to ``state`` before they are measured: 0
        while they fit its headroom, else up to the bound of its new length."""
        if tokens <= state.headroom:
            return 0
        return max(0, self.cost.worst(state.length + tokens) - state.bytes)

    def append(self, request_id: str, tokens: int, now_s: float) -> int:
        """Counts ``tokens`` more for a state used at ``now_s``; returns the bytes reserved."""
        state = self._states[request_id]
        state.last_used_s = now_s
        self._states.move_to_end(request_id)
        reserved = self.growth(state, tokens)
        state.headroom = state.headroom - tokens if not reserved else 0
        state.length += tokens
        state.bytes += reserved
        state.reserved += reserved
        state.pending += 1
        self.bytes += reserved
        return reserved

    def measured(
        self, request_id: str, state: HeldRequest, reserved: int, held: int, headroom: int
    ) -> None:
        """The native work planned with ``reserved`` bytes has run: the drafter now holds
        ``held`` bytes for the request and can take ``headroom`` more tokens without
        allocating. Ignored if the state was dropped or replaced since."""
        if self._states.get(request_id) is not state:
            return
        state.reserved -= reserved
        state.pending -= 1
        now = held + PYTHON_STATE_BYTES + state.reserved
        self.bytes += now - state.bytes
        state.bytes = now
        state.headroom = headroom if not state.pending else 0  # work planned since used some

    def pop(self, request_id: str) -> HeldRequest | None:
        return self._remove(request_id) if request_id in self._states else None

    def expire(self, now_s: float) -> list[tuple[str, HeldRequest]]:
        """Removes and returns the states idle for longer than the TTL. States are in
        use order, so the idle ones are at the front: O(expired)."""
        expired = []
        while self._states:
            request_id, state = next(iter(self._states.items()))
            if now_s - state.last_used_s <= self.ttl_s:
                break
            expired.append((request_id, self._remove(request_id)))
        self.evicted["ttl"] += len(expired)
        return expired

    def trim(self, keep: Iterable[str] = ()) -> list[tuple[str, HeldRequest]]:
        """Removes and returns least recently used states beyond ``max_states`` or
        ``max_bytes``, never one in ``keep`` (the call in progress, which the caller
        checked fits the byte budget): the count may exceed its bound by the size of
        one call until the next one."""
        if len(self._states) <= self.max_states and self.bytes <= self.max_bytes:
            return []
        kept = set(keep)
        doomed: list[str] = []
        count, held = len(self._states), self.bytes
        for request_id, state in self._states.items():  # oldest first
            if count <= self.max_states and held <= self.max_bytes:
                break
            if request_id in kept:
                continue
            self.evicted["count" if count > self.max_states else "bytes"] += 1
            doomed.append(request_id)
            count, held = count - 1, held - state.bytes
        return [(request_id, self._remove(request_id)) for request_id in doomed]

    def _remove(self, request_id: str) -> HeldRequest:
        state = self._states.pop(request_id)
        self.bytes -= state.bytes
        return state
