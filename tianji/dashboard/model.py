"""What the dashboard shows, computed from the controller and the run's monitor (no I/O).

:func:`sample` turns the controller's registry and latest heartbeats plus the monitor's
episode counts into one :class:`Sample`; :class:`MetricsHistory` keeps a bounded ring of
them (the time series of ``/api/metrics``) and the episode returns as they arrive;
:func:`status` and :func:`services` build ``/api/status``. Everything here is a plain
function of its inputs, tested without a server or an event loop.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from tianji.rl.stats import LearnerStat
from tianji.rl.tally import lag_summary
from tianji.rl.topics import index_of
from tianji.runtime.controller import Controller
from tianji.runtime.events import Heartbeat
from tianji.services.balancer import (
    Balancer,
    accounting,
    balancer_of,
    dropped_by_reason,
)
from tianji.services.monitor import newest_evaluation

__all__ = [
    "Members",
    "MetricsHistory",
    "RunMonitor",
    "Sample",
    "lag_histogram",
    "run_state",
    "sample",
    "services",
    "status",
]

log = logging.getLogger(__name__)


class RunMonitor(Protocol):
    """What the dashboard reads from the run's monitor (:class:`~tianji.run.plan.TrainMonitor`)."""

    @property
    def episodes(self) -> int:
        """Episodes finished so far."""

    @property
    def returns(self) -> collections.deque[float]:
        """The returns of the last episodes, oldest first."""

    @property
    def checkpoint_version(self) -> int:
        """Policy version of the newest checkpoint written (-1: none yet)."""

    @property
    def last_checkpoint(self) -> Path | None:
        """The newest checkpoint written, if any."""

    @property
    def env_steps(self) -> int:
        """Env steps of every actor so far."""

    def mean_return(self) -> float | None:
        """Mean return of the last episodes, ``None`` before the first."""

    def done(self) -> str | None:
        """Why the run should stop now, or ``None``."""


Members = Mapping[str, tuple[Controller, RunMonitor | None]]
"""A population run's members (scope -> its view of the controller, its monitor): see
:class:`~tianji.run.members.MemberController`."""


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """The run's counters at one moment (one row of ``/api/metrics``)."""

    t: float
    """Seconds since the dashboard started."""
    env_steps: int
    episodes: int
    mean_return: float | None
    eval_return: float | None
    """Mean return of the newest evaluation (``[eval] workers``), ``None`` before one."""
    eval_policy_version: int | None
    env_steps_per_s: float
    """Over the interval since the previous sample."""
    learner_updates: int
    samples_produced: int
    samples_inserted: int
    samples_consumed: int
    production_per_s: float | None
    """Samples inserted per second (the controller's balance window), ``None`` unbalanced."""
    consumption_per_s: float | None
    lag_mean: float | None
    members: dict[str, dict[str, Any]] | None = None
    """A population run's members: scope -> ``env_steps``, ``episodes``, ``mean_return``,
    ``eval_return``, ``learner_updates`` (each its own); ``None`` for a single policy."""

    def to_json(self) -> dict[str, Any]:
        """The row as JSON-ready values."""
        return dataclasses.asdict(self)


def _total(heartbeats: Iterable[Heartbeat], role: str, key: str) -> int:
    return sum(hb.counters.get(key, 0) for hb in heartbeats if hb.role == role)


MEMBER_KEYS = ("env_steps", "episodes", "mean_return", "eval_return", "learner_updates")


def member_samples(members: Members, t: float) -> dict[str, dict[str, Any]]:
    """Each member's own counters now (:data:`MEMBER_KEYS` of its :func:`sample`)."""
    rows = {}
    for scope, (view, monitor) in members.items():
        row = sample(view, monitor, t).to_json()
        rows[scope] = {k: row[k] for k in MEMBER_KEYS}
    return rows


