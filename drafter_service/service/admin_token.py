"""The admin API's bearer token: checked by the admin API, sent by a replica bootstrapping
from its peers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from drafter_service.edge.grpc_auth import MIN_TOKEN_CHARS

TOKEN_ENV = "DRAFTER_ADMIN_TOKEN"


def load_token(token_file: Path | None, environ: Mapping[str, str]) -> str | None:
    """The file's content (stripped), else ``DRAFTER_ADMIN_TOKEN``, else None; ValueError
    for an unreadable file or a guessable token (under ``MIN_TOKEN_CHARS``)."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"admin_token_file {token_file}: cannot read it: {exc}") from None
        source = f"admin_token_file {token_file}"
    elif environ.get(TOKEN_ENV, "").strip():
        token, source = environ[TOKEN_ENV].strip(), TOKEN_ENV
    else:
        return None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ValueError(
            f"{source}: the admin token must be at least {MIN_TOKEN_CHARS} characters "
            "without whitespace"
        )
    return token
