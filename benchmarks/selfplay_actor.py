"""An actor's self-play steps per second, opponents moved one at a time or batched.

    python benchmarks/selfplay_actor.py --out docs/results/selfplay-actor-batching.json

Builds what one actor of ``examples/connect_four_selfplay.toml`` steps: a group of
``--envs`` connect-four games, the learner's moves from PPO's board net (one batched call
per step, as an actor with local inference makes), opponents drawn for every game as the
league draws them (``--latest`` of the games against the newest of ``--snapshots`` snapshot
policies, the rest uniform over the pool; optionally ``--live`` of them against the
learner's own policy). Steps the same games for ``--seconds`` each way, alternating
rounds so a slow moment hits all: gymnasium's ``SyncVectorEnv`` (every opponent move its
own policy call, as before ``tianji.rl.selfplay_vector``; ``one_by_one``),
:class:`~tianji.rl.selfplay_vector.TwoPlayerVectorEnv` (moves batched by opponent;
``batched``), and the same with PettingZoo's checking wrappers left on the games
(``checked``; :func:`tianji.rl.selfplay.without_checks` takes them off). Prints and writes
learner moves per second, policy calls per move and the ratios batched / one by one
(``speedup``) and batched / checked (``checks_off_speedup``). One thread,
like an actor (``[actors] torch_threads = 1``). Run it alone on the machine.

``--profile SECONDS`` instead profiles the batched way under cProfile and reports the share
of its time in the opponents' policy calls, the learner's, the games' steps (each move's
check and the game's own step, through whatever wrappers it has) and their observations.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "connect_four_selfplay.toml"
GAME = "pettingzoo.classic.connect_four_v3"


def build(way: str, envs: int, snapshots: int, latest: float, live: float, seed: int) -> Any:
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from tianji.rl.selfplay import PolicyOpponent, two_player_factory
    from tianji.rl.selfplay_vector import TwoPlayerVectorEnv
    from tianji.services.common import make_algorithm, parse_run_config

    run = parse_run_config(tomllib.loads(EXAMPLE.read_text()))
    learner = make_algorithm(run, seed=seed, device="cpu")
    pool = []
    for k in range(snapshots):
        policy = make_algorithm(run, seed=seed + k + 1, device="cpu")
        pool.append(PolicyOpponent(f"v{k}", lambda o, p=policy: p.act(o, explore=True)["action"]))
    live_opponent = PolicyOpponent("live", lambda o: learner.act(o, explore=True)["action"])
    rng = np.random.default_rng(seed)

    def draw() -> Any:
        u = rng.random()
        if u < live:
            return live_opponent
        if u < live + (1 - live) * latest:
            return pool[-1]
        return pool[int(rng.integers(len(pool)))]

    make = two_player_factory(GAME, {}, "alternate")
    if way in ("batched", "checked"):
        env = TwoPlayerVectorEnv([make] * envs)
    else:
        env = SyncVectorEnv([make] * envs, autoreset_mode=AutoresetMode.SAME_STEP)
    for game in env.envs:
        game.opponent_source = draw
        if way == "checked":  # PettingZoo's checking wrappers back on, as it makes the game
            game.game = importlib.import_module(GAME).env()
    counted = [0]
    for opponent in [*pool, live_opponent]:
        inner = opponent._act

        def counting(obs: np.ndarray, inner: Any = inner) -> np.ndarray:
            counted[0] += 1
            return inner(obs)  # type: ignore[no-any-return]

        opponent._act = counting
    return env, learner, counted


def step_for(
    way: str, seconds: float, args: argparse.Namespace, profiler: Any = None
) -> dict[str, float]:
    """Step ``way``'s games for ``seconds`` (under ``profiler`` if given): learner moves per
    second, opponent policy calls per move and the seconds stepped."""
    env, learner, counted = build(way, args.envs, args.snapshots, args.latest, args.live, 0)
    obs, _ = env.reset(seed=0)
    moves, start = 0, time.perf_counter()
    counted[0] = 0
    if profiler is not None:
        profiler.enable()
    while time.perf_counter() - start < seconds:
        obs, *_ = env.step(learner.act(obs, explore=True)["action"])
        moves += args.envs
    if profiler is not None:
        profiler.disable()
    elapsed = time.perf_counter() - start
    env.close()
    return {
        "moves_per_s": moves / elapsed,
        "opponent_calls_per_move": counted[0] / moves,
        "seconds": elapsed,
    }


PARTS = {  # part -> (file, function) whose cumulative time it is; learner = all calls - opponents'
    "opponent policy calls": ("selfplay.py", "(act_batch)"),
    "moves (the mask's check, the game's step)": ("selfplay.py", "(_move)"),
    "observations": ("selfplay.py", "(_view)"),
    "networks' forward passes": ("_actor_critic.py", "(forward)"),  # (inside the policy calls)
    "of which linear layers": ("~:0", "torch._C._nn.linear>)"),
    "of which convolutions": ("~:0", "torch.conv2d>)"),
}


def profile(seconds: float, args: argparse.Namespace) -> dict[str, Any]:
    """Where the batched way's time goes, under cProfile (which slows Python code more than
    torch's): each part of :data:`PARTS`'s share of the ``seconds`` stepped."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    stepped = step_for("batched", seconds, args, profiler)
    cumulative: dict[str, float] = {}
    for (path, line, name), row in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        key = f"{Path(path).name}:{line}({name})"
        cumulative[key] = cumulative.get(key, 0.0) + row[3]

    def total(where: str, what: str) -> float:
        return sum(v for k, v in cumulative.items() if k.startswith(where) and k.endswith(what))

    parts = {part: total(*where) for part, where in PARTS.items()}
    parts["learner policy calls"] = total("ppo.py", "(act)") - parts["opponent policy calls"]
    return {
        "seconds": round(stepped["seconds"], 3),
        "moves_per_s_profiled": stepped["moves_per_s"],
        "share": {k: round(v / stepped["seconds"], 3) for k, v in parts.items()},
    }


