"""Replica targets and request ownership for :class:`ReplicaSetClient`: parsing a
``host:port`` target, resolving a name to its replicas' addresses, and rendezvous
(highest-random-weight) hashing of request ids over replica addresses, the same in
every process."""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
from collections.abc import Iterable

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


def replica_key(address: str) -> bytes:
    """A replica's blake2b key (an address may be longer than the 64 bytes a key holds)."""
    return hashlib.blake2b(address.encode(), digest_size=32).digest()


def weight(request_id: bytes, key: bytes) -> bytes:
    # Compared as bytes: big-endian, so the order is the numbers'.
    return hashlib.blake2b(request_id, digest_size=8, key=key).digest()


def rendezvous_owner(request_id: str, replicas: Iterable[str]) -> str | None:
    """The replica (address) that owns ``request_id`` among ``replicas``: the one whose
    key weighs most with it (ties, never seen in practice, to the larger address);
    None for no replicas. Independent of order and of the process (no ``hash()``)."""
    rid = request_id.encode()
    best = max(((weight(rid, replica_key(a)), a) for a in replicas), default=None)
    return None if best is None else best[1]


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
