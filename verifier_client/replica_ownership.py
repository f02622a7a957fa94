"""The replicas of a :class:`~verifier_client.replica_set.ReplicaSetClient` and which one owns
each live request: :class:`ReplicaOwnership`, its base (issue 14, item 3).

Ownership is rendezvous hashing of the request's routing key (its id, or with
``route="prompt"`` a digest of its prompt, so siblings share a replica and its recent tier)
over the usable replicas (present, breaker closed): a replica leaving moves only its own
requests, and they move back when it returns. A request's context lives once, in its
owner's DrafterClient (kept for RESYNC anyway); a move hands it whole to the new owner
(sent with its next step, known length 0) and aborts it on the old one. With no replica
usable, requests stay put (their breakers answer at once); with none at all, they wait here.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from time import perf_counter
from typing import Any, Literal, TypedDict, Unpack

import grpc

from verifier_client.breaker import BreakerConfig, BreakerState
from verifier_client.budget import BudgetRule
from verifier_client.channel import ChannelOptions
from verifier_client.client import DrafterClient
from verifier_client.deltas import DeltaTracker, RequestOptions, RequestState, finish_tail
from verifier_client.replica_targets import ReplicaResolver, rendezvous_owner
from verifier_client.results import ClientStats, StepResult

log = logging.getLogger(__name__)


class ClientOptions(TypedDict, total=False):
    """DrafterClient's keyword arguments (documented there), given to every replica's."""

    deadline_ms: float
    mode: Literal["stream", "unary"]
    budget: BudgetRule | None
    tokenizer_fingerprint: str
    channel_options: ChannelOptions
    credentials: grpc.ChannelCredentials | None
    token: str | None
    ingest_queue_size: int
    breaker: BreakerConfig | None
    resync_retry: bool
    background_timeout_s: float
    probe_timeout_s: float


Route = Literal["request", "prompt"]
"""What places a request on a replica: its id, or its prompt (siblings together)."""


def check_route(route: object) -> Route:
    """``route`` if it is a :data:`Route`, else ValueError naming it."""
    if route not in ("request", "prompt"):
        raise ValueError(f"route must be 'request' or 'prompt', got {route!r}")
    return route


def prompt_key(prompt: Sequence[int]) -> bytes:
    """The routing key of a prompt: a digest of its token ids (the same in every process)."""
    return hashlib.blake2b(array("q", prompt).tobytes(), digest_size=16).digest()


class ReplicaClient(DrafterClient):
    """A replica's DrafterClient, with the one worker thread its calls run on during a step;
    its steps also end by a deadline shared with the other replicas', and a request moving
    is read from (and added to) its ``tracker``."""

    def __init__(self, target: str, **options: Unpack[ClientOptions]) -> None:
        super().__init__(target, **options)
        # One thread: this replica's steps, in order.
        self.worker = ThreadPoolExecutor(1, thread_name_prefix=f"drafter-replica-{target}")
        self.busy: Future[Any] | None = None  # its step still out past a deadline, until seen done
        self.held: dict[str, list[int]] = {}  # commits of a step it missed
        self.tracker = self._session.tracker
        self._session.checked_by_caller = True  # the replica set checks every step's input

    def step_by(
        self, commits: Mapping[str, list[int]], budgets: Mapping[str, int], deadline_s: float
    ) -> StepResult:
        """``step`` of commits and budgets the replica set checked, with every wait ending
        by ``deadline_s`` (perf_counter) at the latest."""
        io = self._begin_step(commits, budgets)
        while not isinstance(io, StepResult):
            io.deadline_s = min(io.deadline_s, deadline_s)
            io = self._advance(io, self._io(io))
        return io

    def idle(self, until_s: float | None = None) -> bool:
        """Waits (until ``until_s``, perf_counter; None: never past its step's deadline) for
        the worker to be done with the client, then records the commits held for it; False
        if still busy. A late step's result is dropped (its counters and deltas are kept)."""
        busy = self.busy
        if busy is not None:
            timeout = None if until_s is None else max(0.0, until_s - perf_counter())
            if not wait([busy], timeout).done:
                return False
            self.busy = None
            if (error := busy.exception()) is not None:
                log.error("drafter replica %s: a late step failed: %r", self.target, error)
        if self.held:  # recorded without drafting
            held, self.held = self.held, {}
            self.tracker.commit_many(held)
        return True


class ReplicaOwnership:
    """The replicas (by address, as of the last :meth:`_sync`) and each live request's
    owner among them, or none; the requests' lifecycle (see the module docstring)."""

    def __init__(
        self, targets: str | Sequence[str], options: ClientOptions, resolve_interval_s: float,
        route: Route,
    ) -> None:  # fmt: skip
        self._route = check_route(route)
        self._keys: dict[str, bytes] = {}  # live request -> its routing key
        self._options = options
        self._replicas: dict[str, ReplicaClient] = {}  # by address
        self._usable: tuple[str, ...] = ()  # addresses usable at the last sync
        self._spread: tuple[ReplicaClient, ...] = ()  # where ingest goes (read from any thread)
        self._owner: dict[str, ReplicaClient | None] = {}  # live request -> its replica, or none
        self._orphans = DeltaTracker()  # requests while no replica exists
        self._retired = ClientStats()  # the counters of replicas gone
        # This client's steps, and the finishes and ingests dropped for want of a replica.
        self._own = ClientStats()
        self._closed = False
        self.moves = 0  # requests handed from one replica (or none) to another
        self._resolver = ReplicaResolver(targets, self._new_client, resolve_interval_s,
                                         options.get("probe_timeout_s", 1.0))  # fmt: skip
        for address in self._resolver.addresses:
            self._replicas[address] = self._new_client(address)
        self._sync()
        self._resolver.start()

    # --- requests

    def replica_of(self, request_id: str) -> str | None:
        """The address of the replica that holds ``request_id`` (None: no replica yet)."""
        owner = self._owner_of(request_id)
        return None if owner is None else owner.target

    def add_request(
        self, request_id: str, prompt_ids: Iterable[int], **options: Unpack[RequestOptions]
    ) -> None:
        """Starts tracking a request on its owner (see DrafterClient.add_request)."""
        state = RequestState.new(request_id, prompt_ids, **options)
        if request_id in self._owner:
            raise ValueError(f"request_id {request_id!r} is already live")
        self._sync()
        by_id = self._route == "request"
        self._keys[request_id] = request_id.encode() if by_id else prompt_key(state.tokens)
        self._place(state, self._rendezvous(request_id, self._usable or tuple(self._replicas)))

    def finish(
        self,
        request_id: str,
        *,
        tail: Iterable[int] = (),
        output: Iterable[int] | None = None,
        store: bool = True,
        durable: bool = False,
    ) -> bool:
        """Ends a finished request on its owner (see DrafterClient.finish); False too when
        it had no replica to store it (counted in ``stats.ingest_drops``)."""
        owner = self._owner_of(request_id)
        if owner is None:
            finish_tail(self._orphans.get(request_id), tail, output)
            self._orphans.finish(request_id)
            self._own.ingest_drops += store
            sent = not store
        else:
            owner.idle()
            sent = owner.finish(request_id, tail=tail, output=output, store=store, durable=durable)
        self._forget(request_id)
        return sent

    def abort(self, request_id: str) -> bool:
        """Ends a cancelled request on its owner; nothing is stored."""
        owner = self._owner_of(request_id)
        sent = True
        if owner is None:
            self._orphans.finish(request_id)
        else:
            owner.idle()
            sent = owner.abort(request_id)
        self._forget(request_id)
        return sent

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops resolving, sends every replica's queued work (up to ``timeout_s``, all at
        once, each on its worker), then closes them."""
        if self._closed:
            return
        self._closed = True
        self._resolver.close()
        closing = [r.worker.submit(r.close, timeout_s) for r in self._replicas.values()]
        wait(closing)
        for replica in self._replicas.values():
            replica.worker.shutdown()

    def _owner_of(self, request_id: str) -> ReplicaClient | None:
        """The replica that holds ``request_id``, None for none; KeyError unless live."""
        try:
            return self._owner[request_id]
        except KeyError:
            raise KeyError(f"unknown request_id {request_id!r}: add it first") from None

    def _by_owner(
        self, commits: Mapping[str, list[int]]
    ) -> tuple[dict[ReplicaClient, dict[str, list[int]]], list[str]]:
        """The commits of live requests split by owner, and the requests with no replica
        (their commits are recorded here)."""
        work: dict[ReplicaClient, dict[str, list[int]]] = {}
        orphaned: dict[str, list[int]] = {}
        for rid, tokens in commits.items():
            owner = self._owner[rid]
            if owner is None:
                orphaned[rid] = tokens
            else:
                work.setdefault(owner, {})[rid] = tokens
        self._orphans.commit_many(orphaned)
        return work, list(orphaned)

    def _forget(self, request_id: str) -> None:
        del self._owner[request_id]
        del self._keys[request_id]

    # --- replicas

    def _sync(self) -> None:
        """Takes the resolver's news and the breakers' states; moves the requests whose
        owner changed, and retires the replicas gone."""
        gone: list[ReplicaClient] = []
        if (news := self._resolver.news()) is not None:
            addresses, offered = news
            for address, client in offered.items():
                if address in addresses and address not in self._replicas:
                    self._replicas[address] = client
                else:
                    client.close(0)
            gone = [r for a, r in self._replicas.items() if a not in addresses]
        present = tuple(a for a, r in self._replicas.items() if r not in gone)
        closed = BreakerState.CLOSED
        usable = tuple(a for a in present if self._replicas[a].breaker_state is closed)
        if not gone and usable == self._usable:
            return
        added = not set(usable) <= set(self._usable)
        self._usable = usable
        self._spread = tuple(self._replicas[a] for a in usable or present)
        for rid, owner in list(self._owner.items()):
            if owner is not None and owner not in gone:
                # It stays when its owner still wins (only the usable set's losers move), or
                # when no replica is usable (nowhere better to go: its breaker answers at once).
                if not usable or (owner.target in usable and not added):
                    continue
            target = self._rendezvous(rid, usable or present)
            if target is not owner:
                self._move(rid, owner, target)
        for replica in gone:
            self._remove_replica(replica)

    def _rendezvous(self, request_id: str, addresses: Iterable[str]) -> ReplicaClient | None:
        """The owner of ``request_id`` among ``addresses`` (see rendezvous_owner)."""
        address = rendezvous_owner(self._keys[request_id], addresses)
        return None if address is None else self._replicas[address]

    def _move(
        self, request_id: str, source: ReplicaClient | None, target: ReplicaClient | None
    ) -> None:
        """Hands a request, its whole context, from one replica (or none) to another."""
        if source is None:
            state = self._orphans.finish(request_id)
        else:
            source.idle()
            state = source.tracker.get(request_id)
            source.abort(request_id)
        # New to the target: its whole context goes with its next step.
        fresh = RequestState(request_id, state.datastore, state.prompt_length, state.tokens,
                             store=state.store)  # fmt: skip
        self._place(fresh, target)
        self.moves += 1

    def _place(self, state: RequestState, owner: ReplicaClient | None) -> None:
        """Tracks a request on ``owner`` (here while it has none)."""
        if owner is None:
            self._orphans.add(state)
        else:
            owner.idle()
            owner.tracker.add(state)
        self._owner[state.request_id] = owner

    def _remove_replica(self, replica: ReplicaClient) -> None:
        """Drops a replica whose requests have moved; it closes on its own worker."""
        replica.idle()
        del self._replicas[replica.target]
        self._retired.add(replica.stats)
        timeout_s = self._options.get("background_timeout_s", 5.0)
        replica.worker.submit(replica.close, timeout_s)
        replica.worker.shutdown(wait=False)
        log.info("drafter replica %s left", replica.target)

    def _new_client(self, address: str) -> ReplicaClient:
        options = self._options.copy()
        name = self._resolver.name
        if name is not None and options.get("credentials") is not None:
            # TLS to an address of a name: the certificate is the name's. First, so that the
            # caller's own override wins (a later option replaces an earlier one).
            override = ("grpc.ssl_target_name_override", name[0])
            options["channel_options"] = [override, *options.get("channel_options", ())]
        return ReplicaClient(address, **options)
