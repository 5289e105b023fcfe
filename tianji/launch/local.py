"""Run a graph of services as separate processes on this machine.

The launcher runs the controller in its own event loop, spawns one fresh Python process
per service (``subprocess``, never ``fork``; the spec travels as JSON on stdin), and
watches them. The run ends when ``until(controller)`` holds, when a child dies (the
others are stopped and :class:`ServiceFailed` is raised), on Ctrl-C / SIGTERM, or on
timeout. In every case every child is stopped: Shutdown first, then SIGTERM, then SIGKILL.

Usage::

    specs = [ServiceSpec(name="producer-0", factory="tianji.demo:Producer", options={...}), ...]
    launcher = LocalLauncher(specs, until=lambda c: "consumer-0" in c.reports, timeout=120)
    result = run_local(launcher)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from tianji.balance import BalanceConfig
from tianji.controller import Controller
from tianji.errors import ConfigError, ServiceFailed
from tianji.events import ServiceReported
from tianji.launch.spec import ServiceSpec, build_service
from tianji.runtime import run
from tianji.service import Service, ServiceOptions

__all__ = ["LaunchResult", "LocalLauncher", "run_local"]

log = logging.getLogger("tianji.launch")
Until = Callable[[Controller], bool]
Progress = Callable[[Controller, float], None]


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchResult:
    """How a launched run ended."""

    run_id: str
    reason: str
    reports: dict[str, ServiceReported]
    exit_codes: dict[str, int | None]
    elapsed: float


class _Child:
    """A launched service: a child process, or a task in this loop (in-process runs)."""

    def __init__(
        self,
        spec: ServiceSpec,
        proc: asyncio.subprocess.Process | None = None,
        service: Service | None = None,
    ) -> None:
        self.spec = spec
        self.proc = proc
        self.service = service
        self.task: asyncio.Task[int] | None = None
        if service is not None:
            self.task = asyncio.create_task(self._run_service(service))

    @staticmethod
    async def _run_service(service: Service) -> int:
        try:
            await service.run()
        except Exception:
            log.exception("service %s failed", service.name)
            return 1
        return 0

    @property
    def returncode(self) -> int | None:
        if self.proc is not None:
            return self.proc.returncode
        assert self.task is not None
        if not self.task.done():
            return None
        return -9 if self.task.cancelled() else self.task.result()

    async def wait(self) -> int | None:
        if self.proc is not None:
            return await self.proc.wait()
        assert self.task is not None
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(self.task)
        return self.returncode

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
        elif self.service is not None and self.task is not None:
            if sig is signal.SIGKILL:
                self.task.cancel()
            else:
                self.service.stop(f"signal {sig.name}")


class LocalLauncher:
    """See the module docstring.

    Args:
        specs: the services to start, one process each.
        until: the run is complete when this holds (checked on every registry change).
        timeout: seconds after which the run is stopped and ``TimeoutError`` raised.
        controller_bind: where the controller listens.
        progress: called about every ``progress_interval`` seconds (e.g. print a line).
        grace: seconds children get to exit after Shutdown before SIGTERM, then SIGKILL.
        in_process: run every service as a task in this loop instead of a process each
            (with ``inproc://`` binds this is the one-process debugging mode).
        local_services: ``f(controller_address)`` builds extra services (e.g. a monitor)
            that run in this loop for the whole run.
        balance: when given, the controller balances production and consumption.
    """

    def __init__(
        self,
        specs: Sequence[ServiceSpec],
        *,
        until: Until,
        timeout: float | None = None,
        controller_bind: str = "tcp://127.0.0.1:0",
        progress: Progress | None = None,
        progress_interval: float = 2.0,
        grace: float = 10.0,
        options: ServiceOptions | None = None,
        in_process: bool = False,
        local_services: Callable[[str], Sequence[Service]] | None = None,
        balance: BalanceConfig | None = None,
    ) -> None:
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError("services", dupes, "unique service names")
        self.specs = list(specs)
        self.until = until
        self.timeout = timeout
        self.progress = progress
        self.progress_interval = progress_interval
        self.grace = grace
        self.controller = Controller(bind=controller_bind, options=options, balance=balance)
        self.children: dict[str, _Child] = {}
        self.in_process = in_process
        self.local_services = local_services

    async def run(self) -> LaunchResult:
        """Start everything, wait for the end, stop everything; see the module docstring.

        Raises:
            ServiceFailed: if a child process exited with an error.
            TimeoutError: if ``timeout`` passed first.
        """
        started = time.monotonic()
        ctl_task = asyncio.create_task(self.controller.run())
        loop = asyncio.get_running_loop()
        stop_signal = asyncio.Event()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, stop_signal.set)
        reason = "interrupted"
        local: list[_Child] = []
        try:
            await _ready_or_failed(self.controller, ctl_task)
            if self.local_services is not None:
                for svc in self.local_services(self.controller.address):
                    local.append(_Child(ServiceSpec(name=svc.name, factory="local:-"), service=svc))
            for spec in self.specs:
                await self._spawn(spec)
            reason = await self._watch(stop_signal, started)
            if reason == "timeout":
                raise TimeoutError(f"run {self.controller.run_id} timed out after {self.timeout}s")
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGTERM)
            codes = await self._stop_all(reason)
            for child in local:
                child.signal(signal.SIGTERM)
                await child.wait()
            self.controller.stop(reason)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ctl_task, self.grace)
        failed = {n: c for n, c in codes.items() if c not in (0, None)}
        if reason.startswith("failed"):
            raise ServiceFailed(reason.split(" ", 2)[1], f"{reason}; exit codes {failed}")
        return LaunchResult(
            self.controller.run_id,
            reason,
            dict(self.controller.reports),
            codes,
            time.monotonic() - started,
        )

    async def _spawn(self, spec: ServiceSpec) -> None:
        spec = dataclasses.replace(spec, controller=self.controller.address)
        if self.in_process:
            self.children[spec.name] = _Child(spec, service=build_service(spec))
            return
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tianji.launch.worker",
            "--run",
            self.controller.run_id,
            "--name",
            spec.name,
            "--parent",
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            start_new_session=True,  # Ctrl-C reaches the launcher only; it stops the children
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(spec.to_json()).encode())
        await proc.stdin.drain()
        proc.stdin.close()
        self.children[spec.name] = _Child(spec, proc=proc)
        log.info("started %s (pid %d)", spec.name, proc.pid)

    async def _watch(self, stop_signal: asyncio.Event, started: float) -> str:
        """Return why the run ends: complete, failed NAME ..., timeout or signal."""
        exits: dict[asyncio.Future[Any], str] = {
            asyncio.ensure_future(c.wait()): n for n, c in self.children.items()
        }
        complete = asyncio.ensure_future(self.controller.wait_until(self.until))
        signalled = asyncio.ensure_future(stop_signal.wait())
        pending: set[asyncio.Future[Any]] = {complete, signalled, *exits}
        next_progress = time.monotonic() + self.progress_interval
        try:
            while True:
                deadline = None if self.timeout is None else started + self.timeout
                wait = self.progress_interval if self.progress else None
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return "timeout"
                    wait = left if wait is None else min(wait, left)
                done, pending = await asyncio.wait(
                    pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if complete in done:
                    return "complete"
                if signalled in done:
                    return "terminated"
                for task in done:
                    name = exits.get(task)
                    code = self.children[name].returncode if name else None
                    if name is not None and code != 0:
                        return f"failed {name} exited with code {code}"
                if self.progress and time.monotonic() >= next_progress:
                    self.progress(self.controller, time.monotonic() - started)
                    next_progress = time.monotonic() + self.progress_interval
        finally:
            for task in pending:
                task.cancel()

    async def _stop_all(self, reason: str) -> dict[str, int | None]:
        """Shutdown -> SIGTERM -> SIGKILL; returns every child's exit code."""
        alive = [c for c in self.children.values() if c.returncode is None]
        if alive:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.controller.shutdown_all(reason), self.grace)
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                alive = [c for c in alive if c.returncode is None]
                if not alive:
                    break
                if sig is not None:
                    log.warning("sending %s to %s", sig.name, [c.spec.name for c in alive])
                    for child in alive:
                        child.signal(sig)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.gather(*(c.wait() for c in alive)), self.grace)
        return {n: c.returncode for n, c in self.children.items()}


