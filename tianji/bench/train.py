"""``tianji bench train``: time-to-target on CartPole-v1, tianji's modes side by side.

One invocation runs, interleaved seed by seed, every (algorithm, system) pair: tianji
``relaxed``, ``sync`` and ``unbalanced`` (the run configs in :data:`CONFIGS`, the same as
``examples/cartpole_ppo.toml`` and ``examples/cartpole_dqn.toml``); from a checkout,
``python benchmarks/peers.py train`` adds Stable-Baselines3 with the RL Zoo's
hyperparameters (``benchmarks/sb3.py``, a :class:`Peer`). Every run is a fresh process.
It prints a progress line per run, then a markdown table with the median and spread of
time-to-target, env steps to target, env steps per second and final return, and the
ratios tianji/SB3 and relaxed/sync, and a second table of where each mode spent its time
(stale and evicted samples, actor pause, learner idle and busy time); ``--out DIR`` also
writes ``train.json`` and ``train.md``. ``--actors 1,2,4,...`` repeats every run for each
actor count (the controller at scale); ``--update-ms X`` makes every learner update wait X
ms more (:mod:`tianji.bench.algos`: a learner on an accelerator); ``--env-step-ms X`` makes
every env step take X ms more (:class:`tianji.bench.envs.DelayedEnv`: an expensive env,
where what relaxing the actor/learner dependency buys shows even on a small machine; a
peer is not run then).

Time-to-target is wall-clock from launching the run's process to the moment the mean return
of the last 20 training episodes reached the target, for both systems: it includes Python
start-up and imports, and for tianji starting its service processes (``startup_s`` in the
JSON). Env steps per second are over the time the actors ran (tianji) or the whole run
(SB3). The figures and tables are :mod:`tianji.bench.train_report`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tianji.bench.spawn import run_json_child, run_training
from tianji.bench.train_report import SYSTEMS, aggregate, markdown, waste_and_waits

__all__ = ["CONFIGS", "TARGETS", "Peer", "run_bench"]

log = logging.getLogger(__name__)

TARGETS = {"ppo": 475.0, "dqn": 300.0, "sac": -200.0, "td3": -200.0}
"""CartPole-v1 targets: PPO to 475 (the env's threshold), DQN to 300 (original TianJi's);
Pendulum-v1 (SAC, TD3): a mean return of -200."""


@dataclasses.dataclass(frozen=True, slots=True)
class Peer:
    """Another system's runs beside tianji's (``benchmarks/peers.py`` gives them)."""

    command: Callable[[str, int, float, float], list[str]]
    """The command line of one run from (algorithm, seed, target return, max seconds);
    the process prints one JSON line with :data:`KEYS` (those it has)."""
    missing: str | None = None
    """Why it cannot run on this machine (its runs are skipped), or ``None``."""


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
        "controller": {"mode": "relaxed"},
        "algo": {
            "updates_per_step": 0.125,
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
    "sac": {
        "algorithm": "sac",
        "transport": "tcp",
        "env": {"id": "Pendulum-v1"},
        "actors": {"count": 2, "envs_per_actor": 1, "fragment_length": 16},
        "learner": {"prefetch": 2},
        "controller": {"mode": "relaxed"},
        "algo": {
            "lr": 1e-3,
            "hidden": [64, 64],
            "updates_per_step": 1.0,
            "learning_starts": 1000,
            "random_steps": 1000,
        },
    },
}
"""tianji's benchmark run configs (a test keeps them equal to the examples)."""
CONFIGS["td3"] = {**CONFIGS["sac"], "algorithm": "td3"}

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
    peer: Peer | None = None,
) -> dict[str, Any]:
    launched = time.time()
    if peer is not None:
        cmd = peer.command(algo, seed, TARGETS[algo], max_seconds)
        run = run_json_child(cmd, None, max_seconds + 120, tail=5)
    else:
        data = run_config(algo, system, seed, max_seconds, actors, env_step_ms, update_ms)
        run = run_training(data, max_seconds + 120)
    if run.result is None:
        return {"system": system, "algorithm": algo, "seed": seed, "error": run.error}
    result = run.result
    result.update(system=system, algorithm=algo, seed=seed)
    if peer is None:
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
    peers: Mapping[str, Peer] | None = None,
) -> dict[str, Any]:
    """Run the plan, printing progress to stderr; return (and write) the report.
    ``systems`` may name ``peers`` (each run by its command)."""
    peers = _runnable(peers or {}, systems, slowed=env_step_ms > 0 or update_ms > 0)
    systems = tuple(s for s in systems if s in SYSTEMS or s in peers)
    plan = Plan(algos, systems, seeds, max_seconds, actors, env_step_ms, update_ms)
    runs = plan.runs()
    results = []
    started = time.monotonic()
    for i, (seed, algo, system, n) in enumerate(runs, 1):
        who = f" {n} actors" if n is not None and system not in peers else ""
        print(
            f"[{i}/{len(runs)}] {algo} {system}{who} seed {seed} ...", file=sys.stderr, flush=True
        )
        peer = peers.get(system)
        r = _run_one(seed, algo, system, max_seconds, n, env_step_ms, update_ms, peer)
        results.append(r)
        elapsed = time.monotonic() - started
        print(f"    {_outcome(r, algo)}  [{elapsed:.0f} s so far]", file=sys.stderr)
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


