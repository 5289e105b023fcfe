"""A run's progress: one snapshot of its numbers, shown as a live table or a plain line.

:func:`take_snapshot` reads the controller's latest heartbeats and the monitor once per
progress interval into a :class:`Snapshot` of plain numbers. Everything shown or written
about a run's progress is formatted from that snapshot, so they never disagree:
:func:`plain_line` (the log line), :func:`metrics_row` (one row of ``metrics.jsonl``),
:func:`scalars` (TensorBoard) and :func:`render` (the ``rich`` table of
:class:`LiveDisplay`, used when the output is a terminal).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from tianji.rl.lagstats import LagStats
from tianji.rl.stats import ActorStat, BufferStat, LearnerStat
from tianji.runtime.controller import Controller
from tianji.runtime.events import Heartbeat
from tianji.services.balancer import accounting, balancer_of
from tianji.services.monitor import newest_evaluation

__all__ = [
    "LiveDisplay",
    "PlainDisplay",
    "RunFacts",
    "Snapshot",
    "learner_totals",
    "links_down_text",
    "make_display",
    "metrics_row",
    "plain_line",
    "render",
    "scalars",
    "take_snapshot",
]

STALE_AFTER = 5.0
"""Seconds without a heartbeat (sent every second) after which a service counts as stale."""


class Watcher(Protocol):
    """What a snapshot reads from the run's monitor (:class:`tianji.run.plan.TrainMonitor`)."""

    env_steps_by_actor: dict[str, int]
    episodes: int
    returns: collections.deque[float]

    @property
    def env_steps(self) -> int: ...

    def mean_return(self) -> float | None: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunFacts:
    """What a snapshot knows of the run beyond the heartbeats (fixed for the run)."""

    services: tuple[str, ...] = ()
    """The run's services by name (the up/total count and the missing ones)."""
    buffer_capacity: int = 0
    """All buffer shards' capacity, in the buffer's unit (transitions or fragments)."""
    on_policy: bool = False
    start_env_steps: int = 0
    """Env steps before this run started (a resumed run continues its checkpoint's count):
    the first interval's rate counts from here."""
    start_updates: int = 0
    """Learner updates (policy version) before this run started."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """A run's numbers at one progress interval. Rates and lag cover the interval since
    the previous snapshot (the whole run so far for the first one)."""

    elapsed: float
    unix: float
    env_steps: int
    env_steps_by_actor: dict[str, int]
    episodes: int
    window: int  # episodes in the mean return
    mean_return: float | None
    updates: int
    consumed: int
    env_steps_per_s: float
    updates_per_s: float
    lag_counts: dict[int, int]  # cumulative histogram over all learners
    lag_sum: int
    lag: dict[str, float] | None  # mean/p50/p95/max of the interval's consumed samples
    learner: dict[str, float]  # the first learner's gauges (losses, entropy, ...)
    buffer_size: float
    buffer_capacity: int
    buffer_unit: str  # "fragments" (on-policy rollouts) or "transitions" (replay)
    controller: dict[str, Any] | None  # Balancer.metrics, None without a balancer
    accounting: dict[str, Any]
    services_up: int
    services_total: int
    stale: dict[str, float]  # service -> seconds since its last heartbeat
    missing: tuple[str, ...]  # services of the run not registered now
    links_down: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    """Subscriber -> {"publisher address": why it cannot connect} (Controller.failing_links)."""
    evaluation: dict[str, Any] | None = None
    """The newest evaluation (``[eval] workers``; see ``TrainMonitor.evaluations``)."""
    actors: dict[str, float] = dataclasses.field(default_factory=dict)
    """The algorithm's actor-side metrics (``actor_metrics()``), averaged over the actors."""


def _role(controller: Controller, role: str) -> list[Heartbeat]:
    """The latest heartbeats of the run's services of ``role``, by name."""
    beats = controller.heartbeats
    return [beats[n] for n in sorted(beats) if beats[n].role == role]


