r"""The controller's control plane: registry of services and the topics they publish.

Services register their listening address and published topics; subscribers watch
topics and are told the publishers' addresses now and on every change, then connect to
the publishers directly (bulk data never passes through the controller). The controller
also keeps each service's latest heartbeat, collects reports and broadcasts commands.

With a :class:`~tianji.balance.BalanceConfig` it also balances the run: a
:class:`Balancer` turns the heartbeats of actors, buffers and learners into
:class:`~tianji.balance.Observation`\ s, asks the pure
:class:`~tianji.balance.BalancePolicy`, and sends what changed as commands
(:class:`PauseProduction` / :class:`ResumeProduction` to actors,
:class:`ConsumptionGranted` to learners). It never touches data. It also keeps the run's
balance metrics (:meth:`Balancer.metrics`) and sample accounting (:func:`accounting`).

Usage::

    controller = Controller(bind="tcp://127.0.0.1:0")
    task = asyncio.create_task(controller.run())
    await controller.wait_ready()
    ...                                   # start services with controller=controller.address
    await controller.wait_until(lambda c: len(c.registry) == 3, timeout=30)
    await controller.shutdown_all("done")
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tianji.balance import BalanceConfig, BalancePolicy, Decision, Grant, LagStats, Observation
from tianji.core import Connection
from tianji.errors import TianjiError
from tianji.events import (
    ConsumptionGranted,
    Event,
    Heartbeat,
    PauseProduction,
    ProductionGranted,
    PublishersChanged,
    RegisterService,
    ResumeProduction,
    ServiceRegistered,
    ServiceReported,
    Shutdown,
    WatchTopics,
)
from tianji.service import CONTROL, Service

__all__ = ["Balancer", "Controller", "ServiceRecord", "accounting"]

log = logging.getLogger("tianji.controller")


@dataclasses.dataclass(slots=True)
class ServiceRecord:
    """What the controller knows about one registered service."""

    name: str
    role: str
    address: str
    publishes: tuple[str, ...]
    host: str
    pid: int
    conn: Connection
    registered_at: float
    local_address: str = ""
    locality: str = ""
    last_heartbeat: Heartbeat | None = None
    last_seen: float = 0.0


class Controller(Service):
    """Registry, heartbeats, reports and commands; see the module docstring.

    Args:
        name: the controller's service name.
        run_id: identifies the run; generated when omitted.
        kwargs: passed to :class:`~tianji.service.Service` (``bind``, ``options``).
    """

    role = "controller"

    def __init__(
        self,
        name: str = "controller",
        *,
        run_id: str | None = None,
        balance: BalanceConfig | None = None,
        **kwargs: Any,
    ):
        super().__init__(name, **kwargs)
        self.balancer = Balancer(balance, self._command) if balance is not None else None
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.run_digest = ""  # when set, services registering another digest are refused
        self._balance_wanted = asyncio.Event()
        self.registry: dict[str, ServiceRecord] = {}
        self.reports: dict[str, ServiceReported] = {}
        self.heartbeats: dict[str, Heartbeat] = {}  # latest per service, kept after it leaves
        self.restarts: collections.Counter[str] = collections.Counter()  # by service name
        self._watchers: dict[str, set[Connection]] = {}

    # ------------------------------------------------------------------ queries
    def publishers(self, topic_name: str, locality: str = "") -> tuple[str, ...]:
        """Addresses of the services that publish ``topic_name``, sorted: for a subscriber
        of the given ``locality`` a publisher's local address (shared memory) where it has
        one and shares that locality, else its main address (TCP)."""
        return tuple(
            sorted(
                r.local_address
                if locality and r.local_address and r.locality == locality
                else r.address
                for r in self.registry.values()
                if topic_name in r.publishes
            )
        )

    def _locality_of(self, conn: Connection) -> str:
        for record in self.registry.values():
            if record.conn is conn:
                return record.locality
        return ""

    async def wait_until(
        self, predicate: Callable[[Controller], bool], timeout: float | None = None
    ) -> None:
        """Wait until ``predicate(self)`` holds; re-checked on every registry change.

        Raises:
            TimeoutError: if it does not hold within ``timeout`` seconds.
        """

        async def wait() -> None:
            while not predicate(self):
                await self._wait_changed()

        await asyncio.wait_for(wait(), timeout)

    async def broadcast(self, ev: Event) -> int:
        """Send a command to every registered service; returns how many got it."""
        frames = self._frames(ev, CONTROL)
        sent = 0
        for record in list(self.registry.values()):
            try:
                await record.conn.send(frames)
                sent += 1
            except TianjiError as exc:
                log.warning("cannot send %s to %s: %s", ev.TYPE, record.name, str(exc))
        return sent

    async def shutdown_all(self, reason: str) -> int:
        """Tell every registered service to drain and stop."""
        return await self.broadcast(Shutdown(reason=reason))

    async def main(self) -> None:
        if self.balancer is None:
            await super().main()
            return
        await self._balance_loop(self.balancer)

    async def _balance_loop(self, balancer: Balancer) -> None:
        """Balance decisions, one at a time, on the latest heartbeats: heartbeats arrive on
        many connections at once, and two interleaved decisions could send commands out of
        order (a pause after the resume that superseded it)."""
        while True:
            await self._balance_wanted.wait()
            self._balance_wanted.clear()
            await balancer.update(self.heartbeats, self.registry)
            self.gauges.update(balancer.gauges())  # in the controller's heartbeat

    # ------------------------------------------------------------------ requests
    async def on_request(self, ev: Event, conn: Connection) -> None:
        if isinstance(ev, RegisterService):
            await self._register(ev, conn)
        elif isinstance(ev, WatchTopics):
            where = self._locality_of(conn)
            for name in ev.topics:
                self._watchers.setdefault(name, set()).add(conn)
                await self._tell(
                    conn, PublishersChanged(topic=name, addresses=self.publishers(name, where))
                )
        elif isinstance(ev, Heartbeat):
            record = self.registry.get(ev.name)
            if record is not None and record.conn is conn:
                self.heartbeats[ev.name] = ev
                record.last_heartbeat = ev
                record.last_seen = time.monotonic()
                if self.balancer is not None and ev.role in Balancer.ROLES:
                    self._balance_wanted.set()  # decided by _balance_loop, one at a time
                self._notify()
        elif isinstance(ev, ServiceReported):
            self.reports[ev.name] = ev
            log.info("%s reported %s: %s", ev.name, ev.status, ev.summary)
            self._notify()
        else:
            await super().on_request(ev, conn)

    async def _register(self, ev: RegisterService, conn: Connection) -> None:
        if self.run_digest and ev.run_digest and ev.run_digest != self.run_digest:
            why = (
                f"refused: {ev.name}'s run config (digest {ev.run_digest}) differs from the "
                f"controller's ({self.run_digest}); start it with the same config and --set"
            )
            log.error("%s", why)
            self.counters["registrations_refused"] += 1
            await self._tell(conn, Shutdown(reason=why))
            return
        if self.restarts.get(ev.name) and ev.name not in self.heartbeats:
            self._settle_retired_learner(ev.name)  # the next incarnation joins
        old = self.registry.get(ev.name)
        if old is not None and old.conn is not conn:
            log.warning(
                "%s registered again from %s; replacing %s", ev.name, ev.address, old.address
            )
        before = set(old.publishes) if old is not None else set()
        now = time.monotonic()
        self.registry[ev.name] = ServiceRecord(
            name=ev.name,
            role=ev.role,
            address=ev.address,
            publishes=ev.publishes,
            host=ev.host,
            pid=ev.pid,
            conn=conn,
            registered_at=now,
            last_seen=now,
            local_address=ev.local_address,
            locality=ev.locality,
        )
        log.info("registered %s (%s) at %s", ev.name, ev.role, ev.address)
        await self._tell(conn, ServiceRegistered(name=ev.name, run_id=self.run_id))
        changed = before ^ set(ev.publishes)
        if old is not None and (old.address, old.local_address) != (
            ev.address,
            ev.local_address,
        ):
            changed |= before | set(ev.publishes)
        await self._announce(changed)
        self._notify()

    async def on_peer_closed(self, conn: Connection) -> None:
        gone = [r for r in self.registry.values() if r.conn is conn]
        for record in gone:
            del self.registry[record.name]
            log.info("%s (%s) left", record.name, record.role)
        for watchers in self._watchers.values():
            watchers.discard(conn)
        await self._announce({t for r in gone for t in r.publishes})
        self._notify()

    async def _announce(self, topics: set[str]) -> None:
        for name in sorted(topics):
            for watcher in list(self._watchers.get(name, ())):
                where = self._locality_of(watcher)
                update = PublishersChanged(topic=name, addresses=self.publishers(name, where))
                await self._tell(watcher, update)

    def retire(self, name: str) -> None:
        """``name`` died and will be restarted: keep its last counts under ``name#<k>``
        (k-th death) so the run's totals and accounting stay cumulative, count what it held
        (``buffered_samples``, ``held_samples``) as ``dropped/lost_in_restart``, and let the
        next incarnation report from zero under ``name``."""
        self.restarts[name] += 1
        if self.balancer is not None:
            self.balancer.forget(name)
        hb = self.heartbeats.pop(name, None)
        if hb is None:
            return
        counters = dict(hb.counters)
        gauges = dict(hb.gauges)
        lost = int(gauges.pop("buffered_samples", 0) + gauges.pop("held_samples", 0))
        if lost:
            counters["dropped/lost_in_restart"] = counters.get("dropped/lost_in_restart", 0) + lost
        retired = f"{name}#{self.restarts[name]}"
        self.heartbeats[retired] = dataclasses.replace(
            hb, name=retired, state="dead", counters=counters, gauges=gauges
        )
        self._notify()

    def _settle_retired_learner(self, name: str) -> None:
        """Rollout batches a buffer sent to a learner that died before it received them
        will never be consumed: count them as ``dropped/lost_in_restart`` (and received) on
        its retired incarnation. Done when the next incarnation registers, when the
        buffers' heartbeats have long reported their last sends; without it the controller
        would wait for that backlog forever and keep the actors paused."""
        retired = f"{name}#{self.restarts[name]}"
        hb = self.heartbeats.get(retired)
        if hb is None or hb.role != "learner":
            return
        beats = self.heartbeats.values()
        sent = sum(b.counters.get("samples_sent", 0) for b in beats if b.role == "buffer")
        received = sum(b.counters.get("samples_received", 0) for b in beats if b.role == "learner")
        lost = sent - received
        if lost <= 0:
            return
        counters = dict(hb.counters)
        counters["samples_received"] = counters.get("samples_received", 0) + lost
        counters["dropped/lost_in_restart"] = counters.get("dropped/lost_in_restart", 0) + lost
        self.heartbeats[retired] = dataclasses.replace(hb, counters=counters)
        log.warning("%s died with %d samples on their way to it: lost_in_restart", name, lost)

    async def command(self, name: str, ev: Event) -> bool:
        """Send a command to one registered service; False if it is not registered or the
        send failed."""
        return await self._command(name, ev)

    async def _command(self, name: str, ev: Event) -> bool:
        record = self.registry.get(name)
        if record is None:
            return False
        try:
            await record.conn.send(self._frames(ev, CONTROL))
        except TianjiError as exc:
            log.info("cannot send %s to %s: %s", ev.TYPE, name, str(exc))
            return False
        return True

    async def _tell(self, conn: Connection, ev: Event) -> None:
        try:
            await conn.send(self._frames(ev, CONTROL))
        except TianjiError as exc:
            log.debug("cannot tell %s about %s: %s", conn.peer, ev.TYPE, str(exc))


Send = Callable[[str, Event], Awaitable[bool]]


class Balancer:
    """The controller's balance shell: heartbeats in, commands out; the policy decides.

    In ``sync`` mode each actor enforces one fragment per policy version itself (a round
    trip through the controller would only add latency to the baseline), so the policy's
    ``paused`` set is reported, not sent; the learner's grant is sent in every mode but
    ``unbalanced``. With K data-parallel learners the policy's limit is for all of them
    and each learner is granted ``limit // K`` (they consume equal batches in lockstep).
    On-policy ``relaxed`` producers are paced by production grants (``ProductionGranted``);
    off-policy ones by ``PauseProduction`` / ``ResumeProduction``.

    It is also the run's watchdog: when no sample is produced and none consumed for
    ``config.watchdog_s`` seconds while producers and learners are up, it logs who waits for
    what (:meth:`stall_report`) and :meth:`metrics` shows it (``stalled``) in the progress
    line and ``/api/status`` until the run moves again.

    Args:
        config: the balance settings.
        send: ``await send(service_name, event) -> delivered``.
        window: seconds over which production and consumption rates are measured.
    """

    ROLES = frozenset({"actor", "buffer", "learner"})

    def __init__(self, config: BalanceConfig, send: Send, *, window: float = 5.0) -> None:
        self.config = config
        self.policy = BalancePolicy(config)
        self._send = send
        self.window = window
        self.paused: set[str] = set()
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

    def forget(self, name: str) -> None:
        """``name`` died: its next incarnation starts without grants."""
        self.grants.pop(name, None)
        self.production.pop(name, None)
        self._incarnation.pop(name, None)
        self.paused.discard(name)

    @staticmethod
    def observe(
        heartbeats: Mapping[str, Heartbeat],
        live: Mapping[str, Any],
        granted: Mapping[str, int] | None = None,
    ) -> Observation:
        """The policy's view of the run from the latest heartbeats of live services (and
        the counts of dead incarnations, ``name#k``, which stay in the totals)."""
        inserted = consumed = dropped = produced = version = 0
        params: int | None = None
        filling = False
        versions: dict[str, int] = {}
        fragments: dict[str, int] = {}
        sent: dict[str, int] = {}
        for name, hb in heartbeats.items():
            if hb.role == "buffer":
                inserted += hb.counters.get("samples_inserted", 0)
                dropped += _dropped(hb)
                filling |= name in live and hb.gauges.get("ready", 1.0) < 1.0
            elif hb.role == "learner":
                consumed += hb.counters.get("samples_consumed", 0)
                dropped += _dropped(hb)
                version = max(version, hb.counters.get("learner_updates", 0))
                if "params_version" in hb.gauges and name in live:
                    params = max(params or 0, int(hb.gauges["params_version"]))
            elif hb.role == "actor":
                produced += hb.counters.get("samples_produced", 0)
                dropped += _dropped(hb)
                # a producer counts from its first heartbeat since it registered: until
                # then the last one may be an earlier incarnation's (its counts, not ours)
                if name in live and getattr(live[name], "last_heartbeat", hb) is not None:
                    versions[name] = int(hb.gauges.get("policy_version", -1))
                    fragments[name] = int(hb.gauges.get("fragments_at_version", 0))
                    sent[name] = int(hb.counters.get("fragments_sent", 0))
        return Observation(
            inserted=inserted,
            consumed=consumed,
            dropped=dropped,
            learner_version=version,
            producer_versions=versions,
            fragments_at_version=fragments,
            filling=filling,
            produced=produced,
            fragments_sent=sent,
            granted={p: granted.get(p, 0) for p in versions} if granted else {},
            params_version=params,
        )

    async def update(self, heartbeats: Mapping[str, Heartbeat], live: Mapping[str, Any]) -> None:
        """Decide on the latest heartbeats and send what changed."""
        self._track_incarnations(live)
        granted = {n: g.limit for n, g in self.production.items()}
        obs = self.observe(heartbeats, live, granted)
        now = time.monotonic()
        self._history.append((now, obs.inserted, obs.consumed))
        while len(self._history) > 2 and self._history[1][0] < now - self.window:
            self._history.popleft()
        decision = self.policy.decide(obs)
        self.decisions += 1
        if self.last is None or decision.reason.split(":")[0] != self.last.reason.split(":")[0]:
            log.debug("balance: %s", decision.reason)
        self.last = decision
        if decision.grants is not None:
            await self._grant_production(decision, live)
        elif self.config.mode == "relaxed":
            await self._pause_resume(decision)
        self.paused &= set(live)
        self._watch(obs, heartbeats, live, now)
        if self.config.mode == "unbalanced" or decision.consume_limit is None:
            return
        # Data-parallel learners step together on equal batches: each gets an equal share.
        limit = decision.consume_limit // self.config.learners
        learners = [n for n, hb in heartbeats.items() if hb.role == "learner" and n in live]
        for name in learners:
            own = limit - _retired_consumed(heartbeats, name)  # a restarted one counts from 0
            if self.grants.get(name) != own:
                grant = ConsumptionGranted(limit=own, reason=decision.reason)
                if await self._send(name, grant):
                    self.grants[name] = own
                    self.commands["grant"] += 1

    def _track_incarnations(self, live: Mapping[str, Any]) -> None:
        """A producer registered anew (restarted under its name) counts its fragments from
        0 again: its grants start over."""
        for name in list(self.production):
            registered = getattr(live.get(name), "registered_at", None)
            if name not in live or registered != self._incarnation.get(name):
                self.forget(name)

    async def _grant_production(self, decision: Decision, live: Mapping[str, Any]) -> None:
        assert decision.grants is not None
        self.paused = set(decision.paused)
        for name, grant in sorted(decision.grants.items()):
            ev = ProductionGranted(
                limit=grant.limit, min_version=grant.min_version, reason=decision.reason
            )
            if await self._send(name, ev):
                self.production[name] = grant
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
        learners_up = any(hb.role == "learner" and n in live for n, hb in heartbeats.items())
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
            if grant is not None or (self.config.on_policy and self.config.mode == "relaxed"):
                limit = grant.limit if grant else 0
                if sent >= limit:
                    why = f"waits for a grant (sent {sent} of {limit} granted)"
                elif grant is not None and version < grant.min_version:
                    why = f"waits for weights v{grant.min_version} (has v{version})"
                else:
                    why = f"may collect (sent {sent} of {limit} granted, v{version})"
            elif name in self.paused:
                why = f"paused (v{version})"
            else:
                why = f"not paused (v{version}, {obs.fragments_at_version.get(name, 0)} at it)"
            parts.append(f"{name} {why}")
        for name, hb in sorted(heartbeats.items()):
            if name not in live:
                continue
            if hb.role == "learner":
                cap = hb.gauges.get("consume_limit")
                allowed = f", grant {cap:.0f}" if cap is not None else ""
                parts.append(
                    f"{name} v{hb.counters.get('learner_updates', 0)} consumed "
                    f"{hb.counters.get('samples_consumed', 0)}{allowed}, holds "
                    f"{hb.gauges.get('held_samples', 0):.0f} samples"
                )
            elif hb.role == "buffer":
                parts.append(
                    f"{name} holds {hb.gauges.get('size', 0):.0f} "
                    f"({hb.gauges.get('buffered_samples', 0):.0f} samples)"
                )
        if self.last is not None:
            parts.append(f"balance: {self.last.reason}")
        return "; ".join(parts)

    async def _pause_resume(self, decision: Decision) -> None:
        wanted = set(decision.paused)
        for name in sorted(wanted - self.paused):
            if await self._send(name, PauseProduction(reason=decision.reason)):
                self.paused.add(name)
                self.commands["pause"] += 1
        for name in sorted(self.paused - wanted):
            self.paused.discard(name)
            if await self._send(name, ResumeProduction(reason=decision.reason)):
                self.commands["resume"] += 1

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
            "balance/paused_producers": float(len(self.paused)),
            "balance/decisions": float(self.decisions),
        }

    def metrics(self, heartbeats: Mapping[str, Heartbeat]) -> dict[str, Any]:
        """The run's balance metrics (see docs/architecture.md, "The controller")."""
        obs = self.observe(heartbeats, heartbeats)
        production, consumption = self.rates()
        effective = obs.inserted - self.config.min_replay_size
        pause = {
            n: round(hb.gauges.get("paused_s", 0.0), 3)
            for n, hb in sorted(heartbeats.items())
            if hb.role == "actor"
        }
        wait = sum(hb.gauges.get("waiting_s", 0.0) for hb in heartbeats.values())
        learners = [hb for hb in heartbeats.values() if hb.role == "learner"]
        idle = sum(hb.gauges.get("idle_s", 0.0) for hb in learners)
        busy = sum(hb.gauges.get("update_s", 0.0) for hb in learners)
        return {
            "mode": self.config.mode,
            "samples_inserted": obs.inserted,
            "samples_consumed": obs.consumed,
            "production_per_s": round(production, 1),
            "consumption_per_s": round(consumption, 1),
            "ratio": round(obs.consumed / effective, 3) if effective > 0 else None,
            "ratio_target": None if self.config.on_policy else self.config.replay_ratio,
            "ratio_window": round(consumption / production, 3) if production > 0 else None,
            "paused_now": sorted(self.paused),
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
            "stalled": self.stalled,
            "stalls": self.stalls,
        }


