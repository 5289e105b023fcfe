"""``tianji bench scale``, fanout part: one set of weights to N subscribers, time to all.

A publisher process runs a controller and a params-like service that publishes
``ParamsPublished`` (one uint8 array of ``bytes``) on the params service's topic
(``LATEST_PARAMS``), with a shared-memory listener beside its TCP one, as ``tianji serve``
and the local launcher start services, and shares the topic on its board as the params
service does (one write per version for the subscribers on its host). N subscriber
services, packed into at most ``PROCESSES_PER_HOST`` processes per host, subscribe as
actors do (shared memory on the publisher's host, TCP from other hosts) and acknowledge
each version with the time its weights were readable in the handler (delivery, not
loading them into a model). Each size is published ``REPEATS`` times, one version at a
time: ``seconds_to_all`` is the median over versions of (last arrival - publish),
``params_bytes_sent`` the bytes the publisher put on its links per version (its
``published_bytes`` counter: a board write counts once).

Across hosts (``hosts`` > 1, root and iproute2; from a checkout: ``python
benchmarks/hosts.py scale``): the publisher's host and ``hosts - 1`` others are network
namespaces on one bridge (``benchmarks/netns.py``, a :class:`Hosts`), the subscribers
spread evenly over the other hosts, each of which runs a params relay
(:class:`~tianji.services.params.ParamsRelay`, as ``tianji serve relay`` starts it): the
publisher sends each version once per host, the relay hands it on through its board.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tianji.bench.spawn import start_json_child

if TYPE_CHECKING:
    from tianji.runtime.service import Service

__all__ = ["PROCESSES_PER_HOST", "REPEATS", "Hosts", "measure_fanout"]

log = logging.getLogger(__name__)

PROCESSES_PER_HOST = 8
REPEATS = 3
ACK = "ArraysPublished/ack"
READY_TIMEOUT = 120.0


class Hosts(Protocol):
    """Hosts simulated on this machine (``benchmarks/netns.py``'s ``Bridge``: root only)."""

    def create(self) -> None:
        """Make the hosts."""

    def destroy(self) -> None:
        """Stop what runs in them and remove them."""

    def prefix(self, host: int) -> list[str]:
        """The command prefix that runs a program on ``host``."""

    def ip(self, host: int) -> str:
        """``host``'s address."""


MakeHosts = Callable[[int], Hosts]
"""Makes ``n`` hosts (host 0 the publisher's)."""


async def _publisher(job: dict[str, Any]) -> dict[str, Any]:
    from tianji.rl.topics import LATEST_PARAMS
    from tianji.runtime.controller import Controller
    from tianji.runtime.events import ArraysPublished
    from tianji.runtime.service import Service

    bind = f"tcp://{job['host']}:0"
    ctl = Controller(bind=bind)
    ctl_task = asyncio.create_task(ctl.run())
    await ctl.wait_ready()
    acks: dict[int, list[float]] = {}
    arrived = asyncio.Event()

    async def on_ack(ev: ArraysPublished) -> None:
        acks.setdefault(ev.seq, []).append(float(ev.arrays["t"][0]))
        if len(acks[ev.seq]) >= job["subscribers"]:
            arrived.set()

    pub = Service(
        "params-0",
        bind=bind,
        local_bind="shm://" if job["shm"] else None,
        controller=ctl.address,
        publishes=[LATEST_PARAMS],
    )
    pub.subscribe(ACK, on_ack)
    pub.share_on_board(LATEST_PARAMS)  # as the params service: one copy per host
    pub_task = asyncio.create_task(pub.run())
    await pub.wait_ready()
    print(json.dumps({"controller": ctl.address}), flush=True)
    try:
        direct = job["relays"] or job["subscribers"]  # with relays: one link per host
        await asyncio.wait_for(pub.wait_subscribers(LATEST_PARAMS, direct), READY_TIMEOUT)
        await asyncio.wait_for(arrived.wait(), READY_TIMEOUT)  # every hello (seq 0) is in

        deadline = time.monotonic() + READY_TIMEOUT  # subscribers moved to their relays
        while pub.subscriber_count(LATEST_PARAMS) != direct and time.monotonic() < deadline:  # noqa: ASYNC110 - a count going down has no event
            await asyncio.sleep(0.05)
        return {"rows": await _publish_sizes(pub, job["sizes"], acks, arrived)}
    finally:
        pub.stop("bench over")
        ctl.stop("bench over")
        try:
            await asyncio.wait_for(asyncio.gather(pub_task, ctl_task), 30)
        except Exception as exc:  # the figures are in; say why a service did not end well
            log.warning("the publisher's or controller's end: %r", exc)


async def _publish_sizes(
    pub: Service, sizes: list[int], acks: dict[int, list[float]], arrived: asyncio.Event
) -> list[dict[str, Any]]:
    """Publish each size ``REPEATS`` times, one version at a time; a row per size."""
    from tianji.rl.events import ParamsPublished
    from tianji.rl.topics import LATEST_PARAMS
    from tianji.runtime.heartbeats import ServiceStat

    rows = []
    version = 0
    for size in sizes:
        weights = {"w": np.full(size, 7, np.uint8)}
        times, sent = [], []
        for _ in range(REPEATS):
            version += 1
            arrived.clear()
            before = pub.counters[ServiceStat.PUBLISHED_BYTES]
            started = time.time()
            params = ParamsPublished(policy_version=version, weights=weights)
            await pub.publish(params, LATEST_PARAMS)
            await asyncio.wait_for(arrived.wait(), READY_TIMEOUT)
            times.append(max(acks[version]) - started)
            sent.append(pub.counters[ServiceStat.PUBLISHED_BYTES] - before)
        rows.append(
            {
                "bytes": size,
                "seconds_to_all": round(statistics.median(times), 4),
                "params_bytes_sent": int(statistics.median(sent)),
            }
        )
    return rows


async def _subscribers(job: dict[str, Any]) -> dict[str, Any]:
    from tianji.rl.events import ParamsPublished
    from tianji.rl.topics import LATEST_PARAMS
    from tianji.runtime.events import ArraysPublished
    from tianji.runtime.service import Service
    from tianji.services.params import ParamsRelay

    bind = f"tcp://{job['host']}:0"
    services: list[Service] = []
    if job.get("relay"):  # this host's params relay, as `tianji serve relay` starts it
        services.append(
            ParamsRelay(
                job["relay"],
                bind=bind,
                local_bind="shm://" if job["shm"] else None,
                controller=job["controller"],
            )
        )
    for name in job["names"]:
        svc = Service(
            name,
            bind=bind,
            local_bind="shm://" if job["shm"] else None,
            controller=job["controller"],
            publishes=[ACK],
        )

        async def on_params(ev: ParamsPublished, svc: Service = svc) -> None:
            # the weights are here, readable: acknowledge (loading them into a model is
            # the actor's cost, the same whatever carried them)
            t = np.array([time.time()])
            ack = ArraysPublished(seq=ev.policy_version, policy_version=0, arrays={"t": t}, meta={})
            await svc.publish(ack, ACK)

        svc.subscribe(LATEST_PARAMS, on_params, latest_only=True)
        services.append(svc)
    tasks = [asyncio.create_task(s.run()) for s in services]

    async def hello(svc: Service) -> None:  # our acks reach the publisher from now on
        await svc.wait_subscribers(ACK, 1)
        t = np.array([time.time()])
        await svc.publish(ArraysPublished(seq=0, policy_version=0, arrays={"t": t}, meta={}), ACK)

    for svc in services:
        if not isinstance(svc, ParamsRelay):
            tasks.append(asyncio.create_task(hello(svc)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def wait_for_eof() -> None:  # the driver closes our stdin at the end
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_for_eof, daemon=True).start()
    await stop.wait()
    for s in services:
        s.stop("bench over")
    await asyncio.gather(*tasks, return_exceptions=True)
    return {}


def _worker(kind: str) -> int:
    import logging

    from tianji.runtime.loop import run

    logging.basicConfig(
        level=os.environ.get("TIANJI_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s {kind} %(levelname)s %(name)s: %(message)s",
    )

    job = json.loads(sys.stdin.readline())
    result = run((_publisher if kind == "publisher" else _subscribers)(job))
    print(json.dumps(result), flush=True)
    return 0


def _spawn(argv: list[str], job: dict[str, Any], prefix: list[str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tianji.bench.scale_fanout", *argv]
    return start_json_child(cmd, job, prefix)


def measure_fanout(
    subscribers: int, sizes: list[int], hosts: int = 1, make_hosts: MakeHosts | None = None
) -> list[dict[str, Any]]:
    """Fanout rows, one per size, for ``subscribers`` on ``hosts`` hosts (more than one:
    made by ``make_hosts``).

    Raises:
        RuntimeError: when a process fails (with its last words).
        ValueError: for several hosts without ``make_hosts``.
    """
    from tianji import transports

    if hosts > 1 and make_hosts is None:
        raise ValueError(f"hosts={hosts}: several hosts need make_hosts (benchmarks/hosts.py)")
    bridge = make_hosts(hosts) if make_hosts is not None and hosts > 1 else None
    procs: list[subprocess.Popen[str]] = []
    try:
        if bridge is not None:
            bridge.create()
        shm = "shm" in transports.names()
        sub_hosts = list(range(1, hosts)) if hosts > 1 else [0]
        relays = len(sub_hosts) if hosts > 1 else 0  # one per host of subscribers
        job = {
            "host": bridge.ip(0) if bridge is not None else "127.0.0.1",
            "subscribers": subscribers,
            "sizes": sizes,
            "shm": shm,
            "relays": relays,
        }
        pub = _spawn(["--publisher"], job, bridge.prefix(0) if bridge is not None else [])
        procs.append(pub)
        assert pub.stdout is not None
        line = pub.stdout.readline()
        if not line:
            raise RuntimeError(f"the publisher did not start: {_last_words(pub)}")
        sub_job = {"controller": json.loads(line)["controller"], "shm": shm}
        procs += _spawn_subscribers(sub_job, subscribers, sub_hosts, relays > 0, bridge)
        out, err = pub.communicate(timeout=READY_TIMEOUT * 2 + 600)
        if pub.returncode != 0:
            last = " | ".join(err.strip().splitlines()[-5:]) or f"exit {pub.returncode}"
            raise RuntimeError(f"the publisher failed: {last}")
        result = json.loads(out.strip().splitlines()[-1])
        return [
            {"part": "fanout", "subscribers": subscribers, "hosts": hosts, "relays": relays, **row}
            for row in result["rows"]
        ]
    finally:
        _end(procs)
        if bridge is not None:
            bridge.destroy()


def _spawn_subscribers(
    job: dict[str, Any],
    subscribers: int,
    sub_hosts: list[int],
    relays: bool,
    bridge: Hosts | None,
) -> list[subprocess.Popen[str]]:
    """The subscribers' processes, spread evenly over ``sub_hosts`` (at most
    ``PROCESSES_PER_HOST`` each; with ``relays``, the first on each host runs its relay)."""
    procs = []
    names = [f"actor-{i}" for i in range(subscribers)]
    by_host = {h: names[k :: len(sub_hosts)] for k, h in enumerate(sub_hosts)}
    for h, mine in by_host.items():
        host = bridge.ip(h) if bridge is not None else "127.0.0.1"
        n = min(PROCESSES_PER_HOST, len(mine))
        for p in range(n):
            part = mine[p::n]
            if part:
                sub = {"host": host, **job, "names": part}
                if relays and p == 0:
                    sub["relay"] = f"relay-{h}"
                where = bridge.prefix(h) if bridge is not None else []
                procs.append(_spawn(["--subscribers"], sub, where))
    return procs


def _end(procs: list[subprocess.Popen[str]]) -> None:
    """Close every process's stdin (the subscribers' signal to stop), then wait for them."""
    for proc in procs:
        try:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
        except OSError as exc:  # it died: its pipe is broken
            log.debug("pid %d: stdin: %r", proc.pid, exc)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired as exc:
            log.warning("%s: killing it", exc)
            proc.kill()
            proc.wait()


def _last_words(proc: subprocess.Popen[str]) -> str:
    err = proc.stderr.read() if proc.stderr is not None else ""
    lines = err.strip().splitlines()
    return " | ".join(lines[-5:]) if lines else f"exit {proc.returncode}"


if __name__ == "__main__":
    sys.exit(_worker("publisher" if "--publisher" in sys.argv else "subscribers"))
