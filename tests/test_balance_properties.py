"""Properties of the one grant mechanism in every mode, proved over a simulation of the
live services.

:mod:`balance_sim` runs actors, the buffer (a rollout FIFO with capacity and eviction, or a
replay with a warm-up), the learner and the controller with the delays between them
(heartbeats, commands, weights, data); the real :class:`tianji.rl.balance.BalancePolicy`
decides. Hypothesis draws actor counts 1-64, envs per actor, fragment lengths, batch
sizes, lag targets and bounds, buffer capacities, replay ratios, warm-ups, bounds on
producers collecting at once, learner and actor speeds and message delays. In every run:

- progress: the learner never goes long without an update (no state in which every
  producer waits and the learner waits for data);
- on-policy relaxed: every consumed sample is within ``max_policy_lag``, and stale +
  evicted samples are at most 2 % of those produced; sync: every sample is consumed by
  the policy that collected it (lag 0), one fragment per actor per version;
- off-policy relaxed: ``consumed`` never exceeds the band's upper edge, the warm-up is
  granted without surplus beyond the error buffer, and the ratio converges;
- sync off-policy: after the warm-up, each actor collects one fragment per version;
- at most ``max_collecting`` actors collect at once;
- no lock-step: updates come close to the bottleneck's rate.

The pause policy before production grants froze in this simulation with 8 actors and the
PPO example's settings (0 updates in 30 s, every actor paused from the start), as the live
run did (``test_the_ppo_example_with_8_actors_runs_at_its_bottleneck``).
"""

from __future__ import annotations

import dataclasses
import math

from balance_sim import SimParams, SimResult, Simulation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def timing(draw: st.DrawFn) -> dict[str, float]:
    return dict(
        collect_s=draw(st.floats(0.001, 0.2)),
        train_s=draw(st.floats(0.001, 0.5)),
        heartbeat_delay=draw(st.floats(0.0, 0.05)),
        command_delay=draw(st.floats(0.0, 0.05)),
        weights_delay=draw(st.floats(0.0, 0.1)),
        data_delay=draw(st.floats(0.0, 0.05)),
    )


@st.composite
def on_policy_runs(draw: st.DrawFn, mode: str = "relaxed") -> SimParams:
    actors = draw(st.integers(1, 64))
    batch = actors if mode == "sync" else draw(st.integers(1, 8))
    target = draw(st.integers(0, 4))
    return SimParams(
        mode=mode,
        actors=actors,
        envs_per_actor=draw(st.integers(1, 8)),
        fragment_length=draw(st.integers(1, 128)),
        fragments_per_batch=batch,
        lag_target=target,
        max_policy_lag=target + draw(st.integers(0, 2)),
        buffer_capacity=batch * draw(st.integers(1, 6)) + draw(st.integers(0, 3)),
        prefetch=draw(st.integers(1, 3)),
        max_collecting=draw(st.sampled_from([0, 0, 1, 2, 4])),
        **timing(draw),
    )


@st.composite
def replay_runs(draw: st.DrawFn, mode: str = "relaxed") -> SimParams:
    actors = draw(st.integers(1, 48))
    fragment_length = draw(st.integers(1, 64))
    envs = draw(st.integers(1, 8))
    ratio = draw(st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0, 16.0]))
    batch = draw(st.integers(16, 256))
    if mode == "sync":  # a round of fragments must pay for at least one update
        ratio = max(ratio, 1.0)
        batch = min(batch, int(ratio * actors * fragment_length * envs))
    return SimParams(
        mode=mode,
        on_policy=False,
        actors=actors,
        envs_per_actor=envs,
        fragment_length=fragment_length,
        batch_samples=max(1, batch),
        replay_ratio=ratio,
        tolerance=ratio * draw(st.sampled_from([0.0, 0.1, 0.25, 0.5])),
        min_replay_size=draw(st.integers(0, 5000)),
        publish_interval=draw(st.integers(1, 8)),
        max_collecting=draw(st.sampled_from([0, 0, 1, 2, 4])),
        prefetch=draw(st.integers(1, 3)),
        **timing(draw),
    )


def round_trip(p: SimParams) -> float:
    """The slowest path a batch can wait on besides collecting and training: the grant
    (heartbeat + command), the weights, the data to the buffer, the batch to the learner
    and its request back."""
    return p.heartbeat_delay + p.command_delay + p.weights_delay + 3 * p.data_delay


def working(p: SimParams, fragments: int) -> int:
    cap = p.max_collecting if p.mode == "relaxed" and p.max_collecting else p.actors
    return min(p.actors, fragments, cap)


