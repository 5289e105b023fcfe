"""Properties of the on-policy balance, proved over a simulation of the live services.

:mod:`balance_sim` runs actors, the rollout buffer, the learner and the controller with
the delays between them (heartbeats, commands, weights, data) and the buffer's capacity
and eviction; the real :class:`tianji.rl.balance.BalancePolicy` decides. Hypothesis draws
actor counts 1-64, envs per actor, fragment lengths, fragments per batch, lag targets and
bounds, buffer capacities, learner and actor speeds and message delays. In every run:

- progress: the learner never goes long without an update (no state in which every
  producer waits and the learner waits for data);
- the lag bound: every consumed sample is within ``max_policy_lag``;
- bounded waste: stale + evicted samples are at most 2 % of those produced;
- no lock-step: updates come close to the bottleneck's rate.

The policy before production grants froze in this simulation with 8 actors and the PPO
example's settings (0 updates in 30 s, every actor paused from the start), as the live
run did (``test_the_pause_policy_froze_where_grants_progress``).
"""

from __future__ import annotations

import dataclasses
import math

from balance_sim import SimParams, SimResult, Simulation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tianji.rl.balance as balance


@st.composite
def runs(draw: st.DrawFn) -> SimParams:
    batch = draw(st.integers(1, 8))
    target = draw(st.integers(0, 4))
    return SimParams(
        actors=draw(st.integers(1, 64)),
        envs_per_actor=draw(st.integers(1, 8)),
        fragment_length=draw(st.integers(1, 128)),
        fragments_per_batch=batch,
        lag_target=target,
        max_policy_lag=target + draw(st.integers(0, 2)),
        buffer_capacity=batch * draw(st.integers(1, 6)) + draw(st.integers(0, 3)),
        prefetch=draw(st.integers(1, 3)),
        collect_s=draw(st.floats(0.001, 0.2)),
        train_s=draw(st.floats(0.001, 0.5)),
        heartbeat_delay=draw(st.floats(0.0, 0.05)),
        command_delay=draw(st.floats(0.0, 0.05)),
        weights_delay=draw(st.floats(0.0, 0.1)),
        data_delay=draw(st.floats(0.0, 0.05)),
    )


def round_trip(p: SimParams) -> float:
    """The slowest path a batch can wait on besides collecting and training: the grant
    (heartbeat + command), the weights, the data to the buffer, the batch to the learner
    and its request back."""
    return p.heartbeat_delay + p.command_delay + p.weights_delay + 3 * p.data_delay


def batch_time(p: SimParams) -> float:
    """Time for one batch with no overlap at all: the fragments collected by as many
    actors as may work at once, then the update, then every message."""
    working = min(p.actors, p.fragments_per_batch)
    rounds = math.ceil(p.fragments_per_batch / working)
    return rounds * p.collect_s + p.train_s + round_trip(p)


def simulate(p: SimParams, batches: int = 120) -> tuple[SimParams, SimResult]:
    params = dataclasses.replace(p, seconds=batches * batch_time(p))
    return params, Simulation(params, balance).run()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(runs())
def test_on_policy_balance_progresses_within_the_lag_bound_without_waste(p: SimParams) -> None:
    params, r = simulate(p)
    where = (params, r)
    # progress: a batch never takes much longer than with no overlap at all
    assert r.longest_gap <= 3 * batch_time(params) + 2 * params.heartbeat_every, where
    # the lag bound, measured where samples are consumed
    assert r.lags and max(r.lags) <= params.max_policy_lag, where
    # bounded waste
    assert r.wasted <= 0.02 * r.produced, where
    # no lock-step: at least one batch per batch_time (which assumes no overlap)
    assert r.updates >= 0.9 * params.seconds / batch_time(params), where


def test_the_pause_policy_froze_where_grants_progress() -> None:
    """The PPO example with 8 actors (2 fragments of 256 samples per batch, lag target 1,
    bound 2): the pause policy paused every actor before the first fragment and the run
    never moved; the grant policy keeps the learner at its own speed."""
    p = SimParams(actors=8, collect_s=0.04, train_s=0.03, seconds=30.0)
    r = Simulation(p, balance).run()
    assert r.updates >= 0.9 * 30.0 / (0.04 + 0.002 * 3)  # actors-bound: 2 fragments in parallel
    assert r.wasted == 0 and r.longest_gap < 0.5
