"""A population member's view of the run's controller (:class:`MemberController`).

The run-level code written for one policy — progress snapshots, summaries, the drain,
restarts, the start watchdog — reads the controller's registry and heartbeats by service
name and sends commands by name. A :class:`MemberController` gives it one member's share
under the local names (``learner-0``, not ``m1.learner-0``), so that code runs unchanged
once per member (:mod:`tianji.runtime.scope`).
"""

from __future__ import annotations

import collections
from typing import Any, TypeVar

from tianji.runtime.controller import Controller
from tianji.runtime.events import Event, Heartbeat
from tianji.runtime.scope import full_name, local_view

__all__ = ["MemberController"]

P = TypeVar("P")


class MemberController:
    """The controller as one member (``scope``) sees it; ``plugins`` are the member's own
    (its balancer), found by :meth:`plugin` before the controller's."""

    def __init__(self, controller: Controller, scope: str, plugins: list[Any]) -> None:
        self.controller = controller
        self.scope = scope
        self.plugins = plugins

    @property
    def name(self) -> str:
        return self.controller.name

    @property
    def run_id(self) -> str:
        return self.controller.run_id

    @property
    def heartbeats(self) -> dict[str, Heartbeat]:
        return local_view(self.controller.heartbeats, self.scope)

    @property
    def registry(self) -> dict[str, Any]:
        return local_view(self.controller.registry, self.scope)

    @property
    def restarts(self) -> collections.Counter[str]:
        return collections.Counter(local_view(self.controller.restarts, self.scope))

    def failing_links(self) -> dict[str, dict[str, str]]:
        return local_view(self.controller.failing_links(), self.scope)

    def plugin(self, kind: type[P]) -> P | None:
        for plugin in self.plugins:
            if isinstance(plugin, kind):
                return plugin
        return self.controller.plugin(kind)

    async def command(self, name: str, ev: Event) -> bool:
        """Send a command to the member's service ``name`` (its local name)."""
        return await self.controller.command(full_name(self.scope, name), ev)
