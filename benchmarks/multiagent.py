"""Multi-agent learning curves against a random policy: mean team return over env steps.

    python benchmarks/multiagent.py [--seconds 300] [--episodes 1000] [--seed 0]
                                    [--examples spread_mappo spread_qmix] [--out DIR]

Measures the random policy's team return on the examples' env (``--episodes`` episodes of
uniformly random joint actions), then trains each example with ``tianji train`` for
``--seconds`` and prints its curve (the mean team return of the last 100 episodes, read
from the run's metrics file) beside the random policy's, with the margin at the end. Runs
one example at a time: on 2 cores two runs side by side would halve both.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tianji.rl.envs import random_policy_returns
from tianji.run.config import load_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CURVE_POINTS = 10


def train(example: str, seconds: float, seed: int, out: Path) -> tuple[dict, list[dict]]:
    """Run ``tianji train`` on an example; its summary and metrics rows."""
    summary, metrics = out / f"{example}.summary.json", out / f"{example}.metrics.jsonl"
    command = [
        sys.executable, "-m", "tianji.cli", "train", str(EXAMPLES / f"{example}.toml"),
        "--max-seconds", str(seconds), "--seed", str(seed), "--no-dashboard",
        "--summary", str(summary), "--metrics", str(metrics), "--run-dir", str(out / "runs"),
    ]  # fmt: skip
    print(f"$ {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return json.loads(summary.read_text()), rows


def curve(rows: list[dict]) -> list[tuple[int, float]]:
    """About ``CURVE_POINTS`` evenly spaced (env steps, mean return) points."""
    points = [(r["env_steps"], r["mean_return"]) for r in rows if r["mean_return"] is not None]
    if not points:
        return []
    picks = np.linspace(0, len(points) - 1, min(CURVE_POINTS, len(points))).round().astype(int)
    return [points[i] for i in sorted(set(picks.tolist()))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="training time per example")
    parser.add_argument("--episodes", type=int, default=1000, help="random-policy episodes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", nargs="+", default=["spread_mappo", "spread_qmix"])
    parser.add_argument("--out", type=Path, default=None, help="keep runs here (default: temp)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="tianji-ma-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    env = load_config(EXAMPLES / f"{args.examples[0]}.toml").env
    rand = random_policy_returns(env, args.episodes, seed=args.seed)
    sem = rand.std() / np.sqrt(len(rand))
    print(f"random policy on {env.id} {env.kwargs}: mean team return {rand.mean():.1f} "
          f"(std {rand.std():.1f}, s.e. {sem:.2f}, {len(rand)} episodes)")  # fmt: skip
    for example in args.examples:
        if load_config(EXAMPLES / f"{example}.toml").env != env:
            print(f"{example}: another env than {args.examples[0]}; skipped")
            continue
        summary, rows = train(example, args.seconds, args.seed, out)
        print(f"\n{example} ({summary['algorithm']}, {summary['actors']} actors x "
              f"{summary['envs_per_actor']} envs, {summary['transport']}):")  # fmt: skip
        print("| env steps | mean team return (last 100) | random | margin |")
        print("| ---: | ---: | ---: | ---: |")
        for steps, ret in curve(rows):
            print(f"| {steps:,} | {ret:.1f} | {rand.mean():.1f} | {ret - rand.mean():+.1f} |")
        final = summary["final_return"]
        print(f"end: {final:.1f} after {summary['env_steps']:,} env steps in "
              f"{summary['wall_s']:.0f} s ({summary['learner_updates']} updates); random "
              f"{rand.mean():.1f}; margin {final - rand.mean():+.1f} "
              f"({(final - rand.mean()) / rand.std():.2f} random-episode std)")  # fmt: skip
    print(f"\nruns kept in {out}")


if __name__ == "__main__":
    main()
