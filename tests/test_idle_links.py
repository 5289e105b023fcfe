"""An idle link costs no CPU: no polling, no timers, on every inter-process transport."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tianji import transports
from tianji.testing import LISTEN_ADDRESSES

pytestmark = pytest.mark.slow

PUBLISHER = """
import asyncio, sys
from tianji.runtime.events import ArraysPublished
from tianji.runtime.loop import run
from tianji.runtime.service import Service

async def main():
    svc = Service("idle-pub", bind=sys.argv[1], publishes=[ArraysPublished])
    task = asyncio.create_task(svc.run())
    await svc.wait_ready()
    print(svc.address, flush=True)
    await svc.wait_subscribers(ArraysPublished)
    print("linked", flush=True)
    await task

run(main())
"""

SUBSCRIBER = """
import asyncio, sys
from tianji.runtime.events import ArraysPublished
from tianji.runtime.loop import run
from tianji.runtime.service import Service

async def main():
    svc = Service("idle-sub", bind=sys.argv[1])
    async def ignore(ev): pass
    svc.subscribe(ArraysPublished, ignore)
    task = asyncio.create_task(svc.run())
    await svc.wait_ready()
    svc.add_publisher(ArraysPublished, sys.argv[2])
    await task

run(main())
"""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def available(scheme: str) -> bool:
    try:
        transports.get(scheme)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("scheme", ["tcp", "shm"])
def test_two_linked_services_with_no_traffic_use_under_2_percent_cpu(scheme: str) -> None:
    if not available(scheme):
        pytest.skip(f"transport {scheme} is not available")
    bind = LISTEN_ADDRESSES[scheme]
    pub = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, bind], stdout=subprocess.PIPE, text=True
    )
    sub = None
    try:
        assert pub.stdout is not None
        address = pub.stdout.readline().strip()
        sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, bind, address])
        assert pub.stdout.readline().strip() == "linked"
        time.sleep(0.5)  # let start-up work settle
        before = {p.pid: cpu_seconds(p.pid) for p in (pub, sub)}
        window = 3.0  # three heartbeat intervals
        time.sleep(window)
        used = {pid: (cpu_seconds(pid) - t0) / window for pid, t0 in before.items()}
        assert all(share < 0.02 for share in used.values()), used
    finally:
        for proc in (pub, sub):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)
