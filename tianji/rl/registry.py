"""Algorithm registry: name -> algorithm class.

In-tree algorithms are imported on first use. Third parties register theirs through the
entry-point group ``tianji.algorithms``::

    [project.entry-points."tianji.algorithms"]
    reinforce = "my_package.reinforce:Reinforce"

A name may also be given as ``"package.module:ClassName"`` or ``"path/file.py:ClassName"``
(used by ``examples/``). See ``docs/writing-an-algorithm.md``.
"""

from __future__ import annotations

from typing import Any

from tianji.runtime.plugins import Registry, load_factory

__all__ = ["ALGORITHMS", "ENTRY_POINT_GROUP", "get", "load_object", "names", "register"]

load_object = load_factory
"""Import ``"package.module:Name"`` or ``"path/file.py:Name"`` (a file is imported as
``tianji_user.<stem>``); raises ``ConfigError`` naming the spec (e.g. a custom torso)."""

ALGORITHMS = Registry(
    "algorithm",
    "tianji.algorithms",
    {
        "dqn": "tianji.algorithms.dqn:DQN",
        "impala": "tianji.algorithms.impala:IMPALA",
        "mappo": "tianji.algorithms.mappo:MAPPO",
        "ppo": "tianji.algorithms.ppo:PPO",
        "qmix": "tianji.algorithms.qmix:QMIX",
        "sac": "tianji.algorithms.sac:SAC",
        "td3": "tianji.algorithms.td3:TD3",
    },
)
ENTRY_POINT_GROUP = ALGORITHMS.group


def register(name: str, cls: Any) -> None:
    """Register an algorithm class under ``name`` (overrides a previous one)."""
    ALGORITHMS.register(name, cls)


def names() -> list[str]:
    """All known algorithm names."""
    return ALGORITHMS.names()


def get(name: str) -> Any:
    """Return the algorithm class for ``name`` (or a ``module:Class`` spec).

    Raises:
        RegistryError: naming the unknown algorithm and the closest known ones.
    """
    return ALGORITHMS.get(name, specs=True)
