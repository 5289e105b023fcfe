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
import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from tianji.dashboard import add_dashboard_options, launch_plan
from tianji.launch.base import Launcher
from tianji.launch.local import LocalLauncher
from tianji.launch.spec import ServiceSpec
from tianji.rl.algorithm import BufferSpec
from tianji.rl.balance import balance_config
from tianji.rl.checkpoint import Checkpoint, read_checkpoint, replay_file
from tianji.rl.config import RunConfig, to_dict
from tianji.rl.events import CheckpointRequested
from tianji.rl.topics import buffer_name, learner_name
from tianji.run import progress as _progress
from tianji.run.progress import RunFacts, Snapshot, learner_totals, plain_line, take_snapshot
from tianji.run.recovery import restart_policy
from tianji.run.rundir import RunDirectory, RunRecorder, resume_point, write_json_atomic
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.runtime.service import Service
from tianji.services.balancer import (
    Balancer,
    accounting,
    balancer_of,
    dropped_by_reason,
    lag_summary,
)
from tianji.services.common import make_algorithm
from tianji.services.monitor import TrainMonitor

__all__ = ["RunPlan", "TrainMonitor", "build_specs", "train"]

FINAL_CHECKPOINT_S = 8.0
"""How long a cleanly stopping run waits for its last checkpoint (within the launcher's
``grace``)."""


def _binds(transport: str) -> tuple[str, str]:
    """Listen addresses for (the run's services, the controller and monitor).

    The controller and monitor listen on TCP unless everything runs in one process.
    """
    services = {"inproc": "inproc://", "tcp": "tcp://127.0.0.1:0", "shm": "shm://"}[transport]
    return services, "inproc://" if transport == "inproc" else "tcp://127.0.0.1:0"


def build_specs(config: RunConfig, buffer_spec: dict[str, Any]) -> list[ServiceSpec]:
    """One spec per service: params, buffer shards (``buffer.shards``), learners
    (``learner.count``), actors."""
    bind = _binds(config.transport)[0]
    data = to_dict(config)
    specs = [
        ServiceSpec(name="params-0", factory="tianji.services.params:ParamsService", bind=bind)
    ]
    for s in range(config.buffer.shards):
        specs.append(
            ServiceSpec(
                name=buffer_name(s),
                factory="tianji.services.buffer:BufferService",
                options={"config": data, "buffer_spec": buffer_spec, "index": s},
                bind=bind,
            )
        )
    for j in range(config.learner.count):
        specs.append(
            ServiceSpec(
                name=learner_name(j),
                factory="tianji.services.learner:LearnerService",
                options={"config": data, "index": j},
                bind=bind,
            )
        )
    if config.actors.inference == "service":
        specs.append(
            ServiceSpec(
                name="inference-0",
                factory="tianji.services.inference:InferenceService",
                options={"config": data},
                bind=bind,
            )
        )
    for i in range(config.actors.count):
        specs.append(
            ServiceSpec(
                name=f"actor-{i}",
                factory="tianji.services.actor:ActorService",
                options={"config": data, "index": i},
                bind=bind,
            )
        )
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
    recorder: RunRecorder | None = None
    resume: tuple[RunDirectory, Checkpoint] | None = None
    replay_resume: dict[str, Checkpoint] = dataclasses.field(default_factory=dict)
    _last: Snapshot | None = None

    def controller_plugins(self) -> list[Balancer]:
        """What the run's controller runs beside its registry: the balancer."""
        return [Balancer(self.balance)]

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
        spec: BufferSpec = algo.buffer_spec()
        del algo
        fragment_samples = config.actors.fragment_length * config.actors.envs_per_actor
        balance = balance_config(config, spec, fragment_samples)  # validates the mode
        specs = build_specs(config, dataclasses.asdict(spec))
        plan = cls(config, specs, balance, spec.kind == "rollout", out, metrics_path)
        if resume is not None:
            plan.resume = resume_point(resume, config)
            for s in specs:
                if s.factory == "tianji.services.learner:LearnerService":
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
            )
            return [self.monitor]

        return make

    def until(self, controller: Controller) -> bool:
        """The run is done (target, step or time budget): the launcher's ``until``."""
        return self.monitor is not None and self.monitor.done() is not None

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
        final policy (``tianji eval``) and a resume continues exactly where it stopped."""
        monitor = self.monitor
        if monitor is None or monitor.checkpoint_dir is None:
            return
        if not self.config.checkpoint.enabled:
            return
        since = time.monotonic()
        ev = CheckpointRequested(reason=reason)
        waits = []
        beat = controller.heartbeats.get(learner_name(0))
        version = beat.counters.get("learner_updates", 0) if beat is not None else 0
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
        return [s.name for s in self.specs if _buffer(s)]

    def facts(self, services: bool = True) -> RunFacts:
        """What progress snapshots know of the run beyond heartbeats."""
        capacity = sum(s.options["buffer_spec"]["capacity"] for s in self.specs if _buffer(s))
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
    ) -> dict[str, Any]:
        """Record a last snapshot, build the summary and write it (run directory and
        ``summary_path``); close the records."""
        recorder = self.recorder
        try:
            if self.monitor is None:
                raise ServiceFailed("monitor", f"the run ended before it started ({reason})")
            if recorder is not None:  # the services have left: no health row
                self._record(controller, wall, self.facts(services=False))
            summary = summarize(self.config, controller, self.monitor, wall, self.on_policy)
            summary["stop_reason"] = self.monitor.done() or reason
            if backend is not None:
                summary["backend"] = backend
            directory = recorder.directory if recorder is not None else None
            summary["run_dir"] = str(directory.path) if directory is not None else None
            if recorder is not None:
                recorder.write_summary(summary, summary_path)
            elif summary_path:
                write_json_atomic(summary_path, summary)
            return summary
        finally:
            if recorder is not None:
                recorder.close()


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
        ServiceFailed: if a service process fails.
    """
    plan = RunPlan.build(config, out, metrics_path, resume)
    plan.dashboard = dashboard
    launcher = _launcher(backend, plan)
    with plan.recording():
        started = time.monotonic()
        with run_token():
            reason = launch_plan(plan, launcher).reason
        wall = time.monotonic() - started
        return plan.finish(launcher.controller, reason, wall, summary_path, backend)


