"""A trained policy leaves tianji: `tianji export` writes TorchScript or ONNX that a fresh
process loads with torch or onnxruntime alone (no tianji import) and that picks the same
greedy actions as tianji on 1,000 observations; what a format cannot hold is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tianji.cli import main
from tianji.rl.checkpoint import algorithm_state, pack_state, write_checkpoint
from tianji.run.config import load_config
from tianji.run.policy import load_policy
from tianji.run.rundir import RunDirectory
from tianji.services.common import make_algorithm

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "ppo-mlp": ("cartpole_ppo", ()),
    "ppo-continuous": ("pendulum_ppo", ()),
    "ppo-cnn": ("pong_ppo", ()),
    "dqn": ("cartpole_dqn", ()),
    "sac": ("pendulum_sac", ()),
    "td3": ("pendulum_td3", ()),
}


def make_run(tmp_path: Path, example: str, overrides: tuple[str, ...] = ()) -> Path:
    """A run directory with the example's config and a checkpoint of its algorithm (seeded
    weights, so the greedy actions vary over observations)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config(ROOT / "examples" / f"{example}.toml", [*overrides])
    RunDirectory(run_dir).write_config(config)
    algo = make_algorithm(config, seed=7, device="cpu")
    meta = {"policy_version": 42, "unix": 0.0, "run": {}, "algorithm": config.algorithm,
            "env_id": config.env.id}  # fmt: skip
    write_checkpoint(run_dir / "checkpoints", pack_state(algorithm_state(algo)), meta)
    return run_dir


def observations(space: Any, n: int = 1000) -> np.ndarray:
    rng = np.random.default_rng(3)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (n, *space.shape), dtype=np.uint8)
    return (rng.standard_normal((n, *space.shape)) * 2).astype(np.float32)


LOADERS = {
    "torchscript": """
import sys, numpy as np, torch
module = torch.jit.load(sys.argv[1])
obs = np.load(sys.argv[2])
with torch.no_grad():
    out = torch.cat([module(torch.as_tensor(obs[i:i + 250])) for i in range(0, len(obs), 250)])
np.save(sys.argv[3], out.numpy())
assert not any(m.startswith("tianji") for m in sys.modules), "tianji was imported"
""",
    "onnx": """
import sys, numpy as np, onnxruntime
session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
obs = np.load(sys.argv[2])
np.save(sys.argv[3], session.run(["action"], {"obs": obs})[0])
assert not any(m.startswith("tianji") for m in sys.modules), "tianji was imported"
""",
}


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_exported_policy_acts_as_tianji_does_without_tianji(
    tmp_path: Path, case: str, fmt: str
) -> None:
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    if case == "ppo-cnn":
        pytest.importorskip("ale_py")
    example, overrides = CASES[case]
    run_dir = make_run(tmp_path, example, overrides)
    out = tmp_path / f"policy.{fmt}"
    assert main(["export", str(run_dir), "--format", fmt, "--out", str(out)]) == 0
    meta = json.loads(Path(f"{out}.json").read_text())
    assert meta["policy_version"] == 42 and meta["format"] == fmt
    policy = load_policy(run_dir)
    obs = observations(policy.observation_space, 1000)
    np.save(tmp_path / "obs.npy", obs)
    script = tmp_path / "load.py"
    script.write_text(LOADERS[fmt])
    done = subprocess.run(
        [sys.executable, "-I", str(script), str(out), str(tmp_path / "obs.npy"),
         str(tmp_path / "actions.npy")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    theirs, ours = np.load(tmp_path / "actions.npy"), policy(obs)
    assert theirs.shape == ours.shape, (theirs.shape, ours.shape)
    if np.issubdtype(ours.dtype, np.integer):
        assert np.array_equal(theirs, ours)
        assert len(np.unique(ours)) > 1  # the observations make a difference
    else:
        np.testing.assert_allclose(theirs, ours, atol=1e-5)
        space = policy.action_space
        assert np.all(theirs >= space.low - 1e-6) and np.all(theirs <= space.high + 1e-6)


def test_a_recurrent_policy_is_refused_with_exit_2_naming_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, "cartpole_ppo", ('algo.core="gru"',))
    assert main(["export", str(run_dir), "--format", "torchscript"]) == 2
    assert "recurrent" in capsys.readouterr().err


def test_a_multi_agent_policy_and_a_bad_source_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mpe2")
    run_dir = make_run(tmp_path, "spread_qmix")
    assert main(["export", str(run_dir), "--format", "onnx"]) == 2
    assert "greedy_module" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nowhere"), "--format", "onnx"]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_a_checkpoint_file_can_be_exported_to_the_runs_export_folder(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "cartpole_dqn")
    ckpt = next((run_dir / "checkpoints").glob("ckpt-*.tjc"))
    assert main(["export", str(ckpt), "--format", "torchscript"]) == 0
    assert (run_dir / "export" / "policy-42.pt").is_file()
