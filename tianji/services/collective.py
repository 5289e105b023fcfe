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

This module is the collective itself; the learner service does not use it yet (it still
runs :mod:`tianji.services.allreduce`). Usage::

    store, where = host_rendezvous("10.0.0.2", world=2)        # learner-0
    group = CollectiveGroup(0, 2, where, store=store)          # (others: without store)
    group.all_reduce_mean([p.grad for p in model.parameters()])
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from tianji.runtime.errors import ConfigError, SyncFailed

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "CollectiveGroup",
    "Rendezvous",
    "buckets",
    "host_rendezvous",
    "pick_backend",
]

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
                self.pg = _c10d.ProcessGroupGloo(scoped, rank, world, timeout)
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
        try:
            works = [self.pg.allreduce([flat]) for flat in flats]
            for work in works:
                work.wait()
        except RuntimeError as exc:
            raise SyncFailed(
                self.name, step, self._peers(), f"the collective failed: {exc}"
            ) from exc
        for flat, group in zip(flats, flat_groups, strict=True):
            flat.div_(self.world)
            if flat.data_ptr() == group[0].data_ptr() and len(group) == 1:
                continue  # reduced in place
            offset = 0
            for t in group:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n

    def _peers(self) -> list[str]:
        return [f"learner-{k}" for k in range(self.world) if k != self.rank]

    def close(self) -> None:
        """Leave the group (its peers' next step fails; they rebuild it)."""
        self.pg = None