def learner_totals(controller: Controller) -> dict[str, Any]:
    """Updates (data-parallel learners step together: the most any learner made), samples
    consumed (the sum), mean policy lag of the last batches and the first learner's gauges."""
    beats = _role(controller, "learner")  # with earlier incarnations (name#k): totals
    live = [hb for hb in beats if "#" not in hb.name] or beats
    lags = [hb.gauges.get(LearnerStat.POLICY_LAG_MEAN, 0.0) for hb in live]
    return {
        "updates": max(
            (hb.counters.get(LearnerStat.LEARNER_UPDATES, 0) for hb in beats), default=0
        ),
        "consumed": sum(hb.counters.get(LearnerStat.SAMPLES_CONSUMED, 0) for hb in beats),
        "lag": sum(lags) / len(lags) if lags else 0.0,
        "gauges": dict(live[0].gauges) if live else {},
    }


def _lag_histogram(controller: Controller) -> tuple[dict[int, int], int]:
    counts: collections.Counter[int] = collections.Counter()
    total = 0
    for hb in _role(controller, "learner"):
        for key, value in hb.counters.items():
            if key.startswith(LearnerStat.LAG_PREFIX):
                counts[int(key.split("/", 1)[1])] += value
        total += hb.counters.get(LearnerStat.LAG_SUM, 0)
    return dict(counts), total


def _interval_lag(
    counts: dict[int, int], total: int, previous: Snapshot | None
) -> dict[str, float] | None:
    """The lag distribution of the samples consumed since ``previous``."""
    before = previous.lag_counts if previous is not None else {}
    diff = {k: n - before.get(k, 0) for k, n in counts.items() if n > before.get(k, 0)}
    if not diff:
        return None
    lag_sum = total - (previous.lag_sum if previous is not None else 0)
    return LagStats.summarize(diff, lag_sum, max(diff))


def _rate(now: float, before: float, elapsed: float, previous: Snapshot | None) -> float:
    span = elapsed - previous.elapsed if previous is not None else elapsed
    return (now - before) / span if span > 0 else 0.0


def _health(
    controller: Controller, services: Sequence[str], now: float
) -> tuple[int, dict[str, float], tuple[str, ...]]:
    """(services up, stale ones with their heartbeat age, missing ones)."""
    stale: dict[str, float] = {}
    missing: list[str] = []
    registry = controller.registry  # (once: a population member's view files it anew)
    for name in services:
        record = registry.get(name)
        if record is None:
            missing.append(name)
        elif now - record.last_seen > STALE_AFTER:
            stale[name] = now - record.last_seen
    return len(services) - len(stale) - len(missing), stale, tuple(missing)


def take_snapshot(
    controller: Controller,
    monitor: Watcher,
    elapsed: float,
    facts: RunFacts | None = None,
    previous: Snapshot | None = None,
    now: float | None = None,
) -> Snapshot:
    """The run's numbers now (``now``: ``time.monotonic()`` unless given), with rates and
    lag over the interval since ``previous``."""
    facts = facts or RunFacts()
    totals = learner_totals(controller)
    counts, lag_sum = _lag_histogram(controller)
    clock = time.monotonic() if now is None else now
    up, stale, missing = _health(controller, facts.services, clock)
    balancer = balancer_of(controller)
    return Snapshot(
        elapsed=elapsed,
        unix=time.time(),
        env_steps=monitor.env_steps,
        env_steps_by_actor=dict(sorted(monitor.env_steps_by_actor.items())),
        episodes=monitor.episodes,
        window=monitor.returns.maxlen or 0,
        mean_return=monitor.mean_return(),
        updates=max(totals["updates"], facts.start_updates),
        consumed=totals["consumed"],
        env_steps_per_s=_rate(
            monitor.env_steps,
            _prev(previous, "env_steps", facts.start_env_steps),
            elapsed,
            previous,
        ),
        updates_per_s=_rate(
            totals["updates"], _prev(previous, "updates", facts.start_updates), elapsed, previous
        ),
        lag_counts=counts,
        lag_sum=lag_sum,
        lag=_interval_lag(counts, lag_sum, previous),
        learner=totals["gauges"],
        buffer_size=sum(hb.gauges.get(BufferStat.SIZE, 0.0) for hb in _role(controller, "buffer")),
        buffer_capacity=facts.buffer_capacity,
        buffer_unit="fragments" if facts.on_policy else "transitions",
        controller=balancer.metrics(controller.heartbeats) if balancer is not None else None,
        accounting=accounting(controller.heartbeats, facts.on_policy),
        services_up=up,
        services_total=len(facts.services),
        stale=stale,
        missing=missing,
        links_down=controller.failing_links(),
        evaluation=newest_evaluation(monitor),
        actors=actor_metrics(controller),
    )


