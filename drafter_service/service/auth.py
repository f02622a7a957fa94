"""Who is calling the drafting service: bearer tokens, mutual TLS, and per-client request ids.

Two ways to authenticate a gRPC client, alone or together:

* **bearer tokens** (the admin API's scheme): ``--grpc-tokens-file`` holds one client
  per line, ``NAME TOKEN`` (``#`` comments); a call carries ``authorization: Bearer
  TOKEN`` in its metadata. A missing or unknown token is UNAUTHENTICATED; tokens are
  compared in constant time.
* **mutual TLS**: with ``--tls-client-ca-file`` the server accepts only clients whose
  certificate that CA signed; without tokens, the certificate's common name names
  the client.

An authenticated client's request ids live in its own namespace (``NAME/``, applied
by the servicer): one client cannot reset, draft from or finish another's requests,
whatever ids it sends. With neither configured, every caller is trusted and ids are
global (the embedded default on loopback; ``drafter serve`` warns when it listens on
another address so). Health checking and reflection stay open, for probes.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drafter_service.service.errors import ServiceError

__all__ = ["ClientAuth", "Unauthenticated", "load_tokens"]

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


@dataclass(frozen=True)
class ClientAuth:
    """The service's authentication policy (see the module docstring)."""

    tokens: dict[str, str] | None = None  # name -> token; None: no bearer tokens
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
        found = None
        for name, token in self.tokens.items():  # every one compared: no timing hint
            if hmac.compare_digest(token.encode(), given.strip().encode()):
                found = name
        if found is None:
            raise Unauthenticated("unknown bearer token")
        return found
