"""The ``codec`` rows of ``tianji bench transport``: encode and decode cost of one event.

Two events, each encoded and decoded ``count`` times in a row by one
:class:`~tianji.runtime.codec.Codec` in this process, best of ``rounds`` rounds (a busy
machine only makes a round slower): a heartbeat as a running actor sends one (the small
control-plane event every service sends every second) and an ``ArraysPublished`` with a
100-byte array (the smallest data-plane event of the throughput cells).
"""

from __future__ import annotations

import time

import numpy as np

from tianji.bench.report import CodecRow
from tianji.runtime.codec import Codec
from tianji.runtime.events import ArraysPublished, Event, Heartbeat

__all__ = ["measure_codec", "sample_events"]


def sample_events() -> dict[str, Event]:
    """The measured events, by row name."""
    heartbeat = Heartbeat(
        name="actor-3",
        role="actor",
        state="running",
        counters={
            "published": 18_311,
            "published_bytes": 94_123_008,
            "received": 412,
            "env_steps": 1_171_904,
            "episodes": 4_410,
            "fragments_sent": 4_577,
            "fragments_dropped": 0,
            "paused_ms": 1_733,
            "policy_updates": 401,
            "bad_frames": 0,
        },
        gauges={"policy_version": 401.0, "env_steps_per_s": 3_412.5, "mean_return": 211.3},
        queue_depths={"out": 1, "weights": 0},
        sent_at=1_796_400_000.25,
    )
    arrays = ArraysPublished(
        seq=7, policy_version=0, arrays={"x": np.zeros(100, np.uint8)}, meta={}
    )
    return {"Heartbeat": heartbeat, "ArraysPublished 100 B": arrays}


def measure_codec(count: int = 20_000, rounds: int = 5) -> list[CodecRow]:
    """One :class:`CodecRow` per sample event (microseconds per event, best round)."""
    codec = Codec()
    clock = time.perf_counter
    rows = []
    for name, ev in sample_events().items():
        frames = codec.encode(ev)
        assert type(codec.decode(frames)) is type(ev)
        encode_s = decode_s = float("inf")
        for _ in range(rounds):
            start = clock()
            for _ in range(count):
                codec.encode(ev)
            middle = clock()
            for _ in range(count):
                codec.decode(frames)
            end = clock()
            encode_s, decode_s = min(encode_s, middle - start), min(decode_s, end - middle)
        rows.append(
            CodecRow(
                name,
                round(encode_s / count * 1e6, 3),
                round(decode_s / count * 1e6, 3),
                len(frames[0]),
            )
        )
    return rows
