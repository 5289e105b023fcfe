"""Where a receiver's time goes (issue 19; not part of CI).

    python benchmarks/profile_receiver.py [tcp|shm] [PAYLOAD_BYTES] [--seconds 4] [--top 14]
        [--no-profile]

A child process sends ``ArraysPublished`` events with a PAYLOAD_BYTES array for
``--seconds`` as ``tianji bench transport`` does (:func:`tianji.bench.transport.send_events`);
this process receives and checks them as the bench's peer does
(:func:`tianji.bench.peer.receive_events`) under ``cProfile``, then prints the rate and the
functions with the most time of their own. Run it from outside the checkout (``cd /tmp``)
to profile the installed tianji rather than the source tree. ``--no-profile`` measures
the rate without cProfile's overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys

import tianji.transports

from tianji.bench.peer import receive_events
from tianji.runtime.core import Limits
from tianji.runtime.loop import run

LISTEN = {"tcp": "tcp://127.0.0.1:0", "shm": "shm://"}
SENDER = """
import sys
import numpy as np
import tianji.transports
from tianji.bench.transport import send_events
from tianji.runtime.core import Limits
from tianji.runtime.loop import run

async def main():
    address, size, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    conn = await tianji.transports.for_address(address).connect(address, limits=Limits())
    print(await send_events(conn, np.zeros(size, np.uint8), seconds))
    await conn.aclose()

run(main())
"""


async def profile(scheme: str, size: int, seconds: float, top: int, enabled: bool) -> None:
    listener = await tianji.transports.for_address(LISTEN[scheme]).listen(
        LISTEN[scheme], limits=Limits()
    )
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SENDER, listener.address, str(size), str(seconds),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    conn = await listener.accept()
    prof = cProfile.Profile()
    if enabled:
        prof.enable()
    got = await receive_events(conn, size, 0.5)
    prof.disable()
    sent = (await child.communicate())[0].decode().strip()
    await listener.aclose()
    how = "profiled" if enabled else "not profiled"
    print(f"{scheme} {size} B: {got.msgs_per_s:,.0f} msg/s received ({how}); sent {sent}")
    if enabled:
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scheme", nargs="?", default="tcp", choices=sorted(LISTEN))
    p.add_argument("size", nargs="?", type=int, default=100)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--no-profile", action="store_true", help="measure without cProfile")
    args = p.parse_args()
    run(profile(args.scheme, args.size, args.seconds, args.top, not args.no_profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
