"""The balancer: the controller-side shell of the balance policy (a controller plug-in).

It turns the heartbeats of actors, buffers and learners into
:class:`~tianji.rl.balance.Observation` values, asks the pure
:class:`~tianji.rl.balance.BalancePolicy`, and sends what changed as commands
(:class:`~tianji.rl.events.GrantProduction` to actors,
:class:`~tianji.rl.events.GrantConsumption` to learners). It never touches data. It also
keeps the run's balance metrics (:meth:`Balancer.metrics`), its watchdog, and the sample
accounting (:func:`accounting`), and settles the counts of services that die.

Usage::

    controller = Controller(plugins=[Balancer(balance_config)])
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import msgspec

from tianji.rl.balance import BalanceConfig, BalancePolicy, Decision, Grant, Observation
from tianji.rl.books import accounting, dropped_by_reason
from tianji.rl.events import GrantConsumption, GrantProduction
from tianji.rl.stats import ActorStat, BookStat, BufferStat, Dropped, LearnerStat
from tianji.rl.tally import Tally, lag_summary
from tianji.rl.topics import index_of, shard_of_actor
from tianji.runtime.controller import Controller, Send
from tianji.runtime.events import Event, Heartbeat
from tianji.runtime.registry import Stamp, stamp, unchanged

__all__ = ["Balancer", "accounting", "balancer_of", "dropped_by_reason"]

log = logging.getLogger("tianji.balancer")


async def _unattached(name: str, ev: Event) -> bool:
    raise RuntimeError(
        f"the balancer is not attached to a controller (sending {ev.TYPE} to {name})"
    )


def balancer_of(controller: Controller) -> Balancer | None:
    """The controller's balancer plug-in, or None (a run without balance)."""
    return controller.plugin(Balancer)