def _runnable(peers: Mapping[str, Peer], systems: tuple[str, ...], slowed: bool) -> dict[str, Peer]:
    """The ``peers`` of ``systems`` that run here (saying on stderr why the others do not)."""
    kept = {}
    for name, peer in peers.items():
        if name not in systems:
            continue
        if slowed:
            print(
                "tianji bench train: --env-step-ms / --update-ms slow tianji's runs only; "
                f"{name} runs are skipped",
                file=sys.stderr,
            )
        elif peer.missing is not None:
            print(f"tianji bench train: {peer.missing}; {name} runs are skipped", file=sys.stderr)
        else:
            kept[name] = peer
    return kept


def _outcome(r: dict[str, Any], algo: str) -> str:
    """A run's progress line: how it ended, its rate and its waste."""
    if "error" in r:
        note = f"failed: {r['error'].splitlines()[-1] if r['error'] else '?'}"
    elif r.get("launch_to_target_s") is not None:
        note = (
            f"{r['launch_to_target_s']:.1f} s to {TARGETS[algo]:g} "
            f"({r['env_steps_to_target']:,} steps)"
        )
    else:
        final = r.get("final_return")
        shown = "—" if final is None else f"{final:.1f}"
        note = f"target not reached ({r.get('stop_reason')}); final {shown}"
    rate = r.get("env_steps_per_s_running") or 0
    waste = ""
    if r.get("stale_pct") is not None:
        waste = f"; stale {r['stale_pct']:.2f}%, evicted {r['evicted_pct']:.2f}%"
    return f"{note}; {rate:,.0f} env steps/s{waste}"


def add_parser(
    bench: Any,
    peers: Mapping[str, Peer] | None = None,
    command: Callable[[], str] = lambda: "tianji bench train " + " ".join(sys.argv[3:]),
) -> None:
    """Add ``tianji bench train`` to the ``bench`` subparsers: tianji's systems, and
    ``peers`` beside them (``benchmarks/peers.py``); ``command`` is the command line the
    report quotes."""
    peers = dict(peers or {})
    systems = (*SYSTEMS, *peers)
    b = bench.add_parser(
        "train",
        help="time-to-target on CartPole-v1: tianji "
        + "/".join(SYSTEMS)
        + "".join(f" against {p}" for p in peers),
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    b.add_argument("--algos", default="ppo,dqn", help="comma-separated (default ppo,dqn)")
    b.add_argument(
        "--systems", default=",".join(systems), help=f"comma-separated subset of {systems}"
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
        help="make every env step take this many ms longer (DelayedEnv; no peer runs)",
    )
    b.add_argument(
        "--update-ms",
        type=float,
        default=0.0,
        help="make every learner update wait this many ms longer, as on an accelerator "
        "(tianji.bench.algos; no peer runs)",
    )
    b.add_argument("--max-seconds", type=float, default=300.0, help="budget per run (300)")
    b.add_argument(
        "--quick", action="store_true", help="one seed, 40 s per run (a smoke run, e.g. in CI)"
    )
    b.add_argument("--out", metavar="DIR", help="write train.json and train.md here")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    b.set_defaults(func=functools.partial(_cmd, peers=peers, command=command))


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


def _cmd(args: Any, peers: dict[str, Peer], command: Callable[[], str]) -> int:
    from tianji.runtime.errors import ConfigError

    algos = tuple(a for a in args.algos.split(",") if a)
    systems = tuple(s for s in args.systems.split(",") if s)
    for a in algos:
        if a not in CONFIGS:
            raise ConfigError("--algos", a, " | ".join(CONFIGS))
    for s in systems:
        if s not in SYSTEMS and s not in peers:
            known = " | ".join((*SYSTEMS, *peers))
            if not peers:  # the peer runs from a checkout
                known += " (sb3 beside them: python benchmarks/peers.py train)"
            raise ConfigError("--systems", s, known)
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
        command=command(),
        actors=actors,
        env_step_ms=args.env_step_ms,
        update_ms=args.update_ms,
        peers=peers,
    )
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    errors = [r for r in report["runs"] if "error" in r]
    return 1 if errors else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(_worker())
    sys.exit("usage: tianji bench train [...]  (this module's --worker mode is internal)")
