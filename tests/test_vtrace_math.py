"""V-trace against a direct implementation of the paper's formula (a sum over each step's
future with an explicit product of traces), on random fragments with terminations and
truncations; on on-policy data without truncation of the weights it is the lambda = 1
return, as GAE's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tianji.algorithms._gae import gae
from tianji.algorithms._vtrace import vtrace


def direct(
    reward: np.ndarray,
    value: np.ndarray,
    next_value: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    log_rho: np.ndarray,
    gamma: float,
    lam: float,
    rho_bar: float,
    c_bar: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``v_s = V(x_s) + sum_t gamma^(t-s) (prod_{i<t} lam min(c_bar, rho_i)) delta_t`` over
    the rest of the episode inside the fragment, written out."""
    steps, width = reward.shape
    rho = np.exp(log_rho)
    ended = terminated | truncated

    def following(t: int, m: int) -> float:  # V(x_{t+1})
        if terminated[t, m]:
            return 0.0
        if truncated[t, m] or t == steps - 1:
            return float(next_value[t, m])
        return float(value[t + 1, m])

    def delta(t: int, m: int) -> float:
        r = min(rho_bar, rho[t, m])
        return r * (reward[t, m] + gamma * following(t, m) - value[t, m])

    targets = np.zeros((steps, width))
    for m in range(width):
        for s in range(steps):
            total, product = 0.0, 1.0
            for t in range(s, steps):
                total += gamma ** (t - s) * product * delta(t, m)
                if ended[t, m]:
                    break
                product *= lam * min(c_bar, rho[t, m])
            targets[s, m] = value[s, m] + total
    advantages = np.zeros((steps, width))
    for m in range(width):
        for s in range(steps):
            if terminated[s, m]:
                nxt = 0.0
            elif truncated[s, m] or s == steps - 1:
                nxt = float(next_value[s, m])
            else:
                nxt = targets[s + 1, m]
            r = min(rho_bar, rho[s, m])
            advantages[s, m] = r * (reward[s, m] + gamma * nxt - value[s, m])
    return targets, advantages


def fragment(seed: int, steps: int, width: int) -> dict[str, np.ndarray]:
    """Random ``[T, M]`` arrays; inside an episode ``next_value[t]`` is ``value[t+1]`` (the
    same observation), as in a real fragment."""
    rng = np.random.default_rng(seed)
    ends = rng.random((steps, width))
    terminated, truncated = ends < 0.1, (ends >= 0.1) & (ends < 0.15)
    value = rng.normal(size=(steps, width))
    next_value = rng.normal(size=(steps, width))
    inside = ~(terminated | truncated)[:-1]
    next_value[:-1] = np.where(inside, value[1:], next_value[:-1])
    return {
        "reward": rng.normal(size=(steps, width)),
        "value": value,
        "next_value": next_value,
        "terminated": terminated,
        "truncated": truncated,
        "log_rho": rng.normal(scale=0.7, size=(steps, width)),
    }


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    steps=st.integers(1, 12),
    width=st.integers(1, 4),
    gamma=st.sampled_from([0.0, 0.9, 0.99, 1.0]),
    lam=st.sampled_from([0.0, 0.5, 0.95, 1.0]),
    rho_bar=st.sampled_from([0.5, 1.0, 2.0, math.inf]),
    c_bar=st.sampled_from([0.5, 1.0, math.inf]),
)
def test_vtrace_equals_the_papers_sum_on_random_fragments(
    seed: int, steps: int, width: int, gamma: float, lam: float, rho_bar: float, c_bar: float
) -> None:
    f = fragment(seed, steps, width)
    targets, advantages = vtrace(
        f["reward"], f["value"], f["next_value"], f["terminated"], f["truncated"], f["log_rho"],
        gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar,
    )  # fmt: skip
    want_targets, want_adv = direct(**f, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    np.testing.assert_allclose(targets, want_targets, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(advantages, want_adv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed", range(5))
def test_on_policy_without_truncation_it_is_the_lambda_one_return(seed: int) -> None:
    f = fragment(seed, 16, 3)
    on_policy = np.zeros_like(f["log_rho"])
    targets, advantages = vtrace(
        f["reward"], f["value"], f["next_value"], f["terminated"], f["truncated"], on_policy,
        gamma=0.97, lam=1.0, rho_bar=math.inf, c_bar=math.inf,
    )  # fmt: skip
    # the discounted return, bootstrapped at truncations and the fragment's end
    want = np.zeros_like(f["reward"])
    for m in range(3):
        ret = 0.0
        for t in reversed(range(16)):
            if f["terminated"][t, m]:
                ret = f["reward"][t, m]
            elif f["truncated"][t, m] or t == 15:
                ret = f["reward"][t, m] + 0.97 * f["next_value"][t, m]
            else:
                ret = f["reward"][t, m] + 0.97 * ret
            want[t, m] = ret
    np.testing.assert_allclose(targets, want, rtol=1e-5, atol=1e-5)
    _, gae_returns = gae(
        f["reward"], f["value"], f["next_value"], f["terminated"], f["truncated"], 0.97, 1.0
    )
    np.testing.assert_allclose(targets, gae_returns, rtol=1e-5, atol=1e-5)
    # and the advantage is the one-step TD error towards the next target
    last = np.where(f["terminated"][-1], 0.0, f["next_value"][-1])
    td = f["reward"][-1] + 0.97 * last - f["value"][-1]
    np.testing.assert_allclose(advantages[-1], td, rtol=1e-5, atol=1e-5)


def test_bad_shapes_and_truncation_levels_are_refused() -> None:
    f = fragment(0, 4, 2)
    with pytest.raises(ValueError, match="one shape"):
        vtrace(f["reward"][0], f["value"][0], f["next_value"][0], f["terminated"][0],
               f["truncated"][0], f["log_rho"][0], gamma=0.9)  # fmt: skip
    with pytest.raises(ValueError, match="rho_bar=0"):
        vtrace(*f.values(), gamma=0.9, rho_bar=0.0)