class Balancer:
    """The controller's balance shell: heartbeats in, commands out; the policy decides.

    Every producer, in every mode, is paced by production grants (``GrantProduction``)
    and sent only the grants a decision raises. Off-policy learners get a consumption
    limit (``GrantConsumption``); with K data-parallel learners the policy's limit is for
    all of them and each learner is granted ``limit // K`` (they consume equal batches in
    lockstep).

    It is also the run's watchdog: when no sample is produced and none consumed for
    ``config.watchdog_s`` seconds while producers and learners are up, it logs who waits for
    what (:meth:`stall_report`) and :meth:`metrics` shows it (``stalled``) in the progress
    line and ``/api/status`` until the run moves again.

    Args:
        config: the balance settings.
        send: ``await send(service_name, event) -> delivered``; the controller attaches its
            own when the balancer is one of its plug-ins.
        window: seconds over which production and consumption rates are measured.
    """

    ROLES = frozenset({"actor", "buffer", "learner"})
    roles = ROLES

    def __init__(
        self, config: BalanceConfig, send: Send | None = None, *, window: float = 5.0
    ) -> None:
        self.config = config
        self.policy = BalancePolicy(config)
        self._send: Send = send or _unattached
        self.window = window
        self.idle: AbstractSet[str] = frozenset()  # producers with nothing granted to collect
        self.grants: dict[str, int] = {}  # learner -> consume limit sent
        self.production: dict[str, Grant] = {}  # producer -> production grant sent
        self._incarnation: dict[str, float | None] = {}  # producer -> registered_at
        self.commands: collections.Counter[str] = collections.Counter()
        self.decisions = 0
        self.last: Decision | None = None
        self._history: collections.deque[tuple[float, int, int]] = collections.deque()
        self._moved: tuple[int, int, float] | None = None  # (produced, consumed, when)
        self.stalled: dict[str, Any] | None = None
        self.stalls = 0
        self.tally = Tally()  # the heartbeats' totals, kept up to date per heartbeat
        self._registry_seen: Stamp | None = None  # the registry at the last incarnation check
        self.draining = False  # the run drains before it stops: no more commands
        self.drained: dict[str, Any] | None = None  # what the drain saw (tianji.services.drain)

    def attach(self, send: Send) -> None:
        """Send commands through the controller (:class:`ControllerPlugin`)."""
        self._send = send

    def retired(self, hb: Heartbeat) -> Heartbeat:
        """A dead service's last heartbeat: what it held (``buffered_samples``,
        ``held_samples``) is counted as ``dropped/lost_in_restart``."""
        counters = dict(hb.counters)
        gauges = dict(hb.gauges)
        lost = int(
            gauges.pop(BufferStat.BUFFERED_SAMPLES, 0) + gauges.pop(LearnerStat.HELD_SAMPLES, 0)
        )
        if lost:
            counters[Dropped.LOST_IN_RESTART] = counters.get(Dropped.LOST_IN_RESTART, 0) + lost
        return msgspec.structs.replace(hb, counters=counters, gauges=gauges)

    def rejoined(self, retired: str, heartbeats: dict[str, Heartbeat]) -> None:
        """Samples on their way to a service that died will never arrive. For the balance
        policy only (an on-policy run's backlog would otherwise wait for them forever and
        keep the actors paused: a PPO run under chaos on two hosts froze so), count them as
        settled when the next incarnation registers (before anyone could send to it): a
        learner's, what its buffers sent minus what every learner received; a buffer's,
        what its actors sent minus what every incarnation of it received. The run's books
        (:func:`tianji.rl.books.accounting`) do not use this estimate: they settle the
        restart from both ends of each stream."""
        hb = heartbeats.get(retired)
        if hb is None:
            return
        beats = heartbeats.values()
        if hb.role == "learner":
            sent = sum(
                b.counters.get(BufferStat.SAMPLES_SENT, 0) for b in beats if b.role == "buffer"
            )
            peers = [b for b in beats if b.role == "learner"]
        elif hb.role == "buffer":
            shard = index_of(retired)
            sent = sum(
                b.counters.get(ActorStat.SAMPLES_SENT, 0)
                for n, b in heartbeats.items()
                if b.role == "actor" and shard_of_actor(index_of(n), self.config.shards) == shard
            )
            peers = [
                b for n, b in heartbeats.items() if b.role == "buffer" and index_of(n) == shard
            ]
        else:
            return
        arrived = sum(
            b.counters.get(BookStat.RECEIVED, 0) + b.counters.get(Dropped.LOST_IN_TRANSIT, 0)
            for b in peers
        )
        group = {b.name for b in peers}
        lost = sent - arrived - sum(n for k, n in self.tally.settled.items() if k in group)
        if lost > 0:
            self.tally.settled[retired] = lost
            log.warning("%s died with about %d samples on their way to it", retired, lost)

    def forget(self, name: str) -> None:
        """``name`` died: its next incarnation starts without grants (and its last heartbeat
        is counted again under its retired name)."""
        self.tally.remove(name)
        self.grants.pop(name, None)
        self.production.pop(name, None)
        self._incarnation.pop(name, None)
        self.idle -= {name}

    @staticmethod
    def observe(
        heartbeats: Mapping[str, Heartbeat],
        live: Mapping[str, Any],
        granted: Mapping[str, int] | None = None,
    ) -> Observation:
        """The policy's view of the run from the latest heartbeats of live services (and
        the counts of dead incarnations, ``name#k``, which stay in the totals)."""
        tally = Tally()
        tally.scan(heartbeats)
        return tally.observation(live, granted)

    async def update(self, heartbeats: Mapping[str, Heartbeat], live: Mapping[str, Any]) -> None:
        """Decide on the latest heartbeats and send what changed."""
        self._track_incarnations(live)
        self.tally.scan(heartbeats)
        obs = self.tally.decision_view(live)
        now = time.monotonic()
        self._history.append((now, obs.inserted, obs.consumed))
        while len(self._history) > 2 and self._history[1][0] < now - self.window:
            self._history.popleft()
        if self.draining:  # producers paused, learners frozen: keep them so
            return
        decision = self.policy.decide(obs)
        self.decisions += 1
        if self.last is None or decision.reason.split(":")[0] != self.last.reason.split(":")[0]:
            log.debug("balance: %s", decision.reason)
        self.last = decision
        # the observation's maps are the tally's own, which a service retired while the
        # grants below are sent (forget) would change: read them (the watchdog) before
        self._watch(obs, heartbeats, live, now)
        await self._grant_production(decision, live)
        if not self.config.limits_consumption or decision.consume_limit is None:
            return
        # Data-parallel learners step together on equal batches: each gets an equal share.
        limit = decision.consume_limit // self.config.learners
        for name in [n for n in self.tally.learners if n in live]:
            own = limit - self.tally.retired_consumed(name)  # a restarted one counts from 0
            if self.grants.get(name) != own:
                grant = GrantConsumption(limit=own, reason=decision.reason)
                if await self._send(name, grant):
                    self.grants[name] = own
                    self.commands["grant"] += 1

    def _track_incarnations(self, live: Mapping[str, Any]) -> None:
        """A producer registered anew (restarted under its name) counts its fragments from
        0 again: its grants start over. Looked for only when the registry changed (a
        :class:`~tianji.runtime.controller.Registry` counts its changes)."""
        if unchanged(live, self._registry_seen):
            return
        self._registry_seen = stamp(live)
        for name in list(self.production):
            registered = getattr(live.get(name), "registered_at", None)
            if name not in live or registered != self._incarnation.get(name):
                self.forget(name)

    async def _grant_production(self, decision: Decision, live: Mapping[str, Any]) -> None:
        self.idle = decision.idle  # of the live producers only (Tally.observation)
        for name, grant in sorted(decision.grants.items()):
            ev = GrantProduction(
                limit=grant.limit, min_version=grant.min_version, reason=decision.reason
            )
            if await self._send(name, ev):
                self.production[name] = grant
                self.tally.grant(name, grant.limit)
                self._incarnation[name] = getattr(live.get(name), "registered_at", None)
                self.commands["grant_production"] += 1

    # ------------------------------------------------------------------ watchdog
    def _watch(
        self,
        obs: Observation,
        heartbeats: Mapping[str, Heartbeat],
        live: Mapping[str, Any],
        now: float,
    ) -> None:
        """Report a run in which nothing is produced and nothing consumed for
        ``watchdog_s`` seconds while producers and a learner are up (once per stall)."""
        produced = obs.produced or obs.inserted
        learners_up = any(n in live for n in self.tally.learners)
        last = self._moved
        moved = last is not None and (produced, obs.consumed) != last[:2]
        if last is None or moved or not obs.producer_versions or not learners_up:
            if self.stalled is not None and last is not None and moved:
                log.warning("the run moves again after %.0f s", now - last[2])
            self.stalled = None  # moving again, or nobody left to wait for
            self._moved = (produced, obs.consumed, now)
            return
        silent = now - last[2]
        if self.config.watchdog_s <= 0 or silent < self.config.watchdog_s:
            return
        state = self.stall_report(obs, heartbeats, live)
        if self.stalled is None:
            self.stalls += 1
            log.warning("watchdog: no sample produced or consumed for %.0f s: %s", silent, state)
        self.stalled = {"seconds": round(silent, 1), "state": state}

    def stall_report(
        self, obs: Observation, heartbeats: Mapping[str, Heartbeat], live: Mapping[str, Any]
    ) -> str:
        """Who waits for what: every producer (its grant, weights or pause), the learners
        (held samples, grant, version) and the buffers (depth)."""
        parts: list[str] = []
        for name in sorted(obs.producer_versions):
            version = obs.producer_versions[name]
            sent = obs.fragments_sent.get(name, 0)
            grant = self.production.get(name)
            limit = grant.limit if grant else 0
            if sent >= limit:
                why = f"waits for a grant (sent {sent} of {limit} granted)"
            elif grant is not None and version < grant.min_version:
                why = f"waits for weights v{grant.min_version} (has v{version})"
            else:
                why = f"may collect (sent {sent} of {limit} granted, v{version})"
            parts.append(f"{name} {why}")
        for name, hb in sorted(heartbeats.items()):
            if name not in live:
                continue
            if hb.role == "learner":
                cap = hb.gauges.get(LearnerStat.CONSUME_LIMIT)
                allowed = f", grant {cap:.0f}" if cap is not None else ""
                version = hb.counters.get(LearnerStat.LEARNER_UPDATES, 0)
                consumed = hb.counters.get(LearnerStat.SAMPLES_CONSUMED, 0)
                held = hb.gauges.get(LearnerStat.HELD_SAMPLES, 0)
                parts.append(
                    f"{name} v{version} consumed {consumed}{allowed}, holds {held:.0f} samples"
                )
            elif hb.role == "buffer":
                parts.append(
                    f"{name} holds {hb.gauges.get(BufferStat.SIZE, 0):.0f} "
                    f"({hb.gauges.get(BufferStat.BUFFERED_SAMPLES, 0):.0f} samples)"
                )
        if self.last is not None:
            parts.append(f"balance: {self.last.reason}")
        return "; ".join(parts)

    def rates(self) -> tuple[float, float]:
        """Samples inserted and consumed per second over the last ``window`` seconds."""
        if len(self._history) < 2:
            return 0.0, 0.0
        t0, i0, c0 = self._history[0]
        t1, i1, c1 = self._history[-1]
        dt = t1 - t0
        return ((i1 - i0) / dt, (c1 - c0) / dt) if dt > 0 else (0.0, 0.0)

    def gauges(self) -> dict[str, float]:
        """The cheap, numeric part of the metrics, kept in the controller's own gauges."""
        production, consumption = self.rates()
        return {
            "balance/production_per_s": production,
            "balance/consumption_per_s": consumption,
            "balance/paused_producers": float(len(self.idle)),
            "balance/decisions": float(self.decisions),
        }

    def metrics(self, heartbeats: Mapping[str, Heartbeat]) -> dict[str, Any]:
        """The run's balance metrics (see docs/architecture.md, "The controller")."""
        self.tally.scan(heartbeats)  # the running totals, not a second sum of everything
        obs = self.tally.observation(heartbeats)
        production, consumption = self.rates()
        effective = obs.inserted - self.config.min_replay_size
        pause = {
            n: round(hb.gauges.get(ActorStat.PAUSED_S, 0.0), 3)
            for n, hb in sorted(heartbeats.items())
            if hb.role == "actor"
        }
        wait = sum(hb.gauges.get(LearnerStat.WAITING_S, 0.0) for hb in heartbeats.values())
        learners = [hb for hb in heartbeats.values() if hb.role == "learner"]
        idle = sum(hb.gauges.get(LearnerStat.IDLE_S, 0.0) for hb in learners)
        busy = sum(hb.gauges.get(LearnerStat.UPDATE_S, 0.0) for hb in learners)
        return {
            "mode": self.config.mode,
            "samples_inserted": obs.inserted,
            "samples_consumed": obs.consumed,
            "production_per_s": round(production, 1),
            "consumption_per_s": round(consumption, 1),
            "ratio": round(obs.consumed / effective, 3) if effective > 0 else None,
            "ratio_target": None if self.config.on_policy else self.config.replay_ratio,
            "ratio_window": round(consumption / production, 3) if production > 0 else None,
            "paused_now": sorted(self.idle),  # nothing granted to collect
            "pause_s": pause,
            "pause_s_total": round(sum(pause.values()), 3),
            "learner_wait_s": round(wait, 3),
            "learner_idle_s": round(idle, 3),
            "learner_update_s": round(busy, 3),
            "dropped": dropped_by_reason(heartbeats),
            "lag": lag_summary(heartbeats),
            "decisions": self.decisions,
            "commands": dict(self.commands),
            "last_decision": self.last.reason if self.last is not None else None,
            "production_grants": {
                n: {"limit": g.limit, "min_version": g.min_version}
                for n, g in sorted(self.production.items())
            },
            "max_collecting": self.config.max_collecting or None,
            "stalled": self.stalled,
            "stalls": self.stalls,
        }
