"""V-trace (Espeholt et al. 2018, "IMPALA"): off-policy corrected value targets and policy
advantages for fragments collected with an older policy, shared by IMPALA and PPO's
V-trace option (APPO).

Over ``[T, M]`` arrays (time, env column), with ``rho_t = pi(a_t|x_t) / mu(a_t|x_t)`` the
ratio of the learner's policy to the behaviour policy that acted:

* ``delta_t = min(rho_bar, rho_t) * (r_t + gamma * V(x_{t+1}) - V(x_t))``;
* ``v_t - V(x_t) = delta_t + gamma * lambda * min(c_bar, rho_t) * (v_{t+1} - V(x_{t+1}))``,
  cut where the episode ended at ``t``;
* the policy gradient's advantage ``min(rho_pg_bar, rho_t) * (r_t + gamma * v_{t+1} -
  V(x_t))``, where ``v_{t+1}`` is the next step's target inside an episode and
  ``V(next_obs_t)`` at a truncation or the fragment's last step.

Ends are handled as in GAE: a termination bootstraps nothing (``V(x_{t+1}) = 0``), a
truncation and the fragment's last step bootstrap ``V(next_obs_t)``, and neither lets the
recursion cross into the next episode. With ``rho_bar = c_bar = inf`` on on-policy data
(``rho = 1``) and ``lambda = 1`` the targets are the discounted returns bootstrapped as
GAE's with ``lambda = 1``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["vtrace"]


def vtrace(
    reward: np.ndarray,
    value: np.ndarray,
    next_value: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    log_rho: np.ndarray,
    *,
    gamma: float,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    rho_pg_bar: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """V-trace targets and policy advantages over ``[T, M]`` arrays (see the module
    docstring).

    Args:
        reward: ``r_t``.
        value: ``V(x_t)`` under the learner's value function.
        next_value: ``V(next_obs_t)`` (read at truncations and at the last step).
        terminated / truncated: how the episode ended at ``t``, if it did.
        log_rho: ``log pi(a_t|x_t) - log mu(a_t|x_t)``.
        gamma, lam: discount and trace decay.
        rho_bar, c_bar: truncation levels of the importance weights (``inf``: none).
        rho_pg_bar: the policy gradient's truncation level (default ``rho_bar``).

    Returns:
        ``(targets, advantages)``: the value targets ``v_t`` and the policy gradient's
        advantages, float32.

    Raises:
        ValueError: if the arrays' shapes differ or a truncation level is not positive.
    """
    pg_bar = rho_bar if rho_pg_bar is None else rho_pg_bar
    _check(reward, (value, next_value, terminated, truncated, log_rho), (rho_bar, c_bar, pg_bar))
    term = np.asarray(terminated, dtype=bool)
    cont = ~(term | np.asarray(truncated, dtype=bool))
    reward = np.asarray(reward, dtype=np.float64)
    value = np.asarray(value, dtype=np.float64)
    rho = np.exp(np.asarray(log_rho, dtype=np.float64))
    boot = np.where(term, 0.0, np.asarray(next_value, dtype=np.float64))  # V(x_{t+1}) at ends
    delta = np.minimum(rho_bar, rho) * (reward + gamma * _following(value, cont, boot) - value)
    trace = gamma * lam * np.minimum(c_bar, rho) * cont
    correction = np.zeros(np.shape(reward), dtype=np.float64)
    running = np.zeros(np.shape(reward)[1:], dtype=np.float64)
    for t in reversed(range(len(reward))):
        running = delta[t] + trace[t] * running
        correction[t] = running
    targets = value + correction
    next_target = _following(targets, cont, boot)
    advantages = np.minimum(pg_bar, rho) * (reward + gamma * next_target - value)
    return targets.astype(np.float32), advantages.astype(np.float32)


def _check(reward: np.ndarray, arrays: tuple[np.ndarray, ...], levels: tuple[float, ...]) -> None:
    """Raise ValueError unless ``reward`` and ``arrays`` are ``[T, M]`` of one shape and the
    truncation ``levels`` (rho_bar, c_bar, rho_pg_bar) are positive."""
    shape = np.shape(reward)
    if len(shape) != 2 or any(np.shape(a) != shape for a in arrays):
        shapes = [np.shape(a) for a in (reward, *arrays)]
        raise ValueError(f"v-trace needs [T, M] arrays of one shape, got {shapes}")
    if min(levels) <= 0:
        rho_bar, c_bar, pg_bar = levels
        raise ValueError(
            f"truncation levels must be > 0: rho_bar={rho_bar}, c_bar={c_bar}, rho_pg_bar={pg_bar}"
        )


def _following(x: np.ndarray, cont: np.ndarray, boot: np.ndarray) -> np.ndarray:
    """``x`` of the step after ``t`` inside an episode (the next row), else ``boot[t]`` (at
    an episode's end and at the fragment's last step)."""
    out = np.empty_like(x)
    out[:-1] = np.where(cont[:-1], x[1:], boot[:-1])
    out[-1] = boot[-1]
    return out
