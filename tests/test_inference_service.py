"""The inference stream: two inference services, four actors with two env groups each,
all asking at once over ``inproc``. Every request is answered exactly once, with the
actions for its own observations, and per-env state follows each env's episodes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tianji.rl.config import RunConfig, to_dict
from tianji.rl.events import ActionsComputed, ComputeActions, ParamsPublished
from tianji.rl.slots import StateSlots
from tianji.rl.stats import InferenceStat
from tianji.rl.topics import LATEST_PARAMS, actions_topic, observations_topic
from tianji.runtime.controller import Controller
from tianji.runtime.service import Service
from tianji.services.inference import InferenceService
from tianji.testing import run_async

BIND = "inproc://"
ECHO = f"{Path(__file__).parent / 'plugins' / 'echo_policy.py'}:EchoPolicy"
ACTORS, SERVICES, SPLITS, ENVS_PER_GROUP, STEPS = 4, 2, 2, 3, 40


def run_config(**inference: Any) -> dict[str, Any]:
    cfg = RunConfig(algorithm=ECHO, transport="inproc", run_dir="")
    data = to_dict(cfg)
    data["actors"].update(count=ACTORS, envs_per_actor=SPLITS * ENVS_PER_GROUP, splits=SPLITS)
    data["actors"]["inference"] = "service"
    data["inference"].update(count=SERVICES, device="cpu", **inference)
    return data


class Params(Service):
    role = "params"

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, publishes=[LATEST_PARAMS], **kw)

    async def on_subscribed(self, conn: Any, topics: Any) -> None:
        if LATEST_PARAMS in topics:
            ev = ParamsPublished(policy_version=7, weights={})
            await self.send_to_subscriber(conn, ev, LATEST_PARAMS)


class FakeActor(Service):
    """Two env groups asking concurrently; each remembers what it asked and was told."""

    role = "actor"

    def __init__(self, name: str, index: int, **kw: Any) -> None:
        self.topic = observations_topic(index % SERVICES, SERVICES)
        super().__init__(name, publishes=[self.topic], **kw)
        self.index = index
        self.asked: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.answers: dict[int, list[ActionsComputed]] = {}
        self.expected_steps: dict[int, list[int]] = {}
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._ids = iter(range(10**6))
        self.subscribe(actions_topic(name), self.on_actions)

    async def on_actions(self, ev: ActionsComputed) -> None:
        self.answers.setdefault(ev.request_id, []).append(ev)
        future = self._waiting.pop(ev.request_id, None)
        if future is not None:
            future.set_result(None)

    async def group(self, g: int) -> None:
        rng = np.random.default_rng(100 * self.index + g)
        env_ids = np.arange(g * ENVS_PER_GROUP, (g + 1) * ENVS_PER_GROUP, dtype=np.int32)
        since_start = np.zeros(ENVS_PER_GROUP, np.int64)
        starts = np.ones(ENVS_PER_GROUP, bool)
        for _ in range(STEPS):
            request_id = next(self._ids)
            obs = np.zeros((ENVS_PER_GROUP, 4), np.float32)
            obs[:, 0] = 1000 * (1000 * self.index + request_id) + env_ids
            since_start = np.where(starts, 1, since_start + 1)
            self.asked[request_id] = (obs, env_ids, starts.copy())
            self.expected_steps[request_id] = since_start.tolist()
            future = asyncio.get_running_loop().create_future()
            self._waiting[request_id] = future
            ask = ComputeActions(
                actor=self.name, request_id=request_id, obs=obs, env_ids=env_ids, starts=starts
            )
            await self.publish(ask, self.topic)
            await asyncio.wait_for(future, 20)
            starts = rng.random(ENVS_PER_GROUP) < 0.2  # some episodes end

    async def main(self) -> None:
        await self.wait_subscribers(self.topic)
        async with asyncio.TaskGroup() as tg:
            for g in range(SPLITS):
                tg.create_task(self.group(g))


def test_every_request_is_answered_once_with_its_own_actions_and_env_state() -> None:
    async def main() -> tuple[list[FakeActor], list[InferenceService]]:
        actors: list[FakeActor] = []
        services = await _run(actors, max_wait_ms=20.0, batch_requests=4)
        return actors, services

    actors, services = run_async(main(), timeout=120)
    for actor in actors:
        assert sorted(actor.answers) == sorted(actor.asked)  # every request answered
        for request_id, replies in actor.answers.items():
            assert len(replies) == 1, f"{actor.name} request {request_id}: {len(replies)} replies"
            obs, _, _ = actor.asked[request_id]
            reply = replies[0]
            np.testing.assert_array_equal(reply.arrays["action"], obs[:, 0].astype(np.int64))
            assert reply.arrays["steps"].tolist() == actor.expected_steps[request_id]
            assert reply.policy_version == 7
    requests = [s.counters[InferenceStat.REQUESTS] for s in services]
    assert requests == [2 * SPLITS * STEPS, 2 * SPLITS * STEPS]  # round-robin: 2 actors each
    passes = [s.counters[InferenceStat.FORWARD_PASSES] for s in services]
    assert all(p < r for p, r in zip(passes, requests, strict=True)), (passes, requests)


async def _run(
    actors: list[FakeActor], actor_type: type[FakeActor] = FakeActor, **inference: Any
) -> list[InferenceService]:
    ctl = Controller(bind=BIND)
    ctl_task = asyncio.create_task(ctl.run())
    await ctl.wait_ready()
    extra = dict(bind=BIND, controller=ctl.address)
    cfg = run_config(**inference)
    services = [
        InferenceService(f"inference-{k}", config=cfg, index=k, **extra) for k in range(SERVICES)
    ]
    actors.extend(actor_type(f"actor-{i}", i, **extra) for i in range(ACTORS))
    others: list[Service] = [Params("params-0", **extra), *services]
    background = [asyncio.create_task(s.run()) for s in others]
    try:
        await asyncio.gather(*(a.run() for a in actors))
    finally:
        for s in others:
            s.stop("test over")
        await asyncio.gather(*background, return_exceptions=True)
        ctl.stop("test over")
        await ctl_task
    return services


class LateSubscriber(FakeActor):
    """Asks before it subscribes to its answers: the answer must wait for its link."""

    def __init__(self, name: str, index: int, **kw: Any) -> None:
        super().__init__(name, index, **kw)
        self._subscriptions.handlers.clear()  # no subscription yet

    async def main(self) -> None:
        await self.wait_subscribers(self.topic)
        future = asyncio.get_running_loop().create_future()
        self._waiting[0] = future
        self.asked[0] = (np.zeros((2, 4), np.float32), np.arange(2, dtype=np.int32), np.ones(2))
        await self.publish(ask(self.name, 0), self.topic)
        await asyncio.sleep(0.3)  # the service has answered by now, to nobody
        self.subscribe(actions_topic(self.name), self.on_actions)
        await asyncio.wait_for(future, 10)


def test_an_answer_waits_for_the_asking_actors_link_instead_of_being_lost() -> None:
    async def main() -> tuple[list[FakeActor], list[InferenceService]]:
        actors: list[FakeActor] = []
        services = await _run(actors, actor_type=LateSubscriber, max_wait_ms=1.0)
        return actors, services

    actors, services = run_async(main(), timeout=60)
    assert all(len(a.answers.get(0, [])) == 1 for a in actors)
    late = sum(s.counters[InferenceStat.ANSWERS_LATE] for s in services)
    assert late == ACTORS
    assert sum(s.counters[InferenceStat.ANSWERS_UNDELIVERED] for s in services) == 0


def ask(actor: str, request_id: int, features: int = 4, ids: int = 2) -> ComputeActions:
    return ComputeActions(
        actor=actor,
        request_id=request_id,
        obs=np.zeros((2, features), np.float32),
        env_ids=np.arange(ids, dtype=np.int32),
        starts=np.ones(2, bool),
    )


def test_a_malformed_request_is_refused_and_counted_and_the_others_are_served() -> None:
    svc = InferenceService("inference-0", config=run_config(), index=0, bind=BIND)
    good, wrong_shape, wrong_ids = (
        ask("actor-0", 1),
        ask("actor-0", 2, features=5),
        ask("actor-2", 3, ids=3),
    )

    async def main() -> int:
        for ev in (good, wrong_shape, wrong_ids):
            await svc.on_observations(ev)
        return svc._requests.qsize()

    assert run_async(main()) == 1
    assert svc.counters[InferenceStat.REQUESTS_MALFORMED] == 2


def test_state_slots_start_fresh_at_episode_starts_and_keep_rows_per_actor() -> None:
    slots = StateSlots(lambda n: np.full((n, 2), -1.0))
    first = slots.gather("a", np.array([0, 3]), np.array([True, True]))
    assert first.tolist() == [[-1.0, -1.0], [-1.0, -1.0]]
    slots.scatter("a", np.array([0, 3]), np.array([[1.0, 1.0], [2.0, 2.0]]))
    slots.scatter("b", np.array([0]), np.array([[9.0, 9.0]]))
    again = slots.gather("a", np.array([3, 0]), np.array([False, True]))
    assert again.tolist() == [[2.0, 2.0], [-1.0, -1.0]]
    assert slots.gather("b", np.array([0]), np.array([False])).tolist() == [[9.0, 9.0]]
    with pytest.raises(ValueError, match="env_ids"):
        slots.gather("a", np.array([0, 1]), np.array([True]))