def actor_metrics(controller: Controller) -> dict[str, float]:
    """Each ``algo/<name>`` gauge of the live actors (an algorithm's ``actor_metrics()``),
    averaged over the actors that report it."""
    values: dict[str, list[float]] = {}
    for hb in _role(controller, "actor"):
        if "#" in hb.name:
            continue  # an earlier incarnation
        for key, value in hb.gauges.items():
            if key.startswith(ActorStat.ALGO_PREFIX):
                values.setdefault(key.removeprefix(ActorStat.ALGO_PREFIX), []).append(value)
    return {k: sum(v) / len(v) for k, v in sorted(values.items())}


def _prev(previous: Snapshot | None, field: str, start: int = 0) -> float:
    return float(getattr(previous, field)) if previous is not None else float(start)


# ---------------------------------------------------------------------------- formats
def plain_line(s: Snapshot) -> str:
    """One human-readable progress line (the display when output is not a terminal)."""
    ret = f"{s.mean_return:7.1f}" if s.mean_return is not None else "      -"
    line = (
        f"[{s.elapsed:6.1f}s] env steps {s.env_steps:>8} ({s.env_steps_per_s:6.0f}/s)"
        f" | episodes {s.episodes:>5} | return(last {s.window}) {ret}"
        f" | updates {s.updates:>5} | {_staleness(s)} | buffer {s.buffer_size:6.0f}"
    )
    ev = s.evaluation
    if ev is not None and ev.get("opponent"):  # self-play: the share of games won
        line += f" | eval vs {ev['opponent']} win {ev['win']:.2f} (v{ev['policy_version']})"
    elif ev is not None:
        line += f" | eval {ev['mean']:7.1f} (v{ev['policy_version']})"
    if s.controller is not None:
        produced, consumed = s.controller["production_per_s"], s.controller["consumption_per_s"]
        paused = len(s.controller["paused_now"])
        line += f" | in/out {produced:6.0f}/{consumed:6.0f} per s | paused {paused}"
    if s.services_total:
        line += f" | services {s.services_up}/{s.services_total} up{_unhealthy(s, ', ')}"
    if s.learner.get("lr") == 0.0:
        line += " | lr 0: learning stopped"
    stalled = s.controller.get("stalled") if s.controller is not None else None
    if stalled:
        line += f" | STALLED {stalled['seconds']:.0f}s: {stalled['state']}"
    return line


def _staleness(s: Snapshot) -> str:
    """On-policy: ``lag 1.2`` (policy versions behind, bounded). Replay: ``upd/step 1.00 |
    age 4.6k`` (updates per env step over the interval; a sample's mean age in updates when
    drawn: old samples are replay's point, not an alarm)."""
    if s.buffer_unit == "fragments":
        return f"lag {s.lag['mean']:4.1f}" if s.lag is not None else "lag    -"
    rate = f"{s.updates_per_s / s.env_steps_per_s:4.2f}" if s.env_steps_per_s > 0 else "   -"
    age = _count(s.lag["mean"]) if s.lag is not None else "-"
    return f"upd/step {rate} | age {age:>5}"


