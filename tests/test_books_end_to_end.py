"""Losses injected into a real run show in its final books by name: a fragment a link
drops, a fragment a link delivers twice, a batch a link drops (PPO on CartPole, every
service in this process over the in-process transport, so the test can break a link)."""

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


def _faulty(cls: type[Any], kind: type[Event], at: int, fault: str) -> Callable[..., Any]:
    """``cls.publish`` with the ``at``-th event of ``kind`` dropped by the link after it
    took it (``drop``: the sender counts it delivered) or delivered twice (``twice``)."""
    original = cls.publish
    seen = {"n": 0}

    async def publish(self: Any, ev: Event, topic_name: str | None = None) -> int:
        if isinstance(ev, kind):
            seen["n"] += 1
            if seen["n"] == at:
                if fault == "drop":
                    return 1
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
@pytest.mark.parametrize(
    ("cls", "kind", "fault", "hop"),
    [
        (ActorService, TrajectoryCollected, "drop", "actor->buffer"),
        (ActorService, TrajectoryCollected, "twice", "actor->buffer"),
        (BufferService, SampleBatch, "drop", "buffer->learner"),
    ],
    ids=["fragment-dropped", "fragment-twice", "batch-dropped"],
)
def test_a_loss_injected_on_a_link_is_named_in_the_final_books(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cls: type[Any],
    kind: type[Event],
    fault: str,
    hop: str,
) -> None:
    monkeypatch.setattr(cls, "publish", _faulty(cls, kind, 5, fault))
    s = _run(tmp_path)
    books = s["accounting"]
    assert books["balanced"], books
    assert books["drain"]["drained"] and books["in_flight"] == 0, books
    link = books["hops"][hop]
    if fault == "drop":
        size = FRAGMENT if kind is TrajectoryCollected else BATCH
        assert link["lost_in_transit"] == size and link["duplicates"] == 0, books
        assert books["dropped"].get("lost_in_transit") == size, books
    else:
        assert link["duplicates"] == 1 and link["lost_in_transit"] == 0, books
        assert "lost_in_transit" not in books["dropped"], books
    assert s["env_steps"] >= 12000  # the run went on past the fault
