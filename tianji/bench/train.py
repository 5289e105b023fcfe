"""``tianji bench train``: time-to-target on CartPole-v1, tianji's modes against SB3.

One invocation runs, interleaved seed by seed, every (algorithm, system) pair: tianji
``relaxed``, ``sync`` and ``unbalanced`` (the run configs in :data:`CONFIGS`, the same as
``examples/cartpole_ppo.toml`` and ``examples/cartpole_dqn.toml``) and Stable-Baselines3
with the RL Zoo's hyperparameters (:mod:`tianji.bench.sb3`). Every run is a fresh process.
It prints a progress line per run, then a markdown table with the median and spread of
time-to-target, env steps to target, env steps per second and final return, and the
ratios tianji/SB3 and relaxed/sync, and a second table of where each mode spent its time
(stale and evicted samples, actor pause, learner idle and busy time); ``--out DIR`` also
writes ``train.json`` and ``train.md``. ``--actors 1,2,4,...`` repeats every run for each
actor count (the controller at scale); ``--update-ms X`` makes every learner update wait X
ms more (:mod:`tianji.bench.algos`: a learner on an accelerator); ``--env-step-ms X`` makes
every env step take X ms
more (:class:`tianji.bench.envs.DelayedEnv`: an expensive env, where what relaxing the
actor/learner dependency buys shows even on a small machine; SB3 is not run then).

Time-to-target is wall-clock from launching the run's process to the moment the mean return
of the last 20 training episodes reached the target, for both systems: it includes Python
start-up and imports, and for tianji starting its service processes (``startup_s`` in the
JSON). Env steps per second are over the time the actors ran (tianji) or the whole run
(SB3).
"""

from __future__ import annotations

# Over 500 lines on purpose: one benchmark's runner, its cells and its report (the run
# configs are the examples'; the SB3 side is tianji.bench.sb3).
import dataclasses
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tianji.bench.spawn import run_json_child, run_training

__all__ = ["CONFIGS", "TARGETS", "aggregate", "markdown", "run_bench"]

log = logging.getLogger(__name__)

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
            "lr": 4e-3,
            "lr_anneal_updates": 200,
            "lr_floor": 0.1,
            "gamma": 0.98,
            "gae_lambda": 0.8,
            "update_epochs": 5,
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

WASTE_KEYS = ("stale_pct", "evicted_pct", "actor_pause_s", "learner_idle_s", "learner_update_s")
"""Per run (tianji only): see :func:`waste_and_waits`."""

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
    actors: tuple[int | None, ...] = (None,)
    """Actor counts to run (``None``: the example's)."""
    env_step_ms: float = 0.0
    update_ms: float = 0.0

    def runs(self) -> list[tuple[int, str, str, int | None]]:
        """(seed, algo, system, actors), interleaved; the system order rotates with the
        seed so no system always runs first (or right after a heavy one)."""
        out = []
        for i, seed in enumerate(self.seeds):
            k = i % len(self.systems)
            order = self.systems[k:] + self.systems[:k]
            out += [
                (seed, algo, system, n)
                for n in self.actors
                for algo in self.algos
                for system in order
            ]
        return out


def run_config(
    algo: str,
    mode: str,
    seed: int,
    max_seconds: float,
    actors: int | None = None,
    env_step_ms: float = 0.0,
    update_ms: float = 0.0,
) -> dict[str, Any]:
    """The tianji run config (as data) of one benchmark run: the example's, with
    ``actors`` actor processes, every env step ``env_step_ms`` ms longer and every learner
    update ``update_ms`` ms longer (:mod:`tianji.bench.algos`) if given."""
    data: dict[str, Any] = json.loads(json.dumps(CONFIGS[algo]))
    data["seed"] = seed
    data["controller"]["mode"] = mode
    if actors is not None:
        data["actors"]["count"] = actors
    if env_step_ms > 0:
        env_id = data["env"]["id"]
        data["env"] = {
            "id": "tianji.bench.envs:DelayedEnv",
            "kwargs": {"env_id": env_id, "step_ms": env_step_ms},
        }
    if update_ms > 0:
        from tianji.bench.algos import DELAYED

        data["algorithm"] = DELAYED[algo]
        data["algo"]["update_ms"] = update_ms
    if mode == "sync" and algo == "ppo":  # the learner's batch: one fragment per actor
        data["algo"]["fragments_per_batch"] = data["actors"]["count"]
        capacity = data["algo"].get("buffer_capacity", 8)
        data["algo"]["buffer_capacity"] = max(capacity, 2 * data["actors"]["count"])
    data["stop"] = {"target_return": TARGETS[algo], "max_seconds": max_seconds}
    return data


