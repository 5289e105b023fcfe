"""The bare ceiling of ``tianji bench throughput``: ``python -m tianji.bench.bare --env pong``.

The benchmark's envs (``tianji.rl.envs.env_factory``, training preprocessing included)
laid out as tianji's actors lay them out: ``--processes`` processes (2), each stepping its
``--envs`` envs (4) in turn in a gymnasium ``SyncVectorEnv`` with actions from its own copy
of the example's PPO network (forward pass on one torch thread, on the CPU): no learning,
no runtime, no messages. The processes build their envs and network, then meet at a
barrier; from there each counts the steps of the same window (``--seconds`` after
``--warmup``). Prints one JSON line: ``env_steps_per_s`` (the processes' rates summed),
``seconds`` (the shortest process window), ``processes`` (``{"env": P}``) and
``model_params`` (the network's trainable parameters).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from typing import Any

__all__ = ["main"]


def _stepper(env: str, envs: int, seconds: float, warmup: float, barrier: Any, out: Any) -> None:
    """One process: build, wait for the others, step for the window, report (steps, s)."""
    import gymnasium as gym
    import torch

    from tianji.algorithms.ppo import PPO, PPOConfig
    from tianji.bench.throughput import ALGO, ENVS
    from tianji.rl.config import EnvConfig
    from tianji.rl.envs import env_factory

    torch.set_num_threads(1)
    vec = gym.vector.SyncVectorEnv([env_factory(EnvConfig(**ENVS[env]))] * envs)
    try:
        algo = PPO(
            PPOConfig(**ALGO[env]),
            vec.single_observation_space,
            vec.single_action_space,
            device="cpu",
        )
        obs, _ = vec.reset(seed=0)
        barrier.wait(timeout=300)  # a sibling that failed to start breaks it
        window_start = time.perf_counter() + warmup
        counted_from: float | None = None
        steps = 0
        while True:
            obs, *_ = vec.step(algo.act(obs, explore=True)["action"])
            now = time.perf_counter()
            if counted_from is None:
                if now >= window_start:
                    counted_from = now
            else:
                steps += envs
                if now - counted_from >= seconds:
                    break
    finally:
        vec.close()
    params = sum(p.numel() for p in algo.net.parameters() if p.requires_grad)
    out.put((steps, now - counted_from, params))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tianji.bench.bare")
    parser.add_argument("--env", required=True, help="a key of tianji.bench.throughput.ENVS")
    parser.add_argument("--processes", type=int, default=2, help="env processes (as actors)")
    parser.add_argument("--envs", type=int, default=4, help="envs per process")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args(argv)

    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(args.processes), ctx.Queue()
    procs = [
        ctx.Process(
            target=_stepper,
            args=(args.env, args.envs, args.seconds, args.warmup, barrier, out),
            name=f"bare-{i}",
        )
        for i in range(args.processes)
    ]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=args.warmup + args.seconds + 300) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    print(
        json.dumps(
            {
                "env_steps_per_s": sum(steps / s for steps, s, _ in results),
                "seconds": min(s for _, s, _ in results),
                "processes": {"env": args.processes},
                "model_params": results[0][2],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
