"""GAE (Schulman et al. 2016): advantages and value targets of on-policy fragments.

Shared by PPO and MAPPO; V-trace (``algorithms/_vtrace.py``) is the off-policy corrected
alternative with the same handling of episode ends.
"""

from __future__ import annotations

import numpy as np

__all__ = ["gae"]


def gae(
    reward: np.ndarray,
    value: np.ndarray,
    next_value: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimates and returns over ``[T, M]`` arrays.

    ``delta_t = r_t + gamma * V(next_obs_t) * (1 - terminated_t) - V(obs_t)`` bootstraps
    at truncations and at the fragment end, never at terminations; the recursion
    ``A_t = delta_t + gamma * lam * A_{t+1}`` is cut wherever an episode ended.

    Returns:
        ``(advantages, returns)`` with ``returns = advantages + value``, float32.
    """
    term = np.asarray(terminated, dtype=bool)
    cont = ~(term | np.asarray(truncated, dtype=bool))
    delta = reward + gamma * np.where(term, 0.0, next_value) - value
    adv = np.zeros(np.shape(reward), dtype=np.float64)
    running = np.zeros(np.shape(reward)[1:], dtype=np.float64)
    for t in reversed(range(len(adv))):
        running = delta[t] + gamma * lam * cont[t] * running
        adv[t] = running
    return adv.astype(np.float32), (adv + value).astype(np.float32)
