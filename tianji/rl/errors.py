"""The errors an algorithm or a buffer raises (the runtime's classes, re-exported so that
algorithms import from :mod:`tianji.rl` only)."""

from __future__ import annotations

from tianji.runtime.errors import ConfigError, RegistryError, SyncFailed, TianjiError

__all__ = ["ConfigError", "RegistryError", "SyncFailed", "TianjiError"]