def _retired_consumed(heartbeats: Mapping[str, Heartbeat], name: str) -> int:
    """Samples consumed by the earlier incarnations of ``name`` (see Controller.retire)."""
    prefix = f"{name}#"
    return sum(
        hb.counters.get("samples_consumed", 0)
        for n, hb in heartbeats.items()
        if n.startswith(prefix)
    )


def _dropped(hb: Heartbeat) -> int:
    return sum(v for k, v in hb.counters.items() if k.startswith("dropped/"))


def dropped_by_reason(heartbeats: Mapping[str, Heartbeat]) -> dict[str, int]:
    """Samples dropped anywhere in the run, by reason (``dropped/<reason>`` counters)."""
    out: collections.Counter[str] = collections.Counter()
    for hb in heartbeats.values():
        for key, value in hb.counters.items():
            if key.startswith("dropped/"):
                out[key.split("/", 1)[1]] += value
    return dict(sorted(out.items()))


def lag_summary(heartbeats: Mapping[str, Heartbeat]) -> dict[str, float] | None:
    """Policy lag of consumed samples over all learners: mean, p50, p95, max."""
    counts: collections.Counter[int] = collections.Counter()
    total = peak = 0
    for hb in heartbeats.values():
        if hb.role != "learner":
            continue
        for key, value in hb.counters.items():
            if key.startswith("lag/"):
                counts[int(key.split("/", 1)[1])] += value
        total += hb.counters.get("lag_sum", 0)
        peak = max(peak, hb.counters.get("lag_max", 0))
    return LagStats.summarize(dict(counts), total, peak)


