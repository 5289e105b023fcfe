"""``tianji bench train``: time-to-target on CartPole-v1, tianji's modes against SB3.

One invocation runs, interleaved seed by seed, every (algorithm, system) pair: tianji
``relaxed``, ``sync`` and ``unbalanced`` (the run configs in :data:`CONFIGS`, the same as
``examples/cartpole_ppo.toml`` and ``examples/cartpole_dqn.toml``) and Stable-Baselines3
with the RL Zoo's hyperparameters (:mod:`tianji.bench.sb3`). Every run is a fresh process.
It prints a progress line per run, then a markdown table with the median and spread of
time-to-target, env steps to target, env steps per second and final return, and the
ratios tianji/SB3 and relaxed/sync; ``--out DIR`` also writes ``train.json`` and
``train.md``.

Time-to-target is wall-clock from launching the run's process to the moment the mean return
of the last 20 training episodes reached the target, for both systems: it includes Python
start-up and imports, and for tianji starting its service processes (``startup_s`` in the
JSON). Env steps per second are over the time the actors ran (tianji) or the whole run
(SB3).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["CONFIGS", "TARGETS", "aggregate", "markdown", "run_bench"]

TARGETS = {"ppo": 475.0, "dqn": 300.0}
"""CartPole-v1 targets: PPO to 475 (the env's threshold), DQN to 300 (original TianJi's)."""

SYSTEMS = ("relaxed", "sync", "unbalanced", "sb3")

CONFIGS: dict[str, dict[str, Any]] = {
    "ppo": {
        "algorithm": "ppo",
        "transport": "tcp",
        "env": {"id": "CartPole-v1"},
        "actors": {"count": 2, "envs_per_actor": 4, "fragment_length": 64},
        "learner": {"max_policy_lag": 2, "prefetch": 1},
        "controller": {"mode": "relaxed", "lag_target": 1},
        "algo": {
            "fragments_per_batch": 2,
            "lr": 1e-3,
            "lr_anneal_updates": 200,
            "gamma": 0.98,
            "gae_lambda": 0.8,
            "update_epochs": 10,
            "num_minibatches": 2,
            "ent_coef": 0.0,
            "clip_value_loss": False,
        },
    },
    "dqn": {
        "algorithm": "dqn",
        "transport": "tcp",
        "env": {"id": "CartPole-v1"},
        "actors": {"count": 2, "envs_per_actor": 4, "fragment_length": 8},
        "learner": {"prefetch": 2},
        "controller": {"mode": "relaxed", "replay_ratio": 16.0, "tolerance": 4.0},
        "algo": {
            "gamma": 0.98,
            "lr": 1e-3,
            "batch_size": 128,
            "hidden": [256, 256],
            "buffer_capacity": 100_000,
            "learning_starts": 1000,
            "target_update_interval": 20,
            "epsilon_decay_updates": 2000,
            "epsilon_end": 0.02,
        },
    },
}
"""tianji's benchmark run configs (a test keeps them equal to the examples)."""

