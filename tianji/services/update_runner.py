"""Where a learner's updates run: on the event loop's thread, or in a worker thread.

A worker thread keeps the loop answering (heartbeats, control commands, batches) during a
long update: an on-policy update is epochs over a whole rollout, seconds with a CNN. But a
short update pays for the hand-off, and torch's intra-op threads are an OpenMP team per
calling thread: a 2-thread SAC update on HalfCheetah (256x256 networks, batches of 256)
took nearly twice as long in a worker thread of the learner service as on its loop's thread
(the learner's ``update_s`` gauge over its updates; ``docs/benchmarks.md``, "Continuous
control").

So an off-policy learner (one update = one minibatch step) without data-parallel peers runs
its updates inline while they take less than ``inline_below_ms`` (the mean of the last
eight; the first three, which build optimizers, aside) and none takes a second; past that
they move to a worker thread, and they come back once the mean of the last eight there is
under half the limit (each move said in the log). A single hiccup (a collection, a busy
machine) that took one update past a second therefore no longer costs the rest of the run:
in a 20-minute HalfCheetah run one did, and the learner made 70 updates/s instead of the
107 it makes inline. K > 1 learners always use the thread: their gradient all-reduce waits
for messages the loop receives.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["UpdateRunner"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class UpdateRunner:
    """Runs a learner's updates inline or in one worker thread of its own.

    Usage::

        runner = UpdateRunner(name, threads=2, inline=True, inline_below_ms=100.0)
        result = await runner.run(algo.update, batch)
        runner.close()
    """

    def __init__(self, name: str, *, threads: int, inline: bool, inline_below_ms: float) -> None:
        import torch

        self.name, self.threads = name, threads
        self.allowed = inline and inline_below_ms > 0
        """Updates may run inline at all (off-policy, no data-parallel peers)."""
        self.inline = self.allowed
        self.moves = 0  # between the loop's thread and the worker thread, either way
        self.limit_s = inline_below_ms / 1000.0
        # the loop's thread gets the intra-op threads only while it runs the updates
        torch.set_num_threads(threads if self.inline else 1)
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self.recent: collections.deque[float] = collections.deque(maxlen=self.WINDOW)
        self.seen = 0  # updates run inline

    WINDOW = 8
    """Updates whose mean time decides (the last ones)."""
    MOST_S = 1.0
    """An update that takes longer moves them at once (the loop must answer heartbeats)."""
    FIRST = 3
    """Updates not judged by their time: the first ones build optimizers and buffers."""

    async def run(self, fn: Callable[[Any], T], arg: Any) -> T:
        """``fn(arg)`` inline or in the worker thread (see the module docstring)."""
        if not self.inline:
            loop = asyncio.get_running_loop()
            started = time.perf_counter()
            result = await loop.run_in_executor(self._thread(), fn, arg)
            if self.allowed:
                self._judge_threaded(time.perf_counter() - started)
            return result
        started = time.perf_counter()
        result = fn(arg)
        took = time.perf_counter() - started
        self.seen += 1
        if self.seen <= self.FIRST:  # they build optimizers and buffers: not judged
            return result
        self.recent.append(took)
        # judged on the mean of the last few: one slow update (a checkpoint, a collection, a
        # busy machine) does not move them for good; one that would starve the heartbeats does
        mean = sum(self.recent) / len(self.recent)
        full = len(self.recent) == self.WINDOW
        if (full and mean > self.limit_s) or took > self.MOST_S:
            self._move_to_thread(max(mean, took))
        return result

    def _judge_threaded(self, took: float) -> None:
        """Back inline once the last few updates in the thread are short again."""
        self.recent.append(took)
        mean = sum(self.recent) / len(self.recent)
        if len(self.recent) == self.WINDOW and mean < self.limit_s / 2:
            import torch

            self.inline = True
            self.moves += 1
            self.recent.clear()
            torch.set_num_threads(self.threads)
            log.info(
                "%s: updates take %.0f ms again (< half of inline_below_ms %.0f): they run "
                "on the loop's thread again",
                self.name, mean * 1000, self.limit_s * 1000,
            )  # fmt: skip

    def _move_to_thread(self, took: float) -> None:
        import torch

        self.inline = False
        self.moves += 1
        self.recent.clear()
        torch.set_num_threads(1)
        log.info(
            "%s: updates took %.0f ms (> inline_below_ms %.0f, or one over a second): they "
            "run in a worker thread until they are short again",
            self.name,
            took * 1000,
            self.limit_s * 1000,
        )

    def _thread(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._worker is None:
            import torch

            self._worker = concurrent.futures.ThreadPoolExecutor(
                1, f"{self.name}-update", initializer=torch.set_num_threads,
                initargs=(self.threads,),
            )  # fmt: skip
        return self._worker

    def close(self) -> None:
        """Let the worker thread end once its update (if any) is done."""
        if self._worker is not None:
            self._worker.shutdown(wait=False)
