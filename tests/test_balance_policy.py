"""The balance policy, pure: counters in, grants out (every mode)."""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest

from tianji.rl.balance import (
    UNLIMITED,
    BalanceConfig,
    BalancePolicy,
    Decision,
    Grant,
    Mode,
    Observation,
)
from tianji.rl.lagstats import stale_mask
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


class Producers:
    """Producers that obey grants: each tick, every producer holding an unfinished grant
    sends one fragment; the controller records what it granted."""

    def __init__(self, names: Iterable[str], fragment: int) -> None:
        self.sent = dict.fromkeys(names, 0)
        self.granted = dict.fromkeys(self.sent, 0)
        self.fragment = fragment
        self.most_collecting = 0

    def observe(self, inserted: int, consumed: int, **kw: Any) -> Observation:
        return Observation(
            inserted=inserted,
            consumed=consumed,
            producer_versions=dict.fromkeys(self.sent, 0),
            fragments_sent=dict(self.sent),
            granted=dict(self.granted),
            **kw,
        )

    def take(self, d: Decision) -> None:
        for p, grant in d.grants.items():
            assert grant.limit > self.granted[p], (p, grant)  # grants only ever rise here
            self.granted[p] = grant.limit
        collecting = [p for p in self.sent if self.sent[p] < self.granted[p]]
        self.most_collecting = max(self.most_collecting, len(collecting))

    def tick(self) -> int:
        """Samples inserted this tick."""
        made = 0
        for p in self.sent:
            if self.sent[p] < self.granted[p]:
                self.sent[p] += 1
                made += self.fragment
        return made


def test_before_min_replay_size_producers_are_granted_and_the_learner_waits() -> None:
    producers = Producers(PRODUCERS, 32)
    d = off_policy().decide(producers.observe(50, 0))
    producers.take(d)
    assert d.idle == frozenset() and d.learner_waits
    assert all(n >= 1 for n in producers.granted.values())


