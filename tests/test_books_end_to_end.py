"""Losses injected into a real run show in its final books by name: a fragment a link
drops, a fragment a link delivers twice, a batch a link drops, all in one run (PPO on
CartPole, every service in this process over the in-process transport, so the test can
break a link)."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tianji.rl.events import SampleBatch, TrajectoryCollected
from tianji.run.config import load_config
from tianji.run.train import train
from tianji.runtime.events import Event
from tianji.services.actor import ActorService
from tianji.services.buffer import BufferService

ROOT = Path(__file__).resolve().parents[1]
FRAGMENT = 64 * 4  # the example's fragment_length x envs_per_actor
BATCH = 2 * FRAGMENT  # fragments_per_batch = 2


def _faulty(cls: type[Any], kind: type[Event], faults: dict[int, str]) -> Callable[..., Any]:
    """``cls.publish`` with the n-th event of ``kind`` (counted over every instance)
    dropped by the link after it took it (``drop``: the sender counts it delivered) or
    delivered twice (``twice``), for each ``n: fault`` of ``faults``."""
    original = cls.publish
    seen = {"n": 0}

    async def publish(self: Any, ev: Event, topic_name: str | None = None) -> int:
        if isinstance(ev, kind):
            seen["n"] += 1
            fault = faults.get(seen["n"])
            if fault == "drop":
                return 1
            if fault == "twice":
                await original(self, ev, topic_name)
        delivered: int = await original(self, ev, topic_name)
        return delivered

    return publish


def _run(tmp_path: Path) -> dict[str, Any]:
    config = load_config(
        ROOT / "examples" / "cartpole_ppo.toml",
        ['transport="inproc"', "stop.max_env_steps=12000", "stop.target_return=1000"],
    )
    config = dataclasses.replace(config, run_dir="")
    return train(config, summary_path=str(tmp_path / "summary.json"), out=io.StringIO())


@pytest.mark.slow
def test_losses_injected_on_the_links_are_named_in_the_final_books(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run, three faults: the actors' link drops the 5th fragment and delivers the 9th
    twice; the buffer's link to the learner drops the 5th batch (the learner gets its
    credit back and the run goes on)."""
    fragments = _faulty(ActorService, TrajectoryCollected, {5: "drop", 9: "twice"})
    monkeypatch.setattr(ActorService, "publish", fragments)
    monkeypatch.setattr(BufferService, "publish", _faulty(BufferService, SampleBatch, {5: "drop"}))
    s = _run(tmp_path)
    books = s["accounting"]
    assert books["balanced"], books
    assert books["drain"]["drained"] and books["in_flight"] == 0, books
    first, second = books["hops"]["actor->buffer"], books["hops"]["buffer->learner"]
    assert first["lost_in_transit"] == FRAGMENT and first["duplicates"] == 1, books
    assert second["lost_in_transit"] == BATCH and second["duplicates"] == 0, books
    assert books["dropped"].get("lost_in_transit") == FRAGMENT + BATCH, books
    assert s["env_steps"] >= 12000  # the run went on past the faults
