"""Helpers for tests of tianji services and transports (also for plugin authors)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from tianji.runtime.loop import run

__all__ = [
    "LISTEN_ADDRESSES",
    "free_tcp_port",
    "interruptible",
    "processes_with_arg",
    "run_async",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

LISTEN_ADDRESSES = {"inproc": "inproc://", "tcp": "tcp://127.0.0.1:0", "shm": "shm://"}
"""A listen address per transport scheme for tests (port 0 / auto name)."""


def run_async(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Run ``coro`` on the configured loop; a hang fails with ``TimeoutError``."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return run(guarded())


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def processes_with_arg(*args: str) -> list[int]:
    """Pids of live processes whose command line contains all ``args`` in sequence."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            words = [w.decode(errors="replace") for w in cmdline]
            if _contains_run(words, list(args)):
                state = (entry / "stat").read_text().split(")")[-1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError as exc:  # it ended while we looked
            log.debug("pid %s: %r", entry.name, exc)
    return found


def _contains_run(words: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(words[i : i + n] == needle for i in range(len(words) - n + 1))


def interruptible() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT as a terminal's Ctrl-C does:
    SIGINT back to its default, whatever this process inherited (a test run started in the
    background by a non-interactive shell has SIGINT ignored, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
