"""Buffer strategies: ring eviction, sum-tree proportions, priority updates, rollout FIFO."""

from __future__ import annotations

import numpy as np
import pytest

from tianji.rl.algorithm import Buffer, BufferSpec
from tianji.rl.buffers import (
    PrioritizedReplayBuffer,
    ReplayBuffer,
    RolloutBuffer,
    SumTree,
    make_buffer,
)
from tianji.runtime.errors import ConfigError


def items(start: int, count: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + count)
    return {"x": ids.astype(np.float32)[:, None].repeat(3, axis=1), "id": ids}


def test_replay_ring_evicts_oldest_and_counts() -> None:
    buf = ReplayBuffer(10, min_size=4, seed=0)
    assert isinstance(buf, Buffer)
    assert buf.add(items(0, 3), policy_version=1) == 3
    assert buf.sample(8) is None  # below min_size
    assert buf.add(items(3, 9), policy_version=2) == 9
    assert buf.statistics() == {
        "size": 10,
        "capacity": 10,
        "inserted": 12,
        "evicted": 2,
        "sampled": 0,
    }
    batch = buf.sample(1000)
    assert batch is not None
    assert set(np.unique(batch["id"])) == set(range(2, 12))
    np.testing.assert_array_equal(batch["index"], batch["id"])  # index = insert sequence number
    np.testing.assert_array_equal(batch["policy_version"], np.where(batch["id"] < 3, 1, 2))
    np.testing.assert_array_equal(batch["x"][:, 0], batch["id"])
    assert buf.statistics()["sampled"] == 1000


def test_replay_add_larger_than_capacity_keeps_the_newest() -> None:
    buf = ReplayBuffer(4)
    assert buf.add(items(0, 10), policy_version=0) == 10
    batch = buf.sample(200)
    assert batch is not None and set(np.unique(batch["id"])) == {6, 7, 8, 9}
    assert buf.statistics()["evicted"] == 6


def test_replay_rejects_a_changed_schema() -> None:
    buf = ReplayBuffer(4)
    buf.add(items(0, 2), policy_version=0)
    with pytest.raises(ValueError, match="keys"):
        buf.add({"x": np.zeros((2, 3))}, policy_version=0)
    with pytest.raises(ValueError, match="item shape"):
        buf.add({"x": np.zeros((2, 4)), "id": np.zeros(2)}, policy_version=0)


def test_sum_tree_batch_set_and_find() -> None:
    tree = SumTree(5)
    tree.set(np.array([0, 1, 2, 3, 4]), np.array([1.0, 2.0, 3.0, 4.0, 0.0]))
    assert tree.total == 10.0
    found = tree.find(np.array([0.0, 0.99, 1.0, 2.5, 3.0, 6.0, 9.99]))
    np.testing.assert_array_equal(found, [0, 0, 1, 1, 2, 3, 3])
    tree.set(np.array([0, 0]), np.array([5.0, 6.0]))  # duplicates: the last wins
    assert tree.total == 15.0


def proportions(buf: PrioritizedReplayBuffer, n: int, draws: int = 100_000) -> np.ndarray:
    batch = buf.sample(draws)
    assert batch is not None
    return np.bincount(batch["id"], minlength=n) / draws


def test_prioritized_sampling_is_proportional_to_priority_power_alpha() -> None:
    n, alpha = 8, 0.6
    buf = PrioritizedReplayBuffer(n, alpha=alpha, beta=0.4, seed=0)
    buf.add(items(0, n), policy_version=0)
    np.testing.assert_allclose(proportions(buf, n), 1 / n, atol=0.01)  # new items: max priority
    priorities = np.arange(1.0, n + 1.0)
    assert buf.update_priorities(np.arange(n), priorities) == 0
    expected = priorities**alpha / np.sum(priorities**alpha)
    np.testing.assert_allclose(proportions(buf, n), expected, atol=0.006)
    buf.update_priorities(np.array([0]), np.array([100.0]))  # changes the proportions
    p = priorities.copy()
    p[0] = 100.0
    np.testing.assert_allclose(proportions(buf, n), p**alpha / np.sum(p**alpha), atol=0.006)
    assert buf.max_priority == 100.0


