"""Child processes of the shared-memory transport tests (``test_shm_transport.py``): scripts
that connect from another process, and helpers to start, reap and measure them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

# --------------------------------------------------------------------------- child processes

CHILD_PRELUDE = """
import asyncio, sys
from tianji import transports
from tianji.runtime.core import Limits
from tianji.runtime.loop import run
"""

KILLED_CHILD = (
    CHILD_PRELUDE
    + """
async def main(address):
    conn = await transports.for_address(address).connect(address, limits=Limits())
    for seq in range(5):
        await conn.send([b"msg", seq.to_bytes(4, "little") * 1000])
    print("sent", flush=True)
    await asyncio.Event().wait()   # hold the link until killed

run(main(sys.argv[1]))
"""
)

COUNTING_CHILD = (
    CHILD_PRELUDE
    + """
async def main(address, count):
    conn = await transports.for_address(address).connect(address, limits=Limits())
    total = 0
    for seq in range(count):
        frames = await conn.recv()
        assert int.from_bytes(frames[0], "little") == seq, (bytes(frames[0]), seq)
        assert frames[1][-1] == seq % 251
        total += sum(f.nbytes for f in frames)
    await conn.send([count.to_bytes(8, "little"), total.to_bytes(8, "little")])
    await conn.aclose()

run(main(sys.argv[1], int(sys.argv[2])))
"""
)

IDLE_CHILD = (
    CHILD_PRELUDE
    + """
async def main(address):
    conn = await transports.for_address(address).connect(address, limits=Limits())
    await conn.send([b"connected"])
    try:
        await conn.recv()               # idle until the parent says goodbye
    except Exception:
        pass
    await conn.aclose()

run(main(sys.argv[1]))
"""
)


async def spawn(script: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdout=asyncio.subprocess.PIPE
    )


async def reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