@pytest.mark.parametrize(
    ("min_size", "fragment", "actors"), [(100, 32, 2), (1000, 200, 3), (256, 8, 8)]
)
def test_the_warm_up_is_granted_exactly_and_the_learner_starts_on_it(
    min_size: int, fragment: int, actors: int
) -> None:
    # Reverb's limiter offsets by its minimum size: the actors collect the fragments that
    # fill the warm-up (the last may pass it) and nothing more until it is in; then the
    # learner may take one round of updates ahead of the next inserts, not a burst on them.
    policy = off_policy(min_replay_size=min_size, fragment_samples=fragment)
    producers = Producers([f"actor-{i}" for i in range(actors)], fragment)
    inserted = 0
    while inserted < min_size:
        producers.take(policy.decide(producers.observe(inserted, 0)))
        inserted += producers.tick()
    warm_up = -(-min_size // fragment) * fragment
    assert inserted == warm_up, (inserted, warm_up)
    assert sum(producers.granted.values()) * fragment == warm_up  # nothing granted beyond it
    first = policy.decide(producers.observe(inserted, 0))
    round_updates = (policy.config.replay_ratio * actors * fragment) / policy.config.batch_samples
    assert first.consume_limit is not None
    assert first.consume_limit / policy.config.batch_samples <= 2 * round_updates + 4


def test_producers_that_run_ahead_get_no_grant_and_get_one_back_in_the_band() -> None:
    policy = off_policy()
    ahead = policy.decide(Observation(inserted=1100, consumed=1000, producer_versions=PRODUCERS))
    assert ahead.grants == {} and ahead.idle == frozenset(PRODUCERS)  # ratio 1.0
    assert not ahead.learner_waits
    balanced = policy.decide(Observation(inserted=600, consumed=1000, producer_versions=PRODUCERS))
    assert set(balanced.grants) == set(PRODUCERS) and not balanced.learner_waits  # ratio 2.0


def test_every_producer_keeps_a_grant_while_a_replay_shard_cannot_sample_yet() -> None:
    # Past min_replay_size in total, but one shard (its actors started late) is still short:
    # holding its actors now could keep it short for good while its learner holds the others.
    obs = Observation(inserted=1100, consumed=1000, producer_versions=PRODUCERS, filling=True)
    d = off_policy().decide(obs)
    assert set(d.grants) == set(PRODUCERS) and d.idle == frozenset() and not d.learner_waits


def test_a_learner_that_runs_ahead_waits_for_data() -> None:
    d = off_policy().decide(Observation(inserted=400, consumed=1000, producer_versions=PRODUCERS))
    assert d.learner_waits and d.idle == frozenset()  # ratio 3.33 > 2.5


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
    producers = Producers(PRODUCERS, cfg.fragment_samples)
    inserted = consumed = 0
    outside = 0
    entered = False
    for _ in range(2000):
        d = policy.decide(producers.observe(inserted, consumed))
        producers.take(d)
        inserted += producers.tick()
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
    """Producers far faster than the learner: they get no grant past the band's lower
    edge. The edge is an absolute error buffer, so consumed/inserted converges to
    replay_ratio (a band relative to all inserts held such runs at replay_ratio -
    tolerance for good: 11.97 for the DQN example's 16 +- 4)."""
    policy = off_policy(replay_ratio=16.0, tolerance=4.0, batch_samples=128, fragment_samples=32)
    producers = Producers(PRODUCERS, 32)
    inserted = consumed = 0
    for _ in range(20_000):
        d = policy.decide(producers.observe(inserted, consumed))
        producers.take(d)
        inserted += producers.tick()  # one fragment from each granted producer per tick
        if not d.learner_waits and (consumed + 128 <= (d.consume_limit or 0)):
            consumed += 128 // 8  # the learner: one update every 8 ticks
    ratio = policy.ratio(Observation(inserted=inserted, consumed=consumed))
    assert ratio is not None and abs(ratio - 16.0) < 0.1, ratio


def test_at_most_max_collecting_producers_hold_a_grant_and_the_learner_stays_fed() -> None:
    """32 replay producers on cores the learner shares: two collect at once. The warm-up
    is granted exactly (no burst of updates on surplus warm-up data while every producer
    waits), and the producers are never all idle for longer than the learner takes to
    consume one fragment's worth at the replay ratio."""
    names = [f"actor-{i}" for i in range(32)]
    policy = off_policy(max_collecting=2, min_replay_size=1000, replay_ratio=4.0, tolerance=1.0)
    cfg = policy.config
    producers = Producers(names, 32)
    inserted = consumed = 0
    idle_run = longest_idle_run = 0
    inserted_at_start: int | None = None
    for _ in range(3000):
        d = policy.decide(producers.observe(inserted, consumed))
        producers.take(d)
        learning = not d.learner_waits
        if learning and inserted_at_start is None:
            inserted_at_start = inserted
        idle_run = idle_run + 1 if learning and len(d.idle) == len(names) else 0
        longest_idle_run = max(longest_idle_run, idle_run)
        inserted += producers.tick()
        if learning:
            consumed += 16
    assert producers.most_collecting == 2
    assert inserted_at_start is not None
    surplus = inserted_at_start - cfg.min_replay_size
    assert surplus <= policy.error(len(names)) / cfg.replay_ratio + 2 * 32, surplus
    assert longest_idle_run <= 32 * 4 // 16 + 1, longest_idle_run
    ratio = policy.ratio(Observation(inserted=inserted, consumed=consumed))
    assert ratio is not None and abs(ratio - 4.0) < 0.5, ratio


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
    assert len(d.idle) == 4  # the other four have nothing to do: reported as idle


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


def test_sync_on_policy_grants_one_fragment_per_actor_per_version_with_those_weights() -> None:
    policy = BalancePolicy(
        BalanceConfig(
            mode="sync", on_policy=True, batch_samples=2 * 512, fragment_samples=512, producers=2
        )
    )
    both = {"actor-0": 2, "actor-1": 3}
    obs = Observation(inserted=0, consumed=0, learner_version=3, producer_versions=both)
    d = policy.decide(obs)
    assert d.grants == {"actor-0": Grant(1, 3), "actor-1": Grant(1, 3)}
    # both fragments out: nothing more until the learner consumed them
    sent = dataclasses.replace(obs, produced=1024, granted={"actor-0": 1, "actor-1": 1})
    sent = dataclasses.replace(sent, fragments_sent={"actor-0": 1, "actor-1": 1})
    assert policy.decide(sent).grants == {}
    # consumed at version 3: the next round needs version 4, which is not published yet
    consumed = dataclasses.replace(sent, consumed=1024, learner_version=4, params_version=3)
    assert policy.decide(consumed).grants == {}
    out = dataclasses.replace(consumed, params_version=4)
    assert policy.decide(out).grants == {"actor-0": Grant(2, 4), "actor-1": Grant(2, 4)}


def test_sync_replay_fills_its_share_then_grants_one_fragment_per_published_version() -> None:
    policy = BalancePolicy(
        BalanceConfig(
            mode="sync",
            replay_ratio=2.0,
            min_replay_size=1000,
            fill_fragments=16,
            batch_samples=128,
            fragment_samples=32,
            producers=2,
        )
    )
    both = {"actor-0": 0, "actor-1": 0}
    filling = Observation(inserted=100, consumed=0, producer_versions=both)
    d = policy.decide(filling)
    assert d.grants == {"actor-0": Grant(16, 0), "actor-1": Grant(16, 0)} and d.learner_waits
    # filled with version 0 (each sent 16 at it): the learner's round, no grant meanwhile
    filled = dataclasses.replace(
        filling,
        inserted=1024,
        fragments_sent={"actor-0": 16, "actor-1": 16},
        fragments_at_version={"actor-0": 16, "actor-1": 16},
        granted={"actor-0": 16, "actor-1": 16},
    )
    d = policy.decide(filled)
    assert d.grants == {} and not d.learner_waits and d.consume_limit == 128
    # the round's update is done and its weights (v1) published: one fragment each with them
    published = dataclasses.replace(filled, consumed=128, learner_version=1, params_version=1)
    d = policy.decide(published)
    assert d.grants == {"actor-0": Grant(17, 1), "actor-1": Grant(17, 1)} and d.learner_waits


def test_unbalanced_mode_grants_without_limit_and_never_holds_the_learner() -> None:
    policy = BalancePolicy(BalanceConfig(mode="unbalanced"))
    d = policy.decide(Observation(inserted=10**6, consumed=0, producer_versions=PRODUCERS))
    assert d.grants == {p: Grant(UNLIMITED, 0) for p in PRODUCERS}
    assert d.idle == frozenset() and not d.learner_waits and d.consume_limit is None
    granted = dict.fromkeys(PRODUCERS, UNLIMITED)
    again = Observation(inserted=0, consumed=0, producer_versions=PRODUCERS, granted=granted)
    assert policy.decide(again).grants == {}  # sent once


def test_only_the_balance_policy_reads_the_mode() -> None:
    """The mode is an enum that only ``tianji.rl.balance`` branches on: the services ask
    its config what they need (a staleness bound, when to publish). Its config is built
    in ``rl/run_balance.py``; reports may show it (``"mode": ...``)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    allowed = {"balance.py", "config.py", "run_balance.py"}
    branch = re.compile(
        r"\.mode\s*(==|!=|\bis\b|\bin\b)"  # self.config.controller.mode != ...
        r"|\bmode\s*(==|!=)\s*[\"']"  # mode == "sync"
        r"|[\"'](relaxed|sync|unbalanced)[\"']\s*:"  # {"sync": 1, ...}.get(mode)
        r"|\bMode\.[A-Z]"
    )
    readers = []
    for path in sorted((root / "tianji").rglob("*.py")):
        if path.name in allowed or "bench" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if branch.search(line):
                readers.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert readers == []
    before = [  # what the actor and the learner held before the one grant
        'self.bound_lag = self.on_policy and self.config.controller.mode != "unbalanced"',
        'if mode == "sync" and not self.on_policy:',
        'self.fragments_per_version = {"sync": 1, "unbalanced": 0}.get(',
    ]
    assert all(branch.search(line) for line in before)


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


def test_producers_take_weights_only_on_a_grant_where_the_collect_bound_idles_them() -> None:
    replay = BalanceConfig(on_policy=False, max_collecting=2)
    assert replay.weights_on_grant
    assert not BalanceConfig(on_policy=False, max_collecting=0).weights_on_grant
    assert not BalanceConfig(on_policy=False, max_collecting=2, mode=Mode.SYNC).weights_on_grant
    assert not BalanceConfig(on_policy=True, max_collecting=2).weights_on_grant
