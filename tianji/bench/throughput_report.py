"""The report of ``tianji bench throughput``: its goals, its table and its command line."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tianji.bench.report import GoalResult, finish_report, goals_markdown

if TYPE_CHECKING:
    from tianji.bench.throughput import PeerCommand

__all__ = ["add_parser", "goals", "markdown"]

Row = dict[str, Any]
Pick = Callable[[Row], bool]


PRODUCED, CONSUMED = "env_steps_per_s", "consumed_per_s"
"""The two counts of a row: what the actors stepped, what the learner trained on."""


def _tianji(mode: str = "relaxed", inference: str | None = None) -> Pick:
    """tianji's own configurations (not the equal-work cell)."""

    def pick(r: Row) -> bool:
        return (
            r["system"] == "tianji"
            and r["work"] == "tianji-defaults"
            and r["mode"] == mode
            and (inference is None or r["inference"] == inference)
        )

    return pick


def _system(name: str) -> Pick:
    return lambda r: r["system"] == name


def _equal(system: str) -> Pick:
    """The equal-work cell of ``system`` (one per env)."""
    return lambda r: r["system"] == system and r["work"] == "equal"


GOALS: tuple[tuple[str, str, Pick, Pick, float, str], ...] = (
    ("ALE/Pong-v5", "tianji >= 1.5 x sample-factory consumed frames/s, equal work",
     _equal("tianji"), _equal("sample-factory"), 1.5, CONSUMED),
    ("CartPole-v1", "tianji >= 2 x sample-factory consumed env steps/s, equal work",
     _equal("tianji"), _equal("sample-factory"), 2.0, CONSUMED),
    ("ALE/Pong-v5", "inference service (best) >= 1.2 x local policies",
     _tianji(inference="service"), _tianji(inference="local"), 1.2, PRODUCED),
    ("CartPole-v1", "inference service (best) >= 0.9 x local policies",
     _tianji(inference="service"), _tianji(inference="local"), 0.9, PRODUCED),
    ("ALE/Pong-v5", "tianji sampling (no learning) >= 0.8 x bare (2 processes x 4 envs)",
     _tianji(mode="sampling"), _system("bare"), 0.8, PRODUCED),
    ("ALE/Pong-v5", "sampling: inference service (best) >= 1.2 x local policies",
     _tianji(mode="sampling", inference="service"), _tianji(mode="sampling", inference="local"),
     1.2, PRODUCED),
)  # fmt: skip
"""(env, goal, rows measured, reference rows, target ratio of the best of each, the rate
compared). The Sample Factory goals compare the one equal-work pair, on what each
learner consumed; the others tianji's own configurations, on what the actors stepped."""


def _best(rows: list[Row], env: str, pick: Pick, key: str = PRODUCED) -> Row | None:
    found = [r for r in rows if r["env"] == env and pick(r) and r.get(key)]
    return max(found, key=lambda r: r[key], default=None)


def goals(rows: list[Row]) -> list[dict[str, Any]]:
    """Each goal checked on the best row of each side (N/A when a side was not measured)."""
    out = []
    for env, text, pick, versus, target, key in GOALS:
        mine, ref = _best(rows, env, pick, key), _best(rows, env, versus, key)
        goal = f"{env}: {text}"
        if mine is None or ref is None:
            result = GoalResult(goal, None, target, "N/A", "a side was not measured")
        else:
            ratio = mine[key] / ref[key]
            note = f"{mine['label']} vs {ref['label']}"
            result = GoalResult(goal, round(ratio, 3), target, _status(ratio, target), note)
        out.append(result.to_json())
    return out


def _status(ratio: float, target: float) -> str:
    return "PASS" if ratio >= target else "MISS"


HEADER = (
    "| system | work | processes | params | env steps/s | consumed/s | consumed frames/s "
    "| vs tianji local | policy lag | reqs/pass |",
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
)
"""processes: env + inference + learner processes; params: the network's trainable
parameters; consumed: agent steps the learner trained on; the ratio is on consumed/s."""


def _cell(value: float | None, fmt: str = ",.0f") -> str:
    return "" if value is None else format(value, fmt)


