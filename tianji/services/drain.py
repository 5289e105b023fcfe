"""The drained end: before a clean stop, nothing is left on its way between services.

Shutdown stops every service at once; a fragment an actor sends while its buffer leaves,
or a batch on its way to a learner that stopped listening, would be lost at the very end
of every run. :func:`drain` first stops the flow and waits (bounded) until every link
between live services has delivered what was sent on it, measured at both ends
(:func:`tianji.rl.books.accounting`): the balancer sends no more grants, every actor's
grant is taken back (a grant of nothing) and every learner's consumption frozen at what
it reported; then it waits until each live actor reports waiting with nothing being
sent, every live service has reported since the drain began, and the books show nothing
in flight between live services, for a few consecutive looks. It returns what it saw
(``drained``, seconds, what was still in flight and why), which the run summary keeps
beside the final books.

Usage (from a run's ``before_stop``)::

    report = await drain(controller, balancer, timeout=5.0)
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tianji.rl.books import accounting
from tianji.rl.events import GrantConsumption, GrantProduction
from tianji.rl.stats import ActorStat, LearnerStat
from tianji.runtime.controller import Controller
from tianji.runtime.events import Heartbeat
from tianji.services.balancer import Balancer

__all__ = ["drain"]

log = logging.getLogger("tianji.drain")

LOOK_S = 0.05
"""Seconds between two looks at the books."""
STEADY_LOOKS = 3
"""Consecutive looks with nothing in flight before the run counts as drained."""
FRESH = frozenset({"actor", "learner"})
"""Roles that must have reported since the drain began (they report on the commands it
sends; a buffer reports whenever data moves, and stale counts of its show as in flight)."""


async def drain(controller: Controller, balancer: Balancer, timeout: float) -> dict[str, Any]:
    """Stop the flow and wait until nothing is in flight between live services.

    Args:
        controller: the run's controller (its registry and heartbeats).
        balancer: the run's balancer (it stops sending grants from now on).
        timeout: the longest wait, in seconds.

    Returns:
        ``{"drained", "waited_s", "in_flight", "why"}``: ``why`` names what was still in
        flight or still producing when the wait ended (``None`` once drained).
    """
    started = time.monotonic()
    balancer.draining = True
    live = dict(controller.registry)
    reason = "draining before the run stops"
    for name, record in sorted(live.items()):
        if record.role == "actor":
            # a grant of nothing: what was granted and not started is taken back
            await controller.command(name, GrantProduction(limit=0, min_version=0, reason=reason))
        elif record.role == "learner":
            consumed = _consumed(record.last_heartbeat)
            await controller.command(name, GrantConsumption(limit=consumed, reason=reason))
    before = {name: record.last_heartbeat for name, record in live.items()}
    steady = in_flight = 0
    why: str | None = None
    while True:
        why, in_flight = _still_moving(controller, before, balancer.config.on_policy)
        steady = steady + 1 if why is None else 0
        if steady >= STEADY_LOOKS:
            break
        if time.monotonic() - started >= timeout:
            log.warning("the run stops with samples still in flight: %s", why)
            break
        await asyncio.sleep(LOOK_S)
    return {
        "drained": steady >= STEADY_LOOKS,
        "waited_s": round(time.monotonic() - started, 3),
        "in_flight": in_flight,
        "why": None if steady >= STEADY_LOOKS else f"timeout after {timeout:g} s: {why}",
    }


def _consumed(hb: Heartbeat | None) -> int:
    return 0 if hb is None else int(hb.counters.get(LearnerStat.SAMPLES_CONSUMED, 0))


def _still_moving(
    controller: Controller, before: dict[str, Heartbeat | None], on_policy: bool
) -> tuple[str | None, int]:
    """What keeps the run from counting as drained now (None: nothing), and the samples in
    flight between live services."""
    live = controller.registry
    books = accounting(controller.heartbeats, on_policy)
    in_flight = sum(
        hop["in_flight"] - hop.get("pending_restart", 0) for hop in books["hops"].values()
    )
    for name, record in sorted(live.items()):
        hb = record.last_heartbeat
        if record.role in FRESH and name in before and hb is before[name]:
            return f"no report from {name} since the drain began", in_flight
        producing = hb is not None and (
            hb.gauges.get(ActorStat.SENDING, 0) or not hb.gauges.get(ActorStat.WAITING, 0)
        )
        if record.role == "actor" and producing:
            return f"{name} is still producing", in_flight
    if in_flight:
        links = {
            link: n
            for hop in books["hops"].values()
            for link, n in hop.get("in_flight_by_link", {}).items()
        }
        return f"{in_flight} samples in flight ({links})", in_flight
    return None, 0
