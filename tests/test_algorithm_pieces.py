"""The pieces the in-tree algorithms share (``algorithms/_base.py``, ``_onpolicy.py``,
``_replay.py``): checkpoint keys kept, config fields declared once and still checked by name,
the epochs loop and its early stop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tianji.algorithms as algorithms
import torch
from gymnasium import spaces
from tianji.algorithms._onpolicy import OnPolicyConfig, run_epochs
from tianji.algorithms._replay import ReplayConfig

from tianji.rl.config import build_dataclass
from tianji.rl.errors import ConfigError

BOX = spaces.Box(-1, 1, (4,), np.float32)
AGENTS = spaces.Box(-1, 1, (3, 4), np.float32)
TEAM = spaces.MultiDiscrete([5, 5, 5])
STATE = spaces.Box(-1, 1, (6,), np.float32)


def build(name: str, seed: int = 0, **config: Any) -> Any:
    cls = algorithms.get(name)
    if getattr(cls, "multi_agent", False):
        return cls(cls.Config(**config), AGENTS, TEAM, seed=seed, device="cpu", state_space=STATE)
    return cls(cls.Config(**config), BOX, spaces.Discrete(3), seed=seed, device="cpu")


@pytest.mark.parametrize(
    ("name", "config", "keys"),
    [
        ("ppo", {}, ["net", "optimizer", "version"]),
        ("ppo", {"normalize_returns": True}, ["net", "optimizer", "version", "returns"]),
        ("impala", {"core": "gru"}, ["net", "optimizer", "version"]),
        ("mappo", {}, ["net", "optimizer", "version"]),
        ("dqn", {}, ["q", "q_target", "optimizer", "version"]),
        (
            "qmix",
            {},
            ["agent", "agent_target", "mixer", "mixer_target", "optimizer", "version"],
        ),
    ],
)
def test_state_dict_keys_are_the_ones_older_checkpoints_hold(
    name: str, config: dict[str, Any], keys: list[str]
) -> None:
    algo = build(name, **config)
    assert list(algo.state_dict()) == keys
    other = build(name, seed=1, **config)
    assert any(np.any(v != algo.get_weights()[k]) for k, v in other.get_weights().items())
    other.load_state_dict(algo.state_dict())
    for key, value in algo.get_weights().items():
        np.testing.assert_array_equal(other.get_weights()[key], value)


def test_actors_get_only_the_published_network() -> None:
    mappo, qmix = build("mappo"), build("qmix")
    assert mappo.get_weights().keys() == dict(mappo.net.actor.named_parameters()).keys()
    assert qmix.get_weights().keys() == dict(qmix.agent.named_parameters()).keys()
    # the optimizer steps QMIX's agent network and mixer, not the targets
    trained = {id(p) for p in qmix.trained_parameters()}
    assert trained == {id(p) for p in [*qmix.agent.parameters(), *qmix.mixer.parameters()]}


@pytest.mark.parametrize(
    ("name", "base"), [("ppo", OnPolicyConfig), ("mappo", OnPolicyConfig), ("dqn", ReplayConfig)]
)
def test_shared_fields_come_from_one_place_and_unknown_keys_are_named(
    name: str, base: type[Any]
) -> None:
    config_cls = algorithms.get(name).Config
    assert issubclass(config_cls, base)
    with pytest.raises(ConfigError, match=r"algo\.gama"):
        build_dataclass(config_cls, {"gama": 0.9}, "algo.")
    with pytest.raises(ConfigError, match=r"algorithm\.gamma"):
        config_cls(gamma=1.5)


def test_mappo_keeps_its_own_defaults_over_the_shared_ones() -> None:
    mappo, shared = algorithms.get("mappo").Config(), OnPolicyConfig()
    assert (mappo.lr, mappo.update_epochs, mappo.max_grad_norm) == (7e-4, 10, 10.0)
    assert (shared.lr, shared.update_epochs, shared.max_grad_norm) == (2.5e-4, 4, 0.5)


def test_run_epochs_averages_every_step_and_stops_when_asked() -> None:
    batch = {"adv": torch.arange(8.0)}
    seen: list[list[float]] = []

    def step(mb: dict[str, torch.Tensor]) -> dict[str, float]:
        seen.append(mb["adv"].tolist())
        return {"approx_kl": float(len(seen)), "loss": 1.0}

    def halves(size: int) -> list[np.ndarray]:
        return [np.arange(0, size // 2), np.arange(size // 2, size)]

    out = run_epochs(batch, 3, halves, step, stop=lambda kl: kl > 1.0)
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7]]  # one epoch: mean kl 1.5 > 1
    assert out == {"approx_kl": 1.5, "loss": 1.0}
    seen.clear()
    assert run_epochs(batch, 3, halves, step)["approx_kl"] == 3.5
    assert len(seen) == 6
