"""Checkpoints: the file format, the algorithms' full state, the monitor's writing, resume."""

from __future__ import annotations

import asyncio
import collections
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import tianji.algorithms as algorithms
import torch

from tianji.rl.checkpoint import (
    MAGIC,
    RNG_KEY,
    CheckpointError,
    algorithm_state,
    checkpoint_files,
    latest_checkpoint,
    pack_state,
    prune_checkpoints,
    read_checkpoint,
    restore_algorithm,
    unpack_state,
    write_checkpoint,
)
from tianji.rl.config import StopConfig
from tianji.rl.config_ops import CheckpointConfig
from tianji.rl.events import CheckpointTaken
from tianji.run.config import load_config
from tianji.run.plan import RunPlan
from tianji.run.rundir import RunDirectory, resume_point
from tianji.runtime.errors import ConfigError
from tianji.services.monitor import TrainMonitor
from tianji.testing import check_checkpoint_round_trip, interruptible

ROOT = Path(__file__).resolve().parents[1]
PPO = ROOT / "examples" / "cartpole_ppo.toml"
DQN = ROOT / "examples" / "cartpole_dqn.toml"


def _meta(version: int, **run: Any) -> dict[str, Any]:
    return {
        "policy_version": version,
        "algorithm": "ppo",
        "env_id": "CartPole-v1",
        "unix": 0.0,
        "run": run,
    }


# ----------------------------------------------------------------------- state trees
def test_state_trees_round_trip_arrays_tensors_and_optimizer_shaped_maps() -> None:
    tree = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "i": np.array([1, -2], np.int64),
        "t": torch.arange(6, dtype=torch.float64).reshape(2, 3),
        "opt": {"state": {0: {"step": torch.tensor(3.0)}}, "groups": [{"betas": (0.9, 0.99)}]},
        "ordered": collections.OrderedDict([("a", 1), ("b", np.float32(2.5))]),
        "scalar": 7,
        "none": None,
        "text": "x",
    }
    back = unpack_state(pack_state(tree))
    assert back["w"].dtype == np.float32 and np.array_equal(back["w"], tree["w"])
    assert np.array_equal(back["i"], tree["i"])
    assert isinstance(back["t"], torch.Tensor) and torch.equal(back["t"], tree["t"])
    assert back["opt"]["state"][0]["step"].item() == 3.0
    assert back["opt"]["groups"][0]["betas"] == [0.9, 0.99]
    assert back["ordered"] == {"a": 1, "b": 2.5}
    assert (back["scalar"], back["none"], back["text"]) == (7, None, "x")


def test_what_cannot_be_checkpointed_is_named() -> None:
    with pytest.raises(TypeError, match="object arrays"):
        pack_state({"a": np.array([object()])})
    with pytest.raises(TypeError, match="set"):
        pack_state({"a": {1, 2}})
    with pytest.raises(ValueError, match="not a packed state"):
        unpack_state(b"\xc1garbage")


@pytest.mark.parametrize(("name", "env_id"), [("dqn", "CartPole-v1"), ("ppo", "Pendulum-v1")])
def test_a_restored_algorithm_continues_exactly_like_the_original(name: str, env_id: str) -> None:
    """Networks, target network and Adam's moments all come back: the next update of the
    restored copy gives bit-identical weights to the next update of the original."""
    cls = algorithms.get(name)
    env = gym.make(env_id)
    config = cls.Config()
    make = lambda seed: cls(config, env.observation_space, env.action_space, seed=seed)  # noqa: E731
    original, restored = make(0), make(1)
    batch = _batch(original, env, np.random.default_rng(0))
    for _ in range(3):
        original.update(batch)
    state = unpack_state(pack_state(algorithm_state(original)))
    restore_algorithm(restored, state, 3)
    assert restored.version == original.version == 3
    for algo in (original, restored):
        torch.manual_seed(5)
        algo.rng = np.random.default_rng(5)
        if hasattr(algo, "generator"):
            algo.generator.manual_seed(5)
        algo.update(batch)
    a, b = original.get_weights(), restored.get_weights()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    fresh = make(0)  # without Adam's moments the same update lands elsewhere
    fresh.set_weights(state["q"] if name == "dqn" else _flat(state), 3)
    fresh.update(batch)
    assert any(not np.array_equal(a[k], fresh.get_weights()[k]) for k in a)


