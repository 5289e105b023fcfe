"""The balancer's running totals (:class:`~tianji.services.balancer.Tally`) give the same
observation as summing every heartbeat afresh, whatever the order of heartbeats, grants,
deaths (retired as ``name#k``) and services leaving or registering anew; the producers it
keeps as holding grants lead the policy to the same decisions as deriving them afresh;
and a decision costs no heartbeat scan, and no look at a registry record, beyond the ones
that changed."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tianji.rl.balance import BalanceConfig, BalancePolicy, Observation
from tianji.rl.grants import Idle
from tianji.rl.stats import ActorStat, BookStat, BufferStat, LearnerStat
from tianji.rl.tally import Tally
from tianji.runtime.events import Heartbeat
from tianji.runtime.registry import LOG_SLACK, Registry

NAMES = {"actor-0": "actor", "actor-1": "actor", "buffer-0": "buffer", "learner-0": "learner"}


def reference(heartbeats: Mapping[str, Heartbeat], live: Mapping[str, Any]) -> Observation:
    """Every heartbeat summed from scratch (what the balancer did before the tally)."""

    def dropped(hb: Heartbeat) -> int:
        return sum(v for k, v in hb.counters.items() if k.startswith("dropped/"))

    inserted = consumed = lost = produced = version = 0
    params: int | None = None
    filling = False
    versions, fragments, sent = {}, {}, {}
    for name, hb in heartbeats.items():
        c, g = hb.counters, hb.gauges
        if hb.role == "buffer":
            inserted += c.get(BufferStat.SAMPLES_INSERTED, 0)
            filling |= name in live and g.get(BufferStat.READY, 1.0) < 1.0
        elif hb.role == "learner":
            consumed += c.get(LearnerStat.SAMPLES_CONSUMED, 0)
            version = max(version, c.get(LearnerStat.LEARNER_UPDATES, 0))
            if LearnerStat.PARAMS_VERSION in g and name in live:
                params = max(params or 0, int(g[LearnerStat.PARAMS_VERSION]))
        elif hb.role == "actor":
            produced += c.get(ActorStat.SAMPLES_PRODUCED, 0)
            if name in live and live[name].last_heartbeat is not None:
                versions[name] = int(g.get(ActorStat.POLICY_VERSION, -1))
                fragments[name] = int(g.get(ActorStat.FRAGMENTS_AT_VERSION, 0))
                sent[name] = int(c.get(ActorStat.FRAGMENTS_SENT, 0))
        lost += dropped(hb)
    furthest: dict[str, float] = {}  # "actor/stream" -> the furthest offset of any buffer
    for hb in heartbeats.values():
        for key, offset in hb.gauges.items():
            if key.startswith(BookStat.RECV):
                stream = key.removeprefix(BookStat.RECV)
                furthest[stream] = max(furthest.get(stream, 0.0), offset)
    transit = 0.0
    for name in versions:
        for key, samples in heartbeats[name].gauges.items():
            if key.startswith(BookStat.SENT):
                stream = f"{name}/{key.removeprefix(BookStat.SENT)}"
                transit += max(0.0, samples - furthest.get(stream, 0.0))
    return Observation(
        in_transit=int(transit),
        inserted=inserted,
        consumed=consumed,
        dropped=lost,
        learner_version=version,
        producer_versions=versions,
        fragments_at_version=fragments,
        filling=filling,
        produced=produced,
        fragments_sent=sent,
        params_version=params,
    )


def beat(name: str, k: int, drop: int) -> Heartbeat:
    role = NAMES[name]
    counters = {
        "actor": {ActorStat.SAMPLES_PRODUCED: 64 * k, ActorStat.FRAGMENTS_SENT: k},
        "buffer": {BufferStat.SAMPLES_INSERTED: 100 * k},
        "learner": {LearnerStat.SAMPLES_CONSUMED: 32 * k, LearnerStat.LEARNER_UPDATES: k},
    }[role]
    gauges = {
        "actor": {
            ActorStat.POLICY_VERSION: float(k % 5),
            ActorStat.FRAGMENTS_AT_VERSION: 1.0,
            f"{BookStat.SENT}main": 64.0 * k,  # samples sent on its stream
        },
        "buffer": {  # how far it has each actor's stream (moving with k, not always ahead)
            BufferStat.READY: float(k % 2),
            f"{BookStat.RECV}actor-0/main": 40.0 * k,
            f"{BookStat.RECV}actor-1/main": 70.0 * k,
        },
        "learner": {LearnerStat.PARAMS_VERSION: float(k)},
    }[role]
    if drop:
        counters = {**counters, "dropped/stale": drop}
    return Heartbeat(
        name=name,
        role=role,
        state="running",
        counters=counters,
        gauges=gauges,
        queue_depths={},
        sent_at=0.0,
    )


POLICIES = [
    BalancePolicy(BalanceConfig(replay_ratio=2.0, fragment_samples=64, batch_samples=32)),
    BalancePolicy(BalanceConfig(replay_ratio=1.0, fragment_samples=64, max_collecting=1)),
    BalancePolicy(
        BalanceConfig(on_policy=True, fragment_samples=64, batch_samples=128, lag_target=1)
    ),
]

step = st.tuples(
    st.sampled_from(["beat", "beat", "beat", "die", "leave", "join", "grant"]),
    st.sampled_from(sorted(NAMES)),
    st.integers(0, 50),
    st.integers(0, 3),
)


@pytest.mark.parametrize("registry", [dict, Registry], ids=["dict", "registry"])
@settings(max_examples=200, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=60))
def test_running_totals_equal_a_fresh_sum_after_any_sequence(
    registry: type[dict[str, Any]], steps: list[Any]
) -> None:
    heartbeats: dict[str, Heartbeat] = registry()
    live: dict[str, Any] = registry()
    deaths: dict[str, int] = {}
    tally = Tally()
    for what, name, k, drop in steps:
        if what == "beat":  # as the controller: the heartbeat of a registered service
            hb = beat(name, k, drop)
            live.setdefault(name, types.SimpleNamespace(last_heartbeat=None))
            heartbeats[name] = hb
            live[name].last_heartbeat = hb
        elif what == "die" and name in heartbeats:  # Controller.retire, with the plug-in
            tally.remove(name)  # Balancer.forget
            deaths[name] = deaths.get(name, 0) + 1
            hb = heartbeats.pop(name)
            heartbeats[f"{name}#{deaths[name]}"] = msgspec.structs.replace(hb, state="dead")
            live.pop(name, None)
        elif what == "leave":  # finished: its heartbeat stays, it is no longer live
            live.pop(name, None)
        elif what == "join":  # registered, no heartbeat of this incarnation yet
            live[name] = types.SimpleNamespace(last_heartbeat=None)
        elif what == "grant" and NAMES[name] == "actor":  # Balancer._grant_production
            tally.grant(name, k)
        tally.scan(heartbeats)
        assert tally.observation(live) == reference(heartbeats, live)
        view = tally.decision_view(live)
        assert view.granted == tally.granted
        derived = dataclasses.replace(view, pending=None)  # what the policy derives alone
        for policy in POLICIES:
            assert policy.decide(view) == policy.decide(derived)


def test_a_heartbeat_dropped_without_notice_rebuilds_the_totals() -> None:
    heartbeats = {n: beat(n, 3, 1) for n in NAMES}
    live = {n: types.SimpleNamespace(last_heartbeat=hb) for n, hb in heartbeats.items()}
    tally = Tally()
    tally.scan(heartbeats)
    del heartbeats["actor-1"]  # not through Balancer.forget
    live.pop("actor-1")
    tally.scan(heartbeats)
    assert tally.observation(live) == reference(heartbeats, live)


def test_only_changed_heartbeats_are_read_again() -> None:
    heartbeats = {n: beat(n, 3, 0) for n in NAMES}
    tally = Tally()
    tally.scan(heartbeats)
    taken: list[str] = []
    original = tally._take

    def spy(name: str, hb: Heartbeat) -> None:
        taken.append(name)
        original(name, hb)

    tally._take = spy  # type: ignore[method-assign]
    heartbeats["actor-0"] = beat("actor-0", 4, 0)
    tally.scan(heartbeats)
    tally.scan(heartbeats)
    assert taken == ["actor-0"]


class CountingRegistry(Registry[Any]):
    looked = 0

    def get(self, name: str, default: Any = None) -> Any:
        self.looked += 1
        return super().get(name, default)


def test_registry_records_are_looked_at_again_only_after_the_registry_changed() -> None:
    heartbeats = {n: beat(n, 3, 0) for n in NAMES}
    live = CountingRegistry()
    for name, hb in heartbeats.items():
        live[name] = types.SimpleNamespace(last_heartbeat=hb)
    tally = Tally()
    tally.scan(heartbeats)
    tally.decision_view(live)  # the first look: every actor
    live.looked = 0
    heartbeats["actor-0"] = beat("actor-0", 4, 0)
    live["actor-0"].last_heartbeat = heartbeats["actor-0"]
    tally.scan(heartbeats)
    assert set(tally.decision_view(live).producer_versions) == {"actor-0", "actor-1"}
    assert live.looked == 1  # only the actor whose heartbeat changed
    live["actor-1"] = types.SimpleNamespace(last_heartbeat=None)  # registered anew
    live.looked = 0
    assert set(tally.decision_view(live).producer_versions) == {"actor-0"}
    assert live.looked == 2  # the registry changed: every actor again


def test_every_way_of_changing_a_registry_moves_its_version_and_is_logged() -> None:
    registry: Registry[int] = Registry()
    changes = [
        (lambda r: r.__setitem__("a", 1), None),  # version 2 is still to come
        (lambda r: r.update(b=2), []),  # bulk: the log starts anew here
        (lambda r: r.setdefault("c", 3), ["c"]),
        (lambda r: r.pop("a"), ["c", "a"]),
        (lambda r: r.__delitem__("b"), ["c", "a", "b"]),
        (lambda r: r.popitem(), ["c", "a", "b", "c"]),
        (lambda r: r.clear(), None),
    ]
    for k, (change, since_update) in enumerate(changes, 1):
        change(registry)
        assert registry.version == k
        if k >= 2:
            assert registry.changed_since(0) is None  # from before the bulk update: too old
        assert registry.changed_since(2) == since_update
        assert registry.changed_since(k) in ([], None)


def test_a_registry_forgets_old_changes_and_a_reader_from_then_reads_everything() -> None:
    registry: Registry[int] = Registry()
    registry["a"] = 0
    for k in range(LOG_SLACK + 10):
        registry["a"] = k
    assert registry.changed_since(0) is None  # the older half went
    assert registry.changed_since(registry.version - 2) == ["a", "a"]
    heartbeats: Registry[Heartbeat] = Registry()
    for name in NAMES:
        heartbeats[name] = beat(name, 1, 0)
    tally = Tally()
    tally.scan(heartbeats)
    for k in range(2, LOG_SLACK + 10):  # the tally misses the log's reach: a full scan
        heartbeats["actor-0"] = beat("actor-0", k, 0)
    heartbeats["buffer-0"] = beat("buffer-0", 7, 0)
    tally.scan(heartbeats)
    live = {n: types.SimpleNamespace(last_heartbeat=hb) for n, hb in heartbeats.items()}
    assert tally.observation(live) == reference(heartbeats, live)


class CountingBeats(Registry[Heartbeat]):
    looked = 0

    def get(self, name: str, default: Any = None) -> Any:
        self.looked += 1
        return super().get(name, default)


def test_a_scan_of_the_controllers_heartbeats_reads_only_the_logged_changes() -> None:
    heartbeats = CountingBeats()
    for k in range(1000):
        heartbeats[f"actor-{k}"] = beat("actor-0", 1, 0)
    tally = Tally()
    tally.scan(heartbeats)
    heartbeats.looked = 0
    heartbeats["actor-7"] = beat("actor-0", 2, 0)
    heartbeats["actor-7"] = beat("actor-0", 3, 0)
    heartbeats["actor-9"] = beat("actor-0", 2, 0)
    tally.scan(heartbeats)
    assert heartbeats.looked == 2  # actor-7 once, actor-9
    assert tally.produced == 64 * (998 + 3 + 2)


@settings(max_examples=200, deadline=None)
@given(
    producers=st.sets(st.sampled_from([f"actor-{i}" for i in range(8)])),
    holding=st.dictionaries(st.sampled_from([f"actor-{i}" for i in range(10)]), st.integers(1, 3)),
)
def test_idle_producers_count_and_list_as_the_producers_not_holding_grants(
    producers: set[str], holding: dict[str, int]
) -> None:
    """A decision's idle producers (counted after every decision, listed in the metrics)
    are the producers holding nothing, however they are read; holders that are not
    producers (left since) do not count."""
    expected = frozenset(producers) - set(holding)
    counted = Idle(dict.fromkeys(producers, 0), holding)
    assert len(counted) == len(expected)  # counted before it is listed
    assert all((p in counted) == (p in expected) for p in [*producers, *holding, "x"])
    listed = Idle(dict.fromkeys(producers, 0), holding)
    assert set(listed) == expected and listed == expected and len(listed) == len(expected)
    assert listed - {"actor-0"} == expected - {"actor-0"}
    assert isinstance(listed - {"actor-0"}, frozenset)
    later = dict.fromkeys(producers, 0)
    answered = Idle(later, holding)
    members = set(answered)
    later["actor-99"] = 0  # a producer that joined after the listing
    assert ("actor-99" in answered) == ("actor-99" in members) and len(answered) == len(members)
