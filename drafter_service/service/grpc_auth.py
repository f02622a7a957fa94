"""Who is calling the drafting service: bearer tokens, mutual TLS, and per-client request ids.

Two ways to authenticate a gRPC client, alone or together:

* **bearer tokens** (the admin API's scheme): ``--grpc-tokens-file`` holds one client
  per line, ``NAME TOKEN`` (``#`` comments); a call carries ``authorization: Bearer
  TOKEN`` in its metadata. A missing or unknown token is UNAUTHENTICATED; tokens are
  compared in constant time.
* **mutual TLS**: with ``--tls-client-ca-file`` the server accepts only clients whose
  certificate that CA signed; without tokens, the certificate's common name names
  the client.

Both are read again when their files change (cert-manager renews certificates in place;
a new client is a new line), with no restart: the tokens file at most once a second
when a call arrives, the certificates on each new connection. A file that changes into
something unreadable keeps the last good contents and logs an error.

An authenticated client's request ids live in its own namespace (``NAME/``, applied
by the servicer): one client cannot reset, draft from or finish another's requests,
whatever ids it sends. With neither configured, every caller is trusted and ids are
global (the embedded default on loopback; ``drafter serve`` warns when it listens on
another address so). Health checking and reflection stay open, for probes.
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

from drafter_service.service.call_errors import ServiceError

__all__ = ["ClientAuth", "TokenFile", "Unauthenticated", "load_tokens", "reloading_tls"]

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
    stats = [os.stat(p) for p in paths]
    return tuple((st.st_mtime_ns, st.st_size) for st in stats)


class _Reloading:
    """A value read from files, read again once they change; a change that cannot be read
    keeps the last good value (logged once per change)."""

    def __init__(self, paths: Sequence[Path], read: Callable[[], Any]) -> None:
        self._paths = list(paths)
        self._read = read
        self._stamp = _stamp(self._paths)
        self.value = read()  # the first read raises: a bad file at startup refuses to start

    def refresh(self) -> bool:
        """Reads the files again if they changed; True when the value did."""
        try:
            stamp = _stamp(self._paths)
        except OSError as exc:
            return self._keep(stamp=None, why=str(exc))
        if stamp == self._stamp:
            return False
        try:
            value = self._read()
        except (OSError, ValueError) as exc:
            return self._keep(stamp, str(exc))
        self.value, self._stamp = value, stamp
        log.info("reloaded %s", ", ".join(str(p) for p in self._paths))
        return True

    def _keep(self, stamp: tuple[tuple[int, int], ...] | None, why: str) -> bool:
        if stamp is not None:
            self._stamp = stamp  # one error per change, not per call
        log.error("kept the previous %s: %s", ", ".join(str(p) for p in self._paths), why)
        return False


class TokenFile:
    """``--grpc-tokens-file``, read again (at most once a second) when it changes."""

    def __init__(self, path: Path) -> None:
        self._file = _Reloading([path], lambda: load_tokens(path))
        self._checked_s = time.monotonic()

    def current(self) -> dict[str, str]:
        now = time.monotonic()
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
        if self.tokens is not None:
            return self._by_token(context.invocation_metadata() or ()) + "/"
        if self.mutual_tls:
            names = context.auth_context().get("x509_common_name") or []
            if not names:
                raise Unauthenticated("the client certificate has no common name")
            return str(names[0].decode("utf-8", "replace")) + "/"
        return ""

    def _by_token(self, metadata: Sequence[Any]) -> str:
        assert self.tokens is not None
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
        return found
