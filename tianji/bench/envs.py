"""Envs for benchmarks: a gymnasium env whose step costs a set amount of wall-clock time.

CartPole steps in microseconds, so on a small machine a run is bound by the learner and
by Python, not by the envs: it cannot show what relaxing the actor/learner dependency
buys when envs are expensive (a physics simulator, a game engine, a remote robot).
:class:`DelayedEnv` makes each step take ``step_ms`` more milliseconds, either waiting
(``busy = False``: the env waits for something outside this process, which leaves the CPU
to others, like a simulator in another process or on another host) or computing
(``busy = True``: the step burns this process's CPU, like an env simulated in Python).

Use it as ``[env] id = "tianji.bench.envs:DelayedEnv"`` with
``kwargs = { env_id = "CartPole-v1", step_ms = 2.0 }``, or ``tianji bench train
--env-step-ms 2``.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym

from tianji.runtime.errors import ConfigError

__all__ = ["DelayedEnv"]


class DelayedEnv(gym.Wrapper[Any, Any, Any, Any]):
    """``gym.make(env_id, **kwargs)`` whose every step takes ``step_ms`` ms longer.

    Args:
        env_id: the gymnasium id of the env to slow down.
        step_ms: milliseconds added to every step (> 0).
        busy: spin (use CPU) instead of sleeping.
        kwargs: passed to ``gym.make``.

    Raises:
        ConfigError: for a ``step_ms`` that is not a positive number.
    """

    def __init__(
        self, env_id: str = "CartPole-v1", step_ms: float = 1.0, busy: bool = False, **kwargs: Any
    ) -> None:
        if not isinstance(step_ms, int | float) or not step_ms > 0:
            raise ConfigError("env.kwargs.step_ms", step_ms, "a number of milliseconds > 0")
        super().__init__(gym.make(env_id, **kwargs))
        self.step_s = float(step_ms) / 1000.0
        self.busy = bool(busy)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if self.busy:
            until = time.perf_counter() + self.step_s
            while time.perf_counter() < until:
                pass
        else:
            time.sleep(self.step_s)
        return self.env.step(action)
