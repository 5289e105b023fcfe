"""What every launcher shares: run the controller here, start the services, watch, stop.

A launcher subclass says only how one service is started (:meth:`Launcher._spawn`, which
returns a :class:`Handle`) and, optionally, what to set up before the run and release
after it (:meth:`Launcher._open`, :meth:`Launcher._close`). Everything else — the
controller in this event loop, the services that run in it (``local_services``), the
watch loop (complete / a service died / signal / timeout) and the ordered stop
(Shutdown, then SIGTERM, then SIGKILL) — is here, once. Whether and when a dead service
starts again is :mod:`tianji.launch.restarts`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from tianji.launch.restarts import RestartPolicy, RestartWindow, restart_delay
from tianji.launch.spec import ServiceSpec
from tianji.runtime.controller import Controller, ControllerPlugin
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.runtime.events import ServiceReported
from tianji.runtime.loop import finished_within, run
from tianji.runtime.service import Service, ServiceOptions

__all__ = [
    "Handle",
    "LaunchResult",
    "Launcher",
    "Progress",
    "ServiceTask",
    "Until",
    "run_launcher",
]

log = logging.getLogger("tianji.launch")
Until = Callable[[Controller], bool]
Progress = Callable[[Controller, float], None]
BeforeStop = Callable[[Controller, str], Awaitable[None]]


class _RestartRefused(Exception):
    """A dead service gets no restart; ``why`` (may be empty) is added to the run's end."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchResult:
    """How a launched run ended."""

    run_id: str
    reason: str
    reports: dict[str, ServiceReported]
    exit_codes: dict[str, int | None]
    elapsed: float


class Handle(Protocol):
    """A started service, however it was placed (process, task, Ray actor)."""

    spec: ServiceSpec
    exit_note: str
    """Why it ended, when more can be said than the exit code (e.g. "Ray actor died")."""

    @property
    def returncode(self) -> int | None:
        """``None`` while running, 0 after a clean stop, anything else after a failure."""

    async def wait(self) -> int | None:
        """Wait until it ended; return :attr:`returncode`."""

    def signal(self, sig: signal.Signals) -> None:
        """SIGTERM: ask it to stop gracefully; SIGKILL: end it now."""


class ServiceTask:
    """A service run as a task in this event loop (in-process runs, the monitor)."""

    def __init__(self, spec: ServiceSpec, service: Service) -> None:
        self.spec = spec
        self.service = service
        self.exit_note = ""
        self.task: asyncio.Task[int] = asyncio.create_task(self._run_service(service))

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
        if not self.task.done():
            return None
        return -9 if self.task.cancelled() else self.task.result()

    async def wait(self) -> int | None:
        await asyncio.wait({self.task})  # its end, however it ended (our own cancel raises)
        return self.returncode

    def signal(self, sig: signal.Signals) -> None:
        if sig is signal.SIGKILL:
            self.task.cancel()
        else:
            self.service.stop(f"signal {sig.name}")


@dataclasses.dataclass(slots=True, kw_only=True)
class LaunchPlan:
    """What a launcher runs and how: every launcher takes one (a run's is built by
    :meth:`tianji.run.plan.RunPlan.launch_plan`).

    Attributes:
        specs: the services to start.
        until: the run is complete when this holds (checked on every registry change).
        timeout: seconds after which the run is stopped and ``TimeoutError`` raised.
        controller_bind: where the controller listens.
        progress: called about every ``progress_interval`` seconds (e.g. print a line).
        grace: seconds services get to exit after Shutdown before SIGTERM, then SIGKILL.
        options: runtime options of the controller.
        local_services: ``f(controller_address)`` builds extra services (e.g. a monitor)
            that run in this loop for the whole run.
        plugins: what the controller runs beside its registry (e.g. the run's
            :class:`~tianji.services.balancer.Balancer`).
        before_stop: awaited (with the reason, at most ``grace`` seconds) before a run that
            ends cleanly (complete, SIGTERM, Ctrl-C once running) is stopped, while every
            service still runs: e.g. take a last checkpoint.
        restarts: start dead services again: a :class:`RestartPolicy`, or
            ``f(controller) -> RestartPolicy`` for a policy that reads the run's controller;
            without it, any death ends the run.
    """

    specs: Sequence[ServiceSpec]
    until: Until
    timeout: float | None = None
    controller_bind: str = "tcp://127.0.0.1:0"
    progress: Progress | None = None
    progress_interval: float = 2.0
    grace: float = 10.0
    options: ServiceOptions | None = None
    local_services: Callable[[str], Sequence[Service]] | None = None
    plugins: Sequence[ControllerPlugin] = ()
    before_stop: BeforeStop | None = None
    restarts: RestartPolicy | Callable[[Controller], RestartPolicy] | None = None


