"""Population-based training's plan: who copies whom, and only declared hyperparameters
move, by the factors and ranges given (hand-computed values)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tianji.rl.pbt import (
    HyperRange,
    MemberState,
    PBTRules,
    check_hyperparameters,
    explore,
    plan,
)
from tianji.runtime.errors import ConfigError

DECLARED = {
    "lr": HyperRange(1e-5, 1e-2),
    "gamma": HyperRange(0.9, 0.999, scale="complement_log"),
    "clip_coef": HyperRange(0.05, 0.5, scale="linear"),
    "num_minibatches": HyperRange(1, 32, integer=True),
}


def test_each_scale_perturbs_as_declared() -> None:
    assert DECLARED["lr"].perturb(1e-3, 1.25) == pytest.approx(1.25e-3)
    assert DECLARED["lr"].perturb(9e-3, 1.25) == 1e-2  # kept in the range
    assert DECLARED["gamma"].perturb(0.99, 0.8) == pytest.approx(1 - 0.01 * 0.8)
    assert DECLARED["clip_coef"].perturb(0.2, 1.2) == pytest.approx(0.2 + 0.2 * 0.45)
    assert DECLARED["num_minibatches"].perturb(4, 1.25) == 5.0


@pytest.mark.parametrize("name", list(DECLARED))
def test_resampling_stays_in_the_range_and_spreads_on_its_scale(name: str) -> None:
    spec, rng = DECLARED[name], np.random.default_rng(0)
    values = np.array([spec.sample(rng) for _ in range(4000)])
    assert values.min() >= spec.low and values.max() <= spec.high
    if spec.scale == "log":  # median of a log-uniform draw: the geometric mean
        assert np.median(values) == pytest.approx(math.sqrt(spec.low * spec.high), rel=0.2)


def test_explore_moves_only_the_explored_hyperparameters() -> None:
    before = {"lr": 1e-3, "gamma": 0.99, "clip_coef": 0.2, "num_minibatches": 4, "ent": 0.01}
    rules = PBTRules(factors=(2.0,), resample_prob=0.0, hyperparameters=("lr", "gamma"))
    after = explore(before, DECLARED, rules, np.random.default_rng(0))
    assert after == {**before, "lr": pytest.approx(2e-3), "gamma": pytest.approx(0.98)}
    every = explore(
        before, DECLARED, PBTRules(factors=(2.0,), resample_prob=0.0), np.random.default_rng(0)
    )
    assert set(k for k in before if every[k] != before[k]) == set(DECLARED)
    assert every["ent"] == 0.01  # not declared: never touched


def _members(*objectives: float | None) -> list[MemberState]:
    return [
        MemberState(f"m{i}", {"lr": 1e-4 * 10**i}, env_steps=1000, objective=o)
        for i, o in enumerate(objectives)
    ]


def test_the_bottom_copies_the_top_once_ready_and_waits_an_interval() -> None:
    members = _members(10.0, 40.0, 20.0, 30.0)
    rules = PBTRules(interval=500, factors=(1.25,), resample_prob=0.0, hyperparameters=("lr",))
    exploits = plan(members, DECLARED, rules, np.random.default_rng(0))
    assert [(e.member, e.source) for e in exploits] == [("m0", "m1")]
    (e,) = exploits
    assert e.before == {"lr": 1e-4} and e.source_hparams == {"lr": pytest.approx(1e-3)}
    assert e.after == {"lr": pytest.approx(1.25e-3)} and e.step == 1000
    assert e.record()["copied_from"] == "m1"
    assert all(m.ready_at == 1500 for m in members)
    assert plan(members, DECLARED, rules, np.random.default_rng(0)) == []  # not ready again
    members[0].env_steps = 1500
    assert [x.member for x in plan(members, DECLARED, rules, np.random.default_rng(0))] == ["m0"]


def test_members_without_an_objective_are_neither_ranked_nor_copied() -> None:
    members = _members(None, 5.0, 1.0, None)
    rules = PBTRules(fraction=0.5, hyperparameters=("lr",))
    exploits = plan(members, DECLARED, rules, np.random.default_rng(0))
    assert [(e.member, e.source) for e in exploits] == [("m2", "m1")]
    assert members[0].ready_at == 0 and members[3].ready_at == 0
    assert plan(_members(3.0, None), DECLARED, rules, np.random.default_rng(0)) == []


def test_an_undeclared_hyperparameter_is_refused_naming_what_is_declared() -> None:
    with pytest.raises(ConfigError, match="vf_coef") as err:
        check_hyperparameters(["lr", "vf_coef"], DECLARED, "ppo")
    assert "lr, gamma" in str(err.value)
    assert check_hyperparameters([], DECLARED, "ppo") == tuple(DECLARED)
    with pytest.raises(ConfigError, match="reinforce"):
        check_hyperparameters([], {}, "reinforce")


@pytest.mark.parametrize(
    ("key", "value"),
    [("interval", 0), ("fraction", 0.75), ("factors", ()), ("resample_prob", 2.0)],
)
def test_bad_rules_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"population.{key}"):
        PBTRules(**{key: value})  # type: ignore[arg-type]