def _run_one(
    seed: int,
    algo: str,
    system: str,
    max_seconds: float,
    actors: int | None = None,
    env_step_ms: float = 0.0,
    update_ms: float = 0.0,
) -> dict[str, Any]:
    launched = time.time()
    if system == "sb3":
        cmd = [sys.executable, "-m", "tianji.bench.sb3", algo, "--seed", str(seed)]
        cmd += ["--target-return", str(TARGETS[algo]), "--max-seconds", str(max_seconds)]
        run = run_json_child(cmd, None, max_seconds + 120, tail=5)
    else:
        data = run_config(algo, system, seed, max_seconds, actors, env_step_ms, update_ms)
        run = run_training(data, max_seconds + 120)
    if run.result is None:
        return {"system": system, "algorithm": algo, "seed": seed, "error": run.error}
    result = run.result
    result.update(system=system, algorithm=algo, seed=seed)
    if system != "sb3":
        result["actors"] = actors or CONFIGS[algo]["actors"]["count"]
        result.update(waste_and_waits(result))
    reached = result.get("target_reached_unix")
    result["launch_to_target_s"] = round(reached - launched, 3) if reached else None
    if not reached:  # keep the run's warnings for a look at why
        result["log_tail"] = [ln for ln in run.stderr.splitlines() if " WARNING " in ln][-20:]
    return result


def _worker() -> int:
    """Run one tianji training from a JSON run config on stdin; print its summary."""
    import io

    from tianji.rl.config import RunConfig, build_dataclass
    from tianji.run.train import train

    config: RunConfig = build_dataclass(RunConfig, json.loads(sys.stdin.read()), "")
    config = dataclasses.replace(config, run_dir="")  # the report keeps what a bench needs
    summary = train(config, out=io.StringIO())
    print(json.dumps({k: summary.get(k) for k in (*KEYS, "env_steps", "controller")}))
    return 0


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def waste_and_waits(summary: dict[str, Any]) -> dict[str, float | None]:
    """Where a tianji run spent its samples and its time, from its summary: stale and
    evicted samples (% of those produced), actor pause (s, mean per actor), learner idle
    (waiting for a batch or for the controller's consumption grant) and busy (in updates)
    seconds."""
    acc = summary.get("accounting") or {}
    ctl = summary.get("controller") or {}
    produced = acc.get("produced") or 0
    dropped = acc.get("dropped") or {}

    def pct(reason: str) -> float | None:
        return round(100.0 * dropped.get(reason, 0) / produced, 2) if produced else None

    pauses = list((ctl.get("pause_s") or {}).values())
    return {
        "stale_pct": pct("stale"),
        "evicted_pct": pct("evicted"),
        "actor_pause_s": round(statistics.mean(pauses), 2) if pauses else None,
        "learner_idle_s": (
            round(ctl.get("learner_idle_s", 0.0) + ctl.get("learner_wait_s", 0.0), 3)
            if "learner_idle_s" in ctl
            else None
        ),
        "learner_update_s": ctl.get("learner_update_s"),
    }


def _cell_key(algo: str, system: str, actors: int | None, several: bool) -> str:
    """``algo/system``, and ``/actors`` when the report has several actor counts (SB3,
    which has no actors, keeps one cell)."""
    return f"{algo}/{system}" + (f"/{actors}" if several and system != "sb3" else "")


