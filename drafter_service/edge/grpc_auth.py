"""Who is calling the drafting service: bearer tokens, mutual TLS, per-client request ids.

* Bearer tokens (``--grpc-tokens-file``: ``NAME TOKEN`` lines, ``#`` comments): a call
  carries ``authorization: Bearer TOKEN``; tokens are compared in constant time.
* Mutual TLS (``--tls-client-ca-file``): without tokens, the client certificate's common
  name names the client.

A client name matches ``[A-Za-z0-9._-]{1,64}``, never a "/", so ``NAME/ID`` (the ids the
servicer keeps a client's under) names one client and one id: no client can name
another's. With neither, every caller is trusted and ids are global. Health checking
and reflection stay open.
``wire.CallGate`` checks credentials before the request message is read, so a refused
caller costs about a refused TLS handshake. Changed files are read again without a
restart (tokens at most once a second, certificates on each new connection); a file
that becomes unreadable keeps the last good contents and logs an error.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from drafter_service.engine.call_errors import ServiceError

log = logging.getLogger(__name__)
_RECHECK_S = 1.0  # how often the tokens file's stat is looked at, at most

MIN_TOKEN_CHARS = 16
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


class Unauthenticated(ServiceError):
    """No valid credentials (UNAUTHENTICATED)."""


def load_tokens(path: Path) -> dict[str, str]:
    """``NAME TOKEN`` lines of ``path`` as {name: token}; ValueError names the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"grpc_tokens_file {path}: cannot read it: {exc}") from None
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        where = f"grpc_tokens_file {path}:{number}"
        if len(parts) != 2:
            raise ValueError(f"{where}: expected 'NAME TOKEN', got {len(parts)} fields")
        name, token = parts
        if not _NAME.fullmatch(name):
            raise ValueError(f"{where}: client name {name!r} must match {_NAME.pattern}")
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(f"{where}: the token of {name!r} must be at least "
                             f"{MIN_TOKEN_CHARS} characters")  # fmt: skip
        if name in tokens:
            raise ValueError(f"{where}: client {name!r} is listed twice")
        tokens[name] = token
    if not tokens:
        raise ValueError(f"grpc_tokens_file {path}: no 'NAME TOKEN' line")
    return tokens


def _stamp(paths: Sequence[Path]) -> tuple[tuple[int, int], ...]:
    """What changes when a file is rewritten or replaced: (mtime_ns, size) of each."""
    return tuple((st.st_mtime_ns, st.st_size) for st in map(os.stat, paths))


class _Reloading:
    """A value read from files, read again once they change; a change that cannot be read
    keeps the last good value (logged once per change)."""

    def __init__(self, paths: Sequence[Path], read: Callable[[], Any]) -> None:
        self._paths = list(paths)
        self._names = ", ".join(str(p) for p in paths)  # for the log
        self._read = read
        self._stamp = _stamp(self._paths)
        self.value = read()  # the first read raises: a bad file at startup refuses to start

    def refresh(self) -> bool:
        """Reads the files again if they changed; True when the value did."""
        try:
            stamp = _stamp(self._paths)
            if stamp == self._stamp:
                return False
            self._stamp = stamp  # a change that cannot be read: one error, not one per call
            self.value = self._read()
        except (OSError, ValueError) as exc:
            log.error("kept the previous %s: %s", self._names, exc)
            return False
        log.info("reloaded %s", self._names)
        return True


class TokenFile:
    """``--grpc-tokens-file``, read again (at most once a second) when it changes.
    ``clock``: what the second is measured on (monotonic seconds; injectable for tests)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._file = _Reloading([path], lambda: load_tokens(path))
        self._clock = clock
        self._checked_s = clock()

    def current(self) -> dict[str, str]:
        now = self._clock()
        if now - self._checked_s >= _RECHECK_S:
            self._checked_s = now
            self._file.refresh()
        tokens: dict[str, str] = self._file.value
        return tokens


def reloading_tls(cert: Path, key: Path, client_ca: Path | None) -> grpc.ServerCredentials:
    """TLS server credentials that pick up renewed files on the next connection
    (gRPC asks the fetcher before every handshake)."""
    paths = [cert, key, *([client_ca] if client_ca else [])]

    def read() -> Any:
        ca = client_ca.read_bytes() if client_ca else None
        return grpc.ssl_server_certificate_configuration(
            [(key.read_bytes(), cert.read_bytes())], root_certificates=ca
        )

    files = _Reloading(paths, read)
    initial = files.value

    def fetch() -> Any:
        return files.value if files.refresh() else None

    return grpc.dynamic_ssl_server_credentials(
        initial, fetch, require_client_authentication=client_ca is not None
    )


@dataclass(frozen=True)
class ClientAuth:
    """The service's authentication policy (see the module docstring)."""

    tokens: TokenFile | None = None  # None: no bearer tokens
    mutual_tls: bool = False  # client certificates are required (and verified by gRPC)

    @property
    def enabled(self) -> bool:
        return self.tokens is not None or self.mutual_tls

    def namespace(self, context: Any) -> str:
        """The calling client's request-id prefix ("" when authentication is off);
        raises :class:`Unauthenticated`."""
        if self.tokens is None:
            return certificate_name(context.auth_context()) + "/" if self.mutual_tls else ""
        metadata = context.invocation_metadata() or ()
        header = next((value for key, value in metadata if key == "authorization"), None)
        if header is None:
            raise Unauthenticated("missing 'authorization: Bearer TOKEN' metadata")
        scheme, _, given = str(header).partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise Unauthenticated("the authorization metadata must be 'Bearer TOKEN'")
        presented, found = given.strip().encode(), None
        for name, token in self.tokens.current().items():  # all compared: no timing hint
            if hmac.compare_digest(token.encode(), presented):
                found = name
        if found is None:
            raise Unauthenticated("unknown bearer token")
        return found + "/"


_COMMON_NAME = "x509_common_name"  # gRPC's auth-context property of the peer's CN


def certificate_name(auth_context: dict[str, list[bytes]]) -> str:
    """The client name of a verified client certificate: its common name, which must be
    one valid client name; raises :class:`Unauthenticated` saying what is wrong."""
    names = [n for n in auth_context.get(_COMMON_NAME) or [] if n]
    if not names:
        raise Unauthenticated("the client certificate has no common name (CN) to name the client")
    if len(names) > 1:
        raise Unauthenticated("the client certificate has several common names (CN)")
    name = names[0].decode("utf-8", "replace")
    if not _NAME.fullmatch(name):
        raise Unauthenticated(f"the client certificate's common name {name[:80]!r} is not a "
                              f"client name: it must match {_NAME.pattern}")  # fmt: skip
    return name