@pytest.mark.parametrize(
    ("name", "env_id"),
    [
        ("dqn", "CartPole-v1"),
        ("ppo", "Pendulum-v1"),
        ("sac", "Pendulum-v1"),
        ("td3", "Pendulum-v1"),
    ],
)
def test_a_resumed_algorithm_draws_what_the_original_would_have_drawn(
    name: str, env_id: str
) -> None:
    """The public round-trip check (``tianji.testing``): the checkpoint holds the random
    generators too (torch's global one, the algorithm's own), so a resumed learner's next
    update, which samples (SAC's policy, TD3's smoothing noise, PPO's minibatches), lands on
    the original's exactly, with no reseeding by hand."""
    cls = algorithms.get(name)
    env = gym.make(env_id)
    make = lambda seed: cls(cls.Config(), env.observation_space, env.action_space, seed=seed)  # noqa: E731
    check_checkpoint_round_trip(make, _batch(make(0), env, np.random.default_rng(0)))


def test_the_round_trip_check_fails_when_the_checkpoint_misses_the_generators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tianji.rl import checkpoint

    monkeypatch.setattr(checkpoint, "set_rng_state", lambda algo, state: None)
    cls, env = algorithms.get("sac"), gym.make("Pendulum-v1")
    make = lambda seed: cls(cls.Config(), env.observation_space, env.action_space, seed=seed)  # noqa: E731
    with pytest.raises(AssertionError, match="differs after resume"):
        check_checkpoint_round_trip(make, _batch(make(0), env, np.random.default_rng(0)))


def _flat(state: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in state["net"].items()}


