"""The arithmetic behind ``[recovery]``'s default restart intensity (not part of CI).

    python benchmarks/restart_intensity.py [--limits 3-7] [--periods 30,40,50,60,70,80,90]
                                           [--every 10,9,8,7] [--services 5] [--hours 1]
                                           [--startup 0.5] [--crash-startup 0.5,2,3.5]
                                           [--simulate RUNS] [--json PATH]

Two questions for each (N restarts within T seconds):

* **chaos**: an outside process kills a random *running* service every ``--every`` seconds
  (as ``tianji bench chaos`` does: a service that is down waiting for its restart is not
  picked). What is the chance that some service is refused a restart within ``--hours``?
  Computed exactly for one service by dynamic programming over its state at each kill
  (the restart times inside the window, the backoff's quick-death count, when it is back)
  with the launcher's own :func:`~tianji.launch.restarts.restart_delay` and
  :class:`~tianji.launch.restarts.RestartWindow`; the service is picked with probability
  ``1/services`` while it runs (``1/(services - 1)`` for the pessimistic column: one other
  service always down), and the run's chance is at most ``services`` times that (union
  bound). ``--startup`` is the seconds from a restart's spawn until the service runs again
  (shorter is worse here: it is back to be killed sooner). A chance of exactly 0 means no
  sequence of kills can do it: the backoff keeps the service down too long.
* with ``--simulate RUNS``, the same chance from RUNS simulated runs of all the services
  (a check of the one-service model and the union bound);
* **crash loop**: a service that dies ``--crash-startup`` seconds after every start. After
  how many seconds from its first death is it stopped (the death that finds N restarts
  within T), if ever?
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import random
import sys
from pathlib import Path

from tianji.launch.restarts import RestartPolicy, RestartWindow, restart_delay

# A service's state at a kill tick: the ages (in ticks) of its restarts within the window,
# its backoff's quick-death count, and the seconds from this tick to its incarnation's
# spawn (negative: spawned that long ago; it runs once spawned ``startup`` seconds ago).
State = tuple[tuple[int, ...], int, float]


def chaos_failure(
    limit: int, period: float, p: float, every: float, ticks: int, startup: float
) -> float:
    """The chance that one service, killed with probability ``p`` at each tick it runs, is
    refused a restart within ``ticks`` kills ``every`` seconds apart (module docstring)."""
    policy = RestartPolicy(limit=lambda s: limit, period=period)
    oldest = -max(policy.stable_after, startup)  # lived longer: all alike

    @functools.cache
    def admitted(ages: tuple[int, ...]) -> bool:  # the launcher's own window decides
        window = RestartWindow(period)
        window.times.extend(sorted(-a * every for a in ages))
        return window.admit(0.0, limit)

    @functools.cache
    def aged(ages: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(a + 1 for a in ages if (a + 1) * every < period)

    dist: dict[State, float] = {((), 0, oldest): 1.0}
    failed = 0.0
    for _ in range(ticks):
        nxt: dict[State, float] = collections.defaultdict(float)
        for (ages, quick, spawn), mass in dist.items():
            later = max(spawn - every, oldest)
            if spawn > -startup:  # not running yet: chaos does not pick it
                nxt[(aged(ages), quick, later)] += mass
                continue
            nxt[(aged(ages), quick, later)] += mass * (1 - p)
            if not admitted(ages):
                failed += mass * p
                continue
            delay, quick_next = restart_delay(policy, -spawn, quick)
            nxt[(aged((0, *ages)), min(quick_next, 5), delay - every)] += mass * p
        dist = nxt
    return failed


def crash_loop_stop(limit: int, period: float, startup: float) -> float | None:
    """Seconds from a crash-looping service's first death until it is refused a restart
    (``None``: never, the backoff keeps it under the limit)."""
    policy = RestartPolicy(limit=lambda s: limit, period=period)
    window = RestartWindow(period)
    now, quick = 0.0, 0
    for _ in range(10_000):
        if not window.admit(now, limit):
            return now
        delay, quick = restart_delay(policy, startup, quick)
        now += delay + startup
    return None


def simulated_failure(
    limit: int, period: float, services: int, every: float, hours: float, startup: float,
    runs: int, seed: int = 0,
) -> float:  # fmt: skip
    """The share of ``runs`` simulated runs of all ``services`` in which a restart was
    refused: the check of :func:`chaos_failure`'s one-service model and union bound."""
    rng = random.Random(seed)
    policy = RestartPolicy(limit=lambda s: limit, period=period)
    failed = 0
    for _ in range(runs):
        windows = [RestartWindow(period) for _ in range(services)]
        quick, spawned = [0] * services, [-1e9] * services
        for tick in range(int(hours * 3600 / every)):
            now = tick * every
            running = [i for i in range(services) if now - spawned[i] >= startup]
            if not running:
                continue
            victim = rng.choice(running)
            if not windows[victim].admit(now, limit):
                failed += 1
                break
            delay, quick[victim] = restart_delay(policy, now - spawned[victim], quick[victim])
            spawned[victim] = now + delay
    return failed / runs


def _ints(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="3-7", help="N values (3-7 or 4,5,6)")
    parser.add_argument("--periods", default="30,40,50,60,70,80,90", help="T values, s")
    parser.add_argument("--every", default="10,9,8,7", help="seconds between kills")
    parser.add_argument("--services", type=int, default=5, help="services chaos may kill (5)")
    parser.add_argument("--hours", type=float, default=1.0, help="length of the run (1)")
    parser.add_argument("--startup", type=float, default=0.5, help="to run again, s (0.5)")
    parser.add_argument(
        "--crash-startup", default="0.5,2,3.5", help="a crash loop's life per start, s"
    )
    parser.add_argument(
        "--simulate", type=int, default=0, metavar="RUNS", help="also simulate RUNS runs"
    )
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args(argv)
    k = args.services
    crash = _floats(args.crash_startup)
    rows = []
    head = " | ".join(f"crash loop ({c:g} s) stopped after s" for c in crash)
    print(f"| N | T s | kill every s | P(run stops), p=1/k | p=1/(k-1) | {head} |")
    print("|---|---|---|---|---|" + "---|" * len(crash))
    for limit in _ints(args.limits):
        for period in _floats(args.periods):
            stops = [crash_loop_stop(limit, period, c) for c in crash]
            shown = " | ".join("never" if x is None else f"{x:.1f}" for x in stops)
            for every in _floats(args.every):
                ticks = int(args.hours * 3600 / every)
                nominal = k * chaos_failure(limit, period, 1 / k, every, ticks, args.startup)
                worst = k * chaos_failure(limit, period, 1 / (k - 1), every, ticks, args.startup)
                row = {
                    "limit": limit, "period_s": period, "kill_every_s": every,
                    "p_stop_bound": nominal, "p_stop_bound_pessimistic": worst,
                    "crash_loop_stopped_s": dict(zip(map(str, crash), stops, strict=True)),
                }  # fmt: skip
                cells = f"{limit} | {period:g} | {every:g} | {nominal:.2g} | {worst:.2g}"
                if args.simulate:
                    row["p_stop_simulated"] = simulated = simulated_failure(
                        limit, period, k, every, args.hours, args.startup, args.simulate
                    )
                    cells += f" (simulated {simulated:.2g})"
                rows.append(row)
                print(f"| {cells} | {shown} |")
    if args.json is not None:
        setup = {key: value for key, value in vars(args).items() if key != "json"}
        args.json.write_text(json.dumps({"setup": setup, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