def aggregate(results: list[dict[str, Any]], max_seconds: float) -> dict[str, Any]:
    """Per (algorithm, system): medians and spreads; then the ratios the targets name.

    A run that missed the target counts as ``inf`` time (so the median is ``None`` when
    most runs missed); spreads are over the runs that reached it.
    """
    cells: dict[str, dict[str, Any]] = {}
    counts = sorted({r["actors"] for r in results if r.get("actors") is not None})
    several = len(counts) > 1
    groups = [
        (algo, system, n)
        for algo in sorted({r["algorithm"] for r in results})
        for n in (counts or [None])
        for system in SYSTEMS
        if not (several and system == "sb3" and n != counts[0])  # SB3 has no actors
    ]
    for algo, system, n in groups:
        runs = [
            r
            for r in results
            if r["algorithm"] == algo
            and r["system"] == system
            and (system == "sb3" or n is None or r.get("actors") == n)
        ]
        if not runs:
            continue
        ok = [r for r in runs if r.get("launch_to_target_s") is not None]
        times = [r["launch_to_target_s"] for r in ok]
        censored = sorted(times + [float("inf")] * (len(runs) - len(ok)))
        median_time = statistics.median(censored)
        rates = [r["env_steps_per_s_running"] for r in runs if r.get("env_steps_per_s_running")]
        finals = [r["final_return"] for r in runs if r.get("final_return") is not None]
        cells[_cell_key(algo, system, n, several)] = {
            "actors": None if system == "sb3" else n,
            "runs": len(runs),
            "reached": len(ok),
            "errors": [r["error"] for r in runs if "error" in r],
            "time_to_target_median_s": None if median_time == float("inf") else median_time,
            "time_to_target_range_s": [min(times), max(times)] if times else None,
            "steps_to_target_median": _median([r["env_steps_to_target"] for r in ok]),
            "env_steps_per_s_median": _median(rates),
            "final_return_median": _median(finals),
            **{k: _median([r[k] for r in runs if r.get(k) is not None]) for k in WASTE_KEYS},
        }

    def ratio(algo: str, a: str, b: str, key: str, n: int | None) -> float | None:
        x = cells.get(_cell_key(algo, a, n, several), {}).get(key)
        y = cells.get(_cell_key(algo, b, n, several), {}).get(key)
        return round(x / y, 3) if x is not None and y else None

    ratios = {
        algo + (f"/{n}" if several else ""): {
            "time_relaxed_over_sb3": ratio(algo, "relaxed", "sb3", "time_to_target_median_s", n),
            "time_relaxed_over_sync": ratio(algo, "relaxed", "sync", "time_to_target_median_s", n),
            "steps_per_s_relaxed_over_sync": ratio(
                algo, "relaxed", "sync", "env_steps_per_s_median", n
            ),
            "time_unbalanced_over_relaxed": ratio(
                algo, "unbalanced", "relaxed", "time_to_target_median_s", n
            ),
        }
        for algo in sorted({r["algorithm"] for r in results})
        for n in (counts or [None])
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
    except OSError as exc:  # not Linux: platform.processor()'s answer
        log.debug("no /proc/cpuinfo: %r", exc)
    versions: dict[str, str | None] = {}
    for pkg in ("tianji", "torch", "gymnasium", "stable_baselines3"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg.replace("_", "-"))
        except Exception as exc:  # not installed: recorded as null
            log.debug("%s: %r", pkg, exc)
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
    """The report as markdown tables: time to target, the ratios, waste and waiting."""
    agg = report["aggregate"]
    lines = [
        "| algorithm | system | actors | reached | time to target from launch, median "
        "(range) s | env steps to target | env steps/s | final return |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, c in agg["cells"].items():
        algo, system = key.split("/")[:2]
        spread = c["time_to_target_range_s"]
        span = f" ({spread[0]:.1f}-{spread[1]:.1f})" if spread else ""
        lines.append(
            f"| {algo} | {system} | {_fmt(c.get('actors'), 'd')} | {c['reached']}/{c['runs']} "
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
    lines += [
        "",
        "| algorithm | system | actors | stale % | evicted % | actor pause s (mean) "
        "| learner idle s | learner busy s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, c in agg["cells"].items():
        algo, system = key.split("/")[:2]
        if system == "sb3":
            continue
        lines.append(
            f"| {algo} | {system} | {_fmt(c.get('actors'), 'd')} "
            f"| {_fmt(c.get('stale_pct'), '.2f')} | {_fmt(c.get('evicted_pct'), '.2f')} "
            f"| {_fmt(c.get('actor_pause_s'))} | {_fmt(c.get('learner_idle_s'))} "
            f"| {_fmt(c.get('learner_update_s'))} |"
        )
    m = report["machine"]
    delay = report.get("env_step_ms") or 0
    env = f"; every env step {delay:g} ms longer (DelayedEnv)" if delay else ""
    update = report.get("update_ms") or 0
    env += f"; every update {update:g} ms longer (tianji.bench.algos)" if update else ""
    lines += [
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), Python {m['python']}, torch {m['torch']}, "
        f"SB3 {m['stable_baselines3']}; seeds {report['seeds']}, budget "
        f"{agg['max_seconds']:.0f} s per run{env}; command: `{report['command']}`.",
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
    actors: tuple[int | None, ...] = (None,),
    env_step_ms: float = 0.0,
    update_ms: float = 0.0,
) -> dict[str, Any]:
    """Run the plan, printing progress to stderr; return (and write) the report."""
    if (env_step_ms > 0 or update_ms > 0) and "sb3" in systems:
        print(
            "tianji bench train: --env-step-ms / --update-ms slow tianji's runs only; SB3 runs "
            "are skipped",
            file=sys.stderr,
        )
        systems = tuple(s for s in systems if s != "sb3")
    have_sb3 = _has_sb3()
    if "sb3" in systems and not have_sb3:
        print(
            "tianji bench train: stable-baselines3 is not installed (pip install "
            '"tianji[bench]"); SB3 runs are skipped',
            file=sys.stderr,
        )
        systems = tuple(s for s in systems if s != "sb3")
    plan = Plan(algos, systems, seeds, max_seconds, actors, env_step_ms, update_ms)
    runs = plan.runs()
    results = []
    started = time.monotonic()
    for i, (seed, algo, system, n) in enumerate(runs, 1):
        who = f" {n} actors" if n is not None and system != "sb3" else ""
        print(
            f"[{i}/{len(runs)}] {algo} {system}{who} seed {seed} ...", file=sys.stderr, flush=True
        )
        r = _run_one(seed, algo, system, max_seconds, n, env_step_ms, update_ms)
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
        waste = ""
        if r.get("stale_pct") is not None:
            waste = f"; stale {r['stale_pct']:.2f}%, evicted {r['evicted_pct']:.2f}%"
        print(
            f"    {note}; {rate:,.0f} env steps/s{waste}  [{elapsed:.0f} s so far]",
            file=sys.stderr,
        )
    report = {
        "command": command,
        "seeds": list(seeds),
        "env_step_ms": env_step_ms,
        "update_ms": update_ms,
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
    b.add_argument(
        "--seeds",
        default="3",
        help="N (seeds 0..N-1, default 3), a range A-B or a list A,B,C",
    )
    b.add_argument(
        "--actors",
        default="",
        help="comma-separated actor counts, e.g. 1,2,4,8 (default: the examples' 2)",
    )
    b.add_argument(
        "--env-step-ms",
        type=float,
        default=0.0,
        help="make every env step take this many ms longer (DelayedEnv; SB3 not run)",
    )
    b.add_argument(
        "--update-ms",
        type=float,
        default=0.0,
        help="make every learner update wait this many ms longer, as on an accelerator "
        "(tianji.bench.algos; SB3 not run)",
    )
    b.add_argument("--max-seconds", type=float, default=300.0, help="budget per run (300)")
    b.add_argument(
        "--quick", action="store_true", help="one seed, 40 s per run (a smoke run, e.g. in CI)"
    )
    b.add_argument("--out", metavar="DIR", help="write train.json and train.md here")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    b.set_defaults(func=_cmd)


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"3"`` -> 0, 1, 2; ``"3-5"`` -> 3, 4, 5; ``"0,4"`` -> 0, 4.

    Raises:
        ConfigError: naming the text when it is none of these.
    """
    from tianji.runtime.errors import ConfigError

    try:
        if "," in text:
            seeds = tuple(int(t) for t in text.split(",") if t)
        elif "-" in text.strip("-"):
            low, high = (int(t) for t in text.split("-", 1))
            seeds = tuple(range(low, high + 1))
        else:
            seeds = tuple(range(int(text)))
    except ValueError as exc:
        raise ConfigError(
            "--seeds", text, "N (seeds 0..N-1), A-B or A,B,C with seeds >= 0"
        ) from exc
    if not seeds or min(seeds) < 0:
        raise ConfigError("--seeds", text, "N (seeds 0..N-1), A-B or A,B,C with seeds >= 0")
    return seeds


def parse_counts(flag: str, text: str) -> tuple[int | None, ...]:
    """``"1,2,8"`` -> (1, 2, 8); ``""`` -> (None,) (the example's count).

    Raises:
        ConfigError: naming the flag and the text for anything but positive integers.
    """
    from tianji.runtime.errors import ConfigError

    if not text:
        return (None,)
    try:
        counts = tuple(int(t) for t in text.split(",") if t)
    except ValueError as exc:
        raise ConfigError(flag, text, "comma-separated positive integers, e.g. 1,2,4,8") from exc
    if not counts or min(counts) < 1:
        raise ConfigError(flag, text, "comma-separated positive integers, e.g. 1,2,4,8")
    return counts


def _cmd(args: Any) -> int:
    from tianji.runtime.errors import ConfigError

    algos = tuple(a for a in args.algos.split(",") if a)
    systems = tuple(s for s in args.systems.split(",") if s)
    for a in algos:
        if a not in CONFIGS:
            raise ConfigError("--algos", a, " | ".join(CONFIGS))
    for s in systems:
        if s not in SYSTEMS:
            raise ConfigError("--systems", s, " | ".join(SYSTEMS))
    seeds = (0,) if args.quick else parse_seeds(args.seeds)
    actors = parse_counts("--actors", args.actors)
    if args.env_step_ms < 0:
        raise ConfigError("--env-step-ms", args.env_step_ms, "a number of milliseconds >= 0")
    if args.update_ms < 0:
        raise ConfigError("--update-ms", args.update_ms, "a number of milliseconds >= 0")
    max_seconds = 40.0 if args.quick else args.max_seconds
    report = run_bench(
        algos=algos,
        systems=systems,
        seeds=seeds,
        max_seconds=max_seconds,
        out_dir=args.out,
        command="tianji bench train " + " ".join(sys.argv[3:]),
        actors=actors,
        env_step_ms=args.env_step_ms,
        update_ms=args.update_ms,
    )
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    errors = [r for r in report["runs"] if "error" in r]
    return 1 if errors else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(_worker())
    sys.exit("usage: tianji bench train [...]  (this module's --worker mode is internal)")
