"""Algorithms with an artificially slow learner, for tests of the controller's balance."""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
from tianji.algorithms.dqn import DQN
from tianji.algorithms.ppo import PPO

from tianji.rl.algorithm import UpdateResult

DELAY_S = 0.2


class SlowPPO(PPO):
    """PPO whose every update takes at least ``DELAY_S`` longer."""

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        time.sleep(DELAY_S)
        return super().update(batch)


class SlowDQN(DQN):
    """DQN whose every update takes at least ``DELAY_S / 10`` longer."""

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        time.sleep(DELAY_S / 10)
        return super().update(batch)