def sample(
    controller: Controller,
    monitor: RunMonitor | None,
    t: float,
    previous: Sample | None = None,
    members: Members | None = None,
) -> Sample:
    """The run's counters now; the env-step rate since ``previous`` where given (actors
    report per fragment, so a window of a few seconds gives a steadier rate); with
    ``members``, each member's own too."""
    beats = controller.heartbeats
    obs = Balancer.observe(beats, {})
    steps = monitor.env_steps if monitor is not None else 0
    rate = 0.0
    if previous is not None and t > previous.t:
        rate = max(0.0, (steps - previous.env_steps) / (t - previous.t))
    production = consumption = None
    balancer = balancer_of(controller)
    if balancer is not None:
        production, consumption = balancer.rates()
    lag = lag_summary(beats)
    evaluation = newest_evaluation(monitor)
    return Sample(
        t=round(t, 3),
        env_steps=steps,
        episodes=monitor.episodes if monitor is not None else 0,
        mean_return=monitor.mean_return() if monitor is not None else None,
        eval_return=evaluation["mean"] if evaluation is not None else None,
        eval_policy_version=evaluation["policy_version"] if evaluation is not None else None,
        env_steps_per_s=round(rate, 1),
        learner_updates=obs.learner_version,
        samples_produced=_total(beats.values(), "actor", "samples_produced"),
        samples_inserted=obs.inserted,
        samples_consumed=obs.consumed,
        production_per_s=None if production is None else round(production, 1),
        consumption_per_s=None if consumption is None else round(consumption, 1),
        lag_mean=None if lag is None else lag["mean"],
        members=member_samples(members, t) if members else None,
    )


class MetricsHistory:
    """A bounded ring of :class:`Sample` rows and of episode returns.

    Args:
        capacity: rows kept (the oldest go first).
        episode_capacity: episode returns kept, each as ``(env_steps, return)``.
    """

    def __init__(self, capacity: int = 2000, episode_capacity: int = 2000) -> None:
        self.rows: collections.deque[Sample] = collections.deque(maxlen=capacity)
        self.episodes: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=episode_capacity
        )
        self._episodes_seen = 0

    @property
    def last(self) -> Sample | None:
        """The newest row, if any."""
        return self.rows[-1] if self.rows else None

    def window_start(self, t: float, window: float) -> Sample | None:
        """The oldest row at most ``window`` seconds before ``t`` (the newest row when all
        are older; ``None`` when there is none): the start of a rate over ``window``."""
        found = None
        for row in reversed(self.rows):
            if row.t < t - window:
                break
            found = row
        return found if found is not None else self.last

    def add(self, row: Sample, recent_returns: Sequence[float] = ()) -> None:
        """Append a row; ``recent_returns`` are the monitor's latest returns (oldest first),
        of which the ``row.episodes`` minus the episodes seen so far are new. Episodes that
        finished while more than ``len(recent_returns)`` others did are not kept."""
        new = row.episodes - self._episodes_seen
        if new > 0 and recent_returns:
            for value in list(recent_returns)[-new:]:
                self.episodes.append((row.env_steps, float(value)))
        self._episodes_seen = max(self._episodes_seen, row.episodes)
        self.rows.append(row)

    def to_json(self, since: float | None = None) -> dict[str, Any]:
        """``/api/metrics``: the rows (after ``since`` seconds, when given) and episodes."""
        rows = [r.to_json() for r in self.rows if since is None or r.t > since]
        return {
            "columns": [f.name for f in dataclasses.fields(Sample)],
            "rows": rows,
            "episodes": [{"env_steps": s, "return": r} for s, r in self.episodes],
        }


def lag_histogram(heartbeats: Mapping[str, Heartbeat]) -> dict[str, int]:
    """Consumed samples by policy lag over all learners (``lag/<k>`` counters), by ``k``."""
    counts: collections.Counter[int] = collections.Counter()
    for hb in heartbeats.values():
        if hb.role == "learner":
            for key, value in hb.counters.items():
                if key.startswith(LearnerStat.LAG_PREFIX):
                    counts[int(key.split("/", 1)[1])] += value
    return {str(k): counts[k] for k in sorted(counts)}


def _index(name: str) -> int | None:
    """The service's index (``actor-3`` and its retired ``actor-3#2``: 3), ``None`` for a
    name without one (``monitor``)."""
    try:
        return index_of(name)
    except ValueError as exc:  # e.g. the monitor: a row without an index
        log.debug("%s: %s", name, exc)
        return None


def _row(
    name: str,
    role: str,
    state: str,
    hb: Heartbeat | None,
    *,
    host: str | None = None,
    pid: int | None = None,
    age: float | None = None,
) -> dict[str, Any]:
    """One row of the services table (``index`` and ``restarts`` are added by the caller)."""
    depth = None if hb is None else sum(hb.queue_depths.values())
    return {
        "name": name,
        "role": role,
        "host": host,
        "pid": pid,
        "state": state,
        "last_heartbeat_age_s": age,
        "queue_depth": depth,
    }