KEYS = (
    "time_to_target_s",
    "target_reached_unix",
    "env_steps_to_target",
    "env_steps_per_s_running",
    "final_return",
    "wall_s",
    "startup_s",
    "stop_reason",
    "learner_updates",
    "accounting",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    algos: tuple[str, ...]
    systems: tuple[str, ...]
    seeds: tuple[int, ...]
    max_seconds: float

    def runs(self) -> list[tuple[int, str, str]]:
        """(seed, algo, system), interleaved; the system order rotates with the seed so no
        system always runs first (or right after a heavy one)."""
        out = []
        for i, seed in enumerate(self.seeds):
            k = i % len(self.systems)
            order = self.systems[k:] + self.systems[:k]
            out += [(seed, algo, system) for algo in self.algos for system in order]
        return out


def run_config(algo: str, mode: str, seed: int, max_seconds: float) -> dict[str, Any]:
    """The tianji run config (as data) of one benchmark run."""
    data: dict[str, Any] = json.loads(json.dumps(CONFIGS[algo]))
    data["seed"] = seed
    data["controller"]["mode"] = mode
    if mode == "sync" and algo == "ppo":  # the learner's batch: one fragment per actor
        data["algo"]["fragments_per_batch"] = data["actors"]["count"]
    data["stop"] = {"target_return": TARGETS[algo], "max_seconds": max_seconds}
    return data


def _run_one(seed: int, algo: str, system: str, max_seconds: float) -> dict[str, Any]:
    if system == "sb3":
        cmd = [sys.executable, "-m", "tianji.bench.sb3", algo, "--seed", str(seed)]
        cmd += ["--target-return", str(TARGETS[algo]), "--max-seconds", str(max_seconds)]
        stdin = None
    else:
        cmd = [sys.executable, "-m", "tianji.bench.train", "--worker"]
        stdin = json.dumps(run_config(algo, system, seed, max_seconds))
    launched = time.time()
    proc = subprocess.run(
        cmd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=max_seconds + 120,
        env={**os.environ, "TIANJI_LOG_LEVEL": "WARNING"},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"system": system, "algorithm": algo, "seed": seed, "error": "\n".join(tail)}
    result: dict[str, Any] = json.loads(lines[-1])
    result.update(system=system, algorithm=algo, seed=seed)
    reached = result.get("target_reached_unix")
    result["launch_to_target_s"] = round(reached - launched, 3) if reached else None
    if not reached:  # keep the run's warnings for a look at why
        result["log_tail"] = [ln for ln in proc.stderr.splitlines() if " WARNING " in ln][-20:]
    return result


def _worker() -> int:
    """Run one tianji training from a JSON run config on stdin; print its summary."""
    import io

    from tianji.config import RunConfig, build_dataclass
    from tianji.training import train

    config: RunConfig = build_dataclass(RunConfig, json.loads(sys.stdin.read()), "")
    config = dataclasses.replace(config, run_dir="")  # the report keeps what a bench needs
    summary = train(config, out=io.StringIO())
    print(json.dumps({k: summary.get(k) for k in (*KEYS, "env_steps", "controller")}))
    return 0


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def aggregate(results: list[dict[str, Any]], max_seconds: float) -> dict[str, Any]:
    """Per (algorithm, system): medians and spreads; then the ratios the targets name.

    A run that missed the target counts as ``inf`` time (so the median is ``None`` when
    most runs missed); spreads are over the runs that reached it.
    """
    cells: dict[str, dict[str, Any]] = {}
    for algo in sorted({r["algorithm"] for r in results}):
        for system in SYSTEMS:
            runs = [r for r in results if r["algorithm"] == algo and r["system"] == system]
            if not runs:
                continue
            ok = [r for r in runs if r.get("launch_to_target_s") is not None]
            times = [r["launch_to_target_s"] for r in ok]
            censored = sorted(times + [float("inf")] * (len(runs) - len(ok)))
            median_time = statistics.median(censored)
            rates = [r["env_steps_per_s_running"] for r in runs if r.get("env_steps_per_s_running")]
            finals = [r["final_return"] for r in runs if r.get("final_return") is not None]
            cells[f"{algo}/{system}"] = {
                "runs": len(runs),
                "reached": len(ok),
                "errors": [r["error"] for r in runs if "error" in r],
                "time_to_target_median_s": None if median_time == float("inf") else median_time,
                "time_to_target_range_s": [min(times), max(times)] if times else None,
                "steps_to_target_median": _median([r["env_steps_to_target"] for r in ok]),
                "env_steps_per_s_median": _median(rates),
                "final_return_median": _median(finals),
            }

    def ratio(algo: str, a: str, b: str, key: str) -> float | None:
        x = cells.get(f"{algo}/{a}", {}).get(key)
        y = cells.get(f"{algo}/{b}", {}).get(key)
        return round(x / y, 3) if x is not None and y else None

    ratios = {
        algo: {
            "time_relaxed_over_sb3": ratio(algo, "relaxed", "sb3", "time_to_target_median_s"),
            "time_relaxed_over_sync": ratio(algo, "relaxed", "sync", "time_to_target_median_s"),
            "steps_per_s_relaxed_over_sync": ratio(
                algo, "relaxed", "sync", "env_steps_per_s_median"
            ),
            "time_unbalanced_over_relaxed": ratio(
                algo, "unbalanced", "relaxed", "time_to_target_median_s"
            ),
        }
        for algo in sorted({r["algorithm"] for r in results})
    }
    return {"cells": cells, "ratios": ratios, "max_seconds": max_seconds}


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for pkg in ("tianji", "torch", "gymnasium", "stable_baselines3"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg.replace("_", "-"))
        except Exception:
            versions[pkg] = None
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        **versions,
    }


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table plus the ratios."""
    agg = report["aggregate"]
    lines = [
        "| algorithm | system | reached | time to target from launch, median (range) s "
        "| env steps to target | env steps/s | final return |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, c in agg["cells"].items():
        algo, system = key.split("/")
        spread = c["time_to_target_range_s"]
        span = f" ({spread[0]:.1f}-{spread[1]:.1f})" if spread else ""
        lines.append(
            f"| {algo} | {system} | {c['reached']}/{c['runs']} "
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
    m = report["machine"]
    lines += [
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), Python {m['python']}, torch {m['torch']}, "
        f"SB3 {m['stable_baselines3']}; seeds {report['seeds']}, budget "
        f"{agg['max_seconds']:.0f} s per run; command: `{report['command']}`.",
    ]
    return "\n".join(lines) + "\n"


def run_bench(
    *,
    algos: tuple[str, ...],
    systems: tuple[str, ...],
    seeds: tuple[int, ...],
    max_seconds: float,
    out_dir: str | None,
    command: str,
) -> dict[str, Any]:
    """Run the plan, printing progress to stderr; return (and write) the report."""
    have_sb3 = _has_sb3()
    if "sb3" in systems and not have_sb3:
        print(
            "tianji bench train: stable-baselines3 is not installed (pip install "
            '"tianji[bench]"); SB3 runs are skipped',
            file=sys.stderr,
        )
        systems = tuple(s for s in systems if s != "sb3")
    plan = Plan(algos, systems, seeds, max_seconds)
    runs = plan.runs()
    results = []
    started = time.monotonic()
    for i, (seed, algo, system) in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {algo} {system} seed {seed} ...", file=sys.stderr, flush=True)
        r = _run_one(seed, algo, system, max_seconds)
        results.append(r)
        if "error" in r:
            note = f"failed: {r['error'].splitlines()[-1] if r['error'] else '?'}"
        elif r.get("launch_to_target_s") is not None:
            note = (
                f"{r['launch_to_target_s']:.1f} s to {TARGETS[algo]:g} "
                f"({r['env_steps_to_target']:,} steps)"
            )
        else:
            note = (
                f"target not reached ({r.get('stop_reason')}); final {_fmt(r.get('final_return'))}"
            )
        rate = r.get("env_steps_per_s_running") or 0
        elapsed = time.monotonic() - started
        print(f"    {note}; {rate:,.0f} env steps/s  [{elapsed:.0f} s so far]", file=sys.stderr)
    report = {
        "command": command,
        "seeds": list(seeds),
        "machine": machine(),
        "runs": results,
        "aggregate": aggregate(results, max_seconds),
    }
    if out_dir:
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        (path / "train.json").write_text(json.dumps(report, indent=2) + "\n")
        (path / "train.md").write_text(markdown(report))
    return report


def _has_sb3() -> bool:
    import importlib.util

    return importlib.util.find_spec("stable_baselines3") is not None


def add_parser(bench: Any) -> None:
    """Add ``tianji bench train`` to the ``bench`` subparsers."""
    b = bench.add_parser(
        "train",
        help="time-to-target on CartPole-v1: tianji relaxed/sync/unbalanced against SB3",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    b.add_argument("--algos", default="ppo,dqn", help="comma-separated (default ppo,dqn)")
    b.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {SYSTEMS}"
    )
    b.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    b.add_argument("--max-seconds", type=float, default=300.0, help="budget per run (300)")
    b.add_argument(
        "--quick", action="store_true", help="one seed, 40 s per run (a smoke run, e.g. in CI)"
    )
    b.add_argument("--out", metavar="DIR", help="write train.json and train.md here")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    b.set_defaults(func=_cmd)


def _cmd(args: Any) -> int:
    from tianji.errors import ConfigError

    algos = tuple(a for a in args.algos.split(",") if a)
    systems = tuple(s for s in args.systems.split(",") if s)
    for a in algos:
        if a not in CONFIGS:
            raise ConfigError("--algos", a, " | ".join(CONFIGS))
    for s in systems:
        if s not in SYSTEMS:
            raise ConfigError("--systems", s, " | ".join(SYSTEMS))
    seeds = (0,) if args.quick else tuple(range(args.seeds))
    max_seconds = 40.0 if args.quick else args.max_seconds
    report = run_bench(
        algos=algos,
        systems=systems,
        seeds=seeds,
        max_seconds=max_seconds,
        out_dir=args.out,
        command="tianji bench train " + " ".join(sys.argv[3:]),
    )
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    errors = [r for r in report["runs"] if "error" in r]
    return 1 if errors else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(_worker())
    sys.exit("usage: tianji bench train [...]  (this module's --worker mode is internal)")