class Launcher:
    """Runs a graph of services to its end; subclasses place the services.

    The run ends when ``until(controller)`` holds, when a service dies (the others are
    stopped and :class:`ServiceFailed` is raised), on SIGTERM / Ctrl-C, or on timeout. In
    every case every service is stopped: Shutdown first, then SIGTERM, then SIGKILL.

    Args:
        plan: what to run and how (:class:`LaunchPlan`); or, for short scripts and tests,
            the specs, with the plan's other fields as keyword arguments
            (``LocalLauncher(specs, until=..., timeout=...)``).

    Raises:
        ConfigError: if two specs share a name.
    """

    def __init__(self, plan: LaunchPlan | Sequence[ServiceSpec], **fields: Any) -> None:
        if not isinstance(plan, LaunchPlan):
            plan = LaunchPlan(specs=plan, **fields)
        elif fields:
            raise TypeError(f"a LaunchPlan and keyword arguments {sorted(fields)}: give one")
        names = [s.name for s in plan.specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError("services", dupes, "unique service names")
        self.plan = plan
        self.specs = list(plan.specs)
        self.until = plan.until
        self.timeout = plan.timeout
        self.progress = plan.progress
        self.progress_interval = plan.progress_interval
        self.grace = plan.grace
        self.controller = Controller(
            bind=plan.controller_bind, options=plan.options, plugins=plan.plugins
        )
        self.children: dict[str, Handle] = {}
        self.local_services = plan.local_services
        self.before_stop = plan.before_stop
        restarts = plan.restarts
        if restarts is not None and not isinstance(restarts, RestartPolicy):
            restarts = restarts(self.controller)
        self.restarts: RestartPolicy | None = restarts
        self._killed: dict[str, str] = {}  # declared dead and killed by us: why
        self._born: dict[str, float] = {}  # when each service's incarnation was spawned
        self._quick_deaths: dict[str, int] = {}  # deaths in a row, each soon after its birth
        self._windows: dict[str, RestartWindow] = {}  # each service's recent restarts

    @property
    def placement(self) -> dict[str, str]:
        """The node each service runs on, where the launcher places services on nodes
        (Ray: service name -> node IP); empty for launchers of one host."""
        return {}

    # ------------------------------------------------------------------ for subclasses
    async def _spawn(self, spec: ServiceSpec) -> Handle:
        """Start one service (``spec.controller`` is already filled in)."""
        raise NotImplementedError

    async def _open(self) -> None:
        """Set up before the controller starts (e.g. connect to a cluster)."""

    async def _started(self) -> None:
        """Called once every service was spawned (e.g. wait until all are placed)."""

    async def _close(self) -> None:
        """Release what :meth:`_open` set up; runs after every service has stopped."""

    # ------------------------------------------------------------------ the run
    async def run(self) -> LaunchResult:
        """Start everything, wait for the end, stop everything; see the class docstring.

        Raises:
            ServiceFailed: if a service failed or died.
            TimeoutError: if ``timeout`` passed first.
        """
        started = time.monotonic()
        try:
            await self._open()
            reason, codes = await self._run_controlled(started)
        finally:
            await self._close()
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

    async def _run_controlled(self, started: float) -> tuple[str, dict[str, int | None]]:
        ctl_task = asyncio.create_task(self.controller.run())
        loop = asyncio.get_running_loop()
        stop_signal = asyncio.Event()
        try:
            loop.add_signal_handler(signal.SIGTERM, stop_signal.set)
        except (NotImplementedError, RuntimeError) as exc:  # not the main thread, or Windows
            log.debug("SIGTERM not watched: %r", exc)
        reason = "interrupted"
        watching = False  # every service was started; then Ctrl-C stops the run cleanly too
        local: list[ServiceTask] = []
        try:
            await _ready_or_failed(self.controller, ctl_task)
            if self.local_services is not None:
                for svc in self.local_services(self.controller.address):
                    spec = ServiceSpec(name=svc.full_name, factory="local:-")
                    local.append(ServiceTask(spec, svc))
            for spec in self.specs:
                spec = dataclasses.replace(spec, controller=self.controller.address)
                self.children[spec.name] = await self._spawn(spec)
                self._born[spec.name] = time.monotonic()
            await self._started()
            watching = True
            reason = await self._watch(stop_signal, started)
            if reason == "timeout":
                raise TimeoutError(f"run {self.controller.run_id} timed out after {self.timeout}s")
        finally:
            try:
                loop.remove_signal_handler(signal.SIGTERM)
            except (NotImplementedError, RuntimeError) as exc:  # it was never added
                log.debug("SIGTERM handler not removed: %r", exc)
            clean = reason in ("complete", "terminated") or (watching and reason == "interrupted")
            if self.before_stop is not None and clean:
                try:
                    await asyncio.wait_for(self.before_stop(self.controller, reason), self.grace)
                except Exception:  # the run's end must not depend on it
                    log.exception("before stop (%s)", reason)
            codes = await self._stop_all(reason)
            for child in local:
                child.signal(signal.SIGTERM)
                await child.wait()
            self.controller.stop(reason)
            await self._controller_ended(ctl_task)
        return reason, codes

    async def _controller_ended(self, ctl_task: asyncio.Task[None]) -> None:
        """Wait (``grace`` s) for the stopped controller; say so if it failed or hung."""
        done, _ = await asyncio.wait({ctl_task}, timeout=self.grace)
        if not done:
            log.warning("the controller did not stop within %.1f s: cancelled", self.grace)
            ctl_task.cancel()
        elif not ctl_task.cancelled() and ctl_task.exception() is not None:
            log.error("the controller failed", exc_info=ctl_task.exception())

    async def _watch(self, stop_signal: asyncio.Event, started: float) -> str:
        """Return why the run ends: complete, failed NAME ..., timeout or terminated.
        Dead services within their restart limit are started again meanwhile."""
        exits: dict[asyncio.Future[Any], str] = {
            asyncio.ensure_future(c.wait()): n for n, c in self.children.items()
        }
        restarting: dict[asyncio.Future[Any], str] = {}
        complete = asyncio.ensure_future(self.controller.wait_until(self.until))
        signalled = asyncio.ensure_future(stop_signal.wait())
        pending: set[asyncio.Future[Any]] = {complete, signalled, *exits}
        next_progress = time.monotonic() + self.progress_interval
        try:
            while True:
                deadline = None if self.timeout is None else started + self.timeout
                wait = self.progress_interval if self.progress else None
                if self.restarts is not None and self.restarts.heartbeat_timeout is not None:
                    wait = min(wait or 1.0, 1.0)
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
                for task in done & restarting.keys():
                    name = restarting.pop(task)
                    handle = task.result()  # a failed spawn ends the run (raises)
                    self.children[name] = handle
                    waiter = asyncio.ensure_future(handle.wait())
                    exits[waiter] = name
                    pending.add(waiter)
                failure = self._failure(done, exits, restarting, pending)
                if failure is not None:
                    return failure
                self._kill_silent()
                if self.progress and time.monotonic() >= next_progress:
                    self.progress(self.controller, time.monotonic() - started)
                    next_progress = time.monotonic() + self.progress_interval
        finally:
            for task in pending:
                task.cancel()
            await self._settle_restarts(restarting)

    def _failure(
        self,
        done: set[asyncio.Future[Any]],
        exits: dict[Any, str],
        restarting: dict[asyncio.Future[Any], str],
        pending: set[asyncio.Future[Any]],
    ) -> str | None:
        """The run's end if a service died beyond its restart limit; else restarts are scheduled."""
        for task in done:
            name = exits.pop(task, None)
            if name is None:
                continue
            child = self.children[name]
            if child.returncode == 0 and name not in self._killed:
                continue
            note = self._killed.pop(name, "") or child.exit_note
            note = f" ({note})" if note else ""
            why = f"exited with code {child.returncode}{note}"
            try:
                restart = self._restart(name, why)
            except _RestartRefused as exc:
                self.controller.bury(name)  # the final books settle what was on its way to it
                return f"failed {name} {why}{exc.why}"
            restarting[restart] = name
            pending.add(restart)
            self._kill_group_of(name)
        return None

    def _kill_group_of(self, name: str) -> None:
        """Kill the live services restarted together with ``name`` (their deaths come back
        through the watch loop and restart them)."""
        group = self.restarts.group if self.restarts is not None else None
        tag = group(self.children[name].spec) if group is not None else ""
        if not tag or group is None:
            return
        for other, child in self.children.items():
            if other == name or other in self._killed or child.returncode is not None:
                continue
            if group(child.spec) == tag:
                log.warning("%s: killed to restart with %s (group %s)", other, name, tag)
                self._killed[other] = f"restarted with {name}"
                child.signal(signal.SIGKILL)

    def _restart(self, name: str, why: str) -> asyncio.Future[Handle]:
        """Schedule the next incarnation of ``name``.

        Raises:
            _RestartRefused: when it may not have one (no policy, its restart limit within
                the period reached, or ``prepare`` refused).
        """
        policy = self.restarts
        if policy is None:
            raise _RestartRefused("")
        spec = self.children[name].spec
        limit = policy.limit(spec)
        window = self._windows.setdefault(name, RestartWindow(policy.period))
        if not window.admit(time.monotonic(), limit):
            raise _RestartRefused(f"; {window.refusal(limit)}")
        done = self.controller.restarts[name]
        if policy.prepare is not None:
            prepared = policy.prepare(spec, done + 1)
            if prepared is None:
                raise _RestartRefused("")
            spec = prepared
        self.controller.retire(name)
        lived = time.monotonic() - self._born.get(name, time.monotonic())
        delay, self._quick_deaths[name] = restart_delay(
            policy, lived, self._quick_deaths.get(name, 0)
        )
        log.warning(
            "%s %s: restart %d (%d of at most %d within %g s) in %.1f s",
            *(name, why, done + 1, len(window.times), limit, policy.period, delay),
        )

        async def again() -> Handle:
            await asyncio.sleep(delay)
            handle = await self._spawn(spec)
            self._born[name] = time.monotonic()
            return handle

        return asyncio.ensure_future(again())

    def _kill_silent(self) -> None:
        """Declare dead (and kill) every registered service silent for too long."""
        timeout = self.restarts.heartbeat_timeout if self.restarts is not None else None
        if timeout is None:
            return
        now = time.monotonic()
        for name, child in self.children.items():
            record = self.controller.registry.get(name)
            if child.returncode is not None or record is None or name in self._killed:
                continue
            if now - record.last_seen > timeout:
                why = f"declared dead: no heartbeat for {now - record.last_seen:.1f} s"
                log.error("%s %s", name, why)
                self._killed[name] = why
                child.signal(signal.SIGKILL)

    async def _settle_restarts(self, restarting: dict[asyncio.Future[Any], str]) -> None:
        """Restarts cut off by the end of the run: a process already spawned is kept in
        ``children`` so that it is stopped with the others."""
        for task, name in restarting.items():
            await asyncio.wait({task})
            if task.cancelled():  # cut off before its process was spawned
                continue
            if task.exception() is not None:
                log.warning("%s: restart failed: %r", name, task.exception())
                continue
            self.children[name] = task.result()

    async def _stop_all(self, reason: str) -> dict[str, int | None]:
        """Shutdown -> SIGTERM -> SIGKILL; returns every service's exit code."""
        alive = [c for c in self.children.values() if c.returncode is None]
        if alive:
            try:
                await asyncio.wait_for(self.controller.shutdown_all(reason), self.grace)
            except Exception as exc:  # the signals below stop them all the same
                log.warning("Shutdown (%s) did not reach every service: %r", reason, exc)
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                alive = [c for c in alive if c.returncode is None]
                if not alive:
                    break
                if sig is not None:
                    log.warning("sending %s to %s", sig.name, [c.spec.name for c in alive])
                    for child in alive:
                        child.signal(sig)
                await finished_within(asyncio.gather(*(c.wait() for c in alive)), self.grace)
        return {n: c.returncode for n, c in self.children.items()}


async def _ready_or_failed(controller: Controller, ctl_task: asyncio.Task[None]) -> None:
    """Wait for the controller to be ready; raise what it died of if it did not get there."""
    ready = asyncio.create_task(controller.wait_ready())
    await asyncio.wait({ready, ctl_task}, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        ctl_task.result()
        raise ServiceFailed(controller.name, "stopped before it was ready")


def run_launcher(launcher: Launcher) -> LaunchResult:
    """Blocking helper: run ``launcher`` on the configured event loop (uvloop if present)."""
    return run(launcher.run())
