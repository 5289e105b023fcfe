"""The report of ``tianji bench train``: per (algorithm, system) medians and spreads, the
ratios the targets name, and the markdown tables (pure: runs in, figures out).

A run is a dict as :func:`tianji.bench.train.run_bench` collects them: the summary keys of
:data:`tianji.bench.train.KEYS` plus ``system``, ``algorithm``, ``seed``, ``actors`` and
``launch_to_target_s``. The peer's runs (:data:`PEER`, Stable-Baselines3, run from a
checkout by ``python benchmarks/peers.py train``) have no actors and no waste columns.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["PEER", "SYSTEMS", "aggregate", "markdown", "waste_and_waits"]

SYSTEMS = ("relaxed", "sync", "unbalanced")
"""tianji's systems (controller modes), each run by ``tianji bench train``."""
PEER = "sb3"
"""The peer the reports compare with (``time_relaxed_over_sb3``): Stable-Baselines3."""
WASTE_KEYS = ("stale_pct", "evicted_pct", "actor_pause_s", "learner_idle_s", "learner_update_s")
"""Per run (tianji only): see :func:`waste_and_waits`."""


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def waste_and_waits(summary: dict[str, Any]) -> dict[str, float | None]:
    """Where a tianji run spent its samples and its time, from its summary: stale and
    evicted samples (% of those produced), actor pause (s, mean per actor), learner idle
    (waiting for a batch or for the controller's consumption grant) and busy (in updates)
    seconds."""
    acc = summary.get("accounting") or {}
    ctl = summary.get("controller") or {}
    produced = acc.get("produced") or 0
    dropped = acc.get("dropped") or {}

    def pct(reason: str) -> float | None:
        return round(100.0 * dropped.get(reason, 0) / produced, 2) if produced else None

    pauses = list((ctl.get("pause_s") or {}).values())
    return {
        "stale_pct": pct("stale"),
        "evicted_pct": pct("evicted"),
        "actor_pause_s": round(statistics.mean(pauses), 2) if pauses else None,
        "learner_idle_s": (
            round(ctl.get("learner_idle_s", 0.0) + ctl.get("learner_wait_s", 0.0), 3)
            if "learner_idle_s" in ctl
            else None
        ),
        "learner_update_s": ctl.get("learner_update_s"),
    }


def _cell_key(algo: str, system: str, actors: int | None, several: bool) -> str:
    """``algo/system``, and ``/actors`` when the report has several actor counts (SB3,
    which has no actors, keeps one cell)."""
    return f"{algo}/{system}" + (f"/{actors}" if several and system != PEER else "")


def _cell(runs: list[dict[str, Any]], actors: int | None) -> dict[str, Any]:
    """One cell's medians and spreads over its ``runs``.

    A run that missed the target counts as ``inf`` time (so the median is ``None`` when
    most runs missed); spreads are over the runs that reached it.
    """
    ok = [r for r in runs if r.get("launch_to_target_s") is not None]
    times = [r["launch_to_target_s"] for r in ok]
    censored = sorted(times + [float("inf")] * (len(runs) - len(ok)))
    median_time = statistics.median(censored)
    rates = [r["env_steps_per_s_running"] for r in runs if r.get("env_steps_per_s_running")]
    finals = [r["final_return"] for r in runs if r.get("final_return") is not None]
    return {
        "actors": actors,
        "runs": len(runs),
        "reached": len(ok),
        "errors": [r["error"] for r in runs if "error" in r],
        "time_to_target_median_s": None if median_time == float("inf") else median_time,
        "time_to_target_range_s": [min(times), max(times)] if times else None,
        "steps_to_target_median": _median([r["env_steps_to_target"] for r in ok]),
        "env_steps_per_s_median": _median(rates),
        "final_return_median": _median(finals),
        **{k: _median([r[k] for r in runs if r.get(k) is not None]) for k in WASTE_KEYS},
    }


