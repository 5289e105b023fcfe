"""How K data-parallel learners average their gradients (``learner.count = K > 1``).

Two ways, chosen by learner-0 and announced to the others with one
:class:`~tianji.rl.events.RendezvousOffered` (a learner that subscribes later gets it at
once), so every learner takes the same:

* ``"collective"``: PyTorch's process group (:mod:`tianji.services.collective`; gloo, or
  NCCL when learner-0 computes on CUDA). Learner-0 hosts the rendezvous store on its
  advertised host and ``learner.rendezvous_port``; the gradients are reduced in place on
  their device, in buckets.
* ``"transport"``: the all-to-all over tianji's own transports
  (:mod:`tianji.services.allreduce`): each learner publishes its flat gradient to the
  K - 1 others.

``learner.allreduce = "auto"`` (the default) takes the collective on CUDA and for large
gradients, the all-to-all for small ones (:func:`choose_way`, after the measurements in
``docs/scaling.md``).

:class:`LearnerSync` is the part of :class:`~tianji.services.learner.LearnerService` that
does this.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any, Final

import numpy as np

from tianji.rl.algorithm import SupportsGradientSync
from tianji.rl.events import RendezvousOffered
from tianji.rl.topics import RENDEZVOUS, gradients_topic, learner_name
from tianji.runtime.errors import ConfigError, SyncFailed
from tianji.runtime.loop import in_daemon_thread
from tianji.services.allreduce import AllReduce, weights_digest
from tianji.services.collective import (
    CollectiveGroup,
    CollectiveSync,
    Rendezvous,
    host_rendezvous,
    pick_backend,
)
from tianji.services.devices import set_cuda_device, torch_device
from tianji.services.learner_state import LearnerState
from tianji.transports.tcp import parse_tcp_address

__all__ = ["TRANSPORT_BELOW", "LearnerSync", "choose_way", "sync_topics"]

log = logging.getLogger(__name__)

TRANSPORT_BELOW: Final = 2_000_000
"""``"auto"`` takes the all-to-all while ``(K - 1) x parameters`` is below this: on 2 cores
it was the faster way at K = 2 up to 1 M parameters and at K = 4 up to 100 k, the collective
at K = 2 with 10 M and at K = 4 with 1 M (``docs/scaling.md``)."""


def choose_way(setting: str, device: str, params: int, count: int) -> str:
    """The way K learners of ``params`` gradient values average them (see the module
    docstring): the collective on CUDA (NCCL, nothing through host memory) or when the
    all-to-all would send ``(K - 1) x params >= TRANSPORT_BELOW`` values per learner."""
    if setting != "auto":
        return setting
    if torch_device(device).type == "cuda":
        return "collective"
    return "transport" if (count - 1) * params < TRANSPORT_BELOW else "collective"


def sync_topics(name: str, index: int, count: int) -> list[str]:
    """What a learner publishes for the gradient sync: its gradients (the all-to-all) and,
    for learner-0, the rendezvous."""
    if count == 1:
        return []
    return [gradients_topic(name), *([RENDEZVOUS] if index == 0 else [])]


class LearnerSync(LearnerState):
    """The gradient sync of one data-parallel learner (see the module docstring)."""

    device: str

    def _setup_sync(self, name: str, index: int, count: int) -> None:
        """Subscribe to what the sync needs (the learner's index and name are checked
        before, by the learner service).

        Raises:
            ConfigError: for an algorithm without ``gradient_sync`` when K > 1.
        """
        self.collective: CollectiveSync | None = None  # once the group formed
        self.allreduce: AllReduce | None = None  # the all-to-all, when it is the way
        self._offer: RendezvousOffered | None = None  # learner-0's, or the one we got
        self._offered = asyncio.Event()
        if count == 1:
            return
        if not isinstance(self.algo, SupportsGradientSync):
            why = f"1: algorithm {self.config.algorithm!r} has no gradient_sync"
            raise ConfigError("learner.count", count, why)
        if index > 0:
            self.subscribe(RENDEZVOUS, self.on_rendezvous)
        self.allreduce = AllReduce(
            name,
            index=index,
            count=count,
            publish=lambda ev: self.publish(ev, gradients_topic(name)),
            timeout=self.config.learner.sync_timeout,
            counters=self.counters,
        )
        for peer in self.allreduce.peers.values():
            self.subscribe(gradients_topic(peer), self.allreduce.received)

    async def on_rendezvous(self, ev: RendezvousOffered) -> None:
        self._offer = ev
        self._offered.set()

    def _own_host(self) -> str:
        """The host of this learner's registered address (where its peers reach it); the
        loopback address for in-process and shared-memory transports or a wildcard bind."""
        if not self.address.startswith("tcp://"):  # in-process or shared memory: one host
            return "127.0.0.1"
        host = parse_tcp_address(self.address)[0]
        return "127.0.0.1" if host in ("0.0.0.0", "::") else host

    async def _start_sync(self) -> None:
        """Learner-0 chooses the way and offers it (with the collective's rendezvous store);
        the others wait for the offer; then each installs its ``gradient_sync``.

        Raises:
            SyncFailed: no offer, or no group, within ``learner.sync_timeout`` (naming the
                address); ConfigError: NCCL offered to a learner without a CUDA device.
        """
        learner = self.config.learner
        count, timeout = learner.count, learner.sync_timeout
        store = None
        if self.index == 0:
            params = sum(int(np.asarray(w).size) for w in self.algo.get_weights().values())
            way = choose_way(learner.allreduce, self.device, params, count)
            host, port, backend = "", 0, "transport"
            if way == "collective":
                store, where = host_rendezvous(
                    self._own_host(), count, port=learner.rendezvous_port, timeout_s=timeout
                )
                host, port = where.host, where.port
                backend = pick_backend([torch_device(self.device)])
            self._offer = RendezvousOffered(
                learner=self.name, host=host, port=port, backend=backend, generation=0
            )
            await self.publish(self._offer, RENDEZVOUS)
        else:
            try:
                await asyncio.wait_for(self._offered.wait(), timeout)
            except TimeoutError:
                why = f"no rendezvous offer within {timeout:g} s"
                raise SyncFailed(self.name, 0, [learner_name(0)], why) from None
        offer = self._offer
        assert offer is not None and self.allreduce is not None
        if offer.backend == "transport":
            self._install_transport(self.allreduce)
            await self.wait_subscribers(gradients_topic(self.name), count - 1)
        else:
            await self._join_group(offer, store)

    async def _join_group(self, offer: RendezvousOffered, store: Any) -> None:
        if offer.backend == "nccl" and torch_device(self.device).type != "cuda":
            why = f"a CUDA device: {offer.learner} chose nccl; give every learner one, or none"
            raise ConfigError(f"{self.name} device", self.device, why)
        if offer.backend == "nccl":
            set_cuda_device(self.device)
        where = Rendezvous(offer.host, offer.port, offer.generation)
        log.info("%s joins the %s group at %s:%d", self.name, offer.backend, where.host, where.port)
        index, count = self.index, self.config.learner.count
        timeout, own = self.config.learner.sync_timeout, self._own_host()
        group = await in_daemon_thread(
            lambda: CollectiveGroup(
                index, count, where, store=store, backend=offer.backend, host=own, timeout_s=timeout
            )
        )
        self.allreduce = None  # not the way: its handlers count nothing
        self.collective = CollectiveSync(group, self.algo.get_weights)
        self.algo.gradient_sync = self.collective

    def _install_transport(self, allreduce: AllReduce) -> None:
        """Give the algorithm a hook that runs each all-to-all step on the event loop and
        blocks the update's worker thread until it is done (bounded: the step times out)."""
        loop = asyncio.get_running_loop()
        bound = self.config.learner.sync_timeout + 10.0

        def sync(flat: np.ndarray) -> np.ndarray:
            digest = weights_digest(self.algo.get_weights()) if allreduce.wants_digest() else ""
            future = asyncio.run_coroutine_threadsafe(allreduce.reduce(flat, digest), loop)
            try:
                return future.result(bound)
            except concurrent.futures.TimeoutError:
                future.cancel()
                why = "event loop did not answer"
                raise SyncFailed(self.name, allreduce.step, [], why) from None

        self.algo.gradient_sync = sync

    def _close_sync(self) -> None:
        """Leave the group: an update blocked in the collective fails at once."""
        if self.collective is not None:
            self.collective.group.close()

    def _report_sync(self) -> None:
        """The sync's time and steps, in the heartbeat."""
        if self.collective is not None:
            self.gauges["allreduce_s"] = self.collective.group.seconds
            self.counters["allreduce/steps"] = self.collective.group.steps
        elif self.allreduce is not None and self.algo.gradient_sync is not None:
            self.gauges["allreduce_s"] = self.allreduce.wait_s
            self.counters["allreduce/steps"] = self.allreduce.step
