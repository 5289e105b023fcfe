"""Gradient all-reduce of data-parallel learners with PyTorch's own collectives.

K learners form one ``torch.distributed`` process group: gloo when a learner computes on
the CPU, NCCL when every learner has a CUDA device (:func:`pick_backend`). Learner-0 hosts
the group's rendezvous store (a ``TCPStore`` on a free port of its host,
:func:`host_rendezvous`); the others connect to the :class:`Rendezvous` it hands them. Each
optimizer step, :meth:`CollectiveGroup.all_reduce_mean` averages the learners' gradients
in buckets (as DDP does: many small tensors travel as a few flat buffers of at most
``bucket_bytes``), so the bytes a learner sends per step are about twice its gradient
whatever K is (ring all-reduce), where the all-to-all of :mod:`tianji.services.allreduce`
sends K - 1 copies.

Every learner ends a step with the same bytes (the collective's result is the same buffer
on every rank, divided by K the same way), so weights stay bit-identical. A peer that dies
or stalls fails the step (:class:`~tianji.runtime.errors.SyncFailed`, naming the step);
the group is then rebuilt under a new ``generation`` (a fresh key prefix in the same
store), so a restarted learner joins a group of its own generation and never meets the
dead one's leftovers.

The learner service forms the group when its learners average this way
(:mod:`tianji.services.learner_sync`) and installs :class:`CollectiveSync` as its
algorithm's ``gradient_sync``; learner-0 hands the others the :class:`Rendezvous` as an
event. Usage::

    store, where = host_rendezvous("10.0.0.2", world=2)        # learner-0
    group = CollectiveGroup(0, 2, where, store=store)          # (others: without store)
    group.all_reduce_mean([p.grad for p in model.parameters()])
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np
import torch
import torch.distributed as dist

from tianji.runtime.errors import ConfigError, SyncFailed
from tianji.services.allreduce import weights_digest

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "CollectiveGroup",
    "CollectiveSync",
    "Rendezvous",
    "buckets",
    "host_rendezvous",
    "pick_backend",
]

log = logging.getLogger(__name__)

_c10d: Any = dist  # (TCPStore, PrefixStore and the process groups are not in its stubs)

DEFAULT_BUCKET_BYTES: Final = 25 * 1024 * 1024
"""The largest flat buffer one collective call carries (DDP's default bucket size)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where the group meets: learner-0's store, and the group's generation."""

    host: str
    port: int
    generation: int = 0

    @property
    def prefix(self) -> str:
        """The store keys of this generation's group."""
        return f"tianji/g{self.generation}/"


def pick_backend(devices: Sequence[torch.device]) -> str:
    """``"nccl"`` when every learner computes on CUDA and NCCL is built in, else ``"gloo"``."""
    if devices and all(d.type == "cuda" for d in devices) and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def host_rendezvous(
    host: str, world: int, *, port: int = 0, timeout_s: float = 60.0
) -> tuple[Any, Rendezvous]:
    """Learner-0's side: a store listening on ``host`` (``port`` 0: a free one) for a group
    of ``world`` learners, and the :class:`Rendezvous` to hand the others.

    Raises:
        ConfigError: naming ``host:port`` when it cannot be listened on.
    """
    try:
        store = _c10d.TCPStore(
            host,
            port,
            world,
            True,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as exc:
        raise ConfigError(
            "learner rendezvous", f"{host}:{port}", f"a free address ({exc})"
        ) from exc
    return store, Rendezvous(host, int(store.port))


def buckets(sizes: Sequence[int], itemsize: int, bucket_bytes: int) -> list[range]:
    """Consecutive tensor indices grouped so that each group's bytes stay within
    ``bucket_bytes`` (a tensor larger than that is a bucket of its own)."""
    groups: list[range] = []
    start, used = 0, 0
    for i, n in enumerate(sizes):
        nbytes = n * itemsize
        if i > start and used + nbytes > bucket_bytes:
            groups.append(range(start, i))
            start, used = i, 0
        used += nbytes
    if start < len(sizes):
        groups.append(range(start, len(sizes)))
    return groups


class CollectiveGroup:
    """One learner's membership in the run's process group (see the module docstring).

    Args:
        rank: this learner's index (learner-``rank``).
        world: the number of learners K.
        rendezvous: where the group meets (from learner-0's :func:`host_rendezvous`).
        store: learner-0's own store (the others connect to ``rendezvous``).
        backend: ``"gloo"`` or ``"nccl"`` (:func:`pick_backend`).
        host: this learner's own address, where its peers reach it (gloo; ``""``: the
            address its host name resolves to, which a multi-homed host may get wrong).
        timeout_s: how long a step or the joining waits for the slowest peer.
        bucket_bytes: the largest flat buffer of one collective call.

    Raises:
        SyncFailed: when the group cannot be formed in ``timeout_s`` (naming the address).
    """

    def __init__(
        self,
        rank: int,
        world: int,
        rendezvous: Rendezvous,
        *,
        store: Any = None,
        backend: str = "gloo",
        host: str = "",
        timeout_s: float = 60.0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        if not 0 <= rank < world:
            raise ConfigError("learner index", rank, f"an index in [0, {world})")
        if backend not in ("gloo", "nccl"):
            raise ConfigError("collective backend", backend, '"gloo" or "nccl"')
        self.rank, self.world, self.rendezvous, self.backend = rank, world, rendezvous, backend
        self.name = f"learner-{rank}"
        self.steps = 0
        self.seconds = 0.0  # spent in collective calls (waiting for peers included)
        self.bucket_bytes = bucket_bytes
        timeout = datetime.timedelta(seconds=timeout_s)
        where = f"{rendezvous.host}:{rendezvous.port}"
        try:
            if store is None:
                store = _c10d.TCPStore(
                    rendezvous.host, rendezvous.port, world, False, timeout=timeout
                )
            self._store = store  # learner-0's must outlive the group
            scoped = _c10d.PrefixStore(rendezvous.prefix, store)
            if backend == "nccl":
                options = _c10d.ProcessGroupNCCL.Options()
                self.pg: Any = _c10d.ProcessGroupNCCL(scoped, rank, world, options)
            else:
                options = _c10d.ProcessGroupGloo._Options()
                options._timeout = timeout
                gloo = _c10d.ProcessGroupGloo
                device = gloo.create_device(hostname=host) if host else gloo.create_default_device()
                options._devices = [device]
                self.pg = _c10d.ProcessGroupGloo(scoped, rank, world, options)
        except RuntimeError as exc:
            raise SyncFailed(self.name, 0, [where], f"cannot join the group: {exc}") from exc

    def all_reduce_mean(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor (in place) by its mean over the group's learners.

        Raises:
            SyncFailed: a peer died or did not answer in time (naming the step).
        """
        step, self.steps = self.steps, self.steps + 1
        if not tensors:
            return
        if self.pg is None:
            raise SyncFailed(self.name, step, self._peers(), "this learner left the group")
        flat_groups = [
            [tensors[i] for i in group]
            for group in buckets(
                [t.numel() for t in tensors], tensors[0].element_size(), self.bucket_bytes
            )
        ]
        flats = [  # a bucket of one contiguous tensor travels as it is, without a copy
            group[0].view(-1)
            if len(group) == 1 and group[0].is_contiguous()
            else torch.cat([t.reshape(-1) for t in group])
            for group in flat_groups
        ]
        started = time.perf_counter()
        try:
            works = [self.pg.allreduce([flat]) for flat in flats]
            for work in works:
                work.wait()
        except RuntimeError as exc:
            self.close()  # broken for good; an unaborted group can abort the process at exit
            raise SyncFailed(
                self.name, step, self._peers(), f"the collective failed: {exc}"
            ) from exc
        finally:
            self.seconds += time.perf_counter() - started
        for flat, group in zip(flats, flat_groups, strict=True):
            flat.div_(self.world)
            if flat.data_ptr() == group[0].data_ptr() and len(group) == 1:
                continue  # reduced in place
            offset = 0
            for t in group:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n

    def check_same(self, digest: bytes) -> None:
        """Compare ``digest`` (of this learner's weights) with every peer's (one
        all-gather, before the step it names).

        Raises:
            SyncFailed: naming the learners whose digest differs from learner-0's.
        """
        step = self.steps  # (a check is no optimizer step: it does not count as one)
        mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
        if self.backend == "nccl":
            mine = mine.to(torch.device("cuda", torch.cuda.current_device()))
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        try:
            self.pg.allgather([gathered], [mine]).wait()
        except RuntimeError as exc:
            self.close()
            why = f"the collective failed: {exc}"
            raise SyncFailed(self.name, step, self._peers(), why) from exc
        reference = gathered[0].cpu()
        differ = [
            f"learner-{k}" for k, g in enumerate(gathered) if not torch.equal(g.cpu(), reference)
        ]
        if differ:
            raise SyncFailed(self.name, step, differ, "weights differ from learner-0's")

    def _peers(self) -> list[str]:
        return [f"learner-{k}" for k in range(self.world) if k != self.rank]

    def close(self) -> None:
        """Leave the group: a step of ours blocked in another thread fails at once, and
        the peers' next step fails (they rebuild the group)."""
        pg, self.pg = self.pg, None
        if pg is not None:
            try:
                pg.abort()
            except RuntimeError as exc:  # already broken
                log.debug("%s: the group was broken already: %s", self.name, exc)


class CollectiveSync:
    """A learner's ``gradient_sync`` hook (:data:`~tianji.rl.algorithm.GradientSync`) on a
    :class:`CollectiveGroup`.

    Called with a flat float32 vector it returns the group's mean of it. Algorithms that
    hold their gradients as tensors on the group's device type (the CPU for gloo, CUDA
    for NCCL) hand them over as they are (:meth:`all_reduce_tensors`, in place, in
    buckets) instead: nothing is copied to host memory. At the first step and every
    ``digest_every`` steps it first checks that every learner holds the same weights
    (``weights()``, hashed).
    """

    def __init__(
        self,
        group: CollectiveGroup,
        weights: Callable[[], Mapping[str, np.ndarray]],
        *,
        digest_every: int = 100,
    ) -> None:
        self.group = group
        self.device_type = "cuda" if group.backend == "nccl" else "cpu"
        self._weights = weights
        self.digest_every = digest_every
        self.calls = 0

    def __call__(self, flat: np.ndarray) -> np.ndarray:
        out = np.array(flat, dtype=np.float32, copy=True).reshape(-1)
        tensor = torch.from_numpy(out)
        if self.device_type == "cuda":
            tensor = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        self.all_reduce_tensors([tensor])
        return tensor.cpu().numpy() if self.device_type == "cuda" else out

    def all_reduce_tensors(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor in place by the group's mean of it."""
        if self.calls % self.digest_every == 0:
            self.group.check_same(bytes.fromhex(weights_digest(self._weights())))
        self.calls += 1
        self.group.all_reduce_mean(tensors)
