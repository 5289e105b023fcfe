"""The bare ceiling of ``tianji bench throughput``: ``python -m tianji.bench.bare --env pong``.

The same envs as the benchmark's actors (``tianji.rl.envs.env_factory``, training
preprocessing included) in one gymnasium ``AsyncVectorEnv`` (a process per env), stepped
with actions from the same PPO network's forward pass in this process, on the CPU: no
learning, no runtime, no messages. Prints one JSON line: ``env_steps_per_s`` and
``seconds`` of the window after ``--warmup``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tianji.bench.bare")
    parser.add_argument("--env", required=True, help="a key of tianji.bench.throughput.ENVS")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args(argv)

    import gymnasium as gym
    import torch

    from tianji.algorithms.ppo import PPO, PPOConfig
    from tianji.bench.throughput import ALGO, ENVS
    from tianji.rl.config import EnvConfig
    from tianji.rl.envs import env_factory

    torch.set_num_threads(1)
    config = EnvConfig(**ENVS[args.env])
    envs = gym.vector.AsyncVectorEnv([env_factory(config)] * args.envs)
    try:
        algo = PPO(
            PPOConfig(**ALGO[args.env]),
            envs.single_observation_space,
            envs.single_action_space,
            device="cpu",
        )
        obs, _ = envs.reset(seed=0)
        steps, started = 0, time.perf_counter()
        window_start = started + args.warmup
        counted_from: float | None = None
        while True:
            obs, *_ = envs.step(algo.act(obs, explore=True)["action"])
            now = time.perf_counter()
            if counted_from is None and now >= window_start:
                counted_from, steps = now, 0
            elif counted_from is not None:
                steps += args.envs
                if now - counted_from >= args.seconds:
                    break
    finally:
        envs.close()
    seconds = now - counted_from
    print(json.dumps({"env_steps_per_s": steps / seconds, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