def _launcher(backend: str, plan: RunPlan) -> Launcher:
    """The launcher of ``backend`` for a planned run (checked before anything starts).

    Raises:
        ConfigError: for an unknown backend, Ray missing, or a transport Ray cannot carry.
    """
    config = plan.config
    control_bind = _binds(config.transport)[1]
    if backend == "local":
        launcher = LocalLauncher(
            plan.specs,
            until=plan.until,
            in_process=config.transport == "inproc",
            controller_bind=control_bind,
            local_services=plan.local_services(control_bind),
            progress=plan.progress,
            progress_interval=2.0,
            before_stop=plan.before_stop,
            plugins=plan.controller_plugins(),
        )
        launcher.restarts = restart_policy(plan, launcher.controller, plan.out)
        return launcher
    if backend != "ray":
        raise ConfigError("backend", backend, "local or ray")
    if config.transport != "tcp":
        raise ConfigError(
            "transport",
            config.transport,
            "tcp with --backend ray (shm reaches one host, inproc one process)",
        )
    from tianji.launch.ray import RayLauncher

    return RayLauncher(
        plan.specs,
        until=plan.until,
        controller_bind=control_bind,
        local_services=plan.local_services(control_bind),
        progress=plan.progress,
        progress_interval=2.0,
        before_stop=plan.before_stop,
        plugins=plan.controller_plugins(),
        address=config.ray.address,
        resources=config.ray,
    )


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


def _sum(controller: Controller, role_prefix: str, key: str) -> int:
    return sum(
        hb.counters.get(key, 0)
        for name, hb in controller.heartbeats.items()
        if name.startswith(role_prefix)
    )


def _buffer(spec: ServiceSpec) -> bool:
    return "buffer_spec" in spec.options


def progress_line(controller: Controller, monitor: TrainMonitor, elapsed: float) -> str:
    """One human-readable progress line (:func:`tianji.run.progress.plain_line`)."""
    return plain_line(take_snapshot(controller, monitor, elapsed))


