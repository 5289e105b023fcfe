"""Per-env state slots: what an inference service keeps for each env between its requests.

A recurrent policy's hidden state belongs to one env of one actor and lives as long as that
env's episode. :class:`StateSlots` keeps one row per ``(actor, env id)``; a request
gathers the rows of its envs (a fresh initial state where an episode starts) and the
forward pass scatters the new ones back. Pure logic, no asyncio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["StateSlots"]


class StateSlots:
    """Rows of per-env state, one table per actor, grown as env ids appear.

    Args:
        initial: ``initial(n) -> [n, ...]`` fresh states (all the same shape and dtype).
    """

    def __init__(self, initial: Callable[[int], np.ndarray]) -> None:
        self.initial = initial
        self._tables: dict[str, np.ndarray] = {}

    @classmethod
    def for_algorithm(cls, algo: Any) -> StateSlots | None:
        """Slots for ``algo``'s per-env state when it is recurrent (``recurrent = True``,
        ``initial_state(n)``), else ``None`` (a feed-forward policy keeps nothing)."""
        return cls(algo.initial_state) if getattr(algo, "recurrent", False) else None

    def gather(self, actor: str, env_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The states of ``env_ids`` (``[n, ...]``, a copy), initial where ``starts``.

        Raises:
            ValueError: if ``env_ids`` and ``starts`` differ in length or an id is negative.
        """
        ids = np.asarray(env_ids, np.int64)
        starts = np.asarray(starts, bool)
        if ids.shape != starts.shape or ids.ndim != 1:
            raise ValueError(f"env_ids {ids.shape} and starts {starts.shape} must be equal [n]")
        if len(ids) and ids.min() < 0:
            raise ValueError(f"env ids must be >= 0, got {ids.min()}")
        table = self._table(actor, int(ids.max()) + 1 if len(ids) else 0)
        fresh = np.flatnonzero(starts)
        if len(fresh):
            table[ids[fresh]] = self.initial(len(fresh))
        return table[ids].copy()

    def scatter(self, actor: str, env_ids: np.ndarray, states: np.ndarray) -> None:
        """Store ``states [n, ...]`` as the rows of ``env_ids``."""
        ids = np.asarray(env_ids, np.int64)
        table = self._table(actor, int(ids.max()) + 1 if len(ids) else 0)
        table[ids] = states

    def act(
        self,
        algo: Any,
        actor: str,
        obs: np.ndarray,
        env_ids: np.ndarray,
        starts: np.ndarray,
        *,
        explore: bool,
    ) -> dict[str, np.ndarray]:
        """``algo.act`` for the envs ``env_ids`` of ``actor`` from their kept states (fresh
        where ``starts``), keeping the states it returns (``next_state``, left out of the
        answer). What an actor with a local recurrent policy does at every step; an
        inference service does the same for a batch of many actors' requests."""
        state = self.gather(actor, env_ids, starts)
        out = dict(algo.act(obs, explore=explore, state=state))
        self.scatter(actor, env_ids, out.pop("next_state"))
        return out

    def forget(self, actor: str) -> None:
        """Drop an actor's table (it left, or restarted with fresh envs)."""
        self._tables.pop(actor, None)

    def _table(self, actor: str, size: int) -> np.ndarray:
        table = self._tables.get(actor)
        if table is None or len(table) < size:
            grown = self.initial(max(size, 1))
            if table is not None:
                grown[: len(table)] = table
            table = self._tables[actor] = grown
        return table
