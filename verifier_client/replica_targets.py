"""Replica targets for ReplicaSetClient: parsing ``host:port``, resolving a name to its
replicas' addresses (again and again in the background: :class:`ReplicaResolver`), and
rendezvous (highest-random-weight) hashing over replica addresses, the same in every process.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import logging
import re
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

import grpc

from verifier_client.client import DrafterClient

log = logging.getLogger(__name__)

_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?")  # a DNS name or an IPv4


def parse_target(target: object) -> tuple[str, int]:
    """(host, port) of a ``host:port`` target (IPv6 as ``[addr]:port``; gRPC's
    ``dns:///`` prefix allowed); ValueError naming the target otherwise."""
    bad = ValueError(f"a drafter target must be 'host:port' (IPv6 as '[addr]:port'), "
                     f"got {target!r}")  # fmt: skip
    if not isinstance(target, str):
        raise bad
    host, _, port = target.removeprefix("dns:///").rpartition(":")
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise bad
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), int(port)
        except ValueError:
            raise bad from None
    if not _HOST.fullmatch(host):
        raise bad
    return host, int(port)


def resolve_target(host: str, port: int) -> tuple[str, ...]:
    """The addresses ``host`` resolves to now, as sorted ``ip:port`` targets: its IPv4
    ones when it has any (a dual-stack Service lists each pod in both families), else
    its IPv6 ones. Raises OSError when the lookup fails."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    v4 = sorted({str(i[4][0]) for i in infos if i[0] == socket.AF_INET})
    if v4:
        return tuple(f"{ip}:{port}" for ip in v4)
    return tuple(sorted({f"[{i[4][0]}]:{port}" for i in infos if i[0] == socket.AF_INET6}))


@functools.lru_cache(maxsize=4096)  # a few addresses, weighed against every request
def replica_key(address: str) -> bytes:
    """A replica's blake2b key (an address may be longer than the 64 bytes a key holds)."""
    return hashlib.blake2b(address.encode(), digest_size=32).digest()


def weight(request_id: bytes, key: bytes) -> bytes:
    # Compared as bytes: big-endian, so the order is the numbers'.
    return hashlib.blake2b(request_id, digest_size=8, key=key).digest()


def rendezvous_owner(request_id: str | bytes, replicas: Iterable[str]) -> str | None:
    """The replica (address) among ``replicas`` whose key weighs most with ``request_id``
    (or a routing key as bytes; ties to the larger address; None for none), whatever the
    order or process."""
    rid = request_id.encode() if isinstance(request_id, str) else request_id
    best = max(((weight(rid, replica_key(a)), a) for a in replicas), default=None)
    return None if best is None else best[1]


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def fixed_targets(targets: Sequence[str]) -> tuple[str, ...]:
    """A fixed set of targets, checked (ValueError naming the bad one)."""
    if not isinstance(targets, Sequence) or not targets:
        raise ValueError(f"targets must be 'host:port' or a non-empty list of them, "
                         f"got {targets!r}")  # fmt: skip
    for target in targets:
        parse_target(target)
    if len(set(targets)) != len(targets):
        twice = sorted({t for t in targets if targets.count(t) > 1})
        raise ValueError(f"targets name {twice} more than once: {list(targets)!r}")
    return tuple(targets)


C = TypeVar("C", bound=DrafterClient)  # a ReplicaClient


class ReplicaResolver(Generic[C]):
    """Where the replicas are: fixed targets, or the addresses of one ``host:port`` name,
    looked up again every ``interval_s`` on its own thread once :meth:`start`-ed (not for an
    IP). A new address is offered (:meth:`news`) with the client ``connect`` made for it once
    that answers within ``probe_timeout_s``; a failed lookup keeps the last set."""

    def __init__(self, targets: str | Sequence[str], connect: Callable[[str], C],
                 interval_s: float, probe_timeout_s: float) -> None:  # fmt: skip
        self.name: tuple[str, int] | None = None  # the looked-up name, if any
        self._connect = connect
        self._interval_s = interval_s
        self._probe_timeout_s = probe_timeout_s
        self._lock = threading.Lock()  # the news, for the decode thread
        self._refresh_lock = threading.Lock()  # one lookup at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._version = self._seen = 0
        self._offered: dict[str, C] = {}  # ready clients for new addresses
        if isinstance(targets, str):
            self.name = parse_target(targets)
            found = self._lookup() or ()
        else:
            found = fixed_targets(targets)
        self.addresses: tuple[str, ...] = tuple(found)  # present (a new one once it is ready)

    def start(self) -> None:
        """Looks the name up again every ``interval_s`` until :meth:`close`."""
        if self.name is not None and not is_ip(self.name[0]):
            self._thread = threading.Thread(
                target=self._loop, daemon=True, name=f"drafter-resolver-{self.name[0]}"
            )
            self._thread.start()

    def news(self) -> tuple[tuple[str, ...], dict[str, C]] | None:
        """The addresses and the clients offered for new ones since the last call (theirs
        to keep or close now); None when nothing changed."""
        if self._version == self._seen:
            return None
        with self._lock:
            self._seen = self._version
            offered, self._offered = self._offered, {}
            return self.addresses, offered

    def refresh(self, ready_timeout_s: float) -> None:
        """Looks the name up again (on the resolver's thread, or for a caller waiting for a
        first address); a new address is offered once its client is ready in time."""
        with self._refresh_lock:
            addresses = self._lookup()
            if addresses is None or self._stop.is_set():
                return  # a failed lookup keeps the last set: breakers handle the dead
            fresh: dict[str, C] = {}
            for address in (a for a in addresses if a not in self.addresses):
                client = self._connect(address)
                try:
                    client.wait_ready(ready_timeout_s)
                except (grpc.RpcError, ValueError) as error:  # ValueError: refused tokenizer
                    log.warning("drafter replica %s not ready: %r", address, error)
                    client.close(0)
                    continue
                fresh[address] = client
                log.info("drafter replica %s joined", address)
            ready = tuple(a for a in addresses if a in self.addresses or a in fresh)
            if ready == self.addresses and not fresh:
                return
            with self._lock:
                self._offered.update(fresh)
                self.addresses = ready
                self._version += 1

    def close(self) -> None:
        """Stops looking up and closes the clients offered but not taken."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            offered, self._offered = self._offered, {}
        for client in offered.values():
            client.close(0)

    def _lookup(self) -> tuple[str, ...] | None:
        """The name's addresses now; None (logged) when the lookup fails."""
        assert self.name is not None, "only a named target is looked up"
        host, port = self.name
        try:
            return resolve_target(host, port)
        except OSError as error:
            log.warning("cannot resolve drafter replicas %s:%d: %s", host, port, error)
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.refresh(self._probe_timeout_s)
