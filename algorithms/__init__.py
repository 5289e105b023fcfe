"""Algorithm registry: name -> algorithm class.

In-tree algorithms are listed in ``_BUILTIN`` and imported on first use. Third parties
register theirs through the entry-point group ``tianji.algorithms``::

    [project.entry-points."tianji.algorithms"]
    reinforce = "my_package.reinforce:Reinforce"

A name may also be given as ``"package.module:ClassName"`` or ``"path/file.py:ClassName"``
(used by ``examples/``). See ``docs/writing-an-algorithm.md``.
"""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points
from typing import Any

from tianji.errors import RegistryError

__all__ = ["get", "names", "register"]

ENTRY_POINT_GROUP = "tianji.algorithms"
_BUILTIN: dict[str, str] = {
    "dqn": "tianji.algorithms.dqn:DQN",
    "mappo": "tianji.algorithms.mappo:MAPPO",
    "ppo": "tianji.algorithms.ppo:PPO",
    "qmix": "tianji.algorithms.qmix:QMIX",
}
_registered: dict[str, Any] = {}


def register(name: str, cls: Any) -> None:
    """Register an algorithm class under ``name`` (overrides a previous one)."""
    _registered[name] = cls


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def names() -> list[str]:
    """All known algorithm names."""
    return sorted({*_BUILTIN, *_registered, *_entry_points()})


def get(name: str) -> Any:
    """Return the algorithm class for ``name`` (or a ``module:Class`` spec).

    Raises:
        RegistryError: naming the unknown algorithm and the known ones.
    """
    if name in _registered:
        return _registered[name]
    spec = _BUILTIN.get(name) or _entry_points().get(name)
    if spec is None and ":" in name:
        spec = name
    if spec is None:
        close = difflib.get_close_matches(name, names(), n=3)
        known = close or names()
        raise RegistryError("algorithm", name, known)
    from tianji.launch.spec import load_factory

    cls = load_factory(spec)
    _registered[name] = cls
    return cls