def _batch(algo: Any, env: gym.Env[Any, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A small batch of the layout the algorithm's learner consumes."""
    t, n = 16, 4
    obs = rng.standard_normal((t, n, *env.observation_space.shape)).astype(np.float32)
    out = algo.act(obs.reshape(t * n, -1), explore=True)
    fragment = {
        "obs": obs,
        "next_obs": rng.standard_normal(obs.shape).astype(np.float32),
        "reward": rng.standard_normal((t, n)).astype(np.float32),
        "terminated": rng.random((t, n)) < 0.05,
        "truncated": np.zeros((t, n), bool),
        **{k: v.reshape(t, n, *v.shape[1:]) for k, v in out.items()},
    }
    samples = algo.postprocess(fragment)
    spec = algo.buffer_spec()
    if spec.kind == "rollout":
        return {k: np.asarray(v) for k, v in samples.items()}
    return {k: np.asarray(v) for k, v in samples.items()}


# ------------------------------------------------------------------------- the files
def test_checkpoint_files_are_written_whole_and_read_back(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "c", b"state-bytes", _meta(42, env_steps=1000))
    assert path.name == "ckpt-0000000042.tjc"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    ckpt = read_checkpoint(path)
    assert (ckpt.policy_version, ckpt.state, ckpt.run) == (42, b"state-bytes", {"env_steps": 1000})
    assert path.read_bytes().startswith(MAGIC)


def test_a_damaged_or_foreign_checkpoint_is_a_typed_error_naming_the_file(tmp_path: Path) -> None:
    good = write_checkpoint(tmp_path, b"s", _meta(1))
    cut = tmp_path / "ckpt-0000000002.tjc"
    cut.write_bytes(good.read_bytes()[:-3])
    foreign = tmp_path / "other.tjc"
    foreign.write_bytes(b"PK\x03\x04 a zip")
    for path, reason in ((cut, "damaged"), (foreign, "not a tianji checkpoint")):
        with pytest.raises(CheckpointError, match=reason) as info:
            read_checkpoint(path)
        assert info.value.path == str(path)
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_checkpoint(tmp_path / "missing.tjc")


def test_the_newest_checkpoint_is_by_policy_version_and_old_ones_are_pruned(
    tmp_path: Path,
) -> None:
    for v in (9, 100, 12, 99):
        write_checkpoint(tmp_path / "checkpoints", b"s", _meta(v))
    assert latest_checkpoint(tmp_path).name == "ckpt-0000000100.tjc"  # run dir or checkpoints/
    deleted = prune_checkpoints(tmp_path / "checkpoints", keep=2)
    assert sorted(p.name for p in deleted) == ["ckpt-0000000009.tjc", "ckpt-0000000012.tjc"]
    names = [p.name for p in checkpoint_files(tmp_path / "checkpoints")]
    assert names == ["ckpt-0000000099.tjc", "ckpt-0000000100.tjc"]
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        latest_checkpoint(tmp_path / "empty")


def test_checkpoint_settings_are_checked() -> None:
    assert CheckpointConfig().enabled
    assert not CheckpointConfig(every_seconds=0).enabled
    for key, value in (("every_updates", -1), ("every_seconds", -1.0), ("keep", 0)):
        with pytest.raises(ConfigError, match=f"checkpoint.{key}"):
            CheckpointConfig(**{key: value})


# ---------------------------------------------------------------------- the monitor
def test_the_monitor_writes_each_checkpoint_with_the_run_counters(tmp_path: Path) -> None:
    monitor = TrainMonitor(
        "monitor",
        stop=StopConfig(),
        checkpoints=tmp_path,
        keep=2,
        identity={"algorithm": "ppo", "env_id": "CartPole-v1"},
    )
    monitor.env_steps_by_actor = {"actor-0": 300, "actor-1": 200}
    monitor.episodes = 7
    monitor.returns.extend([10.0, 20.0])

    async def take(version: int) -> None:
        state = np.frombuffer(pack_state({"v": version}), np.uint8)
        await monitor.on_checkpoint(CheckpointTaken(policy_version=version, state=state))

    for v in (5, 10, 15):
        asyncio.run(take(v))
    assert [p.name for p in checkpoint_files(tmp_path)] == [
        "ckpt-0000000010.tjc",
        "ckpt-0000000015.tjc",
    ]
    ckpt = read_checkpoint(latest_checkpoint(tmp_path))
    assert unpack_state(ckpt.state) == {"v": 15}
    assert ckpt.meta["algorithm"] == "ppo" and ckpt.meta["env_id"] == "CartPole-v1"
    assert ckpt.run["env_steps"] == 500 and ckpt.run["episodes"] == 7
    assert ckpt.run["returns"] == [10.0, 20.0]
    assert monitor.counters["checkpoints_written"] == 3


def test_a_checkpoint_that_cannot_be_written_is_counted_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monitor = TrainMonitor("monitor", stop=StopConfig(), checkpoints=blocker / "checkpoints")
    ev = CheckpointTaken(policy_version=3, state=np.zeros(4, np.uint8))
    asyncio.run(monitor.on_checkpoint(ev))
    assert monitor.counters["checkpoint_errors"] == 1 and monitor.last_checkpoint is None


def test_a_resumed_monitor_counts_on_from_its_checkpoint(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, b"s", _meta(40, env_steps=9000, episodes=80, returns=[5.0]))
    monitor = TrainMonitor(
        "monitor", stop=StopConfig(max_env_steps=9500), resume=read_checkpoint(path)
    )
    assert (monitor.env_steps, monitor.episodes, list(monitor.returns)) == (9000, 80, [5.0])
    monitor.env_steps_by_actor["actor-0"] = 400
    assert monitor.env_steps == 9400 and monitor.env_steps_here == 400
    assert monitor.done() is None
    monitor.env_steps_by_actor["actor-1"] = 100
    assert monitor.done() == "max_env_steps reached"


# ----------------------------------------------------------------------------- resume
def _run_dir(tmp_path: Path, config_path: Path = PPO, versions: tuple[int, ...] = (5,)) -> Path:
    config = load_config(config_path)
    run = RunDirectory.create(tmp_path, "run")
    run.write_config(config)
    for v in versions:
        meta = _meta(v, env_steps=100 * v, episodes=v)
        meta["algorithm"] = config.algorithm
        write_checkpoint(run.checkpoints, b"s", meta)
    return run.path


def test_resume_refuses_another_algorithm_or_env_naming_the_key(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    with pytest.raises(ConfigError, match="algorithm") as info:
        resume_point(run, load_config(DQN))
    assert info.value.key == "algorithm"
    with pytest.raises(ConfigError, match="env"):
        resume_point(run, load_config(PPO, ['env.id="Acrobot-v1"']))
    directory, ckpt = resume_point(run, load_config(PPO, ["actors.count=3"]))  # may change
    assert directory.path == run and ckpt.policy_version == 5


def test_resume_needs_a_run_directory_with_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--resume"):
        resume_point(tmp_path / "nothing", load_config(PPO))
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        resume_point(_run_dir(tmp_path, versions=()), load_config(PPO))


def test_a_resumed_plan_restores_every_learner(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, versions=(5, 30))
    config = load_config(PPO, ["learner.count=2"])
    plan = RunPlan.build(config, io.StringIO(), resume=str(run))
    learners = [s for s in plan.specs if s.name.startswith("learner-")]
    assert len(learners) == 2 and all(s.options["restore"] is True for s in learners)
    assert plan.checkpoint is not None and plan.checkpoint.policy_version == 30
    facts = plan.facts()
    assert (facts.start_env_steps, facts.start_updates) == (3000, 30)
    fresh = RunPlan.build(config, io.StringIO())
    assert all("restore" not in s.options for s in fresh.specs)


def test_the_cli_reports_a_bad_resume_directory_and_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tianji", "train", "--resume", str(tmp_path / "gone")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "--resume" in result.stderr and str(tmp_path / "gone") in result.stderr


# ------------------------------------------------------------------- end to end (slow)
@pytest.mark.slow
def test_a_run_stopped_with_ctrl_c_resumes_from_its_checkpoint_and_reaches_its_target(
    tmp_path: Path,
) -> None:
    """SIGINT (a terminal's Ctrl-C) once the learner made 10 updates, with no periodic
    checkpoints: the run stops with a last checkpoint; the resumed run continues its policy
    version, env steps and episodes and reaches the target; tianji eval plays the final one."""
    train = [sys.executable, "-m", "tianji", "train"]
    common = ["--no-dashboard", "--max-seconds", "240"]
    unreachable = ["--target-return", "1e9"]  # Ctrl-C must come before any clean stop
    target_200, summary_path = ["--target-return", "200"], tmp_path / "s.json"
    no_periodic = [
        "--set",
        "checkpoint.every_updates=100000",
        "--set",
        "checkpoint.every_seconds=0",
    ]
    first = subprocess.Popen(
        [*train, str(PPO), "--run-dir", str(tmp_path), *common, *unreachable, *no_periodic],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
        preexec_fn=interruptible,  # SIGINT acts as in a terminal
    )
    try:
        run, updates = _wait_for_updates(tmp_path, at_least=10, timeout=150)
        interrupted = time.monotonic()
        os.killpg(first.pid, signal.SIGINT)
        out, _ = first.communicate(timeout=60)
        stopping = time.monotonic() - interrupted
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 130, out[-3000:]
    assert stopping < 20, f"Ctrl-C took {stopping:.1f} s"
    assert not (run / "summary.json").exists()
    newest = read_checkpoint(latest_checkpoint(run))  # the one taken at Ctrl-C
    assert newest.policy_version >= updates >= 10
    assert len(checkpoint_files(run / "checkpoints")) == 1
    rows_before = len((run / "metrics.jsonl").read_text().splitlines())

    second = subprocess.run(
        [*train, "--resume", str(run), *common, *target_200, "--summary", str(summary_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["stop_reason"] == "target_return reached"
    _check_the_resumed_run(summary, newest, run, rows_before)
    _check_the_final_checkpoint_plays(summary, newest, run, tmp_path)


def _check_the_resumed_run(summary: Any, newest: Any, run: Path, rows_before: int) -> None:
    """It went on from the checkpoint: policy version, env steps, episodes and metrics."""
    resumed = summary["resumed_from"]
    assert resumed["checkpoint"] == str(newest.path)
    assert resumed["policy_version"] == newest.policy_version
    assert resumed["env_steps"] == newest.run["env_steps"] > 0
    learner = summary["services"]["learner-0"]["counters"]
    assert learner["restored_version"] == newest.policy_version
    assert summary["learner_updates"] > newest.policy_version
    assert summary["env_steps"] > newest.run["env_steps"]
    assert summary["episodes"] > newest.run["episodes"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    after = rows[rows_before:]
    assert after and all(r["env_steps"] >= newest.run["env_steps"] for r in after)
    assert all(r["learner_updates"] >= newest.policy_version for r in after)
    assert json.loads((run / "summary.json").read_text())["resumed_from"] == resumed


def _check_the_final_checkpoint_plays(summary: Any, newest: Any, run: Path, tmp_path: Path) -> None:
    """The clean stop left a last checkpoint; tianji eval plays it greedily."""
    final = read_checkpoint(latest_checkpoint(run))
    assert summary["checkpoints"]["latest"] == str(final.path)
    assert newest.policy_version < final.policy_version <= summary["learner_updates"]
    result = subprocess.run(
        [sys.executable, "-m", "tianji", "eval", str(run), "--episodes", "5", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evaluation = json.loads(result.stdout)
    assert evaluation["policy_version"] == final.policy_version
    assert len(evaluation["returns"]) == 5 and evaluation["mean_return"] > 100


def _wait_for_updates(root: Path, at_least: int, timeout: float) -> tuple[Path, int]:
    """The run directory under ``root`` once its metrics show ``at_least`` updates."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for metrics in root.glob("*/metrics.jsonl"):
            rows = [json.loads(line) for line in metrics.read_text().splitlines() if line]
            if rows and rows[-1]["learner_updates"] >= at_least:
                return metrics.parent, int(rows[-1]["learner_updates"])
        time.sleep(0.5)
    raise AssertionError(f"no run reached {at_least} learner updates in {timeout} s")


def test_an_algorithm_without_state_dict_is_checkpointed_by_its_weights_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The example REINFORCE has no state_dict(): its learner says once that a resume will
    restart the optimizer, and its checkpoints still carry the weights."""
    from tianji.rl.config import EnvConfig, RunConfig, to_dict
    from tianji.services.learner import LearnerService

    reinforce = str(Path(__file__).resolve().parents[1] / "examples" / "reinforce.py")
    cfg = RunConfig(
        algorithm=f"{reinforce}:Reinforce", transport="inproc", env=EnvConfig(id="CartPole-v1")
    )
    learner = LearnerService("learner-0", config=to_dict(cfg))
    with caplog.at_level("WARNING", logger="tianji.services.learner"):
        first = learner._checkpoint_event()
        learner._checkpoint_event()
    warnings = [r.getMessage() for r in caplog.records if "state_dict" in r.getMessage()]
    assert len(warnings) == 1 and "weights only" in warnings[0], warnings
    assert set(unpack_state(first.state.tobytes())) == {"weights", RNG_KEY}
