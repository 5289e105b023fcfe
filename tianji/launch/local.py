"""Run a graph of services as separate processes on this machine.

The launcher runs the controller in its own event loop, spawns one fresh Python process
per service (``subprocess``, never ``fork``; the spec travels as JSON on stdin), and
watches them. The run ends when ``until(controller)`` holds, when a child dies (the
others are stopped and :class:`ServiceFailed` is raised), on Ctrl-C / SIGTERM, or on
timeout. In every case every child is stopped: Shutdown first, then SIGTERM, then SIGKILL.

Usage::

    specs = [ServiceSpec(name="producer-0", factory="tianji.run.demo:Producer", options={...}), ...]
    launcher = LocalLauncher(specs, until=lambda c: "consumer-0" in c.reports, timeout=120)
    result = run_local(launcher)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from tianji.launch.base import (
    Handle,
    Launcher,
    LaunchPlan,
    LaunchResult,
    Progress,
    ServiceTask,
    run_launcher,
)
from tianji.launch.spec import ServiceSpec, build_service
from tianji.runtime.controller import Controller
from tianji.runtime.service import ServiceStat

__all__ = ["LaunchResult", "LocalLauncher", "print_progress", "run_local"]

log = logging.getLogger("tianji.launch")


class _Process:
    """A service running in a child process."""

    def __init__(self, spec: ServiceSpec, proc: asyncio.subprocess.Process) -> None:
        self.spec = spec
        self.proc = proc
        self.exit_note = ""

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def wait(self) -> int | None:
        return await self.proc.wait()

    def signal(self, sig: signal.Signals) -> None:
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError as exc:  # it has exited already
            log.debug("%s: %s: %r", self.spec.name, sig.name, exc)


class LocalLauncher(Launcher):
    """See the module docstring; the watch and stop logic is :class:`Launcher`'s.

    Args:
        plan: the services to start (one process each) and how: a
            :class:`~tianji.launch.base.LaunchPlan`, or the specs and its fields as keyword
            arguments (as for :class:`~tianji.launch.base.Launcher`).
        in_process: run every service as a task in this loop instead of a process each
            (with ``inproc://`` binds this is the one-process debugging mode).
    """

    def __init__(
        self,
        plan: LaunchPlan | Sequence[ServiceSpec],
        *,
        in_process: bool = False,
        **fields: Any,
    ) -> None:
        super().__init__(plan, **fields)
        self.in_process = in_process

    async def _spawn(self, spec: ServiceSpec) -> Handle:
        if self.in_process:
            return ServiceTask(spec, build_service(spec))
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
        log.info("started %s (pid %d)", spec.name, proc.pid)
        return _Process(spec, proc)


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
            count = hb.counters.get(ServiceStat.PUBLISHED, 0) or hb.counters.get(
                ServiceStat.RECEIVED, 0
            )
            then, before = last.get(name, (hb.sent_at, count))
            rate = (count - before) / (hb.sent_at - then) if hb.sent_at > then else 0.0
            last[name] = (hb.sent_at, count)
            parts.append(f"{name}: {count} events ({rate:,.0f}/s)")
        print(f"[{elapsed:6.1f}s] " + " | ".join(parts), file=stream, flush=True)

    return show


def run_local(launcher: Launcher) -> LaunchResult:
    """Blocking helper: run ``launcher`` on the configured event loop (uvloop if present)."""
    return run_launcher(launcher)
