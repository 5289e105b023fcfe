"""Sample storage strategies: uniform replay, prioritized replay, FIFO rollouts.

Pure numpy, no I/O: the buffer service wraps one of these (built by :func:`make_buffer`
from an algorithm's :class:`~tianji.runtime.core.BufferSpec`). As in TorchRL, storage and sampling
are separate small pieces: :class:`RingStorage` keeps preallocated arrays and
:class:`SumTree` does proportional sampling. Every buffer is bounded; the oldest items are
evicted and counted.

Usage::

    buf = make_buffer(algo.buffer_spec(), seed=0)
    buf.add(algo.postprocess(fragment), policy_version=3)
    batch = buf.sample(256)     # arrays + "index" + "policy_version" (+ "weight"), or None
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import numpy as np

from tianji.rl.algorithm import BufferSpec
from tianji.runtime.errors import ConfigError

__all__ = [
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "RingStorage",
    "RolloutBuffer",
    "SumTree",
    "make_buffer",
]


class RingStorage:
    """Preallocated ring of ``capacity`` items per key; the schema is fixed by the first add.

    Each item gets a unique *id* (its insert sequence number); it lives in slot
    ``id % capacity`` until overwritten, so ``ids[slot] == id`` tells whether it is still there.
    """

    def __init__(self, capacity: int) -> None:
        if type(capacity) is not int or capacity <= 0:
            raise ConfigError("buffer.capacity", capacity, "a positive integer")
        self.capacity = capacity
        self.arrays: dict[str, np.ndarray] = {}
        self.ids = np.full(capacity, -1, dtype=np.int64)
        self.policy_version = np.zeros(capacity, dtype=np.int64)
        self.inserted = 0

    def __len__(self) -> int:
        return min(self.inserted, self.capacity)

    @property
    def evicted(self) -> int:
        """Items that were stored and have been overwritten (or never fit)."""
        return self.inserted - len(self)

    def write(self, arrays: Mapping[str, np.ndarray], policy_version: int) -> np.ndarray:
        """Append ``arrays [B, ...]``; returns the slots written (only the last ``capacity``).

        Raises:
            ValueError: if keys, per-item shapes or batch sizes differ from the first add.
        """
        b = self._check(arrays)
        ids = np.arange(self.inserted, self.inserted + b, dtype=np.int64)[-self.capacity :]
        slots = ids % self.capacity
        skip = b - len(ids)
        for k, v in arrays.items():
            self.arrays[k][slots] = np.asarray(v)[skip:]
        self.ids[slots] = ids
        self.policy_version[slots] = policy_version
        self.inserted += b
        return slots

    def state_dict(self) -> dict[str, Any]:
        """The stored items (only the filled slots) and counters, for a checkpoint."""
        n = len(self)
        return {
            "capacity": self.capacity,
            "inserted": self.inserted,
            "arrays": {k: v[:n] for k, v in self.arrays.items()},
            "ids": self.ids[:n],
            "policy_version": self.policy_version[:n],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` of a storage of the same capacity.

        Raises:
            ValueError: for another capacity or inconsistent arrays.
        """
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"capacity {state['capacity']} != this buffer's {self.capacity}")
        n = min(int(state["inserted"]), self.capacity)
        arrays = {str(k): np.asarray(v) for k, v in state["arrays"].items()}
        items = [state["ids"], state["policy_version"], *arrays.values()]
        if any(len(a) != n for a in items):
            raise ValueError(f"{n} items stored but arrays of {[len(a) for a in items]}")
        self.arrays = {
            k: np.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype) for k, v in arrays.items()
        }
        for k, v in arrays.items():
            self.arrays[k][:n] = v
        self.ids[:] = -1
        self.ids[:n] = state["ids"]
        self.policy_version[:] = 0
        self.policy_version[:n] = state["policy_version"]
        self.inserted = int(state["inserted"])

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the items in ``slots`` plus ``index`` (their ids) and ``policy_version``."""
        out = {k: v[slots] for k, v in self.arrays.items()}
        out["index"] = self.ids[slots]
        out["policy_version"] = self.policy_version[slots]
        return out

    def _check(self, arrays: Mapping[str, np.ndarray]) -> int:
        if not arrays:
            raise ValueError("cannot add an empty mapping of arrays")
        sizes = {k: len(np.asarray(v)) for k, v in arrays.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"arrays disagree on the batch size: {sizes}")
        if not self.arrays:
            self.arrays = {
                k: np.zeros((self.capacity, *np.shape(v)[1:]), dtype=np.asarray(v).dtype)
                for k, v in arrays.items()
            }
        elif arrays.keys() != self.arrays.keys():
            raise ValueError(f"keys {sorted(arrays)} differ from the stored {sorted(self.arrays)}")
        for k, v in arrays.items():
            if np.shape(v)[1:] != self.arrays[k].shape[1:]:
                raise ValueError(
                    f"{k}: item shape {np.shape(v)[1:]} != stored {self.arrays[k].shape[1:]}"
                )
        return next(iter(sizes.values()))


class ReplayBuffer:
    """Uniform replay over flat transitions ``[B, ...]`` (sampling with replacement).

    Args:
        capacity: transitions kept at most.
        min_size: ``sample`` returns ``None`` until this many are stored (at least 1).
        seed: seeds the sampling RNG.
    """

    def __init__(self, capacity: int, *, min_size: int = 0, seed: int = 0) -> None:
        self.storage = RingStorage(capacity)
        self.min_size = max(1, min_size)
        self.rng = np.random.default_rng(seed)
        self.sampled = 0

    def __len__(self) -> int:
        return len(self.storage)

    def add(self, arrays: Mapping[str, np.ndarray], *, policy_version: int) -> int:
        """Store ``arrays [B, ...]`` produced by ``policy_version``; returns ``B``."""
        before = self.storage.inserted
        self._written(self.storage.write(arrays, policy_version))
        return self.storage.inserted - before

    def sample(self, batch_size: int) -> dict[str, np.ndarray] | None:
        """``batch_size`` transitions plus ``index`` and ``policy_version``, or ``None``."""
        if len(self) < self.min_size:
            return None
        slots = self._pick(batch_size)
        self.sampled += batch_size
        return self._finish(self.storage.gather(slots), slots)

    def statistics(self) -> dict[str, Any]:
        """Counters: ``size``, ``capacity``, ``inserted``, ``evicted``, ``sampled``."""
        s = self.storage
        return {
            "size": len(s),
            "capacity": s.capacity,
            "inserted": s.inserted,
            "evicted": s.evicted,
            "sampled": self.sampled,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything stored, for a checkpoint (``[checkpoint] replay``)."""
        return {"storage": self.storage.state_dict(), "sampled": self.sampled}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (same capacity).

        Raises:
            ValueError: for another capacity or a damaged state.
        """
        self.storage.load_state_dict(state["storage"])
        self.sampled = int(state["sampled"])

    def _pick(self, batch_size: int) -> np.ndarray:
        return self.rng.integers(0, len(self), size=batch_size)

    def _written(self, slots: np.ndarray) -> None:
        """Hook for subclasses: ``slots`` were just (over)written."""

    def _finish(self, batch: dict[str, np.ndarray], slots: np.ndarray) -> dict[str, np.ndarray]:
        return batch


class SumTree:
    """An array-based binary sum tree over ``capacity`` leaves with vectorized batch ops.

    Node 1 is the root, node ``i`` has children ``2i`` and ``2i+1``; leaves start at
    ``self.leaf0`` (a power of two). Updates and sampling take ``O(log n)`` numpy steps
    for a whole batch.
    """

    def __init__(self, capacity: int) -> None:
        self.leaf0 = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.leaf0.bit_length() - 1
        self.nodes = np.zeros(2 * self.leaf0, dtype=np.float64)

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self.nodes[1])

    def get(self, leaves: np.ndarray) -> np.ndarray:
        """Values of ``leaves``."""
        values: np.ndarray = self.nodes[self.leaf0 + np.asarray(leaves, dtype=np.int64)]
        return values

    def set(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Set ``leaves`` to ``values`` (the last wins for duplicates) and fix the sums."""
        node = self.leaf0 + np.asarray(leaves, dtype=np.int64)
        self.nodes[node] = values
        for _ in range(self.depth):
            node = np.unique(node >> 1)
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaves where the prefix sums reach ``mass`` (each in ``[0, total)``)."""
        node = np.ones(len(mass), dtype=np.int64)
        mass = np.array(mass, dtype=np.float64)
        for _ in range(self.depth):
            left = 2 * node
            # Rounding can push ``mass`` past a left sum whose right sibling is empty.
            right = (mass >= self.nodes[left]) & (self.nodes[left + 1] > 0)
            mass -= np.where(right, self.nodes[left], 0.0)
            node = left + right
        return node - self.leaf0

    def stratified(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """One leaf from each of ``batch_size`` equal slices of the total mass."""
        edges = (np.arange(batch_size) + rng.random(batch_size)) * (self.total / batch_size)
        return self.find(np.minimum(edges, np.nextafter(self.total, 0.0)))


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) over flat transitions.

    Item ``i`` is sampled with probability ``p_i**alpha / sum_j p_j**alpha`` (stratified
    over the batch); new items get the largest priority seen so far. ``sample`` adds
    ``weight``: importance weights ``(size * P(i))**-beta`` divided by the batch maximum.

    Args:
        capacity: transitions kept at most.
        alpha: priority exponent (0 is uniform).
        beta: importance-weight exponent (1 corrects the bias fully).
        min_size: ``sample`` returns ``None`` until this many are stored (at least 1).
        seed: seeds the sampling RNG.
    """

    def __init__(
        self,
        capacity: int,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        min_size: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(capacity, min_size=min_size, seed=seed)
        if not alpha >= 0:
            raise ConfigError("buffer.alpha", alpha, "a number >= 0")
        if not beta >= 0:
            raise ConfigError("buffer.beta", beta, "a number >= 0")
        self.alpha, self.beta = alpha, beta
        self.tree = SumTree(capacity)
        self.max_priority = 1.0
        self.stale_updates = 0

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> int:
        """Set new priorities for items sampled earlier (``indices`` from ``batch["index"]``).

        Items overwritten since they were sampled are skipped.

        Returns:
            How many indices were ignored because their slot was overwritten.

        Raises:
            ValueError: on mismatched lengths or priorities that are not finite and positive.
        """
        ids = np.asarray(indices, dtype=np.int64).reshape(-1)
        prio = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if len(ids) != len(prio):
            raise ValueError(f"{len(ids)} indices but {len(prio)} priorities")
        bad = ~(np.isfinite(prio) & (prio > 0))
        if bad.any():
            raise ValueError(f"priorities must be finite and > 0, got {prio[bad]}")
        slots = ids % self.storage.capacity
        live = (ids >= 0) & (self.storage.ids[slots] == ids)
        if live.any():
            self.tree.set(slots[live], prio[live] ** self.alpha)
            self.max_priority = max(self.max_priority, float(prio[live].max()))
        ignored = int(len(ids) - live.sum())
        self.stale_updates += ignored
        return ignored

    def statistics(self) -> dict[str, Any]:
        """Replay counters plus ``stale_updates`` and ``max_priority``."""
        stats = super().statistics()
        stats.update(stale_updates=self.stale_updates, max_priority=self.max_priority)
        return stats

    def state_dict(self) -> dict[str, Any]:
        """Stored items plus the priorities (sum tree) and ``max_priority``."""
        state = super().state_dict()
        state.update(tree=self.tree.nodes, max_priority=self.max_priority, stale=self.stale_updates)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (same capacity)."""
        tree = np.asarray(state["tree"], dtype=np.float64)
        if tree.shape != self.tree.nodes.shape:
            raise ValueError(f"sum tree of {tree.shape} != this buffer's {self.tree.nodes.shape}")
        super().load_state_dict(state)
        self.tree.nodes[:] = tree
        self.max_priority = float(state["max_priority"])
        self.stale_updates = int(state["stale"])

    def _written(self, slots: np.ndarray) -> None:
        self.tree.set(slots, np.full(len(slots), self.max_priority**self.alpha))

    def _pick(self, batch_size: int) -> np.ndarray:
        return self.tree.stratified(batch_size, self.rng)

    def _finish(self, batch: dict[str, np.ndarray], slots: np.ndarray) -> dict[str, np.ndarray]:
        prob = self.tree.get(slots) / self.tree.total
        weight = (len(self) * prob) ** -self.beta
        batch["weight"] = (weight / weight.max()).astype(np.float32)
        return batch


class RolloutBuffer:
    """FIFO of whole trajectory fragments ``[T, N, ...]`` for on-policy learning.

    Fragments are kept by reference (not copied): callers must not reuse their arrays.
    Fragments may differ in ``N`` (actors with different env counts), nothing else.

    Args:
        capacity: fragments kept at most; adding to a full buffer evicts the oldest.
        min_size: ``sample``/``take`` return ``None`` until this many fragments are stored.
    """

    def __init__(self, capacity: int, *, min_size: int = 0) -> None:
        if type(capacity) is not int or capacity <= 0:
            raise ConfigError("buffer.capacity", capacity, "a positive integer")
        self.capacity = capacity
        self.min_size = min_size
        self.fragments: collections.deque[tuple[dict[str, np.ndarray], int]] = collections.deque()
        self.inserted = self.evicted = self.sampled = 0
        self._evicted_transitions = 0
        self._schema: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}

    def __len__(self) -> int:
        return len(self.fragments)

    def add(self, arrays: Mapping[str, np.ndarray], *, policy_version: int) -> int:
        """Store one fragment produced by ``policy_version``; returns 1 (fragments added).

        Raises:
            ValueError: if keys, shapes or dtypes differ from the first fragment added.
        """
        fragment = {k: np.asarray(v) for k, v in arrays.items()}
        self._check(fragment)
        if len(self.fragments) == self.capacity:
            old, _ = self.fragments.popleft()
            self.evicted += 1
            self._evicted_transitions += _fragment_transitions(old)
        self.fragments.append((fragment, policy_version))
        self.inserted += 1
        return 1

    def take(self, k: int) -> tuple[dict[str, np.ndarray], list[int]] | None:
        """Remove the ``k`` oldest fragments and return them concatenated along the env axis.

        Returns:
            ``(arrays [T, N*k, ...], policy versions of the k fragments)`` or ``None`` if
            fewer than ``max(k, min_size)`` fragments are stored.
        """
        if k <= 0 or len(self.fragments) < max(k, self.min_size):
            return None
        batch, versions, _ = self._pop(k)
        return batch, versions

    def sample(self, batch_size: int) -> dict[str, np.ndarray] | None:
        """:meth:`take` ``batch_size`` fragments, adding ``policy_version [N*k]`` per env column."""
        if batch_size <= 0 or len(self.fragments) < max(batch_size, self.min_size):
            return None
        batch, versions, widths = self._pop(batch_size)
        batch["policy_version"] = np.repeat(np.asarray(versions, dtype=np.int64), widths)
        return batch

    def statistics(self) -> dict[str, Any]:
        """Counters in fragments: ``size``, ``capacity``, ``inserted``, ``evicted``, ``sampled``."""
        return {
            "size": len(self.fragments),
            "capacity": self.capacity,
            "inserted": self.inserted,
            "evicted": self.evicted,
            "sampled": self.sampled,
        }

    def drop_older_than(self, min_version: int) -> int:
        """Drop stored fragments produced before ``min_version``; returns transitions dropped.

        (For on-policy learning: such samples are too stale to use.)
        """
        dropped = 0
        kept: collections.deque[tuple[dict[str, np.ndarray], int]] = collections.deque()
        for fragment, version in self.fragments:
            if version < min_version:
                dropped += _fragment_transitions(fragment)
            else:
                kept.append((fragment, version))
        self.fragments = kept
        return dropped

    @property
    def stored_transitions(self) -> int:
        """Transitions in the stored fragments."""
        return sum(_fragment_transitions(f) for f, _ in self.fragments)

    @property
    def evicted_transitions(self) -> int:
        """Transitions in fragments evicted because the buffer was full."""
        return self._evicted_transitions

    def _pop(self, k: int) -> tuple[dict[str, np.ndarray], list[int], list[int]]:
        taken = [self.fragments.popleft() for _ in range(k)]
        self.sampled += k
        keys = taken[0][0].keys()
        batch = {key: np.concatenate([f[key] for f, _ in taken], axis=1) for key in keys}
        widths = [next(iter(f.values())).shape[1] for f, _ in taken]
        return batch, [v for _, v in taken], widths

    def _check(self, fragment: Mapping[str, np.ndarray]) -> None:
        if not fragment or any(v.ndim < 2 for v in fragment.values()):
            raise ValueError("a fragment needs arrays shaped [T, N, ...]")
        if len({v.shape[1] for v in fragment.values()}) != 1:
            raise ValueError(
                f"fragment arrays disagree on N: { {k: v.shape for k, v in fragment.items()} }"
            )
        # Fragments from different actors may differ in N (the concatenation axis) only.
        schema = {k: (v.shape[:1] + v.shape[2:], v.dtype) for k, v in fragment.items()}
        if not self._schema:
            self._schema = schema
        elif schema != self._schema:
            raise ValueError(f"fragment schema {schema} differs from the first {self._schema}")


def _fragment_transitions(fragment: Mapping[str, np.ndarray]) -> int:
    first = next(iter(fragment.values()))
    return int(first.shape[0] * first.shape[1])


def make_buffer(spec: BufferSpec, seed: int = 0) -> ReplayBuffer | RolloutBuffer:
    """Build the buffer an algorithm asked for.

    Raises:
        ConfigError: for an unknown ``spec.kind`` or bad sizes.
    """
    if spec.kind == "replay":
        return ReplayBuffer(spec.capacity, min_size=spec.min_size, seed=seed)
    if spec.kind == "prioritized":
        return PrioritizedReplayBuffer(
            spec.capacity, alpha=spec.alpha, beta=spec.beta, min_size=spec.min_size, seed=seed
        )
    if spec.kind == "rollout":
        return RolloutBuffer(spec.capacity, min_size=spec.min_size)
    raise ConfigError("buffer.kind", spec.kind, '"replay", "prioritized" or "rollout"')
