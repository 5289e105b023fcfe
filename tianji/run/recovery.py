"""What a training run does when one of its services dies (``[recovery]``).

The launcher (:class:`~tianji.launch.base.Launcher`) notices a death — the process exited,
or a registered service missed ``missed_heartbeats`` heartbeats and was killed — and asks
the :class:`~tianji.launch.restarts.RestartPolicy` built here whether and how to start it again:

* **actors, inference, buffers, evaluation workers and the parameter service** restart up
  to ``restarts[role]`` times each within any ``period_s`` seconds (a death beyond that
  ends the run, naming the service, the count and the period), after ``backoff * 2**k``
  seconds. A restarted actor gets the current weights from the parameter
  service on subscription; a restarted replay buffer starts empty or from its newest replay
  snapshot (``buffer = "snapshot"``). What the dead incarnation held is counted as
  ``dropped/lost_in_restart`` (:meth:`~tianji.runtime.controller.Controller.retire`), so the run's
  accounting still closes.
* **the learner** ends the run (``learner = "stop"``: every process stops, the CLI exits
  non-zero naming it) or restarts from the newest checkpoint (``learner = "resume"``,
  within ``restarts.learner`` per ``period_s`` as the others); its
  policy version continues from the highest one the run reached, so actors and the
  parameter service accept its weights. K data-parallel learners restart together: the
  death of one kills the others (:attr:`RestartPolicy.group`) and all resume from the
  same checkpoint, so their weights stay identical.
* **the parameter service**'s state is the newest weights: the learner sends them to a new
  incarnation the moment it subscribes (``params_resent``), and the actors' links move to
  it through the controller.

A run that fails still writes its summary (``stop_reason`` naming the failure, the counts
and accounting of that moment) and its last metrics row (:func:`tianji.run.train.train`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol, TextIO

from tianji.launch.restarts import RestartPolicy
from tianji.launch.spec import ServiceSpec
from tianji.rl.checkpoint import CheckpointError, latest_checkpoint, read_checkpoint, replay_file
from tianji.rl.config import RunConfig
from tianji.rl.stats import LearnerStat
from tianji.runtime.controller import Controller
from tianji.runtime.scope import full_name
from tianji.runtime.service import ServiceOptions
from tianji.services.monitor import TrainMonitor

__all__ = ["restart_policy"]

log = logging.getLogger(__name__)


class RestartInputs(Protocol):
    """What a restart reads from the run's plan (:class:`tianji.run.plan.RunPlan`), when
    the service dies: its config and its monitor (set once the run started)."""

    @property
    def config(self) -> RunConfig: ...

    @property
    def monitor(self) -> TrainMonitor | None: ...


def restart_policy(plan: RestartInputs, controller: Controller, out: TextIO) -> RestartPolicy:
    """The restart policy of a planned run (see the module docstring)."""
    recovery = plan.config.recovery

    def prepare(spec: ServiceSpec, k: int) -> ServiceSpec | None:
        role = spec.role
        if role == "learner":
            return _resume_learner(plan, controller, spec, out)
        if role == "buffer":
            return _restart_buffer(plan, spec)
        return spec

    def group(spec: ServiceSpec) -> str:
        return "learners" if spec.role == "learner" and plan.config.learner.count > 1 else ""

    return RestartPolicy(
        limit=lambda spec: recovery.limit(spec.role),
        period=recovery.period_s,
        backoff=recovery.backoff,
        heartbeat_timeout=recovery.missed_heartbeats * ServiceOptions().heartbeat_interval,
        prepare=prepare,
        group=group,
    )


def _resume_learner(
    plan: RestartInputs, controller: Controller, spec: ServiceSpec, out: TextIO
) -> ServiceSpec | None:
    monitor = plan.monitor
    directory = monitor.checkpoint_dir if monitor is not None else None
    who = full_name(getattr(plan, "scope", ""), spec.name)  # a population member's: m1.<name>
    try:
        if monitor is None or directory is None:
            raise CheckpointError("-", "the run writes no checkpoints (no run directory)")
        ckpt = read_checkpoint(latest_checkpoint(directory))
    except CheckpointError as exc:
        print(f"{who} died and cannot resume: {exc}", file=out, flush=True)
        return None
    reached = max(
        (
            hb.counters.get(LearnerStat.LEARNER_UPDATES, 0)
            for hb in controller.heartbeats.values()
            if hb.role == "learner"
        ),
        default=0,
    )
    version = max(ckpt.policy_version, reached)
    monitor.prepare_restore(ckpt, version)
    print(
        f"{who} died: resuming from {ckpt.path.name} (its policy version "
        f"{ckpt.policy_version}; weights published as version {version})",
        file=out,
        flush=True,
    )
    return dataclasses.replace(spec, options={**spec.options, "restore": True})


def _restart_buffer(plan: RestartInputs, spec: ServiceSpec) -> ServiceSpec:
    monitor = plan.monitor
    options = {k: v for k, v in spec.options.items() if k != "restore"}
    if plan.config.recovery.buffer == "snapshot" and monitor is not None:
        directory = monitor.checkpoint_dir
        path = replay_file(directory, spec.name) if directory is not None else None
        if path is not None and path.exists():
            try:
                monitor.replay_resume[spec.name] = read_checkpoint(path)
                options["restore"] = True
            except CheckpointError as exc:
                log.error("%s restarts empty: %s", spec.name, exc)
    return dataclasses.replace(spec, options=options)
