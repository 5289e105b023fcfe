"""The balance policy, pure: counters in, pause/resume decisions out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tianji.rl.balance import BalanceConfig, BalancePolicy, Grant, Observation, stale_mask
from tianji.runtime.errors import ConfigError

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


def test_a_learner_bound_replay_run_converges_to_the_ratio_not_the_band_edge() -> None:
    """Producers far faster than the learner: they pause at the band's lower edge. The
    edge is an absolute error buffer, so consumed/inserted converges to replay_ratio (a
    band relative to all inserts held such runs at replay_ratio - tolerance for good:
    11.97 for the DQN example's 16 +- 4)."""
    policy = off_policy(replay_ratio=16.0, tolerance=4.0, batch_samples=128, fragment_samples=32)
    inserted = consumed = 0
    for _ in range(20_000):
        obs = Observation(inserted=inserted, consumed=consumed, producer_versions=PRODUCERS)
        d = policy.decide(obs)
        if not d.paused:
            inserted += 2 * 32  # one fragment from each producer per tick
        if not d.learner_waits and (consumed + 128 <= (d.consume_limit or 0)):
            consumed += 128 // 8  # the learner: one update every 8 ticks
    ratio = policy.ratio(Observation(inserted=inserted, consumed=consumed))
    assert ratio is not None and abs(ratio - 16.0) < 0.1, ratio


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


def test_grants_fill_one_batch_plus_lag_target_batches_then_stop() -> None:
    # 2 fragments per batch, lag target 1: at most 4 fragments outstanding.
    policy = on_policy(lag=2, target=1)
    fresh = {"actor-0": 0, "actor-1": 0, "actor-2": 0}
    d = policy.decide(Observation(inserted=0, consumed=0, producer_versions=fresh))
    assert d.grants is not None
    assert sum(g.limit for g in d.grants.values()) == 4
    assert all(g.min_version == 0 for g in d.grants.values())
    # every producer gets one before any gets a second (idle producers first)
    assert sorted(g.limit for g in d.grants.values()) == [1, 1, 2]
    granted = {p: g.limit for p, g in d.grants.items()}
    again = policy.decide(
        Observation(inserted=0, consumed=0, producer_versions=fresh, granted=granted)
    )
    assert again.grants == {} and again.reason.startswith("4/4")


def test_a_grant_asks_for_the_weights_its_fragment_needs_to_stay_within_the_target() -> None:
    policy = on_policy(lag=2, target=1)
    # learner at version 5 training on a batch (2 fragments held), 2 more buffered: the
    # next fragment is the 5th outstanding one, consumed at 5 + 4 // 2 = 7: weights >= 6.
    obs = Observation(
        inserted=0,
        consumed=0,
        produced=4 * 512,
        learner_version=5,
        params_version=6,
        producer_versions={"actor-0": 5},
    )
    assert policy.consumed_at(obs, 4) == 7
    d = on_policy(lag=3, target=2).decide(obs)
    assert d.grants == {"actor-0": Grant(limit=2, min_version=5)}  # positions 4 and 5
    # target 1: positions 0..3 are taken, nothing more may be outstanding
    assert policy.decide(obs).grants == {}
    # weights 6 not published yet: a grant that needs them waits for them
    early = dataclasses.replace(obs, params_version=5)
    assert on_policy(lag=3, target=1).decide(early).grants == {}


def test_less_than_a_batch_outstanding_is_always_granted_so_the_learner_never_starves() -> None:
    # The freeze of the old policy: 8 actors, all paused, the buffer empty, the learner
    # waiting. Whatever the producers' weights, the first batch is always granted.
    policy = on_policy(lag=1, target=1, batch=512, fragment=256)
    stale = {f"actor-{i}": 1 for i in range(8)}
    obs = Observation(
        inserted=0, consumed=0, learner_version=3, params_version=3, producer_versions=stale
    )
    d = policy.decide(obs)
    assert d.grants is not None and sum(g.limit for g in d.grants.values()) == 4
    assert len(d.paused) == 4  # the other four have nothing to do: reported as paused


def test_dropped_and_consumed_samples_free_their_places() -> None:
    policy = on_policy(lag=2, target=1)
    full = Observation(inserted=0, consumed=0, produced=4 * 512, producer_versions={"actor-0": 0})
    assert policy.outstanding(full) == 4 and policy.decide(full).grants == {}
    freed = dataclasses.replace(full, consumed=1024, dropped=512, learner_version=1)
    assert policy.outstanding(freed) == 1
    grants = policy.decide(freed).grants
    assert grants is not None and grants["actor-0"].limit == 3


def test_the_rollout_buffer_capacity_caps_what_is_outstanding() -> None:
    policy = BalancePolicy(
        BalanceConfig(
            on_policy=True,
            max_policy_lag=4,
            lag_target=4,
            batch_samples=1024,
            fragment_samples=512,
            buffer_fragments=6,
        )
    )
    assert policy.config.outstanding_limit == 6  # not 2 x 5 = 10: nothing is ever evicted
    d = policy.decide(Observation(inserted=0, consumed=0, producer_versions={"a": 0}))
    assert d.grants == {"a": Grant(limit=6, min_version=0)}


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


def test_a_sync_replay_round_keeps_its_grant_until_its_updates_are_done() -> None:
    # 2 actors x 32 samples x ratio 16 = 1024 samples: 8 updates of 128 per round
    policy = BalancePolicy(
        BalanceConfig(
            mode="sync",
            replay_ratio=16.0,
            tolerance=4.0,
            min_replay_size=1000,
            batch_samples=128,
            fragment_samples=32,
        )
    )
    assert policy.updates_per_round(2) == 8
    start = Observation(
        inserted=5000,
        consumed=4096,
        learner_version=32,
        producer_versions={"actor-0": 32, "actor-1": 32},
        fragments_at_version={"actor-0": 1, "actor-1": 1},
    )
    assert policy.decide(start).consume_limit == 4096 + 8 * 128
    # three updates into the round: the actors still hold v32, the grant is unchanged
    # (it used to shrink to what was consumed, one update per round instead of eight)
    midway = dataclasses.replace(start, consumed=4096 + 3 * 128, learner_version=35)
    d = policy.decide(midway)
    assert not d.learner_waits and d.consume_limit == 4096 + 8 * 128
    done = dataclasses.replace(start, consumed=4096 + 8 * 128, learner_version=40)
    assert policy.decide(done).learner_waits
    # the actors got v40 and sent one fragment each: the next round
    nxt = dataclasses.replace(done, producer_versions={"actor-0": 40, "actor-1": 40})
    assert policy.decide(nxt).consume_limit == 4096 + 16 * 128