def metrics_row(
    controller: Controller, monitor: TrainMonitor, elapsed: float, on_policy: bool
) -> dict[str, Any]:
    """One row of the run's metrics file (:func:`tianji.run.progress.metrics_row`)."""
    snap = take_snapshot(controller, monitor, elapsed, RunFacts(on_policy=on_policy))
    return _progress.metrics_row(snap)


def summarize(
    config: RunConfig,
    controller: Controller,
    monitor: TrainMonitor,
    wall: float,
    on_policy: bool = False,
) -> dict[str, Any]:
    """The summary JSON of a finished run (see the README for its keys)."""
    totals = learner_totals(controller)
    env_steps = monitor.env_steps
    here = monitor.env_steps_here  # a resumed run's rates count this part of it only
    resumed = monitor.resume
    start_updates = resumed.policy_version if resumed is not None else 0
    return {
        "algorithm": config.algorithm,
        "env_id": config.env.id,
        "seed": config.seed,
        "mode": config.controller.mode,
        "actors": config.actors.count,
        "envs_per_actor": config.actors.envs_per_actor,
        "transport": config.transport,
        "env_steps": env_steps,
        "env_steps_by_actor": dict(sorted(monitor.env_steps_by_actor.items())),
        "episodes": monitor.episodes,
        "learners": config.learner.count,
        "learner_updates": totals["updates"],
        "wall_s": round(wall, 3),
        "env_steps_per_s": round(here / wall, 1) if wall > 0 else 0.0,
        "startup_s": round(monitor.first_data, 3) if monitor.first_data is not None else None,
        "env_steps_per_s_running": round(monitor.running_rate(), 1),
        "learner_updates_per_s_running": round(
            monitor.running_rate(totals["updates"] - start_updates), 2
        ),
        "samples_produced": _sum(controller, "actor-", "samples_produced"),
        "samples_consumed": totals["consumed"],
        "samples_dropped": dropped_by_reason(controller.heartbeats),
        "final_return": monitor.mean_return(),  # the mean the stop was decided on
        "target_return": config.stop.target_return,
        "time_to_target_s": (
            round(monitor.time_to_target, 3) if monitor.time_to_target is not None else None
        ),
        "env_steps_to_target": monitor.steps_to_target,
        "target_reached_unix": monitor.target_unix,
        "policy_lag": lag_summary(controller.heartbeats),
        "controller": (
            balancer.metrics(controller.heartbeats)
            if (balancer := balancer_of(controller))
            else None
        ),
        "accounting": accounting(controller.heartbeats, on_policy),
        "restarts": dict(sorted(controller.restarts.items())),
        "resumed_from": _resumed(monitor),
        "checkpoints": {
            "written": monitor.counters["checkpoints_written"],
            "errors": monitor.counters["checkpoint_errors"],
            "latest": str(monitor.last_checkpoint) if monitor.last_checkpoint else None,
        },
        "services": {
            name: {
                "role": hb.role,
                "restarts": controller.restarts[name],
                "max_rss_mb": hb.gauges.get("max_rss_mb"),
                "counters": {k: v for k, v in hb.counters.items() if not k.startswith("lag/")},
            }
            for name, hb in sorted(controller.heartbeats.items())
        },
    }


def _resumed(monitor: TrainMonitor) -> dict[str, Any] | None:
    """Where a resumed run continued from (its checkpoint and the counts then)."""
    ckpt = monitor.resume
    if ckpt is None:
        return None
    run = ckpt.run
    return {
        "checkpoint": str(ckpt.path),
        "policy_version": ckpt.policy_version,
        "env_steps": run.get("env_steps"),
        "episodes": run.get("episodes"),
        "elapsed_s": run.get("elapsed_s"),
    }


SHORTCUTS = {
    "env": "env.id",
    "actors": "actors.count",
    "envs_per_actor": "actors.envs_per_actor",
    "transport": "transport",
    "seed": "seed",
    "max_env_steps": "stop.max_env_steps",
    "max_seconds": "stop.max_seconds",
    "target_return": "stop.target_return",
    "mode": "controller.mode",
    "learners": "learner.count",
    "ray_address": "ray.address",
    "run_dir": "run_dir",
}