def accounting(heartbeats: Mapping[str, Heartbeat], on_policy: bool) -> dict[str, Any]:
    """Where every produced sample went, from the counters of actors, buffers and learners.

    On-policy: ``produced = consumed + buffered + dropped + in_flight``; off-policy (replay
    samples are drawn, not taken): ``produced + restored = buffered + dropped + in_flight``
    and ``consumed`` counts draws (``restored``: what resumed replay shards started with).
    ``in_flight`` is measured from both ends of each link
    (sent by one service, not yet received by the next), never derived from the identity,
    so ``balanced`` checks the bookkeeping of every service.
    """

    def total(role: str, key: str, gauge: bool = False) -> int:
        return int(
            sum(
                (hb.gauges if gauge else hb.counters).get(key, 0)
                for hb in heartbeats.values()
                if hb.role == role
            )
        )

    produced = total("actor", "samples_produced")
    unsent = total("actor", "dropped/unsent")
    inserted = total("buffer", "samples_inserted")
    in_flight = produced - unsent - inserted
    consumed = total("learner", "samples_consumed")
    if on_policy:  # sent by the buffer and not received yet, or held by the learner
        in_flight += total("buffer", "samples_sent") - total("learner", "samples_received")
        in_flight += total("learner", "held_samples", gauge=True)
    dropped = dropped_by_reason(
        {n: hb for n, hb in heartbeats.items() if on_policy or hb.role != "learner"}
    )
    buffered = total("buffer", "buffered_samples", gauge=True)
    restored = total("buffer", "samples_restored")
    accounted = buffered + sum(dropped.values()) + in_flight + (consumed if on_policy else 0)
    return {
        "produced": produced,
        "restored": restored,
        "consumed": consumed,
        "buffered": buffered,
        "dropped": dropped,
        "in_flight": in_flight,
        "balanced": produced + restored == accounted,
    }
