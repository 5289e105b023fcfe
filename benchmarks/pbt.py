"""PBT against independent members: the same 4 PPO members, with and without population-based
training, at the same env steps per member, over several seeds.

    python benchmarks/pbt.py --seeds 0-2 --out docs/results

Runs ``tianji train examples/acrobot_pbt.toml`` twice per seed, one run after the other:
``population.pbt=true`` and ``population.pbt=false`` (the members then train side by side
under one controller with the same initial hyperparameters and seeds: 4 independent runs).
Each member stops at the example's ``[stop] max_env_steps``; the figure per member is its
mean return over the last ``[stop] window`` training episodes at the end (the summary's
``population.members.*.final_return``). Reports, per seed and over the seeds, the best and
the median member of each, and whether PBT's best is at least as good and its median
above on every seed. Writes ``<out>/pbt-acrobot.json`` and ``.md`` (``--tag NAME``:
``pbt-acrobot-NAME.*``); ``--set KEY=VALUE`` overrides the example in both runs (e.g.
``--set 'population.init={lr = [1e-5, 4.64e-5, 2.15e-4, 1e-3]}'``). Run it alone on the
machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "acrobot_pbt.toml"


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def run(seed: int, pbt: bool, work: Path, extra: list[str]) -> dict[str, Any]:
    summary = work / f"pbt-{seed}-{pbt}.json"
    command = [
        sys.executable, "-m", "tianji.cli", "train", str(EXAMPLE), "--seed", str(seed),
        "--no-dashboard", "--summary", str(summary), "--set", f"population.pbt={str(pbt).lower()}",
        *(x for item in extra for x in ("--set", item)),
    ]  # fmt: skip
    started = time.time()
    clock = time.strftime("%H:%M:%S")
    print(f"{clock} seed {seed} pbt={pbt}: started", file=sys.stderr, flush=True)
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"run failed (seed {seed}, pbt={pbt}):\n{proc.stderr[-3000:]}")
    s = json.loads(summary.read_text())
    members = s["population"]["members"]
    finals = {m: v["final_return"] for m, v in members.items()}
    row = {
        "seed": seed,
        "pbt": pbt,
        "command": " ".join(command[1:]),
        "wall_s": round(time.time() - started, 1),
        "run_dir": s["run_dir"],
        "env_steps": {m: v["env_steps"] for m, v in members.items()},
        "final_return": finals,
        "best": max(finals.values()),
        "median": statistics.median(finals.values()),
        "exploits": s["population"]["exploits"],
        "hyperparameters": {m: v["hyperparameters"] for m, v in members.items()},
        "books_closed": {m: v["books_closed"] for m, v in members.items()},
    }
    print(
        f"{time.strftime('%H:%M:%S')} seed {seed} pbt={pbt}: best {row['best']:.1f} "
        f"median {row['median']:.1f} ({row['wall_s']} s)",
        file=sys.stderr,
        flush=True,
    )
    return row


def markdown(rows: list[dict[str, Any]], totals: dict[str, Any], overrides: list[str]) -> str:
    lines = [
        "# PBT vs independent members: 4 PPO members on Acrobot-v1 (examples/acrobot_pbt.toml)",
        "",
        f"Overrides of the example: {', '.join(f'`{o}`' for o in overrides) or 'none'}.",
        "",
        "| seed | mode | best member | median member | members' returns | exploits | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mode = "PBT" if r["pbt"] else "independent"
        each = ", ".join(f"{m} {v:.1f}" for m, v in r["final_return"].items())
        lines.append(
            f"| {r['seed']} | {mode} | {r['best']:.1f} | {r['median']:.1f} | {each} "
            f"| {r['exploits']} | {r['wall_s']} |"
        )
    lines += [
        "",
        "| over the seeds (mean) | best member | median member |",
        "|---|---|---|",
        f"| PBT | {totals['pbt_best']:.1f} | {totals['pbt_median']:.1f} |",
        f"| independent | {totals['independent_best']:.1f} | {totals['independent_median']:.1f} |",
        "",
        f"PBT's best at least as good on every seed: {totals['best_every_seed']}; PBT's "
        f"median above on every seed: {totals['median_every_seed']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/pbt.py", description=__doc__)
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--out", type=Path, default=None, help="write pbt-acrobot.{json,md} here")
    p.add_argument("--set", action="append", default=[], help="more overrides for both runs")
    p.add_argument("--tag", default="", help="write pbt-acrobot-<tag>.{json,md} instead")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds_of(args.seeds):
            for pbt in (True, False):
                rows.append(run(seed, pbt, Path(tmp), args.set))

    def mean(key: str, pbt: bool) -> float:
        return statistics.fmean(r[key] for r in rows if r["pbt"] is pbt)

    totals = {
        "pbt_best": mean("best", True),
        "pbt_median": mean("median", True),
        "independent_best": mean("best", False),
        "independent_median": mean("median", False),
    }
    totals["best_at_least_as_good"] = totals["pbt_best"] >= totals["independent_best"]
    totals["median_above"] = totals["pbt_median"] > totals["independent_median"]
    pairs = [
        (a, b) for a in rows for b in rows if a["pbt"] and not b["pbt"] and a["seed"] == b["seed"]
    ]
    totals["best_every_seed"] = all(a["best"] >= b["best"] for a, b in pairs)
    totals["median_every_seed"] = all(a["median"] > b["median"] for a, b in pairs)
    report = {
        "benchmark": "pbt-acrobot",
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "overrides": args.set,
        "rows": rows,
        "totals": totals,
    }
    text = markdown(rows, totals, args.set)
    print(text)
    print(json.dumps(totals))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"pbt-acrobot-{args.tag}" if args.tag else "pbt-acrobot"
        (args.out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / f"{name}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
