"""Run the controller of a run whose services are started by hand, on any hosts.

``tianji controller CONFIG --bind tcp://0.0.0.0:PORT`` runs this launcher: the controller
(and the run's monitor) in this process, no children. Every expected service is started
elsewhere with ``tianji serve ROLE CONFIG --controller tcp://HOST:PORT``; the launcher
waits until all of them have joined, then watches the run exactly like
:class:`~tianji.launch.local.LocalLauncher` does, and at the end tells every service to
drain and stop and waits until each has left.

A service that leaves the registry mid-run (its host went away, its process died) has
``rejoin_timeout`` seconds to register again (services reconnect to the controller by
themselves; ``tianji serve --restart`` starts a dead one again); after that the run stops
and fails, naming it. A service that comes back as a new process is retired and counted as
a restart by the controller (:attr:`Controller.reincarnated`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tianji.launch.local import LocalLauncher
from tianji.runtime.controller import Controller

__all__ = ["HostLauncher"]

log = logging.getLogger("tianji.launch")


class HostLauncher(LocalLauncher):
    """See the module docstring.

    Args:
        expected: names of the services that must join (``actor-0``, ``learner-0``, ...).
        join_timeout: seconds to wait for all of them (``None``: forever).
        rejoin_timeout: seconds a service that left may take to come back.
        on_joined: called once when every expected service has joined.
        kwargs: as for :class:`LocalLauncher` (``until``, ``timeout``, ``progress`` ...),
            without ``specs``; ``timeout`` counts from the moment everything joined.
    """

    def __init__(
        self,
        expected: Sequence[str],
        *,
        join_timeout: float | None = None,
        rejoin_timeout: float = 30.0,
        on_joined: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__([], **kwargs)
        self.expected = list(expected)
        self.join_timeout = join_timeout
        self.rejoin_timeout = rejoin_timeout
        self.on_joined = on_joined
        self._fatal: str | None = None

    def fail(self, reason: str) -> None:
        """End the run at the next check with ``reason`` (``"failed NAME ..."``)."""
        if self._fatal is None:
            self._fatal = reason

    def missing(self) -> list[str]:
        """Expected services not registered right now."""
        return [n for n in self.expected if n not in self.controller.registry]

    async def _watch(self, stop_signal: asyncio.Event, started: float) -> str:
        reason = await self._wait_joined(stop_signal)
        if reason is not None:
            return reason
        if self.on_joined is not None:
            self.on_joined()
        return await self._watch_joined(stop_signal, time.monotonic())

    async def _wait_joined(self, stop_signal: asyncio.Event) -> str | None:
        """Wait until every expected service registered; a reason to stop if not."""
        began = time.monotonic()
        signalled = asyncio.ensure_future(stop_signal.wait())
        try:
            while self.missing():
                if signalled.done():
                    return "terminated"
                waited = time.monotonic() - began
                if self.join_timeout is not None and waited >= self.join_timeout:
                    return f"failed {self.missing()[0]} never joined: still missing after " + (
                        f"{self.join_timeout:g} s: {', '.join(self.missing())}"
                    )
                log.info("waiting for %s to join (%.0f s)", ", ".join(self.missing()), waited)
                print(
                    f"[{waited:6.1f}s] waiting for {len(self.missing())} of "
                    f"{len(self.expected)} services: {', '.join(self.missing())}",
                    flush=True,
                )
                joined = asyncio.ensure_future(self.controller.wait_until(_all_in(self.expected)))
                await asyncio.wait({joined, signalled}, timeout=self.progress_interval)
                joined.cancel()
        finally:
            signalled.cancel()
        print(f"all {len(self.expected)} services joined", flush=True)
        return None

    async def _watch_joined(self, stop_signal: asyncio.Event, started: float) -> str:
        """Like LocalLauncher's watch, with departures from the registry as the deaths."""
        complete = asyncio.ensure_future(self.controller.wait_until(self.until))
        signalled = asyncio.ensure_future(stop_signal.wait())
        gone_since: dict[str, float] = {}
        next_progress = started + self.progress_interval
        try:
            while True:
                await asyncio.wait(
                    {complete, signalled},
                    timeout=min(self.progress_interval, 1.0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if complete.done():
                    return "complete"
                if signalled.done():
                    return "terminated"
                now = time.monotonic()
                if self.timeout is not None and now - started >= self.timeout:
                    return "timeout"
                reason = self._fatal or self._check_departures(gone_since, now)
                if reason is not None:
                    return reason
                if self.progress and now >= next_progress:
                    self.progress(self.controller, now - started)
                    next_progress = now + self.progress_interval
        finally:
            complete.cancel()
            signalled.cancel()

    def _check_departures(self, gone_since: dict[str, float], now: float) -> str | None:
        for name in self.expected:
            if name in self.controller.registry:
                if gone_since.pop(name, None) is not None:
                    log.warning("%s rejoined the run", name)
                continue
            if name not in gone_since:
                log.warning("%s left the run; waiting %g s for it", name, self.rejoin_timeout)
                gone_since[name] = now
            elif now - gone_since[name] > self.rejoin_timeout:
                self.controller.bury(name)  # the final books settle what was on its way to it
                return f"failed {name} left the run and did not rejoin in {self.rejoin_timeout:g} s"
        return None

    async def _stop_all(self, reason: str) -> dict[str, int | None]:
        """Tell every service to stop; wait (``grace``) until each has left the registry.

        Returns ``0`` for every expected service that left, ``None`` for any still there.
        """
        if any(n in self.controller.registry for n in self.expected):
            try:
                await asyncio.wait_for(self.controller.shutdown_all(reason), self.grace)
            except Exception as exc:  # those it missed are named below as still there
                log.warning("Shutdown (%s) did not reach every service: %r", reason, exc)
            try:
                await self.controller.wait_until(_none_of(self.expected), self.grace)
            except TimeoutError as exc:
                still = [n for n in self.expected if n in self.controller.registry]
                log.warning("still registered after %g s: %s (%r)", self.grace, still, exc)
        left = self.missing()
        return {n: (0 if n in left else None) for n in self.expected}


def _all_in(names: Sequence[str]) -> Callable[[Controller], bool]:
    return lambda c: all(n in c.registry for n in names)


def _none_of(names: Sequence[str]) -> Callable[[Controller], bool]:
    return lambda c: not any(n in c.registry for n in names)
