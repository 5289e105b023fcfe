"""Sharded buffers: actor i feeds shard i % S, each learner samples from its own shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_train_cli import EXAMPLES, train
from tianji.rl.run_balance import min_replay_total
from tianji.rl.topics import index_of, learners_of_shard, shards_of_learner
from tianji.run.config import load_config
from tianji.run.plan import RunPlan
from tianji.runtime.errors import ConfigError


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
@pytest.mark.parametrize("learners", [1, 2, 3, 4])
def test_every_shard_has_a_learner_and_every_learner_a_shard(shards: int, learners: int) -> None:
    served = [shards_of_learner(j, learners, shards) for j in range(learners)]
    assert all(served), served
    assert {s for mine in served for s in mine} == set(range(shards))
    for s in range(shards):
        assert learners_of_shard(s, learners, shards) == [
            j for j in range(learners) if s in served[j]
        ]
    if shards >= learners:  # each shard has exactly one learner: no shard is shared
        assert sorted(s for mine in served for s in mine) == list(range(shards))


def test_a_service_index_is_read_from_its_name_and_its_retired_incarnations() -> None:
    assert [index_of(n) for n in ("actor-3", "actor-3#2", "buffer-0", "a-b-12")] == [3, 3, 0, 12]
    for bad in ("monitor", "learner-x", "-", "actor-+3", "actor-x#1"):
        with pytest.raises(ValueError, match="has no index"):
            index_of(bad)


def test_shards_need_an_actor_each_and_no_sync_mode() -> None:
    ppo = str(EXAMPLES / "cartpole_ppo.toml")
    with pytest.raises(ConfigError, match=r"buffer\.shards.*actors\.count=2"):
        load_config(ppo, ["buffer.shards=3"])
    with pytest.raises(ConfigError, match="sync"):
        load_config(ppo, ["buffer.shards=2", "controller.mode='sync'"])
    with pytest.raises(ConfigError, match=r"buffer\.shards"):
        load_config(ppo, ["buffer.shards=0"])


def test_replay_waits_until_the_smallest_shard_can_sample() -> None:
    dqn = str(EXAMPLES / "cartpole_dqn.toml")
    assert min_replay_total(load_config(dqn, []), 1000) == 1000
    assert min_replay_total(load_config(dqn, ["buffer.shards=2"]), 1000) == 2000
    three = load_config(dqn, ["actors.count=3", "buffer.shards=2"])  # shards get 2 and 1 actors
    assert min_replay_total(three, 1000) == 4000


def run(tmp_path: Path, config: str, *args: str) -> dict[str, object]:
    out = tmp_path / "summary.json"
    proc = train(str(EXAMPLES / config), "--summary", str(out), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary: dict[str, object] = json.loads(out.read_text())
    return summary


def test_on_policy_runs_keep_one_buffer() -> None:
    ppo = load_config(str(EXAMPLES / "cartpole_ppo.toml"), ["buffer.shards=2"])
    with pytest.raises(ConfigError, match=r"buffer\.shards.*on-policy"):
        RunPlan.build(ppo)


@pytest.mark.slow
def test_two_learners_sample_their_own_replay_shards(tmp_path: Path) -> None:
    # A light replay ratio: this is about the shards' wiring, not about learning.
    s = run(tmp_path, "cartpole_dqn.toml", "--set", "buffer.shards=2", "--learners", "2",
            "--set", "algo.learning_starts=200", "--set", "controller.replay_ratio=4.0",
            "--set", "controller.tolerance=1.0", "--max-env-steps", "6000",
            "--max-seconds", "150")  # fmt: skip
    assert s["stop_reason"] == "max_env_steps reached", s["stop_reason"]
    services = s["services"]
    assert isinstance(services, dict)
    for shard in ("buffer-0", "buffer-1"):  # both shards took fragments and served batches
        counters = services[shard]["counters"]
        assert counters["samples_inserted"] > 0 and counters["batches_sent"] > 0, counters
    updates = [services[n]["counters"]["learner_updates"] for n in ("learner-0", "learner-1")]
    # In lockstep; the stop may land between one learner's step and the other's report.
    assert min(updates) > 0 and max(updates) - min(updates) <= 1, updates
    assert s["accounting"]["balanced"], s["accounting"]  # type: ignore[index]


@pytest.mark.slow
def test_one_learner_samples_two_prioritized_shards_and_returns_their_priorities(
    tmp_path: Path,
) -> None:
    s = run(tmp_path, "cartpole_dqn.toml", "--set", "buffer.shards=2",
            "--set", "algo.prioritized=true", "--set", "algo.learning_starts=200",
            "--max-env-steps", "8000",
            "--max-seconds", "120")  # fmt: skip
    services = s["services"]
    assert isinstance(services, dict)
    for shard in ("buffer-0", "buffer-1"):
        counters = services[shard]["counters"]
        assert counters["batches_sent"] > 0, counters
        assert counters.get("priorities_ignored", 0) == 0  # priorities came back to their shard
    consumed = services["learner-0"]["counters"]["samples_consumed"]
    assert consumed > 0
    assert s["accounting"]["balanced"], s["accounting"]  # type: ignore[index]
