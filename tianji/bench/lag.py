"""``tianji bench lag``: how much policy lag an algorithm tolerates, on CartPole-v1 and Acrobot-v1.

Each run is the PPO benchmark run of ``tianji bench train`` (``examples/cartpole_ppo.toml``:
2 actor processes, relaxed mode; on Acrobot-v1 the same settings, target -80, see
:data:`ENVS`) with the controller's ``lag_target`` set to L (and the
learner's ``max_policy_lag`` to L + 1, so nothing the controller allowed is dropped), for
three algorithms: ``ppo`` (plain PPO: the clipped ratio is its only correction),
``appo`` (the same with ``vtrace = true``: V-trace targets and advantages) and ``impala``
(``examples/cartpole_impala.toml``'s settings); the rollout buffer holds ``lag + 2``
batches, since the controller never grants more fragments than it holds. Every
(env, algorithm, lag, seed) run is a fresh process; the report gives per (env, algorithm,
lag) how many seeds reached the target, the median time to target from launch (a miss
counts as infinite), the measured mean policy lag and the ratio of the median time to the
same algorithm's at the smallest lag on that env.

Goal (issue 21): with lag 8, APPO reaches the target in every seed within 1.3x its lag-1
time.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from tianji.bench.spawn import run_each, run_training
from tianji.bench.train import CONFIGS, TARGETS, machine, parse_seeds

__all__ = ["ALGOS", "lag_config", "run_lag_bench", "summarize"]

IMPALA_ALGO: dict[str, Any] = {
    "fragments_per_batch": 2,
    "lr": 1e-3,
    "lr_anneal_updates": 400,
    "lr_floor": 0.1,
    "gamma": 0.98,
    "gae_lambda": 0.9,
    "update_epochs": 2,
    "num_minibatches": 2,
    "buffer_capacity": 12,
    "ent_coef": 0.01,
    "vtrace_rho_bar": 1.0,
    "vtrace_c_bar": 1.0,
}
"""``[algo]`` of ``examples/cartpole_impala.toml`` (a test keeps them equal)."""

ALGOS = ("ppo", "appo", "appo-learner", "impala")
"""``appo``: PPO with V-trace, the ratio clipped around the acting policy; ``appo-learner``:
the same clipped around the learner's policy (``vtrace_reference = "learner"``)."""

ENVS: dict[str, tuple[str, float]] = {
    "cartpole": ("CartPole-v1", TARGETS["ppo"]),
    "acrobot": ("Acrobot-v1", -80.0),
}
"""``--envs`` names: (gymnasium id, target mean return). Acrobot-v1's -80 is near what a
solved policy scores (-60 to -80); the example's settings reach it in 7-11 s here."""


def lag_config(
    algo: str,
    lag: int,
    seed: int,
    max_seconds: float,
    update_ms: float = 0.0,
    env: str = "cartpole",
) -> dict[str, Any]:
    """The run config (as data) of one run; ``update_ms``: every learner update waits that
    much longer (:mod:`tianji.bench.algos`), so the actors outrun the learner and the lag
    reaches its target; ``env``: a key of :data:`ENVS`."""
    data: dict[str, Any] = json.loads(json.dumps(CONFIGS["ppo"]))
    if algo in ("appo", "appo-learner"):
        data["algo"]["vtrace"] = True
        if algo == "appo-learner":
            data["algo"]["vtrace_reference"] = "learner"
    elif algo == "impala":
        data["algorithm"] = "impala"
        data["algo"] = dict(IMPALA_ALGO)
    elif algo != "ppo":
        raise ValueError(f"algo {algo!r}: one of {ALGOS}")
    if update_ms > 0:
        from tianji.bench.algos import DELAYED

        data["algorithm"] = DELAYED["impala" if algo == "impala" else "ppo"]
        data["algo"]["update_ms"] = update_ms
    data["seed"] = seed
    data["controller"]["lag_target"] = lag
    data["learner"]["max_policy_lag"] = lag + 1
    # the controller never grants more than the rollout buffer holds: room for the lag
    needed = data["algo"].get("fragments_per_batch", 1) * (lag + 2)
    if needed > data["algo"].get("buffer_capacity", 8):  # 8: PPO's default
        data["algo"]["buffer_capacity"] = needed
    env_id, target = ENVS[env]
    data["env"]["id"] = env_id
    data["stop"] = {"target_return": target, "max_seconds": max_seconds}
    return data