def _count(x: float) -> str:
    """``950``, ``4.6k``, ``1.2M``."""
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    return f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def _unhealthy(s: Snapshot, sep: str) -> str:
    parts = [f"{name} stale {age:.0f}s" for name, age in sorted(s.stale.items())]
    if s.missing:
        shown = ", ".join(s.missing[:4]) + (" ..." if len(s.missing) > 4 else "")
        parts.append(f"missing {shown}")
    links = links_down_text(s.links_down, limit=3)
    if links:
        parts.append(f"links down: {links}")
    return sep + "; ".join(parts) if parts else ""


def links_down_text(down: dict[str, dict[str, str]], limit: int | None = None) -> str:
    """``"actor-0 -> buffer-0 tcp://10.0.0.2:4100: connect failed: ... (down 12 s, never
    up), ..."``: the failing links, the first ``limit`` of them and how many more."""
    items = [f"{sub} -> {pub}: {why}" for sub, links in down.items() for pub, why in links.items()]
    shown = items if limit is None else items[:limit]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" (and {more} more)" if more else "")


def metrics_row(s: Snapshot) -> dict[str, Any]:
    """One row of the run's metrics file (JSON lines); a self-play run's rows also hold the
    newest evaluation's ``eval_opponent`` and ``eval_win`` (its share of games won)."""
    row = _row(s)
    if s.evaluation is not None and s.evaluation.get("opponent"):
        row["eval_opponent"] = s.evaluation["opponent"]
        row["eval_win"] = s.evaluation["win"]
    return row


def _row(s: Snapshot) -> dict[str, Any]:
    return {
        "t": round(s.elapsed, 3),
        "unix": round(s.unix, 3),
        "env_steps": s.env_steps,
        "env_steps_by_actor": s.env_steps_by_actor,
        "episodes": s.episodes,
        "mean_return": s.mean_return,
        "eval_return": s.evaluation["mean"] if s.evaluation is not None else None,
        "eval_policy_version": (
            s.evaluation["policy_version"] if s.evaluation is not None else None
        ),
        "learner_updates": s.updates,
        "samples_consumed": s.consumed,
        "env_steps_per_s": round(s.env_steps_per_s, 1),
        "learner_updates_per_s": round(s.updates_per_s, 3),
        "lag": s.lag,
        "buffer_size": s.buffer_size,
        "services": _services(s),
        "learner": s.learner,
        "actors": s.actors,
        "controller": s.controller,
        "accounting": s.accounting,
    }


def _services(s: Snapshot) -> dict[str, Any] | None:
    if not s.services_total:  # not watched (e.g. the last row, after the services left)
        return None
    up, total, stale = s.services_up, s.services_total, s.stale
    return {
        "up": up,
        "total": total,
        "stale": stale,
        "missing": list(s.missing),
        "links_down": s.links_down,
    }


def scalars(s: Snapshot) -> dict[str, float]:
    """The TensorBoard scalars of a snapshot (step: env steps); absent values are left out."""
    out: dict[str, float] = {
        "rate/env_steps_per_s": s.env_steps_per_s,
        "rate/updates_per_s": s.updates_per_s,
        "buffer/size": s.buffer_size,
    }
    if s.mean_return is not None:
        out["return/mean"] = s.mean_return
    if s.evaluation is not None:
        out["eval/return"] = s.evaluation["mean"]
        out["eval/policy_version"] = float(s.evaluation["policy_version"])
        if s.evaluation.get("opponent"):
            out[f"eval/win_vs_{s.evaluation['opponent']}"] = s.evaluation["win"]
    if s.lag is not None:
        out["lag/mean"], out["lag/p95"] = s.lag["mean"], s.lag["p95"]
    out.update({f"learner/{k}": float(v) for k, v in sorted(s.learner.items())})
    out.update({f"actor/{k}": v for k, v in s.actors.items()})
    c = s.controller
    if c is not None:
        out["balance/production_per_s"] = c["production_per_s"]
        out["balance/consumption_per_s"] = c["consumption_per_s"]
        out["balance/paused_producers"] = float(len(c["paused_now"]))
        if c["ratio"] is not None:
            out["balance/ratio"] = c["ratio"]
    return out