def _row(r: Row, local: Row | None) -> str:
    if "error" in r:
        return f"| {r['label']} | {r['work']} | error: {r['error'][:80]} | | | | | | | |"
    consumed = r.get(CONSUMED)
    ratio = f"{consumed / local[CONSUMED]:.2f}x" if local and consumed is not None else ""
    procs = r.get("processes") or {}
    shown = "+".join(str(procs.get(k, 0)) for k in ("env", "inference", "learner"))
    per_pass = ", ".join(f"{x:g}" for x in r.get("requests_per_pass") or [])
    return (
        f"| {r['label']} | {r['work']} | {shown if procs else ''} | {_cell(r.get('model_params'))} "
        f"| {_cell(r.get(PRODUCED))} | {_cell(consumed)} | {_cell(r.get('consumed_frames_per_s'))} "
        f"| {ratio} | {_cell(r.get('policy_lag_mean'), '.2f')} | {per_pass} |"
    )


def markdown(report: dict[str, Any]) -> str:
    """The rows per env (with the ratio of consumed/s to the env's tianji local-policy
    row) and the goals."""
    lines = []
    for env in dict.fromkeys(r["env"] for r in report["rows"]):
        rows = [r for r in report["rows"] if r["env"] == env]
        local = _best(rows, env, _tianji(inference="local"), CONSUMED)
        lines += [
            f"### {env} (PPO, 2 x 4 envs, learning on; {report['seconds']:g} s after "
            f"{report['warmup']:g} s warm-up)",
            "",
            *HEADER,
            *(_row(r, local) for r in rows),
            "",
        ]
    lines += goals_markdown(report["goals"])
    return "\n".join(lines) + "\n"


def _cmd(args: argparse.Namespace, peer: Callable[[str], PeerCommand] | None = None) -> int:
    from tianji.bench.throughput import ENVS, WORKS, run_bench
    from tianji.runtime.errors import ConfigError

    envs = ["cartpole"] if args.quick and args.envs is None else (args.envs or "cartpole,pong")
    names = envs if isinstance(envs, list) else [e.strip() for e in envs.split(",") if e.strip()]
    for name in names:
        if name not in ENVS:
            raise ConfigError("--envs", name, f"one of {', '.join(ENVS)}")
    peer_python = getattr(args, "peer_python", None)  # only with a peer (benchmarks/peers.py)
    if peer_python is not None and not Path(peer_python).exists():
        raise ConfigError("--peer-python", peer_python, "an existing Python interpreter")
    works = [w.strip() for w in args.work.split(",") if w.strip()] if args.work else list(WORKS)
    for work in works:
        if work not in WORKS:
            raise ConfigError("--work", work, f"one of {', '.join(WORKS)}")
    seconds = args.seconds if args.seconds is not None else (10.0 if args.quick else 60.0)
    warmup = args.warmup if args.warmup is not None else (5.0 if args.quick else 20.0)
    command = None if args.quick or peer is None or peer_python is None else peer(peer_python)
    report = run_bench(names, seconds, warmup, command, args.quick, works, args.brief)
    report["goals"] = goals(report["rows"])
    table = markdown(report)
    return finish_report(report, table, "throughput", args.out, args.json)


def add_parser(bench: Any, peer: Callable[[str], PeerCommand] | None = None) -> None:
    """Add ``tianji bench throughput`` to the ``bench`` subparsers; with ``peer`` (the
    command of Sample Factory's runner for an interpreter: ``benchmarks/peers.py``), also
    ``--peer-python``."""
    from tianji.bench import throughput

    b = bench.add_parser(
        "throughput",
        help="steady-state env steps/s and frames/s with learning on: tianji's inference "
        "modes and the bare ceiling",
        description=(throughput.__doc__ or "").split("\n\n")[1],
    )
    b.add_argument("--envs", help="comma-separated: cartpole, pong (default both)")
    b.add_argument("--seconds", type=float, help="measured seconds per cell (default 60)")
    b.add_argument(
        "--warmup", type=float, help="seconds before each window (default 20; --quick 5)"
    )
    b.add_argument(
        "--work",
        help="comma-separated: only the rows of this work (tianji-defaults, peer-defaults, "
        "equal; default all)",
    )
    if peer is not None:
        b.add_argument(
            "--peer-python",
            metavar="PATH",
            help="the interpreter of a Sample Factory 2.1.1 environment (see "
            "benchmarks/sf_runner.py); without it Sample Factory is not run",
        )
    b.add_argument(
        "--quick",
        action="store_true",
        help="CartPole, 3 tianji cells and the bare ceiling, 10 s each, no peer (CI)",
    )
    b.add_argument(
        "--brief",
        action="store_true",
        help="per env only tianji's local cell, the bare ceiling, the equal-work pair and "
        "Sample Factory's own settings (the rows the README quotes; Sample Factory only "
        "with --peer-python)",
    )
    b.add_argument("--out", metavar="DIR", help="write throughput.json and throughput.md here")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    b.set_defaults(func=functools.partial(_cmd, peer=peer))