def batch_time(p: SimParams) -> float:
    """Time for one update with no overlap at all: its fragments collected by as many
    actors as may work at once, then the update, then every message."""
    if p.on_policy:
        fragments = p.fragments_per_batch
    else:  # the fragments one update pays for at the replay ratio
        fragments = max(1, math.ceil(p.batch_samples / p.replay_ratio / p.fragment_samples))
    rounds = math.ceil(fragments / working(p, fragments))
    return rounds * p.collect_s + p.train_s + round_trip(p)


def warmup_time(p: SimParams) -> float:
    fragments = max(1, math.ceil(p.min_replay_size / p.fragment_samples))
    return math.ceil(fragments / working(p, fragments)) * p.collect_s + round_trip(p)


def simulate(p: SimParams, batches: int = 100) -> tuple[SimParams, SimResult]:
    seconds = batches * batch_time(p) + (0 if p.on_policy else warmup_time(p))
    params = dataclasses.replace(p, seconds=seconds)
    return params, Simulation(params).run()


def check_progress(params: SimParams, r: SimResult) -> None:
    where = (params, r)
    slow = 3 * batch_time(params) + 2 * params.heartbeat_every
    start = 0.0 if params.on_policy else warmup_time(params)
    assert r.longest_gap <= slow + start, where
    # no lock-step: at least one update per batch_time (which assumes no overlap)
    assert r.updates >= 0.9 * (params.seconds - start) / batch_time(params) - 2, where
    if params.max_collecting and params.mode == "relaxed":
        assert r.most_collecting <= params.max_collecting, where


@SETTINGS
@given(on_policy_runs())
def test_relaxed_on_policy_progresses_within_the_lag_bound_without_waste(p: SimParams) -> None:
    params, r = simulate(p)
    check_progress(params, r)
    assert r.lags and max(r.lags) <= params.max_policy_lag, (params, r)
    assert r.wasted <= 0.02 * r.produced, (params, r)


@SETTINGS
@given(on_policy_runs(mode="sync"))
def test_sync_on_policy_consumes_every_sample_with_the_policy_that_collected_it(
    p: SimParams,
) -> None:
    params, r = simulate(p)
    check_progress(params, r)
    assert set(r.lags) == {0} and r.wasted == 0, (params, r)
    assert max(r.fragments_per_version.values()) == 1, (params, r)  # one per actor per version


@settings(SETTINGS, max_examples=20)
@given(on_policy_runs(mode="unbalanced"))
def test_unbalanced_on_policy_runs_never_hold_anyone(p: SimParams) -> None:
    # (short runs: unbounded actors make many events while a slow learner trains)
    params, r = simulate(dataclasses.replace(p, max_collecting=0), batches=20)
    assert r.updates > 0 and r.paused_actor_s <= params.actors * (
        round_trip(params) + params.seconds / 100
    ), (params, r)


@SETTINGS
@given(replay_runs())
def test_relaxed_replay_holds_the_ratio_band_from_the_warm_up_on(p: SimParams) -> None:
    params, r = simulate(p)
    check_progress(params, r)
    policy_error = (params.tolerance + params.replay_ratio) * params.actors * (
        params.fragment_samples
    ) + params.batch_samples
    assert r.above_band == 0, (params, r)
    # the warm-up is granted as any insert: no surplus beyond the error buffer and what
    # was being collected (a fragment of every actor) when the learner started
    assert r.inserted_at_first_update is not None
    surplus = r.inserted_at_first_update - params.min_replay_size
    on_the_way = params.actors * params.fragment_samples
    assert surplus <= policy_error / params.replay_ratio + on_the_way, (params, r)
    effective = r.inserted - params.min_replay_size
    ratio = r.consumed / effective
    assert abs(ratio - params.replay_ratio) <= params.tolerance + policy_error / effective + (
        on_the_way * params.replay_ratio / effective
    ), (params, r)


@SETTINGS
@given(replay_runs(mode="sync"))
def test_sync_replay_collects_one_fragment_per_actor_per_version(p: SimParams) -> None:
    params, r = simulate(p)
    check_progress(params, r)
    after_warmup = [n for (_, version), n in r.fragments_per_version.items() if version > 0]
    assert not after_warmup or max(after_warmup) == 1, (params, r)


def test_the_ppo_example_with_8_actors_runs_at_its_bottleneck() -> None:
    """The PPO example with 8 actors (2 fragments of 256 samples per batch, lag target 1,
    bound 2): the pause policy paused every actor before the first fragment and the run
    never moved; the grants keep the learner at its own speed."""
    p = SimParams(actors=8, collect_s=0.04, train_s=0.03, seconds=30.0)
    r = Simulation(p).run()
    assert r.updates >= 0.9 * 30.0 / (0.04 + 0.002 * 3)  # actors-bound: 2 fragments in parallel
    assert r.wasted == 0 and r.longest_gap < 0.5
