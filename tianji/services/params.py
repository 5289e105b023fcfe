"""The parameter service, which keeps the latest weights and hands them to every newcomer,
and its per-host relay."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np

from tianji.rl.events import ParamsPublished, SnapshotTaken
from tianji.rl.stats import ParamsStat
from tianji.rl.topics import LATEST_PARAMS, LEARNER_PARAMS, SNAPSHOTS
from tianji.runtime.controller import RELAY_ROLE
from tianji.runtime.core import Connection
from tianji.runtime.service import Service

__all__ = ["ParamsRelay", "ParamsService"]


class ParamsService(Service):
    """Subscribes to the learner's weights; republishes the newest on ``LATEST_PARAMS``.

    A late or restarted actor gets the current weights the moment it subscribes. Large
    weights go to the subscribers on this host through a shared-memory board, written once
    per version (:mod:`tianji.runtime.sharing`).
    """

    role = "params"
    source = LEARNER_PARAMS

    def __init__(
        self, name: str, *, snapshot_every: int = 0, pool_size: int = 0, **kwargs: Any
    ) -> None:
        topics = [LATEST_PARAMS, SNAPSHOTS] if snapshot_every else [LATEST_PARAMS]
        super().__init__(name, publishes=topics, **kwargs)
        self.latest: ParamsPublished | None = None
        self.snapshot_every = snapshot_every
        """Self-play (``[selfplay] snapshot_every``): versions between league snapshots."""
        self.snapshots: collections.deque[SnapshotTaken] = collections.deque(
            maxlen=max(1, pool_size)
        )
        self._next_snapshot = 0  # the first weights received are a snapshot
        self.subscribe(self.source, self.on_params, latest_only=self.source == LATEST_PARAMS)
        self.share_on_board(LATEST_PARAMS)

    async def on_params(self, ev: ParamsPublished) -> None:
        if self.latest is not None and ev.policy_version <= self.latest.policy_version:
            self.counters["params_out_of_order"] += 1
            return
        # Our own copy: received over shared memory, the weights view the learner's ring,
        # and keeping them (here, and in what waits to be sent or is held for subscribers
        # that take them on demand) would hold its space until newer ones replace them.
        ev = ParamsPublished(
            policy_version=ev.policy_version,
            weights={k: np.array(v, copy=True) for k, v in ev.weights.items()},
        )
        self.latest = ev
        self.counters[ParamsStat.PARAMS_VERSION] = ev.policy_version
        await self.publish(ev, LATEST_PARAMS)
        if self.snapshot_every and ev.policy_version >= self._next_snapshot:
            await self._snapshot(ev)

    async def _snapshot(self, ev: ParamsPublished) -> None:
        """Freeze ``ev``'s weights as a league snapshot; the pool keeps the newest
        ``pool_size`` (the league and the actors keep the same ones)."""
        snapshot = SnapshotTaken(policy_version=ev.policy_version, weights=ev.weights)
        self.snapshots.append(snapshot)
        self._next_snapshot = ev.policy_version + self.snapshot_every
        self.counters[ParamsStat.SNAPSHOTS] += 1
        await self.publish(snapshot, SNAPSHOTS)

    async def on_subscribed(self, conn: Connection, topics: Sequence[str]) -> None:
        if LATEST_PARAMS in topics and self.latest is not None:
            await self.send_to_subscriber(conn, self.latest, LATEST_PARAMS)
        if SNAPSHOTS in topics:  # a late or restarted actor (or league) gets the pool
            for snapshot in list(self.snapshots):
                await self.send_to_subscriber(conn, snapshot, SNAPSHOTS)


class ParamsRelay(ParamsService):
    """A host's copy of the params service (``tianji serve relay CONFIG``): takes each
    version once from the params service over the network and hands it to the actors and
    inference services of its host through its board, so the params service sends one
    copy per host instead of one per actor. The controller tells the subscribers of the
    relay's host the relay only (:data:`~tianji.runtime.controller.RELAY_ROLE`); they fall
    back to the params service when it leaves."""

    role = RELAY_ROLE
    source = LATEST_PARAMS
