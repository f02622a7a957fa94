"""Where a ``drafter serve`` setting comes from (its flag, its ``DRAFTER_*`` variable or
the TOML settings file, the first that sets it), kept to name it when its value is bad:
``--port: bad value 'http': ...``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, TomlConfigSettingsSource

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


@dataclass(frozen=True, slots=True)
class SettingLayers:
    """The values to validate, and for each one where it came from and as what text."""

    values: dict[str, Any]
    origins: dict[str, tuple[str, Any]]

    @classmethod
    def read(
        cls,
        settings_cls: type[BaseSettings],
        namespace: argparse.Namespace,
        environ: Mapping[str, str],
    ) -> SettingLayers:
        """Flags (unset: None) over variables over the settings file (``--config-file``, else
        ``DRAFTER_CONFIG_FILE``); ValueError for a file that is missing or not TOML."""
        flags = {name: value for name in settings_cls.model_fields
                 if (value := getattr(namespace, name, None)) is not None}  # fmt: skip
        layers: list[tuple[Callable[[str], str], dict[str, Any]]] = [
            (flag_name, flags),
            (env_name, _EnvironSource(settings_cls, environ)()),
        ]
        file_flag = getattr(namespace, "config_file", None)
        config_file = file_flag or environ.get(CONFIG_FILE_ENV, "")
        if config_file:
            origin = "--config-file" if file_flag else CONFIG_FILE_ENV
            settings = _settings_file(settings_cls, Path(config_file), origin)
            layers.append((lambda name: f"{config_file}: {name}", settings))
        values: dict[str, Any] = {}
        origins: dict[str, tuple[str, Any]] = {}
        for describe, layer in layers:  # the first layer that sets a field wins
            for name, value in layer.items():
                if name not in values:
                    values[name] = value
                    shown = ",".join(value) if isinstance(value, list) else value  # repeated flag
                    origins[name] = (describe(name), shown)
        return cls(values, origins)

    def explain(self, error: ValidationError) -> str:
        """Each bad setting with where its value came from: ``--port: bad value 'http': ...``."""
        lines = []
        for item in error.errors():
            context = item.get("ctx", {})
            reason = str(context["error"]) if "error" in context else item["msg"]
            if not item["loc"]:  # a check spanning settings: its message names them
                lines.append(reason)
                continue
            name = str(item["loc"][0])
            where, value = self.origins.get(name, (name, item["input"]))
            if item["type"] == "extra_forbidden":
                lines.append(f"{where}: not a setting of drafter serve")
            else:
                lines.append(f"{where}: bad value {value!r}: {reason}")
        return "; ".join(lines)


class _EnvironSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping, not ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # Keys lower-cased as the base class matches them; an empty variable is unset.
        return {key.lower(): value for key, value in self._environ.items() if value != ""}


def _settings_file(settings_cls: type[BaseSettings], path: Path, origin: str) -> dict[str, Any]:
    """The TOML settings file's keys and values (checked by the model, not here)."""
    if not path.is_file():
        raise ValueError(f"{origin}: {str(path)!r} is not a file")
    try:
        return TomlConfigSettingsSource(settings_cls, toml_file=path)()
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ValueError(f"{origin}: cannot read {str(path)!r}: {exc}") from None