def test_importance_weights_normalized_by_the_batch_max() -> None:
    buf = PrioritizedReplayBuffer(4, alpha=1.0, beta=0.5, seed=0)
    buf.add(items(0, 4), policy_version=0)
    buf.update_priorities(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    batch = buf.sample(400)
    assert batch is not None
    prob = (batch["id"] + 1) / 10.0
    raw = (4 * prob) ** -0.5
    np.testing.assert_allclose(batch["weight"], raw / raw.max(), rtol=1e-6)
    assert batch["weight"].max() == pytest.approx(1.0) and batch["weight"].dtype == np.float32
    assert batch["weight"][batch["id"] == 0][0] == pytest.approx(1.0)  # rarest item: largest weight


def test_stale_priority_updates_are_ignored() -> None:
    buf = PrioritizedReplayBuffer(4, alpha=1.0, seed=0)
    buf.add(items(0, 4), policy_version=0)
    batch = buf.sample(64)
    assert batch is not None
    buf.add(items(4, 2), policy_version=1)  # overwrites ids 0 and 1
    indices = np.array([0, 1, 2, 3])
    assert buf.update_priorities(indices, np.array([50.0, 50.0, 2.0, 3.0])) == 2
    assert buf.statistics()["stale_updates"] == 2
    # Slots 0 and 1 now hold ids 4 and 5 at the initial max priority 1.
    np.testing.assert_allclose(buf.tree.get(np.arange(4)), [1.0, 1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="finite and > 0"):
        buf.update_priorities(np.array([2]), np.array([np.nan]))


def fragment(horizon: int, width: int, value: float) -> dict[str, np.ndarray]:
    return {
        "obs": np.full((horizon, width, 2), value, np.float32),
        "reward": np.full((horizon, width), value, np.float32),
    }


def test_rollout_fifo_take_and_eviction() -> None:
    buf = RolloutBuffer(3)
    assert isinstance(buf, Buffer)
    for v in range(4):
        assert buf.add(fragment(5, 2, v), policy_version=10 + v) == 1
    assert buf.statistics() == {
        "size": 3,
        "capacity": 3,
        "inserted": 4,
        "evicted": 1,
        "sampled": 0,
    }
    assert buf.take(4) is None
    taken = buf.take(2)
    assert taken is not None
    batch, versions = taken
    assert versions == [11, 12] and batch["obs"].shape == (5, 4, 2)
    np.testing.assert_array_equal(batch["reward"][0], [1, 1, 2, 2])
    assert len(buf) == 1 and buf.statistics()["sampled"] == 2


def test_rollout_sample_adds_policy_version_per_env_column() -> None:
    buf = RolloutBuffer(4, min_size=2)
    buf.add(fragment(3, 2, 0), policy_version=5)
    assert buf.sample(1) is None  # below min_size
    buf.add(fragment(3, 3, 1), policy_version=6)  # a wider actor
    batch = buf.sample(2)
    assert batch is not None
    np.testing.assert_array_equal(batch["policy_version"], [5, 5, 6, 6, 6])
    with pytest.raises(ValueError, match="differs"):
        buf.add(fragment(4, 2, 0), policy_version=7)


def test_make_buffer() -> None:
    replay = make_buffer(BufferSpec(kind="replay", capacity=8, batch_size=2), seed=0)
    assert type(replay) is ReplayBuffer
    prio = make_buffer(BufferSpec(kind="prioritized", capacity=8, batch_size=2, alpha=0.7))
    assert isinstance(prio, PrioritizedReplayBuffer) and prio.alpha == 0.7
    rollout = make_buffer(BufferSpec(kind="rollout", capacity=2, batch_size=1))
    assert isinstance(rollout, RolloutBuffer)
    with pytest.raises(ConfigError, match="kind='fifo'"):
        make_buffer(BufferSpec(kind="fifo", capacity=8, batch_size=2))
    with pytest.raises(ConfigError, match="capacity=0"):
        make_buffer(BufferSpec(kind="replay", capacity=0, batch_size=2))


def _filled(buf: ReplayBuffer, n: int) -> ReplayBuffer:
    for v in range(0, n, 10):
        obs = np.arange(v, v + 10, dtype=np.float32)[:, None].repeat(3, axis=1)
        buf.add({"obs": obs, "action": np.arange(v, v + 10)}, policy_version=v)
    return buf


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("prioritized", [False, True])
def test_a_replay_buffer_restored_from_its_state_samples_the_same(
    wrapped: bool, prioritized: bool
) -> None:
    """The snapshot holds the stored items, their ids and versions (and the priorities):
    a restored buffer with the same RNG draws the same batches and updates priorities."""
    from tianji.rl.checkpoint import pack_state, unpack_state

    def make() -> ReplayBuffer:
        if prioritized:
            return PrioritizedReplayBuffer(50, min_size=10, seed=3)
        return ReplayBuffer(50, min_size=10, seed=3)

    original = _filled(make(), 80 if wrapped else 30)
    if prioritized:
        assert isinstance(original, PrioritizedReplayBuffer)
        original.update_priorities(
            np.arange(70, 80) if wrapped else np.arange(10), np.full(10, 5.0)
        )
    restored = make()
    restored.load_state_dict(unpack_state(pack_state(original.state_dict())))
    assert len(restored) == len(original) and restored.statistics() == original.statistics()
    a, b = original.sample(64), restored.sample(64)
    assert a is not None and b is not None and a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # the ids say what is still there: new inserts evict the same items in both
    _filled(original, 20), _filled(restored, 20)
    assert np.array_equal(original.storage.ids, restored.storage.ids)


def test_a_replay_state_of_another_capacity_is_refused() -> None:
    state = _filled(ReplayBuffer(50), 30).state_dict()
    with pytest.raises(ValueError, match="capacity 50"):
        ReplayBuffer(40).load_state_dict(state)