def _run(
    env: str, algo: str, lag: int, seed: int, max_seconds: float, update_ms: float
) -> dict[str, Any]:
    launched = time.time()
    run = run_training(lag_config(algo, lag, seed, max_seconds, update_ms, env), max_seconds + 120)
    row: dict[str, Any] = {"env": env, "algorithm": algo, "lag_target": lag, "seed": seed}
    if run.result is None:
        return {**row, "error": run.error}
    result = run.result
    reached = result.get("target_reached_unix")
    lag_stats = (result.get("controller") or {}).get("lag") or {}
    return {
        **row,
        "launch_to_target_s": round(reached - launched, 3) if reached else None,
        "env_steps_to_target": result.get("env_steps_to_target"),
        "final_return": result.get("final_return"),
        "policy_lag_mean": lag_stats.get("mean"),
        "policy_lag_max": lag_stats.get("max"),
    }


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (env, algorithm, lag): reached, median time (misses as infinite), lag, vs the
    algorithm's smallest lag on the env (rows without ``env`` are CartPole's)."""
    cells = []
    pairs = dict.fromkeys((r.get("env", "cartpole"), r["algorithm"]) for r in rows)
    for env, algo in pairs:
        mine = [r for r in rows if r.get("env", "cartpole") == env and r["algorithm"] == algo]
        lags = sorted({r["lag_target"] for r in mine})
        base: float | None = None
        for lag in lags:
            runs = [r for r in mine if r["lag_target"] == lag]
            times = [r.get("launch_to_target_s") for r in runs]
            censored = sorted(t if t is not None else float("inf") for t in times)
            median = statistics.median(censored) if censored else float("inf")
            finite = None if median == float("inf") else median
            if lag == lags[0]:
                base = finite
            lag_means = [r["policy_lag_mean"] for r in runs if r.get("policy_lag_mean") is not None]
            cells.append(
                {
                    "env": env,
                    "algorithm": algo,
                    "lag_target": lag,
                    "runs": len(runs),
                    "reached": sum(t is not None for t in times),
                    "time_to_target_median_s": finite,
                    "vs_smallest_lag": round(finite / base, 3) if finite and base else None,
                    "policy_lag_mean": round(statistics.mean(lag_means), 2) if lag_means else None,
                    "errors": [r["error"] for r in runs if "error" in r],
                }
            )
    return cells


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| env (target) | algorithm | lag_target | reached | time to target, median s "
        "| vs smallest lag | measured policy lag (mean) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in report["cells"]:
        t = c["time_to_target_median_s"]
        ratio = c["vs_smallest_lag"]
        lag = c["policy_lag_mean"]
        env_id, target = ENVS[c["env"]]
        lines.append(
            f"| {env_id} ({target:g}) | {c['algorithm']} | {c['lag_target']} "
            f"| {c['reached']}/{c['runs']} "
            f"| {'—' if t is None else f'{t:.1f}'} | {'—' if ratio is None else f'{ratio:.2f}'} "
            f"| {'—' if lag is None else f'{lag:.2f}'} |"
        )
    m = report["machine"]
    delay = report.get("update_ms") or 0
    slow = f", every update {delay:g} ms longer" if delay else ""
    lines += [
        "",
        f"2 actor processes{slow}; machine: {m['cpus']} CPUs ({m['cpu']}), torch "
        f"{m['torch']}; seeds {report['seeds']}, budget {report['max_seconds']:.0f} s per run; "
        f"command: `{report['command']}`.",
    ]
    return "\n".join(lines) + "\n"


def run_lag_bench(
    algos: tuple[str, ...],
    lags: tuple[int, ...],
    seeds: tuple[int, ...],
    max_seconds: float,
    update_ms: float = 0.0,
    envs: tuple[str, ...] = ("cartpole",),
) -> dict[str, Any]:
    """Every run, interleaved seed by seed, with a progress line each."""
    plan = [(s, e, a, lag) for s in seeds for e in envs for a in algos for lag in lags]

    def outcome(row: dict[str, Any]) -> str:
        t = row.get("launch_to_target_s")
        return f"{t:.1f} s to the target" if t else "target missed"

    rows = run_each(
        plan,
        lambda p: f"{p[1]} {p[2]} lag {p[3]} seed {p[0]}",
        lambda p: _run(p[1], p[2], p[3], p[0], max_seconds, update_ms),
        outcome,
    )
    return {
        "rows": rows,
        "cells": summarize(rows),
        "seeds": list(seeds),
        "max_seconds": max_seconds,
        "update_ms": update_ms,
        "machine": machine(),
        "command": "tianji bench lag " + " ".join(sys.argv[3:]),
    }


def add_parser(bench: Any) -> None:
    """Add ``tianji bench lag`` to the ``bench`` subparsers."""
    b = bench.add_parser(
        "lag",
        help="policy-lag tolerance on CartPole-v1 and Acrobot-v1: PPO, APPO (V-trace) and "
        "IMPALA at lag_target 1, 2, 4, 8",
        description=(__doc__ or "").split("\n\n")[1],
    )
    b.add_argument("--algos", default=",".join(ALGOS), help=f"comma-separated subset of {ALGOS}")
    b.add_argument("--lags", default="1,2,4,8", help="comma-separated lag targets (1,2,4,8)")
    b.add_argument("--envs", default="cartpole", help=f"comma-separated subset of {tuple(ENVS)}")
    b.add_argument("--seeds", default="3", help="N (0..N-1), A-B or A,B,C (default 3)")
    b.add_argument("--max-seconds", type=float, default=120.0, help="budget per run (120)")
    b.add_argument(
        "--update-ms",
        type=float,
        default=0.0,
        help="every learner update waits this many ms longer, so the actors outrun the "
        "learner and the lag reaches its target (tianji.bench.algos)",
    )
    b.add_argument("--out", metavar="DIR", help="write lag.json and lag.md here")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    b.set_defaults(func=_cmd)


def _cmd(args: Any) -> int:
    from tianji.bench.report import finish_report
    from tianji.runtime.errors import ConfigError

    algos = tuple(a for a in args.algos.split(",") if a)
    for a in algos:
        if a not in ALGOS:
            raise ConfigError("--algos", a, " | ".join(ALGOS))
    try:
        lags = tuple(int(x) for x in args.lags.split(",") if x)
    except ValueError as exc:
        raise ConfigError(
            "--lags", args.lags, "comma-separated integers >= 0, e.g. 1,2,4,8"
        ) from exc
    if not lags or min(lags) < 0:
        raise ConfigError("--lags", args.lags, "comma-separated integers >= 0, e.g. 1,2,4,8")
    if args.max_seconds <= 0:
        raise ConfigError("--max-seconds", args.max_seconds, "a positive number of seconds")
    if args.update_ms < 0:
        raise ConfigError("--update-ms", args.update_ms, "a number of milliseconds >= 0")
    envs = tuple(e for e in args.envs.split(",") if e)
    for e in envs or ("",):
        if e not in ENVS:
            raise ConfigError("--envs", e, " | ".join(ENVS))
    seeds = parse_seeds(args.seeds)
    report = run_lag_bench(algos, lags, seeds, args.max_seconds, args.update_ms, envs)
    return finish_report(report, markdown(report), "lag", args.out, args.json)
