"""The run's monitor: follows episodes and env steps, says when the run is done, writes
checkpoints into the run directory and hands a resumed run's state to its learners.

It runs beside the controller (in ``tianji train``'s or ``tianji controller``'s process),
where the run directory is, so a learner on another host checkpoints into it too: the
learner publishes its packed state (:class:`~tianji.runtime.events.CheckpointTaken`) and the
monitor adds the run's counters and writes the file (:mod:`tianji.rl.checkpoint`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tianji.rl.checkpoint import Checkpoint, prune_checkpoints, replay_file, write_checkpoint
from tianji.rl.events import (
    CheckpointTaken,
    EpisodesFinished,
    PolicyEvaluated,
    RestoreCheckpoint,
)
from tianji.rl.stats import MonitorStat
from tianji.rl.topics import (
    CHECKPOINTS,
    EPISODES,
    EVALUATIONS,
    RESTORE,
    replay_restore_topic,
    replay_snapshots_topic,
)
from tianji.runtime.core import Connection
from tianji.runtime.service import Service

__all__ = ["TrainMonitor", "newest_evaluation"]

log = logging.getLogger(__name__)


def newest_evaluation(monitor: object) -> dict[str, Any] | None:
    """A monitor's newest evaluation (:attr:`TrainMonitor.evaluations`), ``None`` before
    one, or for a monitor that keeps none (a benchmark's or a test's stand-in)."""
    evaluations = getattr(monitor, "evaluations", None)
    return dict(evaluations[-1]) if evaluations else None


class TrainMonitor(Service):
    """Follows training episodes and env steps; says when the run is done.

    Args:
        stop: the run's ``StopConfig``.
        checkpoints: write the learner's checkpoints into this directory (none: ignore).
        keep: newest checkpoints kept there.
        identity: ``algorithm`` and ``env_id`` written into every checkpoint.
        resume: the checkpoint a resumed run continues from: its env steps, episodes,
            recent returns and elapsed time are where the counts start, and every learner
            that subscribes gets its state (:class:`~tianji.runtime.events.RestoreCheckpoint`).
        replay: the replay buffer shards whose snapshots to write (``[checkpoint] replay``).
        replay_resume: a resumed run's replay snapshots, by buffer, sent to each shard.
        restorable: learners (``recovery.learner = "resume"``) and the ``replay`` shards
            (``recovery.buffer = "snapshot"``) may be restarted from checkpoints during the
            run: the restore topics exist from the start (:meth:`prepare_restore`).
    """

    role = "monitor"

    def __init__(
        self,
        name: str,
        *,
        stop: Any,
        checkpoints: Path | None = None,
        keep: int = 3,
        identity: dict[str, str] | None = None,
        resume: Checkpoint | None = None,
        replay: Sequence[str] = (),
        replay_resume: dict[str, Checkpoint] | None = None,
        restorable: bool = False,
        **kwargs: Any,
    ) -> None:
        self.replay_resume = dict(replay_resume or {})
        topics = [RESTORE] if resume is not None or restorable else []
        shards = set(self.replay_resume) | (set(replay) if restorable else set())
        topics += [replay_restore_topic(b) for b in sorted(shards)]
        super().__init__(name, publishes=topics, **kwargs)
        self.stop_config = stop
        self.started = time.monotonic()
        self.returns: collections.deque[float] = collections.deque(maxlen=stop.window)
        self.resume = resume
        self.restore = resume  # what a (re)starting learner continues from ...
        self.restore_version = resume.policy_version if resume is not None else 0  # ... as
        self.env_steps_by_actor: dict[str, int] = {}
        self.episodes = 0
        self._continue_books(resume)
        self.first_data: float | None = None  # seconds until the first fragment arrived
        self.time_to_target: float | None = None
        self.target_unix: float | None = None  # wall clock when the target was reached
        self.stopped: tuple[float, int] | None = None  # (seconds, env steps) at the stop
        self.steps_to_target: int | None = None
        self.return_at_stop: float | None = None  # the moving mean when the stop was decided
        self.run_failure: str | None = None  # why the run failed (see fail_run)
        self.checkpoint_dir = checkpoints
        self.keep = keep
        self.identity = identity or {}
        self.last_checkpoint: Path | None = None
        self.checkpoint_version = -1  # of the newest checkpoint written
        self.latest_state: tuple[int, bytes] | None = None  # (version, packed) of the newest
        self._written = asyncio.Event()  # set (and cleared) at every checkpoint written
        self.evaluations: collections.deque[dict[str, Any]] = collections.deque(maxlen=1000)
        """The newest evaluations (``[eval] workers``), oldest first: ``policy_version``,
        ``mean``, ``std``, ``episodes``, ``env_steps`` (of training, when it arrived),
        ``t`` (seconds into the run) and ``worker``."""
        self.subscribe(EPISODES, self.on_episodes)
        self.subscribe(EVALUATIONS, self.on_evaluation)
        self.replay_written: dict[str, float] = {}  # buffer -> monotonic time of its last
        if checkpoints is not None:
            self.subscribe(CHECKPOINTS, self.on_checkpoint)
            for buffer in replay:
                self.subscribe(replay_snapshots_topic(buffer), self._replay_writer(buffer))

    def _continue_books(self, resume: Checkpoint | None) -> None:
        """The run's books so far: zero, or a resumed run's from its checkpoint."""
        self.retired_env_steps = 0  # env steps of actors' earlier incarnations
        self.start_env_steps = 0  # env steps before this run (a resumed run's checkpoint)
        self.elapsed_before = 0.0  # seconds of the run before this part of it
        if resume is not None:
            run = resume.run
            self.start_env_steps = int(run.get("env_steps", 0))
            self.episodes = int(run.get("episodes", 0))
            self.elapsed_before = float(run.get("elapsed_s", 0.0))
            self.returns.extend(float(r) for r in run.get("returns", []))

    def restart_clock(self) -> None:
        """Count the run's time from now (a deployment by hand starts its clock once every
        service has joined, not while the services are still being started)."""
        self.started = time.monotonic()

    @property
    def env_steps(self) -> int:
        """Env steps of the whole run (a resumed run counts on from its checkpoint)."""
        return self.start_env_steps + self.env_steps_here

    @property
    def env_steps_here(self) -> int:
        """Env steps since this process started the run (or resumed it)."""
        return self.retired_env_steps + sum(self.env_steps_by_actor.values())

    def prepare_restore(self, checkpoint: Checkpoint, version: int) -> None:
        """A learner restarted during the run continues from ``checkpoint``, publishing as
        ``version`` (at least the highest version the run reached, so that the parameter
        service and the actors take its weights as the newest)."""
        self.restore = checkpoint
        self.restore_version = version

    def mean_return(self) -> float | None:
        """The moving mean of the last ``window`` returns; once the stop is decided, the
        mean it was decided on (episodes that end while the services stop do not move it)."""
        if self.stopped is not None:
            return self.return_at_stop
        return float(np.mean(self.returns)) if self.returns else None

    async def on_episodes(self, ev: EpisodesFinished) -> None:
        if self.first_data is None:
            self.first_data = time.monotonic() - self.started
        before = self.env_steps_by_actor.get(ev.actor, 0)
        if ev.env_steps <= before:  # a new incarnation of the actor counts from 0 again
            self.retired_env_steps += before
        self.env_steps_by_actor[ev.actor] = ev.env_steps
        self.returns.extend(ev.returns.tolist())
        self.episodes += int(ev.returns.size)
        mean = self.mean_return()
        if mean is None or not ev.returns.size:
            return
        full = len(self.returns) == self.returns.maxlen
        if self.stop_config.on == "train" and full:
            self._check_target(mean)

    async def on_evaluation(self, ev: PolicyEvaluated) -> None:
        returns = np.asarray(ev.returns, np.float64)
        if not returns.size:
            return
        mean = float(returns.mean())
        entry = {
            "policy_version": int(ev.policy_version),
            "mean": mean,
            "std": float(returns.std()),
            "episodes": int(returns.size),
            "env_steps": self.env_steps,
            "t": round(time.monotonic() - self.started + self.elapsed_before, 3),
            "worker": ev.worker,
        }
        if ev.opponent:  # self-play: games against a fixed opponent, outcomes +1/0/-1
            entry.update(
                opponent=ev.opponent,
                win=float((returns > 0).mean()),
                draw=float((returns == 0).mean()),
                loss=float((returns < 0).mean()),
            )
        self.evaluations.append(entry)
        if self.stop_config.on == "eval":
            self._check_target(mean)

    def eval_return(self) -> float | None:
        """Mean return of the newest evaluation (``None`` before one)."""
        return self.evaluations[-1]["mean"] if self.evaluations else None

    def eval_policy_version(self) -> int | None:
        """The policy version of the newest evaluation (``None`` before one)."""
        return self.evaluations[-1]["policy_version"] if self.evaluations else None

    def _check_target(self, mean: float) -> None:
        """Record the moment the target is reached, by ``mean`` (training's moving mean or
        an evaluation's, as ``[stop] on`` says)."""
        target = self.stop_config.target_return
        if target is not None and self.time_to_target is None and mean >= target:
            self.time_to_target = time.monotonic() - self.started
            self.target_unix = time.time()
            self.steps_to_target = self.env_steps

    async def on_checkpoint(self, ev: CheckpointTaken) -> None:
        """Write learner-0's state with the run's counters now; keep the newest ``keep``.
        A write that fails (disk full, permissions) is logged and counted, and the run goes
        on: the previous checkpoints stay."""
        assert self.checkpoint_dir is not None
        meta = {
            "policy_version": ev.policy_version,
            **self.identity,
            "unix": time.time(),
            "run": {
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "elapsed_s": round(self.elapsed_before + time.monotonic() - self.started, 3),
                "returns": list(self.returns),
            },
        }
        state = ev.state.tobytes()
        self.latest_state = (ev.policy_version, state)
        try:
            path = await asyncio.to_thread(write_checkpoint, self.checkpoint_dir, state, meta)
            await asyncio.to_thread(prune_checkpoints, self.checkpoint_dir, self.keep)
        except OSError as exc:
            self.counters[MonitorStat.CHECKPOINT_ERRORS] += 1
            log.error("checkpoint at version %d not written: %s", ev.policy_version, exc)
            return
        self.last_checkpoint = path
        self.checkpoint_version = ev.policy_version
        self._written.set()
        self._written.clear()
        self.counters[MonitorStat.CHECKPOINTS_WRITTEN] += 1
        self.gauges["checkpoint_version"] = float(ev.policy_version)
        self.report_soon()

    def _replay_writer(self, buffer: str) -> Any:
        async def on_snapshot(ev: CheckpointTaken) -> None:
            await self.on_replay_snapshot(buffer, ev)

        return on_snapshot

    async def on_replay_snapshot(self, buffer: str, ev: CheckpointTaken) -> None:
        """Write a buffer shard's replay snapshot over its previous one (atomically)."""
        assert self.checkpoint_dir is not None
        meta = {"policy_version": ev.policy_version, "buffer": buffer, "unix": time.time()}
        name = replay_file(self.checkpoint_dir, buffer).name
        try:
            await asyncio.to_thread(
                write_checkpoint, self.checkpoint_dir, ev.state.tobytes(), meta, name
            )
        except OSError as exc:
            self.counters[MonitorStat.CHECKPOINT_ERRORS] += 1
            log.error("replay snapshot of %s not written: %s", buffer, exc)
            return
        self.replay_written[buffer] = time.monotonic()
        self.counters["replay_snapshots_written"] += 1
        self._written.set()
        self._written.clear()

    async def wait_replay(self, buffers: Sequence[str], since: float, timeout: float) -> bool:
        """Wait until every buffer in ``buffers`` had a snapshot written after ``since``."""
        written = self.replay_written
        return await self._wait_written(
            lambda: all(written.get(b, -1.0) >= since for b in buffers), timeout
        )

    async def wait_checkpoint(self, version: int, timeout: float) -> bool:
        """Wait until a checkpoint of at least ``version`` is written (or ``timeout``)."""
        return await self._wait_written(lambda: self.checkpoint_version >= version, timeout)

    async def _wait_written(self, done: Callable[[], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done():
            left = deadline - loop.time()
            if left <= 0:
                return False
            waiter = asyncio.ensure_future(self._written.wait())
            await asyncio.wait({waiter}, timeout=left)
            waiter.cancel()
        return True

    async def on_subscribed(self, conn: Connection, topics: Sequence[str]) -> None:
        if RESTORE in topics and self.restore is not None:
            state = np.frombuffer(self.restore.state, np.uint8)
            ev = RestoreCheckpoint(policy_version=self.restore_version, state=state)
            await self.send_to_subscriber(conn, ev, RESTORE)
            self.counters["restores_sent"] += 1
        for buffer, snapshot in self.replay_resume.items():
            topic_name = replay_restore_topic(buffer)
            if topic_name in topics:
                state = np.frombuffer(snapshot.state, np.uint8)
                ev = RestoreCheckpoint(policy_version=snapshot.policy_version, state=state)
                await self.send_to_subscriber(conn, ev, topic_name)
                self.counters["replay_restores_sent"] += 1

    def done(self) -> str | None:
        """Why the run should stop now, or ``None``; the first time it says so, the run's
        length and env steps are recorded (:attr:`stopped`), before shutdown."""
        reason = self._why_done()
        if reason is not None and self.stopped is None:
            self.return_at_stop = self.mean_return()
            self.stopped = (time.monotonic() - self.started, self.env_steps_here)
        return reason

    def fail_run(self, reason: str) -> None:
        """End the run as failed: :meth:`done` says ``reason`` from now on (the first
        failure is kept) and the run's summary is written before the run reports it."""
        if self.run_failure is None:
            log.error("the run fails: %s", reason)
            self.run_failure = reason

    def _why_done(self) -> str | None:
        cfg = self.stop_config
        if self.run_failure is not None:
            return self.run_failure
        if self.time_to_target is not None:
            return "target_return reached" + (" (eval)" if cfg.on == "eval" else "")
        if cfg.max_env_steps is not None and self.env_steps >= cfg.max_env_steps:
            return "max_env_steps reached"
        if cfg.max_seconds is not None and time.monotonic() - self.started >= cfg.max_seconds:
            return "max_seconds reached"
        return None

    def running_rate(self, count: int | None = None) -> float:
        """Env steps of this run (or ``count``, e.g. learner updates) per second from the
        first fragment to the stop decision (not counting process start-up and shutdown)."""
        if self.first_data is None:
            return 0.0
        length, steps = self.stopped or (time.monotonic() - self.started, self.env_steps_here)
        steps = steps if count is None else count
        return steps / (length - self.first_data) if length > self.first_data else 0.0
