"""`tianji bench memory`: its GRU runs are the masked-CartPole example, its MLP runs differ
only in the core, and its summary compares GRU and MLP with the same inference."""

from __future__ import annotations

from pathlib import Path

import pytest

from tianji.bench.memory import memory_config, summarize
from tianji.rl.config import RunConfig, build_dataclass, to_dict
from tianji.run.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_gru_runs_are_the_example() -> None:
    example = to_dict(load_config(ROOT / "examples" / "masked_cartpole_gru.toml"))
    data = memory_config("gru", "local", 0, 100_000)
    data["stop"] = {"target_return": 475, "max_seconds": 300}
    bench: RunConfig = build_dataclass(RunConfig, data, "")
    assert to_dict(bench) == example


def test_the_mlp_runs_differ_in_the_core_only() -> None:
    gru, mlp = (
        memory_config("gru", "service", 3, 50_000),
        memory_config("mlp", "service", 3, 50_000),
    )
    assert mlp["algo"] == {**gru["algo"], "core": "none", "hidden": [64, 64]}
    assert mlp["actors"] == gru["actors"] and gru["actors"]["inference"] == "service"
    assert gru["stop"]["max_env_steps"] == 50_000 and gru["seed"] == 3
    with pytest.raises(ValueError, match="lstm"):
        memory_config("lstm", "local", 0, 1)


def test_the_summary_compares_gru_and_mlp_with_the_same_inference() -> None:
    rows = [
        {"policy": "gru", "inference": "local", "seed": 0, "final_return": 300.0},
        {"policy": "gru", "inference": "local", "seed": 1, "final_return": 200.0},
        {"policy": "mlp", "inference": "local", "seed": 0, "final_return": 50.0},
        {"policy": "mlp", "inference": "local", "seed": 1, "final_return": None, "error": "x"},
        {"policy": "gru", "inference": "service", "seed": 0, "final_return": 90.0},
        {"policy": "mlp", "inference": "service", "seed": 0, "final_return": 45.0},
    ]
    cells = {(c["policy"], c["inference"]): c for c in summarize(rows)}
    assert cells["gru", "local"]["final_return_mean"] == 250.0
    assert cells["gru", "local"]["gru_vs_mlp"] == 5.0
    assert cells["mlp", "local"]["errors"] == ["x"]
    assert cells["gru", "service"]["gru_vs_mlp"] == 2.0
