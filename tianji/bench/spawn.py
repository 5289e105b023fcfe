"""Child processes of the benchmark: :func:`spawn_peer` and :class:`Peer`.

The peer (``python -m tianji.bench.peer``) gets its job as JSON on stdin, never pickle,
and prints its result as one JSON line on stdout. Leaving :func:`spawn_peer` stops the
child on every path (success, error, timeout, Ctrl-C); the child also dies with this
process (``PR_SET_PDEATHSIG``, which is why it must be spawned from the main thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from tianji.bench.measure import BenchError, BenchTimeout
from tianji.bench.peer import Job
from tianji.runtime.loop import finished_within

__all__ = [
    "ChildRun",
    "Peer",
    "kill_leftovers",
    "run_each",
    "run_json_child",
    "run_training",
    "spawn_peer",
    "start_json_child",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
STOP_TIMEOUT = 3.0  # after SIGTERM, before SIGKILL


@dataclass(frozen=True)
class ChildRun:
    """What :func:`run_json_child` got: the child's last JSON line (``result``) or why there
    is none (``error``: exit code and the last lines of its output), and its stderr."""

    result: dict[str, Any] | None
    error: str | None
    stderr: str


def run_training(config: dict[str, Any], timeout: float) -> ChildRun:
    """One tianji training run (the run config as data) in a fresh process
    (``python -m tianji.bench.train --worker``), to its end: its summary's figures."""
    cmd = [sys.executable, "-m", "tianji.bench.train", "--worker"]
    return run_json_child(cmd, json.dumps(config), timeout, tail=5)


def run_each(
    plan: Sequence[T],
    label: Callable[[T], str],
    run: Callable[[T], dict[str, Any]],
    outcome: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """``run`` every item of ``plan`` in turn and return the rows, with a progress line on
    stderr before each (``label``) and after it (the row's error or ``outcome``)."""
    rows = []
    started = time.monotonic()
    for i, item in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {label(item)} ...", file=sys.stderr, flush=True)
        row = run(item)
        rows.append(row)
        what = row.get("error") or outcome(row)
        print(f"    {what} [{time.monotonic() - started:.0f} s so far]", file=sys.stderr,
              flush=True)  # fmt: skip
    return rows


def run_json_child(cmd: list[str], stdin: str | None, timeout: float, tail: int = 6) -> ChildRun:
    """Run a benchmark child to its end (logs at WARNING) and read the JSON line it prints
    last on stdout.

    Raises:
        subprocess.TimeoutExpired: if it runs longer than ``timeout`` seconds (it is killed).
    """
    proc = subprocess.run(
        cmd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TIANJI_LOG_LEVEL": "WARNING"},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-tail:]
        return ChildRun(None, f"exit {proc.returncode}: " + " | ".join(last), proc.stderr)
    return ChildRun(json.loads(lines[-1]), None, proc.stderr)


def start_json_child(
    argv: list[str], job: dict[str, Any], prefix: list[str] | None = None
) -> subprocess.Popen[str]:
    """Start a benchmark child (``prefix`` e.g. ``ip netns exec NS``), write ``job`` as one
    JSON line to its stdin and leave stdin open (closing it is the child's signal to stop,
    by convention of the scale benchmark's workers); stdout and stderr are pipes."""
    proc = subprocess.Popen(
        [*(prefix or []), *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TIANJI_LOG_LEVEL": os.environ.get("TIANJI_BENCH_LOG", "WARNING")},
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(job) + "\n")
    proc.stdin.flush()
    return proc


class Peer:
    """A running ``tianji.bench.peer`` child (see :func:`spawn_peer`)."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr: IO[bytes]) -> None:
        self.proc = proc
        self._stderr = stderr

    def failure(self) -> str:
        """The exit code and the last line the peer wrote to stderr."""
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return f"peer exited {self.proc.returncode}: {lines[-1] if lines else '(no output)'}"

    async def guard(self, aw: Awaitable[T], timeout: float, what: str) -> T:
        """Await ``aw``, unless the peer fails or ``timeout`` seconds pass first.

        Raises:
            BenchError: naming ``what`` and the peer's last words or the timeout.
        """
        task = asyncio.ensure_future(aw)
        exited = asyncio.ensure_future(self.proc.wait())
        try:
            done, _ = await asyncio.wait(
                {task, exited}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if task in done and task.exception() is not None:
                # a broken link usually means the peer died: wait a moment for its reason
                await finished_within(asyncio.shield(exited), 1.0)
            if exited.done() and self.proc.returncode != 0:
                raise BenchError(f"{what}: {self.failure()}")
            if task in done:
                return task.result()
            if not done:
                raise BenchTimeout(f"{what} timed out after {timeout:g} s")
            return await asyncio.wait_for(task, timeout)  # the peer is done: let the task end
        finally:
            for fut in (task, exited):
                fut.cancel()

    async def result(self, timeout: float) -> Any:
        """The JSON document the peer printed, once it exited.

        Raises:
            BenchError: if it failed, printed no JSON or took longer than ``timeout``.
        """
        assert self.proc.stdout is not None
        try:
            out = await asyncio.wait_for(self.proc.stdout.read(), timeout)
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            raise BenchTimeout(f"the peer gave no result within {timeout:g} s") from None
        if self.proc.returncode != 0:
            raise BenchError(self.failure())
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            raise BenchError(f"the peer printed {out[-200:]!r}, not a JSON result") from None


@contextlib.asynccontextmanager
async def spawn_peer(job: Job) -> AsyncIterator[Peer]:
    """Start ``python -m tianji.bench.peer`` with ``job`` as JSON on its stdin.

    The child dies with this process (``PR_SET_PDEATHSIG``, set by the peer); leaving the
    context terminates it if it still runs (then kills it after :data:`STOP_TIMEOUT`).
    """
    with tempfile.TemporaryFile() as stderr:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tianji.bench.peer", "--parent", str(os.getpid())),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(job.to_json()).encode())
            try:
                await proc.stdin.drain()
            except ConnectionError as exc:  # a dead peer is reported by guard()
                log.debug("peer pid %d: stdin: %r", proc.pid, exc)
            proc.stdin.close()
            yield Peer(proc, stderr)
        finally:
            await _stop(proc)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    try:
        proc.terminate()
    except ProcessLookupError as exc:  # it ended meanwhile
        log.debug("peer pid %d: %r", proc.pid, exc)
    if not await finished_within(proc.wait(), STOP_TIMEOUT):
        log.warning("peer pid %d did not stop within %g s: killed", proc.pid, STOP_TIMEOUT)
        try:
            proc.kill()
        except ProcessLookupError as exc:
            log.debug("peer pid %d: %r", proc.pid, exc)
        await proc.wait()


def kill_leftovers(procs: Sequence[subprocess.Popen[Any]]) -> None:
    """Kill and reap every process of ``procs`` still running (after one of them failed,
    its peers must not be left waiting for it)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
