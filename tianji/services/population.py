"""The population's balance: one :class:`~tianji.services.balancer.Balancer` per member.

A population run (``[population] size = N``) runs each member's services in a scope of
their own (:mod:`tianji.runtime.scope`). :class:`PopulationBalancer` is the controller's
one plug-in for all of them: on every decision it hands each member's balancer that
member's heartbeats under their local names, so each balances its member as a whole
single-policy run — its learner's consumption paces its actors, its lag is bounded, its
books close on their own — and its commands go out under the full names. Paused actors
of a slow member leave their cores to the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tianji.runtime.controller import Send
from tianji.runtime.events import Event, Heartbeat
from tianji.runtime.scope import ScopedViews, full_name, local_view, scope_of, split_name
from tianji.services.balancer import Balancer

__all__ = ["PopulationBalancer"]


class PopulationBalancer:
    """The controller plug-in of a population run: one balancer per member scope.

    Args:
        members: scope -> that member's balancer.
        heartbeats, registry: the members' views of the controller's heartbeats and
            registry (shared with the run's member views, :class:`ScopedViews`).
    """

    roles = Balancer.ROLES

    def __init__(
        self,
        members: Mapping[str, Balancer],
        heartbeats: ScopedViews[Heartbeat] | None = None,
        registry: ScopedViews[Any] | None = None,
    ) -> None:
        if not members:
            raise ValueError("a population needs at least one member")
        self.members = dict(members)
        self.heartbeat_views = heartbeats or ScopedViews()
        self.registry_views = registry or ScopedViews()

    def attach(self, send: Send) -> None:
        """Each member's commands go to its services' full names."""
        for scope, balancer in self.members.items():
            balancer.attach(_scoped_send(send, scope))

    async def update(self, heartbeats: Mapping[str, Heartbeat], live: Mapping[str, Any]) -> None:
        beats, alive = self.heartbeat_views.of(heartbeats), self.registry_views.of(live)
        for scope, balancer in self.members.items():
            await balancer.update(beats.get(scope, {}), alive.get(scope, {}))

    def gauges(self) -> dict[str, float]:
        """The members' balance gauges, summed (rates, paused producers, decisions)."""
        total: dict[str, float] = {}
        for balancer in self.members.values():
            for key, value in balancer.gauges().items():
                total[key] = total.get(key, 0.0) + value
        return total

    def _member(self, name: str) -> tuple[Balancer, str] | None:
        balancer = self.members.get(scope_of(name))
        return (balancer, split_name(name, scope_of(name))) if balancer is not None else None

    def forget(self, name: str) -> None:
        found = self._member(name)
        if found is not None:
            found[0].forget(found[1])

    def retired(self, hb: Heartbeat) -> Heartbeat:
        found = self._member(hb.name)
        return found[0].retired(hb) if found is not None else hb

    def rejoined(self, retired: str, heartbeats: dict[str, Heartbeat]) -> None:
        found = self._member(retired)
        if found is not None:
            balancer, local = found
            balancer.rejoined(local, local_view(heartbeats, scope_of(retired)))


def _scoped_send(send: Send, scope: str) -> Send:
    async def scoped(name: str, ev: Event) -> bool:
        return await send(full_name(scope, name), ev)

    return scoped
