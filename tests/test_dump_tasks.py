"""SIGUSR1's dump (:func:`tianji.runtime.loop.dump_tasks`): every task, with its awaits down
to the innermost, so a stuck service shows where it waits."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import time

from tianji.runtime.loop import dump_tasks


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


def test_the_dump_names_each_task_and_its_chain_of_awaits() -> None:
    async def main() -> str:
        gate = asyncio.Event()
        task = asyncio.create_task(_outer(gate), name="the-waiter")
        await asyncio.sleep(0)
        out = io.StringIO()
        dump_tasks("svc", out)
        gate.set()
        await task
        return out.getvalue()

    text = asyncio.run(main())
    assert text.startswith("svc: 2 tasks")
    waiter = text[text.index("task the-waiter:") :]
    assert waiter.index("_outer") < waiter.index("_inner") < waiter.index("Event.wait")


def test_sigusr1_makes_a_serving_process_write_its_tasks_and_keep_running() -> None:
    script = (
        "import asyncio, signal, sys\n"
        "from tianji.runtime.loop import dump_tasks\n"
        "async def main():\n"
        "    loop = asyncio.get_running_loop()\n"
        "    loop.add_signal_handler(signal.SIGUSR1, dump_tasks, 'svc')\n"
        "    print('ready', flush=True)\n"
        "    await asyncio.sleep(30)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(0.5)
        assert proc.poll() is None  # still running
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "svc: 1 tasks" in err and "main" in err