# ---------------------------------------------------------------------------- displays
def render(s: Snapshot, title: str = "tianji") -> Table:
    """The live table of a snapshot."""
    table = Table(title=escape(f"{title}  [{s.elapsed:.0f} s]"), show_header=False, box=None)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    ret = f"{s.mean_return:.1f}" if s.mean_return is not None else "-"
    lag = f"mean {s.lag['mean']:.2f}, p95 {s.lag['p95']:.0f}" if s.lag is not None else "-"
    table.add_row("env steps", f"{s.env_steps:,} ({s.env_steps_per_s:,.0f}/s)")
    table.add_row("episodes", f"{s.episodes:,}")
    table.add_row("updates", f"{s.updates:,} ({s.updates_per_s:,.1f}/s)")
    table.add_row(f"return (last {s.window})", ret)
    if s.evaluation is not None:
        e = s.evaluation
        table.add_row("eval return", f"{e['mean']:.1f} ± {e['std']:.1f} (v{e['policy_version']})")
    if s.buffer_unit == "fragments":
        table.add_row("policy lag", lag)
    else:
        table.add_row("updates / env step, sample age", _staleness(s).replace(" | ", ", "))
    if s.learner.get("lr") == 0.0:
        table.add_row("[red]learning rate[/red]", "0: the policy no longer learns")
    table.add_row("buffer", _fill(s))
    c = s.controller
    if c is not None:
        ratio = f", ratio {c['ratio']:.2f}" if c["ratio"] is not None else ""
        flow = f"{c['production_per_s']:,.0f} / {c['consumption_per_s']:,.0f} samples/s"
        table.add_row("in / out", flow + ratio)
        table.add_row("paused", ", ".join(c["paused_now"]) or "none")
        if c.get("stalled"):
            stalled = c["stalled"]
            table.add_row(
                "[red]stalled[/red]", escape(f"{stalled['seconds']:.0f} s: {stalled['state']}")
            )
    if s.services_total:
        healthy = s.services_up == s.services_total
        style = "green" if healthy else "red"
        up = f"[{style}]{s.services_up}/{s.services_total} up[/{style}]"
        table.add_row("services", up + _unhealthy(s, "; "))
    return table


def _fill(s: Snapshot) -> str:
    if not s.buffer_capacity:
        return f"{s.buffer_size:,.0f} {s.buffer_unit}"
    share = s.buffer_size / s.buffer_capacity
    return f"{s.buffer_size:,.0f} / {s.buffer_capacity:,} {s.buffer_unit} ({share:.0%})"


class PlainDisplay:
    """One :func:`plain_line` per snapshot (when the output is not a terminal)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def show(self, snapshot: Snapshot) -> None:
        print(plain_line(snapshot), file=self.out, flush=True)

    def close(self) -> None:
        """Nothing to release."""


class LiveDisplay:
    """A ``rich`` live table on a terminal, redrawn on each snapshot; what else is printed
    to stdout/stderr meanwhile scrolls above it."""

    def __init__(self, out: TextIO, title: str = "tianji") -> None:
        self.title = title
        self._live = Live(console=Console(file=out), auto_refresh=False)
        self._started = False

    def show(self, snapshot: Snapshot) -> None:
        if not self._started:
            self._live.start()
            self._started = True
        self._live.update(render(snapshot, self.title), refresh=True)

    def close(self) -> None:
        """Stop redrawing (the last table stays); idempotent."""
        if self._started:
            self._started = False
            self._live.stop()


def make_display(out: TextIO, title: str = "tianji") -> PlainDisplay | LiveDisplay:
    """A live table when ``out`` is a terminal, else plain lines."""
    return LiveDisplay(out, title) if out.isatty() else PlainDisplay(out)
