"""Helpers of the codec tests (``test_codec.py``, ``test_codec_bad_frames.py``): events made
by hand, frames and headers in the documented layout."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import pytest

from tianji.rl.events import (
    ActionsComputed,
    AdoptState,
    BatchRequested,
    CheckpointTaken,
    ComputeActions,
    DrawOpponents,
    EpisodesFinished,
    GamesPlayed,
    GradientsShared,
    GrantConsumption,
    GrantProduction,
    ParamsPublished,
    PolicyEvaluated,
    PrioritiesUpdated,
    RendezvousOffered,
    RestoreCheckpoint,
    SampleBatch,
    SnapshotTaken,
    TakeCheckpoint,
    TrajectoryCollected,
)
from tianji.runtime import codec
from tianji.runtime.codec import ARRAY_EXT, WIRE_VERSION, Codec
from tianji.runtime.errors import BadFrame
from tianji.runtime.events import (
    ArraysPublished,
    BoardPosted,
    Event,
    Heartbeat,
    HeartbeatBatch,
    PublishersChanged,
    RegisterService,
    ServiceRegistered,
    ServiceReported,
    Shutdown,
    Subscribe,
    Want,
    WatchTopics,
)

# --------------------------------------------------------------------------- helpers


def assert_same(expected: object, actual: object, path: str = "event") -> None:
    """Structural equality that also compares types, dtypes, shapes and raw array bytes.

    Struct ``==`` cannot compare events holding arrays, and ``np.array_equal`` treats
    NaN payloads and ``-0.0`` loosely; the wire must be bit-exact.
    """
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, Event):
        for name in expected.__struct_fields__:
            assert_same(getattr(expected, name), getattr(actual, name), f"{path}.{name}")
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray)
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.dtype.str == expected.dtype.str, f"{path}: byte order changed"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.tobytes() == expected.tobytes(), f"{path}: array bytes differ"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict)
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key, value in expected.items():
            assert_same(value, actual[key], f"{path}[{key!r}]")
    elif isinstance(expected, tuple):
        assert isinstance(actual, tuple)
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_same(e, a, f"{path}[{i}]")
    elif isinstance(expected, float) and math.isnan(expected):
        assert isinstance(actual, float) and math.isnan(actual), f"{path}: {actual} is not NaN"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def round_trip(ev: Event, c: Codec | None = None) -> Event:
    frames = (c or codec._default_codec).encode(ev)
    return (c or codec._default_codec).decode(frames)


def arrays_event(**arrays: np.ndarray) -> ArraysPublished:
    return ArraysPublished(seq=1, policy_version=2, arrays=arrays, meta={})


def array_ext(dtype: object, shape: object, index: object) -> msgpack.ExtType:
    """An array reference exactly as the codec writes it: ext 1 of [dtype, shape, index]."""
    return msgpack.ExtType(ARRAY_EXT, msgpack.packb([dtype, shape, index]))


def header(type_name: object, body: object, version: object = WIRE_VERSION) -> bytes:
    """A hand-made header frame: [version, type, body]."""
    return msgpack.packb([version, type_name, body], use_bin_type=True)


def arrays_body(arrays: object, **overrides: object) -> dict[str, object]:
    body: dict[str, object] = {"seq": 1, "policy_version": 2, "arrays": arrays, "meta": {}}
    body.update(overrides)
    return body


def float32_frame(n: int = 3) -> bytes:
    return np.arange(n, dtype=np.float32).tobytes()


def array_message(ext: object, payload: object = None, **overrides: object) -> list[Any]:
    """An ArraysPublished message whose one array ``x`` is ``ext``, plus its payload frame."""
    body = arrays_body({"x": ext}, **overrides)
    return [header("ArraysPublished", body), float32_frame() if payload is None else payload]


def decode_error(frames: list[Any], c: Codec | None = None) -> BadFrame:
    with pytest.raises(BadFrame) as info:
        (c or codec._default_codec).decode(frames)
    return info.value


DTYPES = [
    "float32", "float64", "int64", "uint8", "bool", "float16", "complex64",
    ">f4", ">i8", "int8", "int16", "uint64", "complex128",
]  # fmt: skip


# --------------------------------------------------------------------------- samples

RNG = np.random.default_rng(1234)


def sample_events() -> list[Event]:
    """One populated instance of every event class declared in tianji.runtime.events and
    tianji.rl.events."""
    return [*_runtime_samples(), *_rl_samples(), *_rl_commands()]


def _runtime_samples() -> list[Event]:
    return [
        Subscribe(topics=("Heartbeat", "TrajectoryCollected/actor-3")),
        Subscribe(
            topics=("ParamsPublished/latest",),
            locality="h/net:1",
            on_demand=("ParamsPublished/latest",),
        ),
        Want(topic="ParamsPublished/latest"),
        BoardPosted(
            topic="ParamsPublished/latest",
            board="tianji-1-2-board0a",
            slot=2,
            seq=6,
            lengths=(40, 4096),
        ),
        RegisterService(
            name="actor-0",
            role="actor",
            address="tcp://127.0.0.1:5555",
            publishes=("TrajectoryCollected/actor-0",),
            host="node-1",
            pid=4242,
        ),
        ServiceRegistered(name="actor-0", run_id="run-2024-07"),
        WatchTopics(topics=()),
        PublishersChanged(topic="ParamsPublished", addresses=("tcp://10.0.0.1:1", "inproc://b")),
        Heartbeat(
            name="learner",
            role="learner",
            state="running",
            counters={"updates": 12, "negative": -3, "max": 2**63 - 1},
            gauges={"loss": 0.25, "lr": 3e-4},
            queue_depths={},
            sent_at=1712345678.25,
        ),
        HeartbeatBatch(
            aggregator="aggregator-0",
            heartbeats=(
                Heartbeat(
                    name="actor-3",
                    role="actor",
                    state="running",
                    counters={"env_steps": 4096},
                    gauges={"rss_mb": 250.5},
                    queue_depths={"to:tcp://10.0.0.2:1": 0},
                    sent_at=1712345678.5,
                    links_down={"tcp://10.0.0.1:1": "refused (down 3 s)"},
                ),
            ),
        ),
        HeartbeatBatch(aggregator="aggregator-1", heartbeats=()),
        ServiceReported(
            name="learner-0",
            status="ok",
            summary={"return_mean": 195.5, "steps": 100_000, "curve": ((0, 9.5), (1000, 22.0))},
        ),
        Shutdown(reason="done"),
        ArraysPublished(
            seq=7,
            policy_version=3,
            arrays={
                "f32": RNG.standard_normal((4, 5), dtype=np.float32),
                "u8": RNG.integers(0, 255, size=(2, 3, 4), dtype=np.uint8),
                "scalar": np.array(2.5),
                "empty": np.zeros((0, 3), dtype=np.int64),
            },
            meta={
                "env": "CartPole-v1",
                "nested": {"tuple": (1, 2.5, "three", None, True, b"\x00\xff"), "deep": {"x": ()}},
                "array_in_meta": (np.arange(3, dtype=np.int16),),
            },
        ),
    ]


def _rl_samples() -> list[Event]:
    return [
        EpisodesFinished(
            actor="actor-1",
            policy_version=3,
            returns=np.array([10.0, 200.0], np.float32),
            lengths=np.array([10, 200], np.int64),
            env_steps=4096,
        ),
        PolicyEvaluated(
            worker="eval-0",
            policy_version=12,
            returns=np.array([500.0, 480.5]),
            lengths=np.array([500, 481], np.int64),
        ),
        ComputeActions(
            actor="actor-0",
            request_id=7,
            obs=np.zeros((4, 3), np.float32),
            env_ids=np.arange(4, dtype=np.int32),
            starts=np.array([True, False, False, True]),
        ),
        ActionsComputed(
            actor="actor-0",
            request_id=7,
            policy_version=3,
            arrays={"action": np.array([0, 1, 1, 0]), "logp": np.zeros(4, np.float32)},
        ),
        SampleBatch(
            batch_id=5,
            policy_version=17,
            arrays={"obs": np.ones((4, 3), np.float32), "action": np.arange(4)},
            policy_versions=np.array([15, 16, 16, 17], np.int64),
        ),
        RendezvousOffered(
            learner="learner-0", host="10.0.0.2", port=29500, backend="gloo", generation=3
        ),
        GradientsShared(
            learner="learner-1",
            index=1,
            step=42,
            grads=RNG.standard_normal(10, dtype=np.float32),
            digest="0f1e2d3c",
        ),
        TrajectoryCollected(
            actor="actor-3",
            policy_version=9,
            arrays={
                "obs": RNG.standard_normal((16, 4), dtype=np.float32),
                "action": RNG.integers(0, 2, size=16, dtype=np.int64),
                "reward": np.ones(16, dtype=np.float32),
                "done": np.arange(16) % 5 == 0,
            },
        ),
        ParamsPublished(
            policy_version=10,
            weights={"w": RNG.standard_normal((8, 4)), "b": np.zeros(4, dtype=np.float32)},
        ),
        SnapshotTaken(policy_version=20, weights={"w": np.ones((2, 2), np.float32)}),
        GamesPlayed(
            actor="actor-0",
            policy_version=21,
            opponents=("v20", "random"),
            seats=np.array([0, 1], np.int8),
            outcomes=np.array([1.0, -1.0], np.float32),
        ),
        PolicyEvaluated(
            worker="eval-0",
            policy_version=21,
            returns=np.array([1.0, 0.0, -1.0]),
            lengths=np.array([7, 21, 9], np.int64),
            opponent="scripted",
        ),
    ]


def _rl_commands() -> list[Event]:
    return [
        DrawOpponents(
            probabilities={"v0": 0.25, "v20": 0.75}, ratings={"v0": 990.0, "v20": 1010.5}
        ),
        PrioritiesUpdated(
            policy_version=17,
            indices=np.array([3, 9], np.int64),
            priorities=np.array([0.5, 1.5], np.float32),
        ),
        BatchRequested(learner="learner-0", count=2, learner_version=17),
        CheckpointTaken(policy_version=40, state=np.frombuffer(b"packed state", np.uint8)),
        RestoreCheckpoint(policy_version=40, state=np.frombuffer(b"packed", np.uint8)),
        TakeCheckpoint(reason="complete"),
        AdoptState(
            source="m1",
            source_version=12,
            state=np.frombuffer(b"packed", np.uint8),
            hyperparameters={"lr": 3e-4},
        ),
        GrantProduction(limit=0, min_version=0, reason="draining before the run stops"),
        GrantConsumption(limit=4096, reason="consumed 3968 in [3000, 4096]"),
        GrantProduction(limit=12, min_version=5, reason="3/4 fragments outstanding"),
    ]