def add_train_parser(sub: Any) -> None:
    """Add ``tianji train`` to the CLI's subparsers."""
    p = sub.add_parser("train", help="train an algorithm from a TOML run config")
    add_run_options(p, resume=True)
    p.add_argument(
        "--transport", choices=["inproc", "tcp", "shm"], help="inproc: all services in one process"
    )
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="the run's secret token (default: TIANJI_TOKEN, else a fresh one per run)",
    )
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: one process per service here (default); ray: one Ray actor per service",
    )
    p.add_argument(
        "--ray-address", metavar="ADDR", help="Ray cluster to join, e.g. HOST:6379 (ray.address)"
    )
    p.set_defaults(func=_cmd_train)


def add_run_options(p: Any, *, run: bool = True, resume: bool = False) -> None:
    """The config argument and ``--set`` (and with ``run``, the options of a whole run:
    shortcuts, stop conditions, ``--summary``, ``--metrics``, ``--run-dir``) shared by
    ``tianji train``, ``tianji controller`` and ``tianji serve``; with ``resume``,
    ``--resume RUN_DIR`` (and the config may be left out: the run directory's is used)."""
    if resume:
        p.add_argument(
            "config",
            nargs="?",
            help="run config (TOML), e.g. examples/cartpole_ppo.toml "
            "(with --resume: default RUN_DIR/config.json)",
        )
        p.add_argument(
            "--resume",
            metavar="RUN_DIR",
            help="continue this run directory's run from its newest checkpoint",
        )
    else:
        p.add_argument("config", help="run config (TOML), e.g. examples/cartpole_ppo.toml")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set actors.count=4 (repeatable)",
    )
    p.add_argument("--env", help="env id (env.id)")
    p.add_argument("--actors", type=int, help="actor processes (actors.count)")
    p.add_argument("--envs-per-actor", type=int, help="envs per actor")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--mode",
        choices=["relaxed", "sync", "unbalanced"],
        help="controller.mode: relaxed (default), sync (baseline) or unbalanced (no limits)",
    )
    p.add_argument("--learners", type=int, help="data-parallel learners (learner.count)")
    if not run:
        return
    p.add_argument("--max-env-steps", type=int)
    p.add_argument("--max-seconds", type=float)
    p.add_argument(
        "--target-return",
        type=float,
        help="stop when the mean return of the last [stop] window episodes (20) reaches this",
    )
    _add_record_options(p)


def _add_record_options(p: Any) -> None:
    """Where a run's records go: ``--summary``, ``--metrics``, ``--run-dir``."""
    p.add_argument("--summary", metavar="PATH", help="also write the summary JSON here")
    p.add_argument(
        "--metrics", metavar="PATH", help="also write one JSON line of metrics every 2 s here"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--run-dir",
        metavar="PATH",
        help="put the run directory (config, metrics, TensorBoard, summary) under PATH "
        "(run_dir, default runs)",
    )
    where.add_argument(
        "--no-run-dir", action="store_true", help='write no run directory (run_dir = "")'
    )
    add_dashboard_options(p)


def config_from_args(args: Any) -> RunConfig:
    """The run config from ``add_run_options`` arguments (shortcuts become ``--set``)."""
    from tianji.run.config import load_config

    overrides = list(args.set)
    for attr, key in SHORTCUTS.items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    if getattr(args, "no_run_dir", False):
        overrides.append('run_dir=""')
    path = args.config
    resume = getattr(args, "resume", None)
    if path is None:
        if resume is None:
            raise ConfigError("config", None, "a run config (TOML), or --resume RUN_DIR")
        path = str(RunDirectory.existing(resume).config)
    return load_config(path, overrides)


def _cmd_train(args: Any) -> int:
    config = config_from_args(args)
    if args.token_file:
        from tianji.transports._auth import load_token

        os.environ["TIANJI_TOKEN"] = load_token(args.token_file)
    print(
        f"tianji train: {config.algorithm} on {config.env.id}, {config.actors.count} actors x "
        f"{config.actors.envs_per_actor} envs, {config.learner.count} learner(s), "
        f"transport {config.transport}, seed {config.seed}, "
        f"controller {config.controller.mode}, backend {args.backend}",
        flush=True,
    )
    summary = train(
        config,
        summary_path=args.summary,
        metrics_path=args.metrics,
        backend=args.backend,
        dashboard=args.dashboard,
        resume=args.resume,
    )
    print(json.dumps(summary, indent=2))
    return 0