def services(
    controller: Controller, expected: Sequence[str] = (), now: float | None = None
) -> list[dict[str, Any]]:
    """One row per service: registered ones, those that left (state ``left``) and expected
    ones that have not joined yet (state ``waiting``), sorted by name."""
    now = time.monotonic() if now is None else now
    rows: dict[str, dict[str, Any]] = {}
    for name, record in controller.registry.items():
        hb = record.last_heartbeat
        rows[name] = _row(
            name,
            record.role,
            hb.state if hb is not None else "registered",
            hb,
            host=record.host,
            pid=record.pid,
            age=None if hb is None else round(now - record.last_seen, 2),
        )
    for name, hb in controller.heartbeats.items():
        if name not in rows and "#" not in name:  # name#k: an earlier incarnation
            age = round(max(0.0, time.time() - hb.sent_at), 2)
            rows[name] = _row(name, hb.role, "left", hb, age=age)
    for name in expected:
        if name not in rows:
            rows[name] = _row(name, name.rsplit("-", 1)[0], "waiting", None)
    restarts = controller.restarts
    return [rows[n] | {"index": _index(n), "restarts": restarts[n]} for n in sorted(rows)]


def run_state(monitor: RunMonitor | None, finished: str | None) -> tuple[str, str | None]:
    """``(state, stop reason)``: starting (no monitor yet), running, stopping (the monitor
    said why) or finished (the launcher's reason)."""
    if finished is not None:
        return "finished", finished
    if monitor is None:
        return "starting", None
    reason = monitor.done()
    return ("stopping", reason) if reason is not None else ("running", None)


def status(
    controller: Controller,
    monitor: RunMonitor | None,
    *,
    title: str = "",
    on_policy: bool = False,
    expected: Sequence[str] = (),
    finished: str | None = None,
    elapsed: float = 0.0,
    members: Members | None = None,
) -> dict[str, Any]:
    """``/api/status``: run state, counters, balance metrics, accounting and services; a
    population run's accounting and balance metrics are per member (each member's books
    close on their own), under ``members``."""
    beats = controller.heartbeats
    state, reason = run_state(monitor, finished)
    now = sample(controller, monitor, elapsed, members=members)
    counters = now.to_json()
    del counters["t"], counters["env_steps_per_s"]
    counters["samples_dropped"] = dropped_by_reason(beats)
    balance: dict[str, Any] | None
    if members:  # each member's books and balance, from its own view
        per_member = {m: member_status(view, on_policy) for m, (view, _) in members.items()}
        books = {
            "balanced": all(m["accounting"]["balanced"] for m in per_member.values()),
            "members": {m: row["accounting"] for m, row in per_member.items()},
        }
        balance = {"members": {m: row["controller"] for m, row in per_member.items()}}
    else:
        books = accounting(beats, on_policy)
        balancer = balancer_of(controller)
        balance = balancer.metrics(beats) if balancer is not None else None
    return {
        "run_id": controller.run_id,
        "title": title,
        "state": state,
        "stop_reason": reason,
        "elapsed_s": round(elapsed, 3),
        "counters": counters,
        "policy_lag": lag_summary(beats),
        "on_policy": on_policy,
        "lag_histogram": lag_histogram(beats),
        "controller": balance,
        "accounting": books,
        "checkpoint": checkpoint_status(monitor),
        "services": services(controller, expected),
        "links_down": [
            {"subscriber": sub, "publisher": pub, "error": why}
            for sub, links in controller.failing_links().items()
            for pub, why in links.items()
        ],
    }


def member_status(view: Controller, on_policy: bool) -> dict[str, Any]:
    """A population member's books and balance metrics, from its view of the controller."""
    balancer = balancer_of(view)
    return {
        "accounting": accounting(view.heartbeats, on_policy),
        "controller": balancer.metrics(view.heartbeats) if balancer is not None else None,
    }


def checkpoint_status(monitor: RunMonitor | None) -> dict[str, Any] | None:
    """The newest checkpoint written (file and policy version), ``None`` before one."""
    if monitor is None or monitor.last_checkpoint is None:
        return None
    return {"path": str(monitor.last_checkpoint), "policy_version": monitor.checkpoint_version}
