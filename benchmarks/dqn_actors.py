"""DQN with few and many actors: the time to the target return from the moment every service
is up (issue 33's goal: 32 actors within 1.5x the 2-actor time).

Runs ``tianji train examples/cartpole_dqn.toml --actors N --seed S`` for each actor count
and seed, one run at a time (run it alone on the machine), and reads each run's summary:
``time_to_target_s`` and ``all_up_s`` are both on the run monitor's clock, so their
difference is the time from "every service registered" to the target.

    python benchmarks/dqn_actors.py --actors 2 32 --seeds 0 1 2 --json out.json
    python benchmarks/dqn_actors.py --tianji OTHER/.venv/bin/tianji --checkout OTHER  # a commit

Prints one row per run, then per actor count the median of each figure, and the ratio of
the medians (many actors against the fewest).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_once(
    tianji: str,
    config: str,
    actors: int,
    seed: int,
    limit: float,
    cwd: Path = ROOT,
    sets: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One run's figures (``error`` when it failed or reported no summary). ``cwd`` is the
    checkout ``tianji`` belongs to: its service processes start with ``python -m``, which
    imports the package from the working directory first."""
    cmd = [tianji, "train", config, "--actors", str(actors), "--seed", str(seed)]
    cmd += ["--no-dashboard", "--run-dir", "", "--max-seconds", str(limit)]
    for setting in sets:
        cmd += ["--set", setting]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    row: dict[str, Any] = {"actors": actors, "seed": seed, "wall_s": time.monotonic() - started}
    text = proc.stdout
    at = text.find("\n{\n")
    if proc.returncode != 0 or at < 0:
        row["error"] = f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"
        return row
    summary = json.loads(text[at:])
    target, up = summary.get("time_to_target_s"), summary.get("all_up_s")
    controller = summary.get("controller") or {}
    row.update(
        stop_reason=summary.get("stop_reason"),
        time_to_target_s=target,
        all_up_s=up,
        from_up_s=None if target is None or up is None else round(target - up, 3),
        pause_s_total=controller.get("pause_s_total"),
        learner_idle_s=controller.get("learner_idle_s"),
        updates=summary.get("learner_updates"),
    )
    if row["from_up_s"] and row["updates"] is not None:  # the run stops at the target
        row["updates_per_s"] = round(row["updates"] / row["from_up_s"], 1)
    return row


def medians(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[2, 32])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default="examples/cartpole_dqn.toml")
    parser.add_argument("--tianji", default=str(Path(sys.executable).parent / "tianji"))
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument(
        "--checkout", type=Path, default=ROOT, help="the checkout --tianji belongs to (cwd)"
    )
    parser.add_argument("--json", help="write the rows and medians here")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every run, e.g. 'stop.on=\"eval\"' (repeatable)",
    )
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for actors in args.actors:
        for seed in args.seeds:
            row = run_once(
                args.tianji,
                args.config,
                actors,
                seed,
                args.max_seconds,
                args.checkout,
                tuple(args.set),
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    table: dict[int, dict[str, Any]] = {}
    for actors in args.actors:
        mine = [r for r in rows if r["actors"] == actors and "error" not in r]
        keys = ("time_to_target_s", "all_up_s", "from_up_s", "pause_s_total", "updates")
        keys += ("updates_per_s",)
        table[actors] = {k: medians(mine, k) for k in keys}
        table[actors]["reached"] = sum(r.get("time_to_target_s") is not None for r in mine)
        table[actors]["runs"] = len([r for r in rows if r["actors"] == actors])
    fewest = min(args.actors)
    print(
        "| actors | reached | from launch, median s | all up, median s | from all up, median s "
        "| updates to target, median | learner updates/s from all up, median |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for actors, t in table.items():
        print(
            f"| {actors} | {t['reached']}/{t['runs']} | {t['time_to_target_s']} | {t['all_up_s']} "
            f"| {t['from_up_s']} | {t['updates']} | {t['updates_per_s']} |"
        )
    ratios = {}
    for actors in args.actors:
        base, mine = table[fewest]["from_up_s"], table[actors]["from_up_s"]
        if actors != fewest and base and mine is not None:
            ratios[str(actors)] = round(mine / base, 2)
            print(f"{actors} actors / {fewest} actors, from all up: {ratios[str(actors)]}x")
    if args.json:
        out = {"config": args.config, "tianji": args.tianji, "sets": args.set, "rows": rows}
        out["medians"] = table
        out["ratio_from_up"] = ratios
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