async def _ready_or_failed(controller: Controller, ctl_task: asyncio.Task[None]) -> None:
    """Wait for the controller to be ready; raise what it died of if it did not get there."""
    ready = asyncio.create_task(controller.wait_ready())
    await asyncio.wait({ready, ctl_task}, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        ctl_task.result()
        raise ServiceFailed(controller.name, "stopped before it was ready")


def print_progress(stream: TextIO = sys.stdout) -> Progress:
    """A progress callback printing one line per interval from the heartbeats' counters."""
    last: dict[str, tuple[float, int]] = {}

    def show(controller: Controller, elapsed: float) -> None:
        parts = []
        for name, record in sorted(controller.registry.items()):
            hb = record.last_heartbeat
            if hb is None:
                parts.append(f"{name}: starting")
                continue
            count = hb.counters.get("published", 0) or hb.counters.get("received", 0)
            then, before = last.get(name, (hb.sent_at, count))
            rate = (count - before) / (hb.sent_at - then) if hb.sent_at > then else 0.0
            last[name] = (hb.sent_at, count)
            parts.append(f"{name}: {count} events ({rate:,.0f}/s)")
        print(f"[{elapsed:6.1f}s] " + " | ".join(parts), file=stream, flush=True)

    return show


def run_local(launcher: LocalLauncher) -> LaunchResult:
    """Blocking helper: run ``launcher`` on the configured event loop (uvloop if present)."""
    return run(launcher.run())
