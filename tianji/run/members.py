"""A population member's view of the run's controller (:class:`MemberController`).

The run-level code written for one policy — progress snapshots, summaries, the drain,
restarts, the start watchdog — reads the controller's registry and heartbeats by service
name and sends commands by name. A :class:`MemberController` gives it one member's share
under the local names (``learner-0``, not ``m1.learner-0``), so that code runs unchanged
once per member (:mod:`tianji.runtime.scope`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tianji.runtime.controller import Controller
from tianji.runtime.events import Event, Heartbeat
from tianji.runtime.scope import ScopedViews, full_name, local_view

__all__ = ["MemberController", "PopulationMonitor"]

P = TypeVar("P")


class MemberController:
    """The controller as one member (``scope``) sees it; ``plugins`` are the member's own
    (its balancer), found by :meth:`plugin` before the controller's."""

    def __init__(
        self,
        controller: Controller,
        scope: str,
        plugins: list[Any],
        heartbeats: ScopedViews[Heartbeat] | None = None,
        registry: ScopedViews[Any] | None = None,
    ) -> None:
        self.controller = controller
        self.scope = scope
        self.plugins = plugins
        self._heartbeats = heartbeats or ScopedViews()  # shared by the members' views
        self._registry = registry or ScopedViews()

    @property
    def name(self) -> str:
        return self.controller.name

    @property
    def run_id(self) -> str:
        return self.controller.run_id

    @property
    def heartbeats(self) -> dict[str, Heartbeat]:
        return self._heartbeats.view(self.controller.heartbeats, self.scope)

    @property
    def registry(self) -> dict[str, Any]:
        return self._registry.view(self.controller.registry, self.scope)

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


class PopulationMonitor:
    """The members' monitors as one, for what reads a run's monitor (the dashboard's
    counters, a failed run's record): env steps and episodes of all members, the best
    member's mean return, recent returns of every member; checkpoints are per member
    (``members/<m>/checkpoints``), shown here as member ``m0``'s."""

    def __init__(self, monitors: Callable[[], list[Any]]) -> None:
        self._monitors = monitors

    def _all(self) -> list[Any]:
        return [m for m in self._monitors() if m is not None]

    @property
    def env_steps(self) -> int:
        return sum(m.env_steps for m in self._all())

    @property
    def episodes(self) -> int:
        return sum(m.episodes for m in self._all())

    @property
    def returns(self) -> collections.deque[float]:
        merged: collections.deque[float] = collections.deque()
        for m in self._all():
            merged.extend(m.returns)
        return merged

    @property
    def checkpoint_version(self) -> int:
        found = self._all()
        return found[0].checkpoint_version if found else -1

    @property
    def last_checkpoint(self) -> Path | None:
        found = self._all()
        return found[0].last_checkpoint if found else None

    def mean_return(self) -> float | None:
        means = [r for m in self._all() if (r := m.mean_return()) is not None]
        return max(means) if means else None

    def done(self) -> str | None:
        return next((r for m in self._all() if (r := m.done()) is not None), None)

    def fail_run(self, reason: str) -> None:
        for m in self._all():
            m.fail_run(reason)
