"""Keep one service of a hand-deployed run alive: ``tianji serve ROLE CONFIG --restart N``.

The supervisor runs the service in a child process (``python -m tianji.launch.worker``,
the spec as JSON on stdin, as the local launcher starts its services) and starts it again
when it dies — killed, crashed or failed — up to ``restarts`` times within any ``period``
seconds (:class:`~tianji.launch.restarts.RestartWindow`, as the launcher counts them), after
:func:`~tianji.launch.restarts.restart_delay` (``backoff`` seconds, doubled over deaths in a
row that came less than ``stable_after`` seconds after a start, at most ``backoff_max``).

The new incarnation registers under the same name from another pid; the controller sees a
new process where no launcher retired the old one, retires it itself (its last counts are
kept under ``NAME#k``, what it held is counted as ``dropped/lost_in_restart``) and counts
the restart (``restarts`` in the summary and the dashboard), exactly as for a service the
local launcher restarts. The controller's host waits ``rejoin_timeout`` seconds for a
service that left, so a restart must come back within that.

The supervisor ends (with the child's code) when the service stopped cleanly (0: the run
ended), when the controller refused it (2: another run config), or when it died with
``restarts`` restarts already within the last ``period`` seconds (1). SIGTERM / SIGINT are
passed to the child, which drains and stops.

Usage::

    code = run(supervise(spec, digest="...", restarts=5, period=50.0, out=sys.stdout))
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tianji.launch.restarts import RestartPolicy, RestartWindow, restart_delay
from tianji.launch.spec import ServiceSpec
from tianji.runtime.loop import wait_set

__all__ = ["serving_pids", "supervise"]

log = logging.getLogger(__name__)

Prepare = Callable[[ServiceSpec, int], ServiceSpec]
"""The spec of restart ``k`` (e.g. a learner told to wait for its checkpoint)."""


_RUNNING = re.compile(r"tianji serve: \S+ running \(pid (\d+)\)")


def serving_pids(output: str) -> list[int]:
    """The pids of the service processes a supervisor started, oldest first, from its
    output (one ``tianji serve: NAME running (pid N)`` line each)."""
    return [int(pid) for pid in _RUNNING.findall(output)]


async def _start(spec: ServiceSpec, digest: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tianji.launch.worker",
        "--run",
        "serve",
        "--name",
        spec.name,
        "--parent",
        str(os.getpid()),
        "--digest",
        digest,
        stdin=asyncio.subprocess.PIPE,
        start_new_session=True,  # signals reach it through the supervisor only
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(spec.to_json()).encode())
    await proc.stdin.drain()
    proc.stdin.close()
    return proc


async def supervise(
    spec: ServiceSpec,
    digest: str,
    restarts: int,
    *,
    period: float,
    out: TextIO = sys.stdout,
    backoff: float = 1.0,
    prepare: Prepare | None = None,
) -> int:
    """Run ``spec`` in a child process and restart it when it dies (module docstring).

    Args:
        restarts: restarts it may have within any ``period`` seconds.

    Returns:
        0 after a clean stop, 2 when the controller refused the service, 1 when it died
        with ``restarts`` restarts within the last ``period`` seconds already.
    """
    supervisor = _Supervisor(spec, digest, restarts, period, out, backoff)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, supervisor.stop, sig)
    try:
        return await supervisor.run(prepare)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


class _Supervisor:
    """One supervised service: its child process, its restarts and the stop request."""

    def __init__(
        self,
        spec: ServiceSpec,
        digest: str,
        restarts: int,
        period: float,
        out: TextIO,
        backoff: float,
    ) -> None:
        self.spec, self.digest, self.restarts, self.period, self.out = (
            spec, digest, restarts, period, out,
        )  # fmt: skip
        self.policy = RestartPolicy(limit=lambda s: restarts, period=period, backoff=backoff)
        self.window = RestartWindow(period)
        self.stopping = asyncio.Event()
        self.child: asyncio.subprocess.Process | None = None
        self.done = self.quick = 0

    def stop(self, sig: signal.Signals) -> None:
        """A signal's handler: stop the child (SIGTERM) and do not restart it."""
        self.stopping.set()
        child = self.child
        if child is not None and child.returncode is None:
            try:
                child.send_signal(signal.SIGTERM)
            except ProcessLookupError as exc:  # it has just exited: its code says how
                log.debug("%s: SIGTERM: %r", self.spec.name, exc)

    async def run(self, prepare: Prepare | None) -> int:
        """Start the child, and again after each death the policy admits; the exit code
        of :func:`supervise`."""
        spec, current = self.spec, self.spec
        while True:
            self.child = await _start(current, self.digest)
            born = time.monotonic()
            running = f"tianji serve: {spec.name} running (pid {self.child.pid})"
            print(running, file=self.out, flush=True)
            code = await self.child.wait()
            if code in (0, 2):  # stopped cleanly, or refused by the controller
                return code
            if self.stopping.is_set():  # told to stop, and it did not stop cleanly
                return 1
            delay = self._delay(f"exited with code {code}", time.monotonic() - born)
            if delay is None:
                return 1
            if await wait_set(self.stopping, delay):
                return 0
            current = prepare(spec, self.done) if prepare is not None else dataclasses.replace(spec)

    def _delay(self, why: str, lived: float) -> float | None:
        """Seconds before the restart after a death (said on the output), or ``None`` when
        the restart limit within the period is reached (said on stderr)."""
        name, restarts, period = self.spec.name, self.restarts, self.period
        if not self.window.admit(time.monotonic(), restarts):
            print(
                f"tianji serve: {name} {why}; {self.window.refusal(restarts)} "
                f"(--restart {restarts} --restart-period {period:g})",
                file=sys.stderr,
                flush=True,
            )
            return None
        delay, self.quick = restart_delay(self.policy, lived, self.quick)
        self.done += 1
        print(
            f"tianji serve: {name} {why}; restart {self.done} ({len(self.window.times)} of at "
            f"most {restarts} within {period:g} s) in {delay:.1f} s",
            file=self.out,
            flush=True,
        )
        return delay
