"""Reading a run config: a TOML file (or a run directory's ``config.json``) plus ``--set``
overrides, built into the :class:`~tianji.rl.config.RunConfig` that every service reads.
"""

from __future__ import annotations

import json
import logging
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tianji.rl.config import RunConfig, build_dataclass
from tianji.runtime.errors import ConfigError

__all__ = ["apply_overrides", "load_config"]

log = logging.getLogger(__name__)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a TOML run config (or the ``config.json`` saved in a run directory) and apply
    ``section.key=value`` overrides.

    Raises:
        ConfigError: naming the file, key or value that is wrong.
    """
    try:
        text = Path(path).read_text()
        data = json.loads(text) if str(path).endswith(".json") else tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError("config", str(path), "an existing TOML file") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("config", str(path), f"valid TOML or JSON ({exc})") from None
    data = apply_overrides(data, overrides)
    config: RunConfig = build_dataclass(RunConfig, data, "")
    return config


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return ``data`` with ``a.b=value`` overrides set; values parse as TOML, else strings."""
    result = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", item, "KEY=VALUE, e.g. actors.count=4")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError as exc:  # not a TOML value: the text itself
            log.debug("--set %s: %s; taken as the string %r", key, exc, raw)
            value = raw
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(key, item, f"{part} to be a section")
            node = child
        node[parts[-1]] = value
    return result


def _deep_copy(data: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in data.items()}
