"""Child-process entry point: ``python -m tianji.launch.worker --run RUN_ID --name NAME``.

The service spec arrives as JSON on stdin (never pickle). The worker asks the kernel to
SIGTERM it when its parent dies (Linux ``PR_SET_PDEATHSIG``), turns SIGTERM/SIGINT into a
graceful stop, runs the service and exits 0 on a clean stop, 1 on failure, 2 when the
controller refused it (another run config: ``--digest``, see ``tianji serve``). SIGUSR1
writes what each of its tasks waits on to stderr
(:func:`~tianji.runtime.loop.dump_tasks`).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
import sys

from tianji.launch.spec import ServiceSpec, build_service
from tianji.runtime.controller import REFUSED
from tianji.runtime.loop import dump_tasks, run
from tianji.runtime.service import Service

log = logging.getLogger("tianji.worker")
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError) as exc:
            log.debug("prctl unavailable (%r); relying on the controller link to notice", exc)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(1)


async def _serve(service: Service) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop, f"signal {signal.Signals(sig).name}")
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks, service.name)
    await service.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tianji.launch.worker")
    parser.add_argument("--run", required=True, help="run id (also marks the process)")
    parser.add_argument("--name", required=True, help="service name")
    parser.add_argument("--parent", type=int, required=True, help="launcher pid")
    parser.add_argument("--digest", default="", help="the run config's digest (tianji serve)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("TIANJI_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s",
    )
    _die_with_parent(args.parent)
    spec = ServiceSpec.from_json(json.loads(sys.stdin.read()))
    service = build_service(spec)
    service.run_digest = args.digest
    try:
        run(_serve(service))
    except Exception:
        log.exception("service %s failed", args.name)
        return 1
    if service.stop_reason.startswith(REFUSED):
        log.error("%s: %s", args.name, service.stop_reason)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
