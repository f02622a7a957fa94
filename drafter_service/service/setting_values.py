"""How a ``drafter serve`` setting is read: the value types of ``ServeConfig``'s fields
and how a flag's or variable's text becomes a value (each check's message names the
setting and the value), and where it came from (its flag, its ``DRAFTER_*`` variable or
the TOML settings file, the first that sets it), kept to name it when its value is bad:
``--port: bad value 'http': ...``."""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, ValidationInfo

from drafter_service.live.live_datastore import LivePolicy

DATASTORE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
DEFAULT_DATASTORE = "default"
DEFAULT_VOCAB_SIZE = 128256  # Llama 3's, when nothing else gives a vocabulary
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def bounds(low: float, high: float | None = None, *, low_open: bool = False) -> AfterValidator:
    """A number within [low, high] (above low with ``low_open``), checked once parsed so the
    message shows it: ``ServeConfig.port = 70000 is out of range [0, 65535]``."""
    if high is not None:
        shown = f"{'(' if low_open else '['}{low}, {high}]"
    else:
        shown = f"({'>' if low_open else '>='} {low})"

    def check(value: float, info: ValidationInfo) -> float:
        above = value > low if low_open else value >= low
        if not (above and (high is None or value <= high)):
            raise ValueError(f"ServeConfig.{info.field_name} = {value!r} is out of range {shown}")
        return value

    return AfterValidator(check)


def bool_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # a file's true/false, or Python's
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")


def none_text(value: Any) -> Any:
    """``""`` or ``none`` (any case) is None, for the settings whose default is None."""
    return None if isinstance(value, str) and value.strip().lower() in ("", "none") else value


def pairs(form: str) -> BeforeValidator:
    """``A=B`` pairs from ``A=B[,A=B...]``, the repeated flag's list, a file's table or
    Python's tuple of pairs; a pair needs both sides."""

    def parse(value: Any) -> Any:
        if isinstance(value, Mapping):
            return tuple((key, str(item)) for key, item in value.items())
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value  # not pairs: the type check says so
        pairs = []
        for item in items:
            if not isinstance(item, str):
                pairs.append(item)  # Python's pair, or not a pair: the type check says so
            elif item.strip():  # a blank item is none
                key, sep, text = (part.strip() for part in item.partition("="))
                if not sep or not key or not text:
                    raise ValueError(f"{item.strip()!r} is not {form}")
                pairs.append((key, text))
        return tuple(pairs)

    return BeforeValidator(parse)


def urls(value: Any) -> Any:
    """Peer URLs from ``A,B`` text or a list; each ``http[s]://host:port``."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return value  # the type check says so
    urls = []
    for item in items:
        text = str(item).strip().rstrip("/")
        if not text:
            continue
        parts = urlsplit(text)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            raise ValueError(f"{text!r} is not an admin API URL http[s]://host:port")
        urls.append(text)
    return tuple(urls)


def check_log_level(value: str) -> str:
    if value.upper() not in LOG_LEVELS:
        raise ValueError(f"ServeConfig.log_level = {value!r} is out of range {LOG_LEVELS}")
    return value


def check_live_store(value: Any) -> Any:
    LivePolicy(store=value)  # LivePolicy owns what may be stored, and says so when it is not
    return value


def unique_datastore_names(pairs: tuple[tuple[str, Path], ...]) -> tuple[tuple[str, Path], ...]:
    seen = {DEFAULT_DATASTORE}
    for name, _ in pairs:
        if not DATASTORE_NAME.fullmatch(name) or name in seen:
            raise ValueError(
                f"ServeConfig.datastores: name {name!r} is invalid, reserved or repeated "
                f"(expected {DATASTORE_NAME.pattern}, not {DEFAULT_DATASTORE!r})"
            )
        seen.add(name)
    return pairs


def cpu_count() -> int:
    """CPUs this process may run on (its affinity set), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity API (not Linux)
        return os.cpu_count() or 1


Bool = Annotated[bool, BeforeValidator(bool_text)]
Host = Annotated[str, Field(min_length=1)]
Port = Annotated[int, bounds(0, 65535)]
OptionalPort = Annotated[int, bounds(-1, 65535)]  # -1: that endpoint is off
AtLeastOne = Annotated[int, bounds(1)]
Seconds = Annotated[float, bounds(0)]
PositiveSeconds = Annotated[float, bounds(0, low_open=True)]
Pairs = tuple[tuple[str, str], ...]

ENV_PREFIX = "DRAFTER_"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG_FILE"
REPEATED_FLAGS = {  # a pair per flag; their variable lists pairs, comma-separated
    "datastores": ("--datastore", "NAME=DIR"),
    "draft_config": ("--draft-config", "KEY=VALUE"),
}


def flag_name(field_name: str) -> str:
    """``max_budget`` -> ``--max-budget`` (``datastores`` -> ``--datastore``)."""
    repeated = REPEATED_FLAGS.get(field_name)
    return repeated[0] if repeated else "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    """``max_budget`` -> ``DRAFTER_MAX_BUDGET``."""
    return ENV_PREFIX + field_name.upper()


Validated = TypeVar("Validated")


def read_settings(
    validate: Callable[[dict[str, Any]], Validated],
    fields: Collection[str],
    namespace: argparse.Namespace,
    environ: Mapping[str, str],
) -> Validated:
    """``validate`` of flags (unset: None) over variables (empty: unset; names in any case)
    over the settings file (``--config-file``, else ``DRAFTER_CONFIG_FILE``); ValueError for
    a file that is missing or not TOML, and for each bad setting with where its value came
    from: ``--port: bad value 'http': ...``."""
    file_flag = getattr(namespace, "config_file", None)
    config_file = file_flag or environ.get(CONFIG_FILE_ENV, "")
    given: dict[str, tuple[str, Any]] = {}  # each value and where it came from; later wins
    if config_file:
        origin = "--config-file" if file_flag else CONFIG_FILE_ENV
        for name, value in _settings_file(Path(config_file), origin).items():
            given[name] = (f"{config_file}: {name}", value)
    variables = {key.upper(): value for key, value in environ.items() if value != ""}
    for name in fields:
        if env_name(name) in variables:
            given[name] = (env_name(name), variables[env_name(name)])
        if (value := getattr(namespace, name, None)) is not None:
            given[name] = (flag_name(name), value)
    try:
        return validate({name: value for name, (_, value) in given.items()})
    except ValidationError as error:
        raise ValueError(_explain(error, given)) from None


def _explain(error: ValidationError, given: Mapping[str, tuple[str, Any]]) -> str:
    lines = []
    for item in error.errors():
        context = item.get("ctx", {})
        reason = str(context["error"]) if "error" in context else item["msg"]
        if not item["loc"]:  # a check spanning settings: its message names them
            lines.append(reason)
            continue
        name = str(item["loc"][0])
        where, value = given.get(name, (name, item["input"]))
        if isinstance(value, list):  # a repeated flag's, or a list in the file
            value = ",".join(map(str, value))
        if item["type"] == "extra_forbidden":
            lines.append(f"{where}: not a setting of drafter serve")
        else:
            lines.append(f"{where}: bad value {value!r}: {reason}")
    return "; ".join(lines)


def _settings_file(path: Path, origin: str) -> dict[str, Any]:
    """The TOML settings file's keys and values (checked by the model, not here)."""
    if not path.is_file():
        raise ValueError(f"{origin}: {str(path)!r} is not a file")
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ValueError(f"{origin}: cannot read {str(path)!r}: {exc}") from None
