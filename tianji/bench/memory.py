"""``tianji bench memory``: does a recurrent policy remember what the env hides?

The env is ``tianji.rl.envs:MaskedCartPole`` (CartPole-v1 without the velocities). Each run
is ``examples/masked_cartpole_gru.toml`` (PPO, 2 actor processes, a GRU core) or the same with
``core = "none"`` (an MLP policy that sees only the current position and angle), with the
actors' policies local or in an inference service, for a fixed number of env steps. The
report gives per (policy, inference) the mean over seeds of the final mean return (the
last 20 episodes) and the ratio of the GRU's to the MLP's with the same inference.

Goal (issue 21): the GRU reaches >= 3x the MLP's mean return after the same env steps,
with local and with remote policies.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from tianji.bench.spawn import run_each, run_training
from tianji.bench.train import machine, parse_seeds

__all__ = ["MEMORY_CONFIG", "POLICIES", "memory_config", "run_memory_bench", "summarize"]

MEMORY_CONFIG: dict[str, Any] = {
    "algorithm": "ppo",
    "transport": "tcp",
    "env": {"id": "tianji.rl.envs:MaskedCartPole"},
    "actors": {"count": 2, "envs_per_actor": 8, "fragment_length": 32},
    "learner": {"max_policy_lag": 2, "prefetch": 1},
    "controller": {"mode": "relaxed", "lag_target": 1},
    "algo": {
        "core": "gru",
        "core_hidden": 64,
        "hidden": [64],
        "fragments_per_batch": 2,
        "num_minibatches": 4,
        "update_epochs": 4,
        "lr": 1e-3,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "ent_coef": 0.0,
        "clip_value_loss": False,
        "reward_scale": 0.05,
    },
}
"""``examples/masked_cartpole_gru.toml`` as data, without ``[stop]`` (a test keeps them equal)."""

POLICIES = ("gru", "mlp")
INFERENCE = ("local", "service")


def memory_config(policy: str, inference: str, seed: int, env_steps: int) -> dict[str, Any]:
    """The run config (as data) of one run.

    Raises:
        ValueError: for a policy or inference not in :data:`POLICIES` / :data:`INFERENCE`.
    """
    if policy not in POLICIES or inference not in INFERENCE:
        raise ValueError(f"policy {policy!r} / inference {inference!r}")
    data: dict[str, Any] = json.loads(json.dumps(MEMORY_CONFIG))
    if policy == "mlp":
        data["algo"]["core"] = "none"
        data["algo"]["hidden"] = [64, 64]  # the torso's layer and one in place of the core
    data["actors"]["inference"] = inference
    data["seed"] = seed
    data["stop"] = {"max_env_steps": env_steps, "max_seconds": 600}
    return data


def _run(policy: str, inference: str, seed: int, env_steps: int) -> dict[str, Any]:
    run = run_training(memory_config(policy, inference, seed, env_steps), 720)
    row: dict[str, Any] = {"policy": policy, "inference": inference, "seed": seed}
    if run.result is None:
        return {**row, "error": run.error}
    r = run.result
    return {
        **row,
        "env_steps": r.get("env_steps"),
        "final_return": r.get("final_return"),
        "wall_s": r.get("wall_s"),
        "env_steps_per_s": r.get("env_steps_per_s_running"),
    }


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (policy, inference): mean final return over seeds and the GRU/MLP ratio."""
    cells = []
    means: dict[tuple[str, str], float | None] = {}
    for inference in INFERENCE:
        for policy in POLICIES:
            runs = [r for r in rows if r["policy"] == policy and r["inference"] == inference]
            if not runs:
                continue
            returns = [r["final_return"] for r in runs if r.get("final_return") is not None]
            mean = round(statistics.mean(returns), 1) if returns else None
            means[policy, inference] = mean
            cells.append(
                {
                    "policy": policy,
                    "inference": inference,
                    "runs": len(runs),
                    "final_return_mean": mean,
                    "final_returns": returns,
                    "env_steps_per_s_mean": _mean([r.get("env_steps_per_s") for r in runs]),
                    "errors": [r["error"] for r in runs if "error" in r],
                }
            )
    for cell in cells:
        mode = str(cell["inference"])
        gru, mlp = means.get(("gru", mode)), means.get(("mlp", mode))
        cell["gru_vs_mlp"] = round(gru / mlp, 2) if gru is not None and mlp else None
    return cells


