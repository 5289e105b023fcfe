"""Demo services: producer -> relay -> consumer, with numpy payloads checked end to end.

The producer derives each payload from its sequence number, the relay transforms it
(``2 * x + 1``), and the consumer regenerates the expected payload and compares it
bit-exactly, so any loss, reordering or corruption is caught. ``tianji demo`` runs the
three as separate processes over TCP; the multi-process test does the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tianji.launch.spec import ServiceSpec
from tianji.runtime.events import ArraysPublished, ServiceReported, topic
from tianji.runtime.service import Service

__all__ = ["Consumer", "Producer", "Relay", "demo_specs", "payload"]

RAW = topic(ArraysPublished, "raw")
RELAYED = topic(ArraysPublished, "relayed")


def payload(seq: int, size: int) -> np.ndarray:
    """The deterministic float32 payload of event ``seq``."""
    return np.random.default_rng(seq).standard_normal(size, dtype=np.float32)


def transform(x: np.ndarray) -> np.ndarray:
    """What the relay does to every payload."""
    return (x * np.float32(2.0) + np.float32(1.0)).astype(np.float32)


class Producer(Service):
    """Publishes ``count`` events of ``size`` float32s on the ``raw`` topic, then stops."""

    role = "producer"

    def __init__(self, name: str, *, count: int, size: int = 1024, **kwargs: Any) -> None:
        super().__init__(name, publishes=[RAW], **kwargs)
        self.count = count
        self.size = size

    async def main(self) -> None:
        await self.wait_subscribers(RAW)
        for seq in range(self.count):
            ev = ArraysPublished(
                seq=seq, policy_version=0, arrays={"x": payload(seq, self.size)}, meta={}
            )
            await self.publish(ev, RAW)


class Relay(Service):
    """Transforms every ``raw`` event and republishes it on ``relayed``."""

    role = "relay"

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, publishes=[RELAYED], **kwargs)
        self.subscribe(RAW, self.on_raw)

    async def on_raw(self, ev: ArraysPublished) -> None:
        await self.wait_subscribers(RELAYED)
        out = {k: transform(v) for k, v in ev.arrays.items()}
        relayed = ArraysPublished(
            seq=ev.seq, policy_version=ev.policy_version, arrays=out, meta={"via": self.name}
        )
        await self.publish(relayed, RELAYED)


class Consumer(Service):
    """Checks every ``relayed`` event against the expected payload; reports when done."""

    role = "consumer"

    def __init__(self, name: str, *, count: int, size: int = 1024, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.count = count
        self.size = size
        self.next_seq = 0
        self.corrupt: list[int] = []
        self.out_of_order: list[int] = []
        self.subscribe(RELAYED, self.on_relayed)

    async def on_relayed(self, ev: ArraysPublished) -> None:
        if ev.seq != self.next_seq:
            self.out_of_order.append(ev.seq)
        self.next_seq = ev.seq + 1
        if not np.array_equal(ev.arrays["x"], transform(payload(ev.seq, self.size))):
            self.corrupt.append(ev.seq)
        self.counters["checked"] += 1
        if self.counters["checked"] == self.count:
            ok = not self.corrupt and not self.out_of_order
            await self.send_to_controller(
                ServiceReported(
                    name=self.name,
                    status="ok" if ok else "failed",
                    summary={
                        "checked": self.counters["checked"],
                        "corrupt": len(self.corrupt),
                        "out_of_order": len(self.out_of_order),
                    },
                )
            )


def demo_specs(count: int, size: int, bind: str = "tcp://127.0.0.1:0") -> list[ServiceSpec]:
    """The three-process demo graph."""
    return [
        ServiceSpec(
            name="consumer-0",
            factory="tianji.run.demo:Consumer",
            options={"count": count, "size": size},
            bind=bind,
        ),
        ServiceSpec(name="relay-0", factory="tianji.run.demo:Relay", bind=bind),
        ServiceSpec(
            name="producer-0",
            factory="tianji.run.demo:Producer",
            options={"count": count, "size": size},
            bind=bind,
        ),
    ]
