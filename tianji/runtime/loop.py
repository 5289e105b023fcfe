"""Event-loop selection: uvloop when installed, unless ``TIANJI_LOOP=asyncio``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tianji.runtime.errors import ConfigError

__all__ = ["loop_factory", "run"]

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """Return the loop factory to use (``None`` means asyncio's default).

    Raises:
        ConfigError: if ``TIANJI_LOOP`` names an unknown loop or uvloop is asked for but missing.
    """
    choice = os.environ.get("TIANJI_LOOP", "auto")
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ConfigError("TIANJI_LOOP", choice, "one of auto, uvloop, asyncio")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("TIANJI_LOOP", choice, "uvloop to be installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run ``main`` to completion on the selected event loop (like :func:`asyncio.run`)."""
    with asyncio.Runner(debug=debug, loop_factory=loop_factory()) as runner:
        return runner.run(main)