def _mean(values: list[Any]) -> float | None:
    finite = [v for v in values if v is not None]
    return round(statistics.mean(finite), 1) if finite else None


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| policy | inference | runs | final mean return (mean over seeds) | per seed "
        "| GRU / MLP | env steps/s |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for c in report["cells"]:
        ret, sps = c["final_return_mean"], c["env_steps_per_s_mean"]
        ratio = c["gru_vs_mlp"] if c["policy"] == "gru" else None
        seeds = ", ".join(f"{x:.0f}" for x in c["final_returns"])
        lines.append(
            f"| {c['policy']} | {c['inference']} | {c['runs']} "
            f"| {'—' if ret is None else f'{ret:.1f}'} | {seeds} "
            f"| {'—' if ratio is None else f'{ratio:.2f}x'} "
            f"| {'—' if sps is None else f'{sps:.0f}'} |"
        )
    m = report["machine"]
    lines += [
        "",
        f"tianji.rl.envs:MaskedCartPole, 2 actor processes, {report['env_steps']:,} env steps "
        f"per run; machine: {m['cpus']} CPUs ({m['cpu']}), torch {m['torch']}; seeds "
        f"{report['seeds']}; command: `{report['command']}`.",
    ]
    return "\n".join(lines) + "\n"


def run_memory_bench(
    policies: tuple[str, ...],
    inference: tuple[str, ...],
    seeds: tuple[int, ...],
    env_steps: int,
) -> dict[str, Any]:
    """Every run, interleaved seed by seed, with a progress line each."""
    plan = [(s, i, p) for s in seeds for i in inference for p in policies]
    rows = run_each(
        plan,
        lambda p: f"{p[2]} {p[1]} seed {p[0]}",
        lambda p: _run(p[2], p[1], p[0], env_steps),
        lambda row: f"mean return {row.get('final_return')}",
    )
    return {
        "rows": rows,
        "cells": summarize(rows),
        "seeds": list(seeds),
        "env_steps": env_steps,
        "machine": machine(),
        "command": "tianji bench memory " + " ".join(sys.argv[3:]),
    }


def add_parser(bench: Any) -> None:
    """Add ``tianji bench memory`` to the ``bench`` subparsers."""
    b = bench.add_parser(
        "memory",
        help="GRU vs MLP policies on the masked CartPole, local and remote inference",
        description=(__doc__ or "").split("\n\n")[1],
    )
    b.add_argument("--policies", default=",".join(POLICIES), help=f"subset of {POLICIES}")
    b.add_argument("--inference", default=",".join(INFERENCE), help=f"subset of {INFERENCE}")
    b.add_argument("--seeds", default="3", help="N (0..N-1), A-B or A,B,C (default 3)")
    b.add_argument("--env-steps", type=int, default=100_000, help="env steps per run (100000)")
    b.add_argument("--out", metavar="DIR", help="write memory.json and memory.md here")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    b.set_defaults(func=_cmd)


def _cmd(args: Any) -> int:
    from tianji.bench.report import finish_report
    from tianji.runtime.errors import ConfigError

    policies = tuple(p for p in args.policies.split(",") if p)
    for p in policies:
        if p not in POLICIES:
            raise ConfigError("--policies", p, " | ".join(POLICIES))
    modes = tuple(i for i in args.inference.split(",") if i)
    for i in modes:
        if i not in INFERENCE:
            raise ConfigError("--inference", i, " | ".join(INFERENCE))
    if not policies or not modes:
        raise ConfigError("--policies/--inference", f"{args.policies}/{args.inference}", "one each")
    if args.env_steps <= 0:
        raise ConfigError("--env-steps", args.env_steps, "a positive number of env steps")
    report = run_memory_bench(policies, modes, parse_seeds(args.seeds), args.env_steps)
    return finish_report(report, markdown(report), "memory", args.out, args.json)
