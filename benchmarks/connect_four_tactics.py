"""How often a connect-four policy follows the one-move tactical rules in its games.

    python benchmarks/connect_four_tactics.py RUN_DIR [--games 200] [--seed 0] [--out FILE]

Plays ``--games`` games of the run's newest checkpoint (its greedy moves) against the
scripted player (``tianji.rl.selfplay.ConnectFourScripted``), half first and half second,
and at each of the policy's moves asks ``tianji.rl.selfplay.connect_four_tactic`` which
one-move rule decides the position:

- ``win``: the policy can win at once; right if it plays a winning column.
- ``block``: it cannot, and the opponent could win in exactly one column; right if the
  policy plays there.
- ``safe``: neither, and some columns (not all) let the opponent win on top of the
  policy's piece; right if it plays none of them.

Prints, per kind, how many positions came up and the share the policy got right, and how
many of its losses followed a missed win or block (the scripted player never misses
these). ``--out FILE`` writes the same as JSON; ``benchmarks/selfplay.py`` reports it for
the policy it trains.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tianji.rl.selfplay import (
    TACTICS,
    ConnectFourScripted,
    TwoPlayerGame,
    connect_four_tactic,
    two_player_factory,
)

GAME = "pettingzoo.classic.connect_four_v3"


def _play(
    env: TwoPlayerGame, policy: Callable[[np.ndarray], Any], seed: int, tally: dict[str, list[int]]
) -> tuple[float, bool]:
    """One game; its outcome and whether the policy missed a win or a block in it."""
    obs, _ = env.reset(seed=seed)
    missed, done, info = False, False, {}
    while not done:
        move = int(np.asarray(policy(obs[None])).reshape(-1)[0])
        tactic = connect_four_tactic(obs)
        if tactic is not None:
            kind, right = tactic
            tally[kind][0] += move in right
            tally[kind][1] += 1
            missed |= move not in right and kind != "safe"
        obs, _, terminated, truncated, info = env.step(move)
        done = terminated or truncated
    return float(info["outcome"]), missed


def tactics(policy: Callable[[np.ndarray], Any], games: int, seed: int = 0) -> dict[str, Any]:
    """``policy``'s one-move tactics in ``games`` games against the scripted player."""
    if games < 2 or games % 2:
        raise ValueError(f"games must be even and >= 2, got {games}")
    env = two_player_factory(GAME, {}, "alternate")()
    env.set_opponent(ConnectFourScripted(seed=seed))
    tally = {kind: [0, 0] for kind in TACTICS}
    losses = after_miss = 0
    try:
        for k in range(games):
            outcome, missed = _play(env, policy, seed + k, tally)
            losses += outcome < 0
            after_miss += outcome < 0 and missed
    finally:
        env.close()
    out: dict[str, Any] = {
        kind: {"right": round(r / n, 4) if n else None, "positions": n}
        for kind, (r, n) in tally.items()
    }
    return {**out, "games": games, "losses": losses, "losses_after_a_miss": after_miss}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/connect_four_tactics.py")
    parser.add_argument("run_dir")
    parser.add_argument("--games", type=int, default=200, help="even: half first, half second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from tianji.run.policy import load_policy

    policy = load_policy(args.run_dir)
    report = {
        "checkpoint": str(policy.checkpoint),
        "policy_version": policy.policy_version,
        **tactics(policy, args.games, args.seed),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
