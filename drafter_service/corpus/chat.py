"""Chat templates: conversations rendered to text the way ``transformers`` does: in a
Jinja2 sandbox with its options, globals, ``tojson`` filter (non-ASCII kept) and the
config's special tokens as variables; a whole conversation, no generation prompt.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from drafter_service.corpus.build_errors import BuildError


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (assistant-mask markers): renders its body."""

    tags = {"generation"}  # noqa: RUF012 - the Extension API names it so

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template and the variables it is rendered with."""

    def __init__(self, source: str, special_tokens: Mapping[str, str], origin: str) -> None:
        self.origin = origin
        self.sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise BuildError(f"{origin}: bad chat template (line {exc.lineno}): {exc}") from None
        self._variables = dict(special_tokens)

    def render(self, messages: list[Mapping[str, Any]], where: str) -> str:
        """The whole conversation as text (``add_generation_prompt=False``)."""
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=False, **self._variables
            )
        except Exception as exc:  # template code may raise anything
            raise BuildError(
                f"{where}: chat template {self.origin} failed: {type(exc).__name__}: {exc}"
            ) from None

    @classmethod
    def load(cls, config_path: Path | None, template_path: Path | None) -> ChatTemplate:
        """The template of ``template_path`` if given, else the ``chat_template`` of the
        tokenizer config (or ``chat_template.jinja`` beside it); special tokens from
        the config when it exists."""
        config = _read_config(config_path) if config_path is not None else {}
        special = _special_tokens(config)
        if template_path is not None:
            return cls(_read_template(template_path), special, str(template_path))
        if config_path is None:
            raise BuildError(
                "chat records need a chat template: give --tokenizer-config or --chat-template"
            )
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if isinstance(source, str):
            return cls(source, special, f"{config_path} (chat_template)")
        beside = config_path.parent / "chat_template.jinja"
        if beside.is_file():
            return cls(_read_template(beside), special, str(beside))
        raise BuildError(
            f"{config_path}: no 'chat_template' key (and no chat_template.jinja beside it); "
            "chat records need one: give --chat-template FILE"
        )


def _read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BuildError(f"{path}: cannot read the chat template: {exc}") from None


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise BuildError(
            f"{path}: tokenizer config not found (chat records need its "
            "chat template; give --tokenizer-config or --chat-template)"
        ) from None
    except OSError as exc:
        raise BuildError(f"{path}: cannot read the tokenizer config: {exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"{path}: the tokenizer config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BuildError(f"{path}: the tokenizer config must be a JSON object")
    return data


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ... as strings (AddedToken dicts give their content)."""
    values = {
        key: value.get("content") if isinstance(value, dict) else value
        for key, value in config.items()
        if key.endswith("_token")
    }
    return {key: value for key, value in values.items() if isinstance(value, str)}
