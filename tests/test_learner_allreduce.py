"""Data-parallel learners (``learner.count = K``) average gradients every optimizer step.

Two real :class:`LearnerService` instances run in one process over ``inproc`` with a
controller; a scripted feeder plays the buffer and hands each learner *different*
batches. Their full state (every network, DQN's target net too) is compared after every
update: bit-exact.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch import nn

from tianji.rl.config import EnvConfig, LearnerConfig, RunConfig, to_dict
from tianji.rl.events import BatchRequested, GradientsShared, ParamsPublished, SampleBatch
from tianji.rl.topics import LEARNER_PARAMS, REQUESTS, batches_topic
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.runtime.service import Service
from tianji.services.allreduce import AllReduce, average
from tianji.services.learner import LearnerService
from tianji.services.learner_sync import choose_way
from tianji.testing import run_async

BIND = "inproc://"
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_config(algorithm: str, algo: dict[str, Any], **learner: Any) -> dict[str, Any]:
    cfg = RunConfig(
        algorithm=algorithm,
        transport="inproc",
        env=EnvConfig(id="CartPole-v1"),
        learner=LearnerConfig(count=2, prefetch=1, max_policy_lag=1, **learner),
        algo=algo,
    )
    return to_dict(cfg)


DQN_ALGO = {"batch_size": 32, "hidden": [32, 32], "target_update_interval": 2}
PPO_ALGO = {"hidden": [32, 32], "update_epochs": 2, "num_minibatches": 2}


def dqn_batch(rng: np.random.Generator, n: int = 32) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, 4), dtype=np.float32),
        "action": rng.integers(0, 2, n).astype(np.int64),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, 4), dtype=np.float32),
        "discount": np.full(n, 0.99, np.float32),
    }


def ppo_batch(rng: np.random.Generator, t: int = 8, m: int = 4) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((t, m, 4), dtype=np.float32),
        "action": rng.integers(0, 2, (t, m)).astype(np.int64),
        "reward": rng.standard_normal((t, m), dtype=np.float32),
        "terminated": rng.random((t, m)) < 0.1,
        "truncated": np.zeros((t, m), bool),
        "next_obs": rng.standard_normal((t, m, 4), dtype=np.float32),
        "logp": np.full((t, m), np.log(0.5), np.float32),
        "value": rng.standard_normal((t, m), dtype=np.float32),
    }


class Feeder(Service):
    """Plays the buffer: answers each learner's cumulative requests from its own script.

    ``script[name]`` lists the lag of each batch it will get (0: fresh, > max_policy_lag:
    stale); the data come from a generator seeded per learner, so the learners see
    different batches.
    """

    role = "buffer"

    def __init__(self, name: str, *, algorithm: str, script: dict[str, list[int]], **kw: Any):
        super().__init__(name, publishes=[batches_topic(n) for n in script], **kw)
        self.script = script
        self.make = dqn_batch if algorithm == "dqn" else ppo_batch
        self.rngs = {n: np.random.default_rng(100 + i) for i, n in enumerate(script)}
        self.sent = dict.fromkeys(script, 0)
        self.requests: dict[str, BatchRequested] = {}
        self.subscribe(REQUESTS, self.on_request)

    async def on_request(self, ev: BatchRequested) -> None:
        self.requests[ev.learner] = ev
        await self.serve(ev.learner)

    async def on_subscribed(self, conn: Any, topics: Any) -> None:
        for name in list(self.requests):
            await self.serve(name)

    async def serve(self, name: str) -> None:
        """Like the buffer: only to a learner whose subscription is wired."""
        ev = self.requests[name]
        while self.sent[name] < min(ev.count, len(self.script[name])):
            if not self.subscriber_count(batches_topic(name)):
                return
            lag = self.script[name][self.sent[name]]
            self.sent[name] += 1
            arrays = self.make(self.rngs[name])
            samples = int(np.asarray(arrays["reward"]).size)
            versions = np.full(samples, ev.learner_version - lag, np.int64)
            batch = SampleBatch(
                batch_id=self.sent[name],
                policy_version=ev.learner_version,
                arrays=arrays,
                policy_versions=versions,
            )
            await self.publish(batch, batches_topic(name))


class ParamsSink(Service):
    role = "params"

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.versions: list[int] = []
        self.subscribe(LEARNER_PARAMS, self.on_params)

    async def on_params(self, ev: ParamsPublished) -> None:
        self.versions.append(ev.policy_version)


def snapshot(algo: Any) -> dict[str, np.ndarray]:
    """Every network the algorithm holds (e.g. DQN's target net too), as numpy copies."""
    out: dict[str, np.ndarray] = {}
    for attr, module in sorted(vars(algo).items()):
        if isinstance(module, nn.Module):
            for key, value in module.state_dict().items():
                out[f"{attr}.{key}"] = value.detach().cpu().numpy().copy()
    return out


@dataclasses.dataclass
class Recorder:
    """Wraps ``algo.update`` to keep the state and the loss after every update."""

    states: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    losses: list[float] = dataclasses.field(default_factory=list)

    def wrap(self, algo: Any) -> None:
        original = algo.update

        def update(batch: Any) -> Any:
            result = original(batch)
            self.states.append(snapshot(algo))
            self.losses.append(result.metrics["loss"])
            return result

        algo.update = update


async def run_learners(
    algorithm: str,
    algo: dict[str, Any],
    script: dict[str, list[int]],
    updates: int,
    *,
    vanish_after: int | None = None,
    prepare: Any = None,
    **learner: Any,
) -> tuple[list[LearnerService], list[Recorder], list[BaseException | None]]:
    """Run a controller, a params sink, a feeder and two learners until each learner made
    ``updates`` updates (or, with ``vanish_after``, stop learner-1 after that many and
    wait for learner-0 to end)."""
    ctl = Controller(bind=BIND)
    ctl_task = asyncio.create_task(ctl.run())
    await ctl.wait_ready()
    cfg = run_config(algorithm, algo, **learner)
    extra = dict(bind=BIND, controller=ctl.address)
    learners = [LearnerService(f"learner-{j}", config=cfg, index=j, **extra) for j in range(2)]
    recorders = [Recorder() for _ in learners]
    if prepare is not None:  # e.g. patch a learner before it runs
        prepare(learners)
    for rec, svc in zip(recorders, learners, strict=True):
        rec.wrap(svc.algo)
    others = [
        ParamsSink("params-0", **extra),
        Feeder("feeder", algorithm=algorithm, script=script, **extra),
    ]
    tasks = [asyncio.create_task(s.run()) for s in [*others, *learners]]
    try:
        if vanish_after is not None:
            await until(lambda: len(recorders[1].states) >= vanish_after)
            learners[1].stop("vanished")
            await asyncio.wait_for(asyncio.wait({tasks[-2]}), 30)  # learner-0 ends itself
        else:
            await until(lambda: all(len(r.states) >= updates for r in recorders))
    finally:
        for s in [*others, *learners]:
            s.stop("test over")
        results = await asyncio.gather(*tasks, return_exceptions=True)
        ctl.stop("test over")
        await ctl_task
    errors = [r if isinstance(r, BaseException) else None for r in results[-2:]]
    return learners, recorders, errors


async def until(predicate: Any, timeout: float = 30.0) -> None:
    async def poll() -> None:
        while not predicate():  # noqa: ASYNC110 - reads plain attributes of services
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


def assert_identical_after_every_update(recorders: list[Recorder], updates: int) -> None:
    a, b = recorders[0].states[:updates], recorders[1].states[:updates]
    assert len(a) == len(b) == updates
    for i, (wa, wb) in enumerate(zip(a, b, strict=True)):
        assert wa.keys() == wb.keys()
        for key in wa:
            assert np.array_equal(wa[key], wb[key]), f"update {i + 1}: {key} differs"
    # Not trivially equal: the weights moved, and the learners saw different data.
    assert any(not np.array_equal(a[0][k], a[-1][k]) for k in a[0])
    assert recorders[0].losses[:updates] != recorders[1].losses[:updates]


@pytest.mark.parametrize("way", ["collective", "transport"])
@pytest.mark.parametrize("algorithm", ["dqn", "ppo"])
def test_two_learners_fed_different_batches_hold_bit_identical_weights_after_every_update(
    algorithm: str, way: str
) -> None:
    updates = 5
    algo = DQN_ALGO if algorithm == "dqn" else PPO_ALGO
    script = {"learner-0": [0] * updates, "learner-1": [0] * updates}
    learners, recorders, errors = run_async(
        run_learners(algorithm, algo, script, updates, allreduce=way)
    )
    assert errors == [None, None]
    assert_identical_after_every_update(recorders, updates)
    steps_per_update = 1 if algorithm == "dqn" else 2 * 2  # epochs x minibatches
    for svc in learners:
        assert svc.version == updates
        assert (svc.collective is not None) == (way == "collective")
        assert svc.counters["allreduce/steps"] == updates * steps_per_update
        assert svc.counters["samples_consumed"] > 0
    assert learners[1].counters["published"] > 0  # its batch requests, never weights


@pytest.mark.parametrize("way", ["collective", "transport"])
def test_a_stale_batch_on_one_learner_keeps_the_learners_in_step(way: str) -> None:
    """learner-1's second batch is stale: it is dropped (counted), learner-1 takes no step
    for it and fetches the next one while learner-0 waits at the all-reduce."""
    updates = 4
    script = {"learner-0": [0] * updates, "learner-1": [0, 5] + [0] * (updates - 1)}
    learners, recorders, errors = run_async(
        run_learners("ppo", PPO_ALGO, script, updates, allreduce=way)
    )
    assert errors == [None, None]
    assert learners[1].counters["dropped/stale"] == 32  # one batch of 8 x 4
    assert learners[0].counters["dropped/stale"] == 0
    assert learners[0].version == learners[1].version == updates
    assert_identical_after_every_update(recorders, updates)


@pytest.mark.parametrize(
    ("way", "says"), [("collective", "the collective failed"), ("transport", "within 1 s")]
)
def test_a_learner_whose_peer_vanishes_fails_naming_the_peer_and_step(way: str, says: str) -> None:
    """The collective breaks at once when the peer leaves its group; the all-to-all
    notices after ``sync_timeout``."""
    timeout = 1.0
    # learner-1 gets two batches, then waits for a third and is stopped: learner-0, fed on,
    # waits for learner-1's gradient of step 2.
    script = {"learner-0": [0] * 10, "learner-1": [0] * 2}

    async def main() -> tuple[float, list[BaseException | None]]:
        started = time.monotonic()
        _, _, errors = await run_learners(
            "dqn", DQN_ALGO, script, 0, vanish_after=2, sync_timeout=timeout, allreduce=way
        )
        return time.monotonic() - started, errors

    elapsed, errors = run_async(main())
    failure = errors[0]
    assert isinstance(failure, ServiceFailed), errors
    assert "learner-1" in failure.reason and "step 2" in failure.reason, failure.reason
    assert says in failure.reason, failure.reason
    assert elapsed < timeout + 15  # start-up included; never a hang


def test_auto_takes_the_all_to_all_for_small_gradients_and_the_collective_for_large() -> None:
    assert choose_way("auto", "cpu", 10_000, 4) == "transport"
    assert choose_way("auto", "cpu", 1_000_000, 2) == "transport"
    assert choose_way("auto", "cpu", 1_000_000, 4) == "collective"  # 3 M values a step
    assert choose_way("auto", "cpu", 10_000_000, 2) == "collective"
    assert choose_way("auto", "cuda:1", 10_000, 2) == "collective"  # NCCL, on the GPU
    assert choose_way("transport", "cpu", 10_000_000, 8) == "transport"  # as set
    with pytest.raises(ConfigError, match=r"learner\.allreduce"):
        LearnerConfig(allreduce="mpi")


def test_a_single_learner_installs_no_gradient_sync() -> None:
    cfg = run_config("dqn", DQN_ALGO)
    cfg["learner"]["count"] = 1
    svc = LearnerService("learner-0", config=cfg)
    assert svc.collective is None and svc.allreduce is None and svc.algo.gradient_sync is None


def test_learner_settings_are_checked_naming_the_bad_value() -> None:
    with pytest.raises(ConfigError, match=r"learner\.count"):
        LearnerConfig(count=0)
    with pytest.raises(ConfigError, match=r"learner\.sync_timeout"):
        LearnerConfig(sync_timeout=0.0)
    cfg = run_config("dqn", DQN_ALGO)
    with pytest.raises(ConfigError, match="learner index"):
        LearnerService("learner-2", config=cfg, index=2)
    with pytest.raises(ConfigError, match="learner name"):
        LearnerService("trainer", config=cfg, index=1)


def test_the_mean_is_summed_in_learner_order_and_late_or_duplicate_steps_are_counted() -> None:
    parts = [np.array([1e8, 1.0], np.float32), np.array([-1e8, 1.0], np.float32)]
    assert np.array_equal(average(parts), np.array([0.0, 1.0], np.float32))

    async def main() -> AllReduce:
        sent: list[GradientsShared] = []

        async def publish(ev: GradientsShared) -> None:
            sent.append(ev)

        ar = AllReduce("learner-0", index=0, count=2, publish=publish, timeout=5.0)

        def peer(step: int) -> GradientsShared:
            grads = np.full(2, 3.0, np.float32)
            return GradientsShared(learner="learner-1", index=1, step=step, grads=grads, digest="")

        await ar.received(peer(0))
        await ar.received(peer(0))  # duplicate
        mean = await ar.reduce(np.ones(2, np.float32))
        assert np.array_equal(mean, np.full(2, 2.0, np.float32)) and sent[0].step == 0
        await ar.received(peer(0))  # late
        return ar

    ar = run_async(main())
    assert ar.step == 1
    assert ar.counters["allreduce/duplicate"] == 1 and ar.counters["allreduce/late"] == 1


@pytest.mark.slow
def test_two_learner_processes_train_cartpole_ppo_to_a_modest_target(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    config = str(EXAMPLES / "cartpole_ppo.toml")
    # the collective across processes (the all-to-all's are in tests/test_recovery.py)
    args = ["--set", "learner.count=2", "--set", 'learner.allreduce="collective"']
    args += ["--target-return", "200", "--max-seconds", "150"]
    result = subprocess.run(
        [sys.executable, "-m", "tianji.cli", "train", config, *args, "--summary", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    s = json.loads(path.read_text())
    assert s["learners"] == 2 and s["time_to_target_s"] is not None, s
    assert s["accounting"]["balanced"], s["accounting"]
    # Both learners consumed: every update takes one batch (2 fragments of 256) from each
    # (the last heartbeats may be one update apart).
    assert s["samples_consumed"] >= (s["learner_updates"] - 1) * 2 * 512
    learners = [s["services"][f"learner-{j}"] for j in range(2)]
    steps = [x["counters"]["allreduce/steps"] for x in learners]
    assert min(steps) > 0 and max(steps) - min(steps) <= 8, steps  # in step, one update apart


def test_a_batch_consumed_just_before_a_stop_is_not_also_dropped_at_shutdown() -> None:
    """A stop that cancels the learner after it counted a batch as consumed (here while it
    asks for the next one) must not count that batch again as ``dropped/shutdown``: every
    received sample is consumed, dropped or held exactly once."""

    def hold_after_first_update(learners: list[LearnerService]) -> None:
        first = learners[0]
        original = first._request
        never = asyncio.Event()

        async def request(more: int) -> None:
            if first.counters["samples_consumed"] > 0:
                await never.wait()  # the stop arrives while the learner waits here
            await original(more)

        first._request = request  # type: ignore[method-assign]

    script = {"learner-0": [0] * 3, "learner-1": [0] * 3}
    learners, _, _ = run_async(
        run_learners("ppo", PPO_ALGO, script, 1, prepare=hold_after_first_update)
    )
    c = learners[0].counters
    accounted = c["samples_consumed"] + c["dropped/shutdown"] + c["dropped/stale"]
    assert c["samples_consumed"] > 0
    assert accounted + learners[0].gauges["held_samples"] == c["samples_received"], dict(c)