def aggregate(results: list[dict[str, Any]], max_seconds: float) -> dict[str, Any]:
    """Per (algorithm, system): medians and spreads (:func:`_cell`); then the ratios the
    targets name."""
    cells: dict[str, dict[str, Any]] = {}
    counts = sorted({r["actors"] for r in results if r.get("actors") is not None})
    several = len(counts) > 1
    algos = sorted({r["algorithm"] for r in results})
    groups = [
        (algo, system, n)
        for algo in algos
        for n in (counts or [None])
        for system in (*SYSTEMS, PEER)
        if not (several and system == PEER and n != counts[0])  # SB3 has no actors
    ]
    for algo, system, n in groups:
        runs = [
            r
            for r in results
            if r["algorithm"] == algo
            and r["system"] == system
            and (system == PEER or n is None or r.get("actors") == n)
        ]
        if runs:
            cells[_cell_key(algo, system, n, several)] = _cell(runs, None if system == PEER else n)

    def ratio(algo: str, a: str, b: str, key: str, n: int | None) -> float | None:
        x = cells.get(_cell_key(algo, a, n, several), {}).get(key)
        y = cells.get(_cell_key(algo, b, n, several), {}).get(key)
        return round(x / y, 3) if x is not None and y else None

    time, rate = "time_to_target_median_s", "env_steps_per_s_median"
    ratios = {
        algo + (f"/{n}" if several else ""): {
            "time_relaxed_over_sb3": ratio(algo, "relaxed", PEER, time, n),
            "time_relaxed_over_sync": ratio(algo, "relaxed", "sync", time, n),
            "steps_per_s_relaxed_over_sync": ratio(algo, "relaxed", "sync", rate, n),
            "time_unbalanced_over_relaxed": ratio(algo, "unbalanced", "relaxed", time, n),
        }
        for algo in algos
        for n in (counts or [None])
    }
    return {"cells": cells, "ratios": ratios, "max_seconds": max_seconds}


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown tables: time to target, the ratios, waste and waiting."""
    agg = report["aggregate"]
    lines = [
        "| algorithm | system | actors | reached | time to target from launch, median "
        "(range) s | env steps to target | env steps/s | final return |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, c in agg["cells"].items():
        algo, system = key.split("/")[:2]
        spread = c["time_to_target_range_s"]
        span = f" ({spread[0]:.1f}-{spread[1]:.1f})" if spread else ""
        lines.append(
            f"| {algo} | {system} | {_fmt(c.get('actors'), 'd')} | {c['reached']}/{c['runs']} "
            f"| {_fmt(c['time_to_target_median_s'])}{span} "
            f"| {_fmt(c['steps_to_target_median'], ',.0f')} "
            f"| {_fmt(c['env_steps_per_s_median'], ',.0f')} "
            f"| {_fmt(c['final_return_median'])} |"
        )
    lines += [
        "",
        "| algorithm | relaxed/SB3 time | relaxed/sync time | relaxed/sync steps/s "
        "| unbalanced/relaxed time |",
        "| --- | --- | --- | --- | --- |",
    ]
    for algo, r in agg["ratios"].items():
        lines.append(
            f"| {algo} | {_fmt(r['time_relaxed_over_sb3'], '.2f')} "
            f"| {_fmt(r['time_relaxed_over_sync'], '.2f')} "
            f"| {_fmt(r['steps_per_s_relaxed_over_sync'], '.2f')} "
            f"| {_fmt(r['time_unbalanced_over_relaxed'], '.2f')} |"
        )
    lines += [
        "",
        "| algorithm | system | actors | stale % | evicted % | actor pause s (mean) "
        "| learner idle s | learner busy s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, c in agg["cells"].items():
        algo, system = key.split("/")[:2]
        if system == PEER:
            continue
        lines.append(
            f"| {algo} | {system} | {_fmt(c.get('actors'), 'd')} "
            f"| {_fmt(c.get('stale_pct'), '.2f')} | {_fmt(c.get('evicted_pct'), '.2f')} "
            f"| {_fmt(c.get('actor_pause_s'))} | {_fmt(c.get('learner_idle_s'))} "
            f"| {_fmt(c.get('learner_update_s'))} |"
        )
    m = report["machine"]
    delay = report.get("env_step_ms") or 0
    env = f"; every env step {delay:g} ms longer (DelayedEnv)" if delay else ""
    update = report.get("update_ms") or 0
    env += f"; every update {update:g} ms longer (tianji.bench.algos)" if update else ""
    lines += [
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), Python {m['python']}, torch {m['torch']}, "
        f"SB3 {m['stable_baselines3']}; seeds {report['seeds']}, budget "
        f"{agg['max_seconds']:.0f} s per run{env}; command: `{report['command']}`.",
    ]
    return "\n".join(lines) + "\n"
