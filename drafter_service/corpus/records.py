"""Which fields of a record become datastore text, and their validation.

A record yields one document made of one or two *parts* (the prompt and the output
are tokenized separately and their ids joined, exactly as the token files hold them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from drafter_service.corpus.build_errors import BuildError
from drafter_service.corpus.record_checks import token_id_array

RecordKind = Literal["text", "prompt-output", "chat", "token-ids"]
Store = Literal["output", "prompt+output"]
RECORD_KINDS: tuple[RecordKind, ...] = ("text", "prompt-output", "chat", "token-ids")
STORES: tuple[Store, ...] = ("output", "prompt+output")

Renderer = Callable[[list[Mapping[str, Any]], str], str]
"""Renders a conversation (``messages``, ``where``) into one text."""


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """How records become documents.

    * ``text``: the string field ``text_field``;
    * ``prompt-output``: the string fields ``output_field`` (``store="output"``) or
      ``prompt_field`` then ``output_field`` (``store="prompt+output"``);
    * ``chat``: the list of ``{role, content}`` objects in ``messages_field``, rendered
      with the tokenizer's chat template;
    * ``token-ids``: like ``prompt-output`` but the fields hold lists of token ids.

    A field not given (None or empty) is at its default: ``text``, ``prompt``, ``output``
    and ``messages``; token-id records default to ``prompt_ids`` and ``output_ids``.
    """

    kind: RecordKind = "text"
    store: Store = "output"
    text_field: str | None = None
    prompt_field: str | None = None
    output_field: str | None = None
    messages_field: str | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields read from each record, in the order of the document's parts."""
        if self.kind == "text":
            return (self.text_field or "text",)
        if self.kind == "chat":
            return (self.messages_field or "messages",)
        ids = self.kind == "token-ids"
        output = self.output_field or ("output_ids" if ids else "output")
        if self.store == "output":
            return (output,)
        return (self.prompt_field or ("prompt_ids" if ids else "prompt"), output)


def _field(record: Mapping[str, Any], name: str, where: str) -> Any:
    try:
        value = record[name]
    except KeyError:
        have = ", ".join(map(repr, list(record)[:12])) or "none"
        raise BuildError(f"{where}: missing field {name!r} (the record has: {have})") from None
    if value is None:
        raise BuildError(f"{where}: field {name!r} is null")
    return value


def text_parts(
    spec: RecordSpec, record: Mapping[str, Any], where: str, render: Renderer | None
) -> list[str]:
    """The texts to tokenize for one record (``text``, ``prompt-output``, ``chat``)."""
    if spec.kind == "chat":
        (name,) = spec.fields
        messages = _field(record, name, where)
        _check_messages(messages, name, where)
        assert render is not None  # build loads the chat template for chat records
        return [render(messages, where)]
    parts = []
    for name in spec.fields:
        value = _field(record, name, where)
        if not isinstance(value, str):
            raise BuildError(
                f"{where}: field {name!r} must be a string, got {type(value).__name__}"
            )
        parts.append(value)
    return parts


def _check_messages(messages: Any, name: str, where: str) -> None:
    if not isinstance(messages, list):
        raise BuildError(
            f"{where}: field {name!r} must be a list of {{role, content}} objects, "
            f"got {type(messages).__name__}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BuildError(
                f"{where}: field {name!r}: message {i} must be an object with a string "
                f"'role' (and a 'content'), got {message!r:.80}"
            )


def id_parts(
    spec: RecordSpec, record: Mapping[str, Any], where: str, vocab_size: int
) -> list[npt.NDArray[np.int32]]:
    """The token-id lists of one ``token-ids`` record, validated against ``vocab_size``."""
    return [
        token_id_array(_field(record, name, where), name, where, vocab_size, BuildError)
        for name in spec.fields
    ]
