"""The report of ``tianji bench throughput``: its goals, its table and its command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tianji.bench.report import GoalResult, finish_report, goals_markdown

__all__ = ["add_parser", "goals", "markdown"]

Row = dict[str, Any]
Pick = Callable[[Row], bool]


def _tianji(mode: str = "relaxed", inference: str | None = None) -> Pick:
    def pick(r: Row) -> bool:
        return (
            r["system"] == "tianji"
            and r["mode"] == mode
            and (inference is None or r["inference"] == inference)
        )

    return pick


def _system(name: str) -> Pick:
    return lambda r: r["system"] == name


GOALS: tuple[tuple[str, str, Pick, Pick, float], ...] = (
    ("ALE/Pong-v5", "tianji best relaxed >= 1.5 x sample-factory frames/s",
     _tianji(), _system("sample-factory"), 1.5),
    ("CartPole-v1", "tianji best relaxed >= 2 x sample-factory env steps/s",
     _tianji(), _system("sample-factory"), 2.0),
    ("ALE/Pong-v5", "inference service (best) >= 1.2 x local policies",
     _tianji(inference="service"), _tianji(inference="local"), 1.2),
    ("CartPole-v1", "inference service (best) >= 0.9 x local policies",
     _tianji(inference="service"), _tianji(inference="local"), 0.9),
    ("ALE/Pong-v5", "tianji sampling (no learning) >= 0.8 x bare AsyncVectorEnv",
     _tianji(mode="sampling"), _system("bare"), 0.8),
    ("ALE/Pong-v5", "sampling: inference service (best) >= 1.2 x local policies",
     _tianji(mode="sampling", inference="service"), _tianji(mode="sampling", inference="local"),
     1.2),
)  # fmt: skip
"""(env, goal, rows measured, reference rows, target ratio of the best of each)."""


def _best(rows: list[Row], env: str, pick: Pick) -> Row | None:
    found = [r for r in rows if r["env"] == env and pick(r) and r.get("env_steps_per_s")]
    return max(found, key=lambda r: r["env_steps_per_s"], default=None)


def goals(rows: list[Row]) -> list[dict[str, Any]]:
    """Each goal checked on the best row of each side (N/A when a side was not measured)."""
    out = []
    for env, text, pick, versus, target in GOALS:
        mine, ref = _best(rows, env, pick), _best(rows, env, versus)
        goal = f"{env}: {text}"
        if mine is None or ref is None:
            result = GoalResult(goal, None, target, "N/A", "a side was not measured")
        else:
            ratio = mine["env_steps_per_s"] / ref["env_steps_per_s"]
            note = f"{mine['label']} vs {ref['label']}"
            result = GoalResult(goal, round(ratio, 3), target, _status(ratio, target), note)
        out.append(result.to_json())
    return out


def _status(ratio: float, target: float) -> str:
    return "PASS" if ratio >= target else "MISS"


def markdown(report: dict[str, Any]) -> str:
    """The rows per env (with the ratio to the env's local-policy row) and the goals."""
    lines = []
    for env in dict.fromkeys(r["env"] for r in report["rows"]):
        rows = [r for r in report["rows"] if r["env"] == env]
        local = _best(rows, env, _tianji(inference="local"))
        lines += [
            f"### {env} (PPO, 2 x 4 envs, learning on; {report['seconds']:g} s after "
            f"{report['warmup']:g} s warm-up)",
            "",
            "| system | env steps/s | frames/s | vs tianji local | policy lag | reqs/pass |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['label']} | error: {r['error'][:80]} | | | | |")
                continue
            ratio = f"{r['env_steps_per_s'] / local['env_steps_per_s']:.2f}x" if local else ""
            lag = r.get("policy_lag_mean")
            per_pass = ", ".join(f"{x:g}" for x in r.get("requests_per_pass") or [])
            lines.append(
                f"| {r['label']} | {r['env_steps_per_s']:,.0f} | {r['frames_per_s']:,.0f} "
                f"| {ratio} | {'' if lag is None else f'{lag:.2f}'} | {per_pass} |"
            )
        lines.append("")
    lines += goals_markdown(report["goals"])
    return "\n".join(lines) + "\n"


def _cmd(args: argparse.Namespace) -> int:
    from tianji.bench.throughput import ENVS, run_bench
    from tianji.runtime.errors import ConfigError

    envs = ["cartpole"] if args.quick and args.envs is None else (args.envs or "cartpole,pong")
    names = envs if isinstance(envs, list) else [e.strip() for e in envs.split(",") if e.strip()]
    for name in names:
        if name not in ENVS:
            raise ConfigError("--envs", name, f"one of {', '.join(ENVS)}")
    if args.peer_python is not None and not Path(args.peer_python).exists():
        raise ConfigError("--peer-python", args.peer_python, "an existing Python interpreter")
    seconds = args.seconds if args.seconds is not None else (10.0 if args.quick else 60.0)
    warmup = 5.0 if args.quick else 20.0
    peer = None if args.quick else args.peer_python
    report = run_bench(names, seconds, warmup, peer, args.quick)
    report["goals"] = goals(report["rows"])
    table = markdown(report)
    return finish_report(report, table, "throughput", args.out, args.json)


def add_parser(bench: Any) -> None:
    """Add ``tianji bench throughput`` to the ``bench`` subparsers."""
    from tianji.bench import throughput

    b = bench.add_parser(
        "throughput",
        help="steady-state env steps/s and frames/s with learning on: tianji's inference "
        "modes, the bare AsyncVectorEnv ceiling and Sample Factory",
        description=(throughput.__doc__ or "").split("\n\n")[1],
    )
    b.add_argument("--envs", help="comma-separated: cartpole, pong (default both)")
    b.add_argument("--seconds", type=float, help="measured seconds per cell (default 60)")
    b.add_argument(
        "--peer-python",
        metavar="PATH",
        help="the interpreter of a Sample Factory 2.1.1 environment (see "
        "tianji/bench/sf_runner.py); without it Sample Factory is not run",
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="CartPole, 3 tianji cells and the bare ceiling, 10 s each, no peer (CI)",
    )
    b.add_argument("--out", metavar="DIR", help="write throughput.json and throughput.md here")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    b.set_defaults(func=_cmd)
