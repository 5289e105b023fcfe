"""MuJoCo side by side: tianji's example against Stable-Baselines3 with the RL Zoo's settings,
the same task, seed and wall-clock budget, one run after the other.

    python benchmarks/continuous.py halfcheetah_sac --seconds 1200 --out docs/results
    python benchmarks/continuous.py hopper_td3 --seconds 1200 --out docs/results

Each run is a fresh process timed from its launch: ``tianji train examples/<task>.toml
--max-seconds S`` and ``python benchmarks/sb3.py <algo>_<env> --max-seconds S`` (SB3 stops at
S seconds after its imports). The figure compared is the mean return of the last 10
training episodes at the end (``final_return`` of both). Each run says when it started
and when it will end. Writes ``<out>/mujoco-<task>.json`` and ``.md``. Run it alone
on the machine: a second training beside it spoils both.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"halfcheetah_sac": "sac_halfcheetah", "hopper_td3": "td3_hopper"}
"""tianji example -> the SB3 zoo entry of ``benchmarks/sb3.py``."""
WINDOW = 10


def run_tianji(task: str, seconds: float, seed: int, work: Path) -> dict[str, Any]:
    summary = work / f"{task}-tianji.json"
    command = [
        sys.executable, "-m", "tianji.cli", "train", str(ROOT / "examples" / f"{task}.toml"),
        "--max-seconds", str(seconds), "--seed", str(seed), "--no-dashboard",
        "--summary", str(summary), "--set", f"stop.window={WINDOW}",
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 600)
    if proc.returncode != 0:
        raise SystemExit(f"tianji run failed:\n{proc.stderr[-3000:]}")
    s = json.loads(summary.read_text())
    return {
        "system": "tianji",
        "command": " ".join(command[1:]),
        "wall_s": round(time.time() - started, 1),
        "final_return": s["final_return"],
        "env_steps": s["env_steps"],
        "learner_updates": s["learner_updates"],
        "learner_updates_per_s_running": s["learner_updates_per_s_running"],
        "update_ms": _update_ms(s),
        "episodes": s["episodes"],
    }


def _update_ms(summary: dict[str, Any]) -> float | None:
    """Mean milliseconds per update from the learner's last metrics row."""
    rows = Path(summary["run_dir"]) / "metrics.jsonl"
    if not rows.exists():
        return None
    last = json.loads(rows.read_text().splitlines()[-1])
    updates = last.get("learner_updates") or 0
    spent = last.get("learner", {}).get("update_s")
    return round(1000 * spent / updates, 2) if updates and spent else None


def run_sb3(task: str, seconds: float, seed: int) -> dict[str, Any]:
    entry = TASKS[task]
    command = [
        sys.executable, str(ROOT / "benchmarks" / "sb3.py"), entry, "--seed", str(seed),
        "--target-return", "1e12", "--max-seconds", str(seconds), "--window", str(WINDOW),
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 600)
    if proc.returncode != 0:
        raise SystemExit(f"SB3 run failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "system": "sb3",
        "command": " ".join(command[1:]),
        "wall_s": round(time.time() - started, 1),
        "final_return": out["final_return"],
        "env_steps": out["env_steps"],
        "learner_updates": None,
        "env_steps_per_s": out["env_steps_per_s"],
    }


def markdown(task: str, seconds: float, rows: list[dict[str, Any]], ratio: float | None) -> str:
    lines = [
        f"# {task}: tianji vs Stable-Baselines3 (RL Zoo settings), {seconds:.0f} s each",
        "",
        "| system | mean return (last 10 episodes) | env steps | learner updates | wall s |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ret = f"{r['final_return']:.1f}" if r["final_return"] is not None else "-"
        upd = r["learner_updates"] if r["learner_updates"] is not None else "-"
        lines.append(f"| {r['system']} | {ret} | {r['env_steps']} | {upd} | {r['wall_s']} |")
    if ratio is not None:
        lines += ["", f"tianji / SB3 mean return: {ratio:.2f}x"]
    return "\n".join(lines) + "\n"


def _clock(later: float = 0.0) -> str:
    return time.strftime("%H:%M:%S", time.localtime(time.time() + later))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/continuous.py", description=__doc__)
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--seconds", type=float, default=1200.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write mujoco-<task>.{json,md} here")
    p.add_argument(
        "--no-sb3", action="store_true", help="tianji's run only (no ratio; half the time)"
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        span = f"{args.seconds:.0f} s from {_clock()} to {_clock(args.seconds)}"
        print(f"tianji {args.task}: {span}", flush=True)
        ours = run_tianji(args.task, args.seconds, args.seed, Path(tmp))
        print(json.dumps(ours), flush=True)
    rows, ratio = [ours], None
    if not args.no_sb3:
        span = f"{args.seconds:.0f} s from {_clock()} to {_clock(args.seconds)}"
        print(f"sb3 {TASKS[args.task]}: {span}", flush=True)
        theirs = run_sb3(args.task, args.seconds, args.seed)
        print(json.dumps(theirs), flush=True)
        rows.append(theirs)
        a, b = ours["final_return"], theirs["final_return"]
        ratio = a / b if a is not None and b is not None and b > 0 else None
    report = {
        "task": args.task,
        "seconds": args.seconds,
        "seed": args.seed,
        "window": WINDOW,
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "runs": rows,
        "return_ratio_tianji_over_sb3": round(ratio, 3) if ratio is not None else None,
        "unix": time.time(),
    }
    text = markdown(args.task, args.seconds, rows, ratio)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"mujoco-{args.task}.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / f"mujoco-{args.task}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
