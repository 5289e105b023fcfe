"""Event-loop selection (uvloop when installed, unless ``TIANJI_LOOP=asyncio``) and timed
waits whose timeout is an answer, not an error (:func:`wait_set`, :func:`finished_within`)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TextIO, TypeVar

from tianji.runtime.errors import ConfigError

__all__ = [
    "dump_tasks",
    "finished_within",
    "in_daemon_thread",
    "loop_factory",
    "run",
    "wait_set",
]

T = TypeVar("T")

log = logging.getLogger(__name__)


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


async def finished_within(aw: Awaitable[Any], timeout: float | None) -> bool:
    """Await ``aw`` for at most ``timeout`` seconds (``None``: no limit), without raising on
    the timeout.

    Returns:
        ``True`` if it finished (if it raised, that exception propagates); ``False`` if the
        time ran out first (then it is cancelled, and awaited until it has unwound).
    """
    task = asyncio.ensure_future(aw)
    try:
        limit = None if timeout is None else max(timeout, 0.0)
        done, _ = await asyncio.wait({task}, timeout=limit)
    finally:
        if not task.done():  # timed out, or we were cancelled: it goes too
            task.cancel()
    if not done:
        await asyncio.wait({task})
        return False
    task.result()
    return True


async def wait_set(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set, at most ``timeout`` seconds (``None``: no limit);
    ``True`` if it is set."""
    if event.is_set():
        return True
    return await finished_within(event.wait(), timeout)


async def first_done(*aws: Coroutine[Any, Any, Any]) -> None:
    """Wait until the first of ``aws`` completes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


def dump_tasks(name: str, out: TextIO | None = None) -> None:
    """Write what every task of the running loop waits on, innermost await last (``kill
    -USR1`` a service process to see where a stuck one hangs)."""
    out = out or sys.stderr
    tasks = asyncio.all_tasks()
    print(f"{name}: {len(tasks)} tasks", file=out)
    for task in tasks:
        print(f"  task {task.get_name()}:", file=out)
        aw: Any = task.get_coro()
        while aw is not None:
            frame = getattr(aw, "cr_frame", None) or getattr(aw, "gi_frame", None)
            if frame is not None:
                code = frame.f_code
                print(f"    {code.co_filename}:{frame.f_lineno} {code.co_qualname}", file=out)
            aw = getattr(aw, "cr_await", None) or getattr(aw, "gi_yieldfrom", None)
    out.flush()


async def in_daemon_thread(fn: Callable[[], T], name: str = "tianji-blocking") -> T:
    """``fn()`` in a daemon thread of its own, awaited. Unlike ``run_in_executor``, a task
    that is cancelled while ``fn`` blocks (e.g. joining a process group that waits for its
    peers) leaves the thread behind without the loop's shutdown waiting for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    def hand_over(ok: bool, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError as exc:  # a closed loop: nobody waits any more
            log.debug("%s: its result has nobody to go to: %s", name, exc)

    def work() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting task
            hand_over(False, exc)
        else:
            hand_over(True, result)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future
