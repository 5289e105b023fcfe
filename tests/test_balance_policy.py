"""The balance policy, pure: counters in, pause/resume decisions out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tianji.balance import BalanceConfig, BalancePolicy, Observation, stale_mask
from tianji.errors import ConfigError

PRODUCERS = {"actor-0": 0, "actor-1": 0}


def off_policy(**kw: float) -> BalancePolicy:
    cfg = dict(
        on_policy=False,
        replay_ratio=2.0,
        tolerance=0.5,
        min_replay_size=100,
        batch_samples=16,
        fragment_samples=32,
    )
    cfg.update(kw)
    return BalancePolicy(BalanceConfig(**cfg))  # type: ignore[arg-type]


def test_before_min_replay_size_producers_run_and_the_learner_waits() -> None:
    d = off_policy().decide(Observation(inserted=50, consumed=0, producer_versions=PRODUCERS))
    assert d.paused == frozenset() and d.learner_waits


def test_producers_that_run_ahead_are_paused_and_resume_in_the_band() -> None:
    policy = off_policy()
    ahead = policy.decide(Observation(inserted=1100, consumed=1000, producer_versions=PRODUCERS))
    assert ahead.paused == frozenset(PRODUCERS) and not ahead.learner_waits  # ratio 1.0
    balanced = policy.decide(Observation(inserted=600, consumed=1000, producer_versions=PRODUCERS))
    assert balanced.paused == frozenset() and not balanced.learner_waits  # ratio 2.0


def test_no_producer_pauses_while_a_replay_shard_cannot_sample_yet() -> None:
    # Past min_replay_size in total, but one shard (its actors started late) is still short:
    # pausing now could keep it short for good while its learner holds the others.
    obs = Observation(inserted=1100, consumed=1000, producer_versions=PRODUCERS, filling=True)
    d = off_policy().decide(obs)
    assert d.paused == frozenset() and not d.learner_waits


def test_a_learner_that_runs_ahead_waits_for_data() -> None:
    d = off_policy().decide(Observation(inserted=400, consumed=1000, producer_versions=PRODUCERS))
    assert d.learner_waits and d.paused == frozenset()  # ratio 3.33 > 2.5


@pytest.mark.parametrize(("produce", "consume"), [(64, 16), (16, 64), (32, 64), (100, 10)])
def test_a_simulated_run_never_leaves_the_band_for_more_than_one_interval(
    produce: int, consume: int
) -> None:
    """Every tick is one control interval: apply the decision, then let both sides work.

    The ratio starts at 0 (nothing consumed yet) and enters the band as fast as the learner
    can consume; from then on it may leave the band for one interval at most.
    """
    policy = off_policy(batch_samples=consume, fragment_samples=produce // 2)
    cfg = policy.config
    inserted = consumed = 0
    outside = 0
    entered = False
    for _ in range(2000):
        d = policy.decide(
            Observation(inserted=inserted, consumed=consumed, producer_versions=PRODUCERS)
        )
        if not d.paused:
            inserted += produce
        if not d.learner_waits:
            consumed += consume
        band = policy.band(Observation(inserted=inserted, consumed=consumed), len(PRODUCERS))
        if band is not None and consumed > 0:
            in_band = band[0] <= consumed <= band[1]
            entered = entered or in_band
            outside = 0 if in_band or not entered else outside + 1
            assert outside <= 1, (inserted, consumed, band)
    assert entered and consumed > 0 and inserted > cfg.min_replay_size
    ratio = policy.ratio(Observation(inserted=inserted, consumed=consumed))
    assert ratio is not None
    # The long-run ratio is within the tolerance, up to the one-step error buffer, whose
    # share of the total shrinks as the run goes on.
    slack = cfg.replay_ratio * len(PRODUCERS) * cfg.fragment_samples + cfg.batch_samples
    assert abs(ratio - cfg.replay_ratio) <= cfg.tolerance + slack / (inserted - cfg.min_replay_size)


def on_policy(
    lag: int = 1, batch: int = 1024, fragment: int = 512, target: int = 1
) -> BalancePolicy:
    return BalancePolicy(
        BalanceConfig(
            on_policy=True,
            max_policy_lag=lag,
            lag_target=target,
            batch_samples=batch,
            fragment_samples=fragment,
        )
    )


def test_a_producer_with_too_old_a_policy_is_paused_until_it_has_newer_weights() -> None:
    policy = on_policy(lag=1)
    versions = {"actor-0": 3, "actor-1": 5}
    d = policy.decide(
        Observation(inserted=0, consumed=0, learner_version=5, producer_versions=versions)
    )
    assert d.paused == {"actor-0"}
    versions["actor-0"] = 4
    d = policy.decide(
        Observation(inserted=0, consumed=0, learner_version=5, producer_versions=versions)
    )
    assert d.paused == frozenset()


def test_producers_pause_before_producing_what_would_be_dropped() -> None:
    policy = on_policy(lag=1, batch=1024, fragment=512)
    fresh = {"actor-0": 4, "actor-1": 4}
    # The batch in training (1024) is consumed at version 4; with the other actor's
    # fragment in progress a new fragment is consumed at 4 + 1536 // 1024 = 5: lag 1, fine.
    training = Observation(inserted=5120, consumed=4096, learner_version=4, producer_versions=fresh)
    assert policy.consumed_at(training, 2) == 5
    assert policy.decide(training).paused == frozenset()
    # One more batch waiting behind it: a new fragment would be consumed at 6, lag 2.
    backlog = Observation(inserted=6144, consumed=4096, learner_version=4, producer_versions=fresh)
    assert policy.decide(backlog).paused == {"actor-0", "actor-1"}
    # Dropped samples are not waiting any more.
    drained = dataclasses.replace(backlog, dropped=1024)
    assert policy.decide(drained).paused == frozenset()
    # A larger target (within a larger bound) allows a longer backlog.
    assert on_policy(lag=2, target=2).decide(backlog).paused == frozenset()
    assert on_policy(lag=3, target=1).decide(backlog).paused == {"actor-0", "actor-1"}


def test_on_policy_lag_of_consumed_samples_stays_within_the_bound_in_a_simulation() -> None:
    """A discrete simulation: producers take ``collect`` ticks per fragment, the learner
    ``train`` ticks per batch, weights reach producers ``delay`` ticks after an update.
    Decisions apply from the tick after the state they saw (one control interval late,
    shorter than a fragment). Nothing consumed exceeds the bound, and little is produced only to be
    dropped as stale."""
    lag_bound, frag, batch = 1, 512, 1024
    for collect, train, delay in [
        (3, 2, 1),
        (4, 8, 1),
        (6, 1, 0),
        (3, 3, 2),
        (10, 30, 1),
        (10, 3, 1),
    ]:
        policy = on_policy(lag=lag_bound, batch=batch, fragment=frag)
        version = 0
        queue: list[int] = []  # versions of waiting fragments
        producer = {"a": [0, 0], "b": [0, 0]}  # weights version, ticks into the fragment
        in_flight: list[tuple[int, int]] = []  # (arrive tick, version) of weights
        training = 0
        inserted = consumed = dropped = 0
        paused: frozenset[str] = frozenset()
        lags: list[int] = []
        for tick in range(3000):
            for p, state in producer.items():
                if state[1] == 0 and p in paused:
                    continue
                started = state[1] == 0
                state[1] += 1
                if state[1] >= collect:
                    queue.append(state[2] if len(state) > 2 else state[0])
                    inserted += frag
                    state[1] = 0
                    del state[2:]
                elif started:
                    state.append(state[0])  # the version that acts in this fragment
            if training == 0:  # the buffer drops what is stale, then serves a batch
                fresh = [v for v in queue if version - v <= lag_bound]
                dropped += (len(queue) - len(fresh)) * frag
                queue = fresh
                if len(queue) * frag >= batch:
                    lags += [version - v for v in queue[: batch // frag]]
                    del queue[: batch // frag]
                    training = train
            if training:
                training -= 1
                if training == 0:
                    consumed += batch
                    version += 1
                    in_flight.append((tick + delay, version))
            for arrive, v in list(in_flight):
                if arrive <= tick:
                    for state in producer.values():
                        state[0] = max(state[0], v)
                    in_flight.remove((arrive, v))
            obs = Observation(  # what the heartbeats say at the end of this tick
                inserted=inserted,
                consumed=consumed,
                dropped=dropped,
                learner_version=version,
                producer_versions={p: v[0] for p, v in producer.items()},
            )
            paused = policy.decide(obs).paused  # acted on from the next tick
        assert lags and max(lags) <= lag_bound, (collect, train, delay)
        assert dropped <= 0.02 * inserted, (collect, train, delay, dropped, inserted)
        # ... and the pipeline keeps the slower side busy (no lock-step): consumption is
        # close to the bottleneck's rate, actors collecting while the learner trains.
        bottleneck = min(2 * frag / collect, batch / train)
        assert consumed / 3000 >= 0.8 * bottleneck, (collect, train, delay)


def test_exactly_the_samples_over_the_lag_bound_are_stale() -> None:
    versions = np.array([10, 9, 8, 7, 10, 6])
    assert stale_mask(versions, learner_version=10, max_policy_lag=2).tolist() == [
        False,
        False,
        False,
        True,
        False,
        True,
    ]


def test_sync_mode_pauses_each_producer_after_one_fragment_per_version() -> None:
    policy = BalancePolicy(BalanceConfig(mode="sync", on_policy=True))
    obs = Observation(
        inserted=0,
        consumed=0,
        learner_version=3,
        producer_versions={"actor-0": 3, "actor-1": 3},
        fragments_at_version={"actor-0": 1, "actor-1": 0},
    )
    assert policy.decide(obs).paused == {"actor-0"}
    newer = dataclasses.replace(obs, learner_version=4)
    assert policy.decide(newer).paused == frozenset()  # new weights are out: go on


def test_unbalanced_mode_never_pauses_anyone() -> None:
    policy = BalancePolicy(BalanceConfig(mode="unbalanced"))
    d = policy.decide(Observation(inserted=10**6, consumed=0, producer_versions=PRODUCERS))
    assert d.paused == frozenset() and not d.learner_waits


@pytest.mark.parametrize(
    "kw",
    [
        {"mode": "chaos"},
        {"replay_ratio": 0.0},
        {"tolerance": 2.0, "replay_ratio": 1.0},
        {"max_policy_lag": -1},
        {"batch_samples": 0},
    ],
)
def test_bad_balance_settings_are_config_errors(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        BalanceConfig(**kw)  # type: ignore[arg-type]


def test_sync_off_policy_learner_waits_for_every_actor_then_takes_one_rounds_updates() -> None:
    policy = BalancePolicy(
        BalanceConfig(
            mode="sync",
            replay_ratio=2.0,
            min_replay_size=1000,
            batch_samples=128,
            fragment_samples=32,
        )
    )
    assert policy.updates_per_round(2) == 1  # 2 actors x 32 samples x ratio 2 = 128
    both = {"actor-0": 5, "actor-1": 5}
    half = Observation(
        inserted=5000,
        consumed=4096,
        learner_version=5,
        producer_versions=both,
        fragments_at_version={"actor-0": 1, "actor-1": 0},
    )
    assert policy.decide(half).learner_waits  # actor-1 has not sent with the new weights
    full = dataclasses.replace(half, fragments_at_version={"actor-0": 1, "actor-1": 1})
    d = policy.decide(full)
    assert not d.learner_waits and d.consume_limit == 4096 + 128
    # after the update the learner is one version ahead: the next round has not started
    after = dataclasses.replace(full, consumed=4224, learner_version=6)
    assert policy.decide(after).learner_waits and policy.decide(after).consume_limit == 4224
    filling = dataclasses.replace(full, inserted=900, consumed=0, learner_version=0)
    assert policy.decide(filling).learner_waits
