"""Where a learner's updates run: short off-policy ones on the loop's thread, long ones in a
worker thread of their own; one slow update does not move them, a run of slow ones does."""

from __future__ import annotations

import asyncio
import threading
import time

from tianji.services.update_runner import UpdateRunner


def thread_of(seconds: float) -> str:
    time.sleep(seconds)
    return threading.current_thread().name


def run_all(runner: UpdateRunner, durations: list[float]) -> list[str]:
    async def scenario() -> list[str]:
        return [await runner.run(thread_of, d) for d in durations]

    try:
        return asyncio.run(scenario())
    finally:
        runner.close()


def test_short_updates_run_on_the_loops_thread_and_one_slow_update_does_not_move_them() -> None:
    runner = UpdateRunner("learner-0", threads=1, inline=True, inline_below_ms=20.0)
    names = run_all(runner, [0.05] * 3 + [0.0] * 7 + [0.05] + [0.0] * 10)
    assert set(names) == {"MainThread"} and runner.inline


def test_a_run_of_slow_updates_moves_them_to_one_worker_thread_while_they_stay_slow() -> None:
    runner = UpdateRunner("learner-0", threads=1, inline=True, inline_below_ms=5.0)
    names = run_all(runner, [0.0] * 3 + [0.01] * 8 + [0.01] * 12)
    assert names[:11] == ["MainThread"] * 11  # judged once eight are in
    assert len(set(names[11:])) == 1 and names[11].startswith("learner-0-update")
    assert not runner.inline and runner.moves == 1


def test_one_update_long_enough_to_starve_the_heartbeats_moves_them_until_short_again() -> None:
    runner = UpdateRunner("learner-0", threads=1, inline=True, inline_below_ms=100.0)
    runner.MOST_S = 0.05
    names = run_all(runner, [0.0] * 3 + [0.08] + [0.0] * 8 + [0.0] * 3)
    assert names[3] == "MainThread" and names[4].startswith("learner-0-update")
    # eight short updates in the thread (mean under half the limit) bring them back
    assert all(n.startswith("learner-0-update") for n in names[4:12])
    assert names[12:] == ["MainThread"] * 3 and runner.inline and runner.moves == 2


def test_updates_between_half_the_limit_and_the_limit_stay_where_they_are() -> None:
    runner = UpdateRunner("learner-0", threads=1, inline=True, inline_below_ms=20.0)
    runner.MOST_S = 0.05
    names = run_all(runner, [0.0] * 3 + [0.08] + [0.015] * 12)  # 15 ms: not under 10
    assert all(n.startswith("learner-0-update") for n in names[4:]) and runner.moves == 1


def test_on_policy_or_data_parallel_learners_always_use_the_thread() -> None:
    runner = UpdateRunner("learner-1", threads=1, inline=False, inline_below_ms=100.0)
    names = run_all(runner, [0.0, 0.0])
    assert all(n.startswith("learner-1-update") for n in names)
