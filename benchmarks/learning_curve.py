"""A run's learning curve from its metrics file: mean return over wall time and frames.

    python benchmarks/learning_curve.py RUN_DIR/metrics.jsonl [--every 300] [--frame-skip 4]
                                        [--label tianji] [--json]

Reads the metrics rows ``tianji train`` writes (one per progress interval) and prints one
markdown row per ``--every`` seconds of the run: wall time, env steps, frames (env steps x
``--frame-skip``; 4 for the Atari preset), the mean return of the last ``[stop] window``
episodes (whole games, raw scores with the Atari preset) and episodes so far; then the
first time the mean return reached each of -20, -15, -10, 0 and 10. ``--json`` prints the
rows as JSON instead (to plot, or to set beside another system's curve).

``--sf`` reads a Sample Factory run's curve instead (the JSON that ``benchmarks/sf_runner.py
--curve EVERY`` prints; its points are already every EVERY seconds, so the first time a mark
was reached is the first point at or above it: a bound, at that resolution):

    python benchmarks/learning_curve.py --sf docs/results/pong-learning-sf.txt --label SF
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

MARKS = (-20.0, -15.0, -10.0, 0.0, 10.0)


def curve(rows: list[dict[str, Any]], every: float, frame_skip: int) -> list[dict[str, Any]]:
    """The last row at or before each multiple of ``every`` seconds, and the final row."""
    out: list[dict[str, Any]] = []
    mark = every
    for i, row in enumerate(rows):
        following = rows[i + 1] if i + 1 < len(rows) else None
        if following is None or following["t"] > mark:
            out.append(_point(row, frame_skip))
            while following is not None and following["t"] > mark:
                mark += every
    return out


def _point(row: dict[str, Any], frame_skip: int) -> dict[str, Any]:
    return {
        "t": row["t"],
        "env_steps": row["env_steps"],
        "frames": row["env_steps"] * frame_skip,
        "mean_return": row["mean_return"],
        "episodes": row["episodes"],
    }


def first_reached(rows: list[dict[str, Any]], mark: float) -> dict[str, Any] | None:
    """The first row whose mean return is at least ``mark``."""
    return next(
        (r for r in rows if r["mean_return"] is not None and r["mean_return"] >= mark), None
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument("--every", type=float, default=300.0, help="seconds between rows (300)")
    parser.add_argument("--frame-skip", type=int, default=4, help="frames per env step (4)")
    parser.add_argument("--label", default="tianji", help="the system's name in the table")
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    parser.add_argument("--sf", action="store_true", help="METRICS is sf_runner's JSON")
    args = parser.parse_args(argv)
    if not args.metrics.is_file():
        parser.error(f"no metrics file {args.metrics}")
    if args.sf:
        text = args.metrics.read_text()
        rows = json.loads(text[text.index("{") :])["curve"]
        points = [
            _point({**r, "env_steps": r["frames"] // args.frame_skip}, args.frame_skip)
            for r in rows
        ]
    else:
        rows = [json.loads(line) for line in args.metrics.read_text().splitlines() if line.strip()]
        points = curve(rows, args.every, args.frame_skip)
    if args.json:
        print(json.dumps({"label": args.label, "points": points}))
        return 0
    print(f"| {args.label}: wall min | env steps | frames | mean return | episodes |")
    print("|---:|---:|---:|---:|---:|")
    for p in points:
        ret = "-" if p["mean_return"] is None else f"{p['mean_return']:.1f}"
        print(
            f"| {p['t'] / 60:.0f} | {p['env_steps']:,} | {p['frames']:,} | {ret} "
            f"| {p['episodes']} |"
        )
    for mark in MARKS:
        hit = first_reached(rows, mark)
        when = (
            "not reached"
            if hit is None
            else (f"{hit['t'] / 60:.1f} min, {hit['env_steps'] * args.frame_skip:,} frames")
        )
        print(f"- mean return >= {mark:g}: {when}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
