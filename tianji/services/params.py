"""The parameter service: keeps the latest weights and hands them to every newcomer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tianji.rl.events import ParamsPublished
from tianji.rl.stats import ParamsStat
from tianji.rl.topics import LATEST_PARAMS, LEARNER_PARAMS
from tianji.runtime.core import Connection
from tianji.runtime.service import Service

__all__ = ["ParamsService"]


class ParamsService(Service):
    """Subscribes to the learner's weights; republishes the newest on ``LATEST_PARAMS``.

    A late or restarted actor gets the current weights the moment it subscribes.
    """

    role = "params"

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, publishes=[LATEST_PARAMS], **kwargs)
        self.latest: ParamsPublished | None = None
        self.subscribe(LEARNER_PARAMS, self.on_params)

    async def on_params(self, ev: ParamsPublished) -> None:
        if self.latest is not None and ev.policy_version <= self.latest.policy_version:
            self.counters["params_out_of_order"] += 1
            return
        self.latest = ev
        self.counters[ParamsStat.PARAMS_VERSION] = ev.policy_version
        await self.publish(ev, LATEST_PARAMS)

    async def on_subscribed(self, conn: Connection, topics: Sequence[str]) -> None:
        if LATEST_PARAMS in topics and self.latest is not None:
            await self.send_to_subscriber(conn, self.latest, LATEST_PARAMS)
