"""A custom pub/sub graph: a sensor publishes arrays, a smoother averages them, a printer prints.

Run it all in one process over the in-process transport::

    python examples/pubsub.py

or as three processes over TCP through the launcher (the services are the same classes)::

    python examples/pubsub.py --processes
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import numpy as np

from tianji.launch.local import LocalLauncher, print_progress, run_local
from tianji.launch.spec import ServiceSpec
from tianji.runtime.controller import Controller
from tianji.runtime.events import ArraysPublished, ServiceReported, topic
from tianji.runtime.loop import run
from tianji.runtime.service import Service

RAW = topic(ArraysPublished, "raw")
SMOOTH = topic(ArraysPublished, "smooth")


class Sensor(Service):
    """Publishes ``count`` noisy readings."""

    role = "sensor"

    def __init__(self, name: str, *, count: int = 200, **kw: Any) -> None:
        super().__init__(name, publishes=[RAW], **kw)
        self.count = count

    async def main(self) -> None:
        await self.wait_subscribers(RAW)
        rng = np.random.default_rng(0)
        for seq in range(self.count):
            reading = np.sin(seq / 10) + rng.normal(0, 0.3, size=8).astype(np.float32)
            ev = ArraysPublished(seq=seq, policy_version=0, arrays={"x": reading}, meta={})
            await self.publish(ev, RAW)


class Smoother(Service):
    """Publishes an exponential moving average of what the sensor sends."""

    role = "smoother"

    def __init__(self, name: str, *, alpha: float = 0.1, **kw: Any) -> None:
        super().__init__(name, publishes=[SMOOTH], **kw)
        self.alpha = alpha
        self.average: np.ndarray | None = None
        self.subscribe(RAW, self.on_raw)

    async def on_raw(self, ev: ArraysPublished) -> None:
        x = ev.arrays["x"]
        self.average = (
            x if self.average is None else (1 - self.alpha) * self.average + self.alpha * x
        )
        await self.wait_subscribers(SMOOTH)
        smoothed = ArraysPublished(
            seq=ev.seq, policy_version=0, arrays={"x": self.average}, meta={}
        )
        await self.publish(smoothed, SMOOTH)


class Printer(Service):
    """Prints every 50th smoothed reading; reports to the controller after ``count``."""

    role = "printer"

    def __init__(self, name: str, *, count: int = 200, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.count = count
        self.subscribe(SMOOTH, self.on_smooth)

    async def on_smooth(self, ev: ArraysPublished) -> None:
        if ev.seq % 50 == 0:
            print(f"{self.name}: reading {ev.seq}: mean {float(ev.arrays['x'].mean()):+.3f}")
        if ev.seq + 1 == self.count:
            report = ServiceReported(name=self.name, status="ok", summary={"seen": self.count})
            await self.send_to_controller(report)


async def in_one_process(count: int) -> None:
    controller = Controller(bind="inproc://")
    ctl = asyncio.create_task(controller.run())
    await controller.wait_ready()
    kw: dict[str, Any] = {"bind": "inproc://", "controller": controller.address}
    services = [
        Printer("printer", count=count, **kw),
        Smoother("smoother", **kw),
        Sensor("sensor", count=count, **kw),
    ]
    tasks = [asyncio.create_task(s.run()) for s in services]
    await controller.wait_until(lambda c: "printer" in c.reports, timeout=60)
    await controller.shutdown_all("done")
    await asyncio.gather(*tasks)
    controller.stop("done")
    await ctl


def in_processes(count: int) -> None:
    here = __file__
    specs = [
        ServiceSpec(name="printer", factory=f"{here}:Printer", options={"count": count}),
        ServiceSpec(name="smoother", factory=f"{here}:Smoother"),
        ServiceSpec(name="sensor", factory=f"{here}:Sensor", options={"count": count}),
    ]
    launcher = LocalLauncher(
        specs, until=lambda c: "printer" in c.reports, timeout=120, progress=print_progress()
    )
    result = run_local(launcher)
    print(f"{result.reason}: {result.reports['printer'].summary}, exit codes {result.exit_codes}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", action="store_true", help="one process per service")
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    if args.processes:
        in_processes(args.count)
    else:
        run(in_one_process(args.count))
