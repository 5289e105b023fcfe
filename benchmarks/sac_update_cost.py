"""What one SAC update costs on this machine, alone (no services): the bound on any SAC run.

    python benchmarks/sac_update_cost.py --out docs/results/sac-update-cost.json

Builds ``algorithms/sac.py``'s SAC for HalfCheetah-v5's spaces with the example's settings
(256x256 networks, batches of 256) and times ``update`` on a fixed random batch, after a
warm-up, in four ways: 1 and 2 torch threads, bf16 autocast (2 threads), and the networks
under ``torch.compile`` (2 threads). Prints and writes milliseconds per update. Run it alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def batch(n: int, obs_dim: int, act_dim: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "obs": rng.standard_normal((n, obs_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
        "reward": rng.standard_normal(n).astype(np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": rng.standard_normal((n, obs_dim)).astype(np.float32),
    }


def time_updates(threads: int, way: str, updates: int) -> float:
    import gymnasium as gym
    from tianji.algorithms.sac import SAC

    torch.set_num_threads(threads)
    env = gym.make("HalfCheetah-v5")
    algo = SAC(SAC.Config(), env.observation_space, env.action_space, seed=0, device="cpu")
    if way == "compile":
        algo.actor.net = torch.compile(algo.actor.net)
        algo.critic = torch.compile(algo.critic)
        algo.critic_target = torch.compile(algo.critic_target)
    b = batch(256, env.observation_space.shape[0], env.action_space.shape[0])
    for _ in range(30):  # optimizers, allocations, compilation
        algo.update(b)
    autocast: Any = torch.autocast("cpu", dtype=torch.bfloat16) if way == "bf16" else None
    started = time.perf_counter()
    if autocast is not None:
        with autocast:
            for _ in range(updates):
                algo.update(b)
    else:
        for _ in range(updates):
            algo.update(b)
    return 1000 * (time.perf_counter() - started) / updates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/sac_update_cost.py", description=__doc__)
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    rows = []
    for threads, way in ((1, "fp32"), (2, "fp32"), (2, "bf16"), (2, "compile")):
        ms = time_updates(threads, way, args.updates)
        rows.append({"threads": threads, "way": way, "ms_per_update": round(ms, 2)})
        print(json.dumps(rows[-1]), flush=True)
    report = {"updates": args.updates, "batch": 256, "hidden": [256, 256], "rows": rows,
              "unix": time.time()}  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
