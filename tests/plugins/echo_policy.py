"""A recurrent "policy" that answers what it was asked: for tests of the inference service.

``act`` returns ``action`` = the first feature of each observation (the test writes a
unique id there) and ``steps`` = how many observations of that env it has seen since its
episode started, kept in the per-env state slots the inference service manages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from tianji.rl.algorithm import BufferSpec


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EchoConfig:
    """No settings."""


class EchoPolicy:
    """See the module docstring."""

    name = "echo"
    Config = EchoConfig
    recurrent = True

    @staticmethod
    def check_spaces(observation_space: Any, action_space: Any) -> str | None:
        return None

    def __init__(self, config: EchoConfig, obs_space: Any, action_space: Any, **_: Any) -> None:
        self.version = 0

    def initial_state(self, n: int) -> np.ndarray:
        return np.zeros((n, 1), np.int64)

    def act(self, obs: np.ndarray, *, explore: bool, state: np.ndarray) -> dict[str, np.ndarray]:
        steps = state + 1
        return {
            "action": np.asarray(obs)[:, 0].astype(np.int64),
            "steps": steps[:, 0].copy(),
            "next_state": steps,
        }

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        self.version = version

    def buffer_spec(self) -> BufferSpec:
        return BufferSpec(kind="rollout", capacity=4, batch_size=1, min_size=1)
