"""``tianji train``: launch a planned run (locally or on Ray), watch it, and report."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from tianji.dashboard import launch_plan
from tianji.launch.base import Launcher
from tianji.launch.local import LocalLauncher
from tianji.launch.spec import ServiceSpec
from tianji.rl.config import RunConfig
from tianji.run.plan import RunPlan, bind_addresses
from tianji.run.population import PopulationPlan
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.services.devices import resolve_device

__all__ = ["run_token", "train"]

log = logging.getLogger(__name__)


def train(
    config: RunConfig,
    *,
    summary_path: str | None = None,
    metrics_path: str | None = None,
    out: TextIO = sys.stdout,
    backend: str = "local",
    dashboard: str | None = None,
    resume: str | None = None,
) -> dict[str, Any]:
    """Run a training job to its end and return (and optionally write) its summary.

    The run directory (``config.run_dir``, see :mod:`tianji.run.rundir`) gets the resolved
    config, the metrics rows, TensorBoard event files and the summary.

    Args:
        config: the run config.
        summary_path: also write the summary JSON here.
        metrics_path: also write one JSON line of metrics per progress interval here.
        out: where progress goes: a live table on a terminal, else plain lines.
        backend: "local" (one process per service here) or "ray" (one Ray actor per
            service, placed as ``config.ray`` says).
        dashboard: serve the live dashboard at this ``HOST:PORT`` during the run.
        resume: continue the run in this run directory from its newest checkpoint (learner
            state, policy version, env steps, episodes); its records are appended to.

    Raises:
        ConfigError: before any process starts, for any bad setting.
        CheckpointError: when ``resume`` holds no usable checkpoint.
        ServiceFailed: if a service process fails (after the summary, with the failure
            as its ``stop_reason``, and the last metrics row were written).
    """
    plan: RunPlan | PopulationPlan
    if config.population.size > 1:
        plan = PopulationPlan.build(config, out, metrics_path, resume)
    else:
        plan = RunPlan.build(config, out, metrics_path, resume)
    plan.dashboard = dashboard
    launcher = _launcher(backend, plan)
    with plan.recording():
        started = time.monotonic()
        try:
            with run_token():
                reason = launch_plan(plan, launcher).reason
        except ServiceFailed as failure:
            wall = time.monotonic() - started
            _finish_failed(plan, launcher, failure, wall, summary_path, backend)
            raise
        wall = time.monotonic() - started
        return plan.finish(
            launcher.controller, reason, wall, summary_path, backend, launcher.placement
        )


def _finish_failed(
    plan: RunPlan | PopulationPlan,
    launcher: Launcher,
    failure: ServiceFailed,
    wall: float,
    summary_path: str | None,
    backend: str,
) -> None:
    """A failed run still leaves its record: the last metrics row and the summary, whose
    ``stop_reason`` names the failure and whose counters and accounting are those of the
    moment it failed (nothing is written when it failed before the monitor existed)."""
    if plan.monitor is None:
        return
    plan.monitor.fail_run(str(failure))
    try:
        plan.finish(
            launcher.controller, str(failure), wall, summary_path, backend, launcher.placement
        )
    except ServiceFailed as exc:  # finish raises it again after writing; our caller raises
        log.debug("the failed run's record is written: %s", exc)


def _check_devices(config: RunConfig, specs: Sequence[ServiceSpec]) -> None:
    """Every learner and inference service started on this host gets a device it has
    (each checks again where it runs: a Ray node or another host may have others).

    Raises:
        ConfigError: naming the first service and its device this host lacks.
    """
    wanted = {"learner": config.learner.device, "inference": config.inference.device}
    for spec in specs:
        if spec.role in wanted:
            resolve_device(spec.name, wanted[spec.role], index=int(spec.options.get("index", 0)))


def _launcher(backend: str, plan: RunPlan | PopulationPlan) -> Launcher:
    """The launcher of ``backend`` for a planned run (checked before anything starts).

    Raises:
        ConfigError: for an unknown backend, Ray missing, or a transport Ray cannot carry.
    """
    config = plan.config
    control_bind = bind_addresses(config.transport)[1]
    launch = plan.launch_plan(control_bind)
    if backend == "local":
        _check_devices(config, launch.specs)
        return LocalLauncher(launch, in_process=config.transport == "inproc")
    if backend != "ray":
        raise ConfigError("backend", backend, "local or ray")
    if config.transport != "tcp":
        raise ConfigError(
            "transport",
            config.transport,
            "tcp with --backend ray (shm reaches one host, inproc one process)",
        )
    from tianji.launch.ray import RayLauncher

    return RayLauncher(launch, address=config.ray.address, resources=config.ray)


@contextlib.contextmanager
def run_token() -> Iterator[str]:
    """The run's secret token in ``TIANJI_TOKEN`` (inherited by every service process):
    the caller's when set, else a fresh one for this run. Every TCP link proves it."""
    given = os.environ.get("TIANJI_TOKEN")
    if given:
        yield given
        return
    token = secrets.token_hex(32)
    os.environ["TIANJI_TOKEN"] = token
    try:
        yield token
    finally:
        os.environ.pop("TIANJI_TOKEN", None)