def ways(args: argparse.Namespace) -> dict[str, Any]:
    """Every way in alternating rounds: the medians and the ratios."""
    runs: dict[str, list[dict[str, float]]] = {"one_by_one": [], "checked": [], "batched": []}
    for r in range(args.rounds):
        for way in runs:
            runs[way].append(step_for(way, args.seconds, args))
            print(f"round {r + 1} {way}: {runs[way][-1]}", file=sys.stderr)
    med = {w: {k: float(np.median([x[k] for x in v])) for k in v[0]} for w, v in runs.items()}
    return {
        "rounds": runs,
        "median": med,
        "speedup": med["batched"]["moves_per_s"] / med["one_by_one"]["moves_per_s"],
        "checks_off_speedup": med["batched"]["moves_per_s"] / med["checked"]["moves_per_s"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/selfplay_actor.py", description=__doc__)
    p.add_argument("--envs", type=int, default=16, help="games in the group (the example's)")
    p.add_argument("--snapshots", type=int, default=40, help="the example's pool_size")
    p.add_argument("--latest", type=float, default=0.5, help="the example's latest_prob")
    p.add_argument("--live", type=float, default=0.0, help="share of live games")
    p.add_argument("--seconds", type=float, default=20.0, help="per way and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--profile", type=float, default=0.0, metavar="SECONDS",
        help="instead: profile the batched way for SECONDS and report each part's share",
    )  # fmt: skip
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    report = profile(args.profile, args) if args.profile > 0 else ways(args)
    report["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    report["command"] = "python benchmarks/selfplay_actor.py " + " ".join(argv or sys.argv[1:])
    report["unix"] = time.time()
    shown = ("share", "moves_per_s_profiled") if args.profile > 0 else ("median",)
    ratios = {k: round(report[k], 2) for k in ("speedup", "checks_off_speedup") if k in report}
    print(json.dumps({**{k: report[k] for k in shown}, **ratios}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
