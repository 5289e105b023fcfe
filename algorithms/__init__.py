"""The in-tree algorithms (one file each) and the algorithm registry.

``tianji.algorithms.get(name)`` / ``names()`` / ``register(name, cls)`` are the registry of
:mod:`tianji.rl.registry` under their long-standing names; third parties add algorithms
through the entry-point group ``tianji.algorithms``. See ``docs/writing-an-algorithm.md``.
"""

from __future__ import annotations

from tianji.rl.registry import ENTRY_POINT_GROUP, get, names, register

__all__ = ["ENTRY_POINT_GROUP", "get", "names", "register"]
