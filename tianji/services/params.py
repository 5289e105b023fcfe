"""The parameter service, which keeps the latest weights and hands them to every newcomer,
and its per-host relay."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tianji.rl.events import ParamsPublished
from tianji.rl.stats import ParamsStat
from tianji.rl.topics import LATEST_PARAMS, LEARNER_PARAMS
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

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, publishes=[LATEST_PARAMS], **kwargs)
        self.latest: ParamsPublished | None = None
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

    async def on_subscribed(self, conn: Connection, topics: Sequence[str]) -> None:
        if LATEST_PARAMS in topics and self.latest is not None:
            await self.send_to_subscriber(conn, self.latest, LATEST_PARAMS)


class ParamsRelay(ParamsService):
    """A host's copy of the params service (``tianji serve relay CONFIG``): takes each
    version once from the params service over the network and hands it to the actors and
    inference services of its host through its board, so the params service sends one
    copy per host instead of one per actor. The controller tells the subscribers of the
    relay's host the relay only (:data:`~tianji.runtime.controller.RELAY_ROLE`); they fall
    back to the params service when it leaves."""

    role = RELAY_ROLE
    source = LATEST_PARAMS
