"""``tianji train``: validate a run config, launch the services, watch, summarize.

Everything that can be wrong with a config (keys, algorithm, env id, spaces) is found
here, before any process starts. The run is watched by a :class:`TrainMonitor` service
in the launcher's process (it subscribes to the actors' :class:`EpisodesFinished`), which
also decides when the run is done: target return, env-step budget or time budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

from tianji.launch.base import LaunchPlan
from tianji.launch.spec import ServiceSpec
from tianji.rl.algorithm import BufferSpec
from tianji.rl.checkpoint import Checkpoint, read_checkpoint, replay_file
from tianji.rl.config import RunConfig, to_dict
from tianji.rl.events import TakeCheckpoint
from tianji.rl.run_balance import balance_config
from tianji.rl.selfplay import fixed_opponent
from tianji.rl.stats import LearnerStat
from tianji.rl.topics import buffer_name, inference_name, learner_name
from tianji.run import progress as _progress
from tianji.run.progress import RunFacts, Snapshot, take_snapshot
from tianji.run.recovery import restart_policy
from tianji.run.rundir import RunDirectory, RunRecorder, resume_point, write_json_atomic
from tianji.run.summary import summarize
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ServiceFailed
from tianji.runtime.service import Service
from tianji.services.balancer import Balancer, balancer_of
from tianji.services.common import make_algorithm
from tianji.services.drain import drain
from tianji.services.league import LeagueService, selfplay_summary
from tianji.services.monitor import TrainMonitor

__all__ = ["RunPlan", "TrainMonitor", "bind_addresses", "build_specs"]

log = logging.getLogger("tianji.run")

DRAIN_S = 3.0
"""How long a cleanly stopping run waits for nothing to be in flight (within ``grace``)."""
FINAL_CHECKPOINT_S = 8.0
"""How long a cleanly stopping run waits for its last checkpoint (within the launcher's
``grace``)."""


def _warn_lag_capped(balance: Any) -> None:
    """Say so when the rollout buffer is too small for the lag the controller may allow
    (it never grants more fragments than the buffer holds)."""
    if not (balance.on_policy and balance.buffer_fragments):
        return
    target = balance.target
    needed = balance.batch_fragments * (target + 1)
    if balance.buffer_fragments < needed:
        reached = max(0, balance.buffer_fragments // balance.batch_fragments - 1)
        log.warning(
            "controller.lag_target %d needs a rollout buffer of %d fragments "
            "(algo.buffer_capacity); it holds %d, so the policy lag stays at most about %d",
            target, needed, balance.buffer_fragments, reached,
        )  # fmt: skip


def bind_addresses(transport: str) -> tuple[str, str]:
    """Listen addresses for (the run's services, the controller and monitor).

    The controller and monitor listen on TCP unless everything runs in one process.
    """
    services = {"inproc": "inproc://", "tcp": "tcp://127.0.0.1:0", "shm": "shm://"}[transport]
    return services, "inproc://" if transport == "inproc" else "tcp://127.0.0.1:0"


def build_specs(config: RunConfig, buffer_spec: dict[str, Any]) -> list[ServiceSpec]:
    """One spec per service: params, buffer shards (``buffer.shards``), learners
    (``learner.count``), inference services, actors, evaluation workers (``eval.workers``)."""
    bind = bind_addresses(config.transport)[0]
    data = to_dict(config)
    league = config.selfplay
    snapshots = (
        {"snapshot_every": league.snapshot_every, "pool_size": league.pool_size}
        if config.env.api == "two_player"
        else {}
    )  # self-play: the parameter service takes the league's snapshots
    specs = [
        ServiceSpec(
            name="params-0",
            role="params",
            factory="tianji.services.params:ParamsService",
            options=snapshots,
            bind=bind,
        )
    ]

    def add(name: str, role: str, factory: str, index: int, **more: Any) -> None:
        options = {"config": data, **more, "index": index}
        specs.append(ServiceSpec(name=name, role=role, factory=factory, options=options, bind=bind))

    for s in range(config.buffer.shards):
        buffer = "tianji.services.buffer:BufferService"
        add(buffer_name(s), "buffer", buffer, s, buffer_spec=buffer_spec)
    for j in range(config.learner.count):
        add(learner_name(j), "learner", "tianji.services.learner:LearnerService", j)
    if config.actors.inference == "service":
        for k in range(config.inference.count):
            inference = "tianji.services.inference:InferenceService"
            add(inference_name(k), "inference", inference, k)
    for i in range(config.actors.count):
        add(f"actor-{i}", "actor", "tianji.services.actor:ActorService", i)
    for k in range(config.eval.workers):
        add(f"eval-{k}", "eval", "tianji.services.evaluator:EvalService", k)
    return specs


@dataclasses.dataclass(slots=True)
class RunPlan:
    """A validated run: its services, balance settings and the watching of it.

    ``train`` launches the services itself; ``tianji controller`` waits for them to be
    started by hand (``tianji serve``) on other hosts. Both watch the run the same way.
    """

    config: RunConfig
    specs: list[ServiceSpec]
    balance: Any
    on_policy: bool
    out: TextIO
    metrics_path: str | None = None
    dashboard: str | None = None  # HOST:PORT of the live dashboard, None: no dashboard
    monitor: TrainMonitor | None = None
    league: LeagueService | None = None
    """Self-play runs' league (``[env] api = "two_player"``), beside the monitor."""
    recorder: RunRecorder | None = None
    resume: tuple[RunDirectory, Checkpoint] | None = None
    replay_resume: dict[str, Checkpoint] = dataclasses.field(default_factory=dict)
    scope: str = ""
    """A population member's scope (``m0``, ...; :mod:`tianji.run.population`), "" else."""
    _last: Snapshot | None = None
    _joined_at: float | None = None  # monotonic time every service was first registered
    _all_up_at: float | None = None  # the same, in seconds on the monitor's clock

    def controller_plugins(self) -> list[Balancer]:
        """What the run's controller runs beside its registry: the balancer."""
        return [Balancer(self.balance)]

    def launch_plan(self, controller_bind: str) -> LaunchPlan:
        """What a launcher needs to run this plan, with its controller at
        ``controller_bind`` (the same for every backend)."""
        return LaunchPlan(
            specs=self.specs,
            until=self.until,
            controller_bind=controller_bind,
            local_services=self.local_services(controller_bind),
            progress=self.progress,
            progress_interval=2.0,
            before_stop=self.before_stop,
            plugins=self.controller_plugins(),
            restarts=lambda controller: restart_policy(self, controller, self.out),
        )

    @classmethod
    def build(
        cls,
        config: RunConfig,
        out: TextIO = sys.stdout,
        metrics_path: str | None = None,
        resume: str | None = None,
    ) -> RunPlan:
        """Validate everything (keys, algorithm, env id, spaces, mode) and plan the run;
        with ``resume`` (a run directory), plan it to continue from its newest checkpoint.

        Raises:
            ConfigError: for any bad setting, before any process starts.
            CheckpointError: when ``resume`` holds no usable checkpoint.
        """
        algo = make_algorithm(config, seed=config.seed, device="cpu")  # validates everything
        if config.env.api == "two_player":  # the fixed opponents evaluation will play
            for name in config.selfplay.eval_opponents:
                fixed_opponent(name, seed=0)
            for name in config.selfplay.train_opponents:
                fixed_opponent(name, seed=0, key="selfplay.train_opponents")
        spec: BufferSpec = algo.buffer_spec()
        del algo
        balance = balance_config(config, spec)  # validates the mode
        _warn_lag_capped(balance)
        specs = build_specs(config, dataclasses.asdict(spec))
        plan = cls(config, specs, balance, spec.kind == "rollout", out, metrics_path)
        if resume is not None:
            plan.resume = resume_point(resume, config)
            for s in specs:
                if s.role == "learner":
                    s.options["restore"] = True
            plan._plan_replay_resume()
        return plan

    def _plan_replay_resume(self) -> None:
        """A resumed run's replay shards start from their snapshots, where there are any."""
        assert self.resume is not None
        directory = self.resume[0].checkpoints
        for s in self.specs:
            if s.name not in self.replay_buffers():
                continue
            path = replay_file(directory, s.name)
            if path.exists():
                self.replay_resume[s.name] = read_checkpoint(path)
                s.options["restore"] = True
            else:
                print(f"resume: {s.name} starts empty (no {path.name})", file=self.out)

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The checkpoint a resumed run continues from."""
        return self.resume[1] if self.resume is not None else None

    def local_services(self, bind: str, advertise: str = "") -> Callable[[str], list[Service]]:
        """The launcher's ``local_services``: the run's monitor, bound at ``bind``."""

        def make(controller_address: str) -> list[Service]:
            directory = self.recorder.directory if self.recorder is not None else None
            config = self.config
            self.monitor = TrainMonitor(
                "monitor",
                stop=config.stop,
                checkpoints=directory.checkpoints if directory is not None else None,
                keep=config.checkpoint.keep,
                identity={"algorithm": config.algorithm, "env_id": config.env.id},
                resume=self.checkpoint,
                replay=self.replay_buffers(),
                replay_resume=self.replay_resume,
                restorable=config.recovery.learner == "resume"
                or config.recovery.buffer == "snapshot",
                bind=bind,
                controller=controller_address,
                advertise=advertise or None,
                scope=self.scope,
            )
            if config.env.api != "two_player":
                return [self.monitor]
            self.league = LeagueService(
                "league",
                settings=config.selfplay,
                record=directory.path / "league.jsonl" if directory is not None else None,
                bind=bind,
                controller=controller_address,
                advertise=advertise or None,
            )
            return [self.monitor, self.league]

        return make

    def until(self, controller: Controller) -> bool:
        """The run is done (target, step or time budget, or a start that never came, see
        ``[stop] start_timeout``): the launcher's ``until``."""
        if self.monitor is None:
            return False
        if self._all_up_at is None:
            self._note_all_up(controller, self.monitor)
        self._check_start(controller, self.monitor)
        return self.monitor.done() is not None

    def _note_all_up(self, controller: Controller, monitor: TrainMonitor) -> None:
        """Note when every planned service was first registered (the summary's
        ``all_up_s``, on the monitor's clock as ``time_to_target_s``)."""
        registry = controller.registry
        if len(registry) >= len(self.specs) and all(s.name in registry for s in self.specs):
            self._all_up_at = time.monotonic() - monitor.started

    def _check_start(self, controller: Controller, monitor: TrainMonitor) -> None:
        """Fail the run when no env step arrived ``start_timeout`` s after all joined."""
        timeout = self.config.stop.start_timeout
        # (first_data: set by the first fragment's report; O(1) on every heartbeat)
        if timeout <= 0 or monitor.first_data is not None or monitor.run_failure is not None:
            return
        now = time.monotonic()
        if self._joined_at is None:  # (checked on every heartbeat: the count first)
            registry = controller.registry
            if len(registry) >= len(self.specs) and all(s.name in registry for s in self.specs):
                self._joined_at = now
            return
        if now - self._joined_at < timeout:
            return
        down = controller.failing_links()
        why = (
            f"links that never came up: {_progress.links_down_text(down)}"
            if down
            else "no link reports a failure; see the actors' logs"
        )
        monitor.fail_run(f"failed: no env step {timeout:g} s after every service joined ({why})")

    @contextlib.contextmanager
    def recording(self) -> Iterator[RunRecorder]:
        """The run's records (run directory, metrics rows, TensorBoard, progress display)
        for the length of the run, closed on every way out (errors, Ctrl-C).

        Raises:
            ConfigError: when the run directory cannot be created (before anything starts).
        """
        ckpt = self.checkpoint
        resume = None
        if self.resume is not None and ckpt is not None:
            resume = (self.resume[0], int(ckpt.run.get("env_steps", 0)))
        self.recorder = RunRecorder.open(self.config, self.out, self.metrics_path, resume)
        try:
            yield self.recorder
        finally:
            self.recorder.close()

    async def before_stop(self, controller: Controller, reason: str) -> None:
        """Before a clean stop: ask learner-0 for a last checkpoint (and the replay shards
        for their snapshots, ``[checkpoint] replay``) and wait (at most
        ``FINAL_CHECKPOINT_S``) until the monitor wrote them, so the run directory holds the
        final policy (``tianji eval``) and a resume continues exactly where it stopped.

        First the run drains (:func:`tianji.services.drain.drain`, at most ``DRAIN_S``):
        producers paused, learners frozen, until nothing is in flight between services,
        so the final books have ``in_flight == 0`` or name what was left and why."""
        balancer = balancer_of(controller)
        if balancer is not None:
            balancer.drained = await drain(controller, balancer, DRAIN_S)
        monitor = self.monitor
        if monitor is None or monitor.checkpoint_dir is None:
            return
        if not self.config.checkpoint.enabled:
            return
        since = time.monotonic()
        ev = TakeCheckpoint(reason=reason)
        waits = []
        beat = controller.heartbeats.get(learner_name(0))
        version = beat.counters.get(LearnerStat.LEARNER_UPDATES, 0) if beat is not None else 0
        newer = version > max(monitor.checkpoint_version, 0)
        if newer and await controller.command(learner_name(0), ev):
            waits.append(monitor.wait_checkpoint(version, FINAL_CHECKPOINT_S))
        asked = [b for b in self.replay_buffers() if await controller.command(b, ev)]
        if asked:
            waits.append(monitor.wait_replay(asked, since, FINAL_CHECKPOINT_S))
        if not all(await asyncio.gather(*waits)):
            print(
                f"no final checkpoint: not written within {FINAL_CHECKPOINT_S} s"
                f" (the newest is at version {monitor.checkpoint_version})",
                file=self.out,
                flush=True,
            )

    def replay_buffers(self) -> list[str]:
        """The buffer shards that snapshot their replay contents (``[checkpoint] replay``)."""
        if not self.config.checkpoint.replay or self.on_policy:
            return []
        return [s.name for s in self.specs if s.role == "buffer"]

    def facts(self, services: bool = True) -> RunFacts:
        """What progress snapshots know of the run beyond heartbeats."""
        capacity = sum(
            s.options["buffer_spec"]["capacity"] for s in self.specs if s.role == "buffer"
        )
        names = tuple(s.name for s in self.specs) if services else ()
        ckpt = self.checkpoint
        return RunFacts(
            services=names,
            buffer_capacity=capacity,
            on_policy=self.on_policy,
            start_env_steps=int(ckpt.run.get("env_steps", 0)) if ckpt is not None else 0,
            start_updates=ckpt.policy_version if ckpt is not None else 0,
        )

    def progress(self, controller: Controller, elapsed: float) -> None:
        """Snapshot the run; show it, write its metrics row and TensorBoard scalars."""
        if self.monitor is None:
            return
        if self.recorder is None:  # watched outside recording(): no run directory
            self.recorder = RunRecorder(_progress.make_display(self.out), None, self.metrics_path)
        self._record(controller, elapsed, self.facts())

    def _record(self, controller: Controller, elapsed: float, facts: RunFacts) -> None:
        assert self.monitor is not None and self.recorder is not None
        snap = take_snapshot(controller, self.monitor, elapsed, facts, self._last)
        self.recorder.record(snap)
        self._last = snap

    def finish(
        self,
        controller: Controller,
        reason: str,
        wall: float,
        summary_path: str | None,
        backend: str | None = None,
        placement: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Record a last snapshot, build the summary and write it (run directory and
        ``summary_path``); close the records. ``placement``: the node (IP) each service
        ran on, where the launcher knows it (Ray)."""
        recorder = self.recorder
        try:
            if self.monitor is None:
                raise ServiceFailed("monitor", f"the run ended before it started ({reason})")
            if recorder is not None:  # the services have left: no health row
                self._record(controller, wall, self.facts(services=False))
            summary = summarize(self.config, controller, self.monitor, wall, self.on_policy)
            summary["stop_reason"] = self.monitor.done() or reason
            if self.league is not None:
                summary["selfplay"] = selfplay_summary(self.league, self.monitor)
            up = self._all_up_at
            summary["all_up_s"] = round(up, 3) if up is not None else None
            if backend is not None:
                summary["backend"] = backend
            if placement:
                summary["placement"] = dict(placement)
            directory = recorder.directory if recorder is not None else None
            summary["run_dir"] = str(directory.path) if directory is not None else None
            if recorder is not None:
                recorder.write_summary(summary, summary_path)
            elif summary_path:
                write_json_atomic(summary_path, summary)
            if self.monitor.run_failure is not None:  # written first: a failed run can be read
                raise ServiceFailed("run", self.monitor.run_failure)
            return summary
        finally:
            if recorder is not None:
                recorder.close()
