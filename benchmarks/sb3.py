"""Stable-Baselines3 runs beside tianji's in ``python benchmarks/peers.py train``, with the RL
Zoo's hyperparameters.

Run as ``python benchmarks/sb3.py ALGO --seed S --target-return R --max-seconds T`` (one
process per run, like tianji's); prints one JSON line with the same keys as tianji's
summary that the benchmark compares. Needs ``pip install "tianji[bench]"``.

The hyperparameters are those of rl-baselines3-zoo (``hyperparams/ppo.yml`` and
``hyperparams/dqn.yml``, entry ``CartPole-v1``; ``hyperparams/sac.yml`` and
``hyperparams/td3.yml``, entry ``Pendulum``); training runs for the zoo's
``n_timesteps`` (their learning-rate schedules depend on it) and stops early once the mean
return of the last 20 training episodes reaches the target: the same criterion as
``tianji train``.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from typing import Any

__all__ = ["ZOO", "run"]

ZOO: dict[str, dict[str, Any]] = {
    "ppo": {
        "n_envs": 8,
        "n_timesteps": 100_000,
        "kwargs": {
            "n_steps": 32,
            "batch_size": 256,
            "gae_lambda": 0.8,
            "gamma": 0.98,
            "n_epochs": 20,
            "ent_coef": 0.0,
            "learning_rate": ("linear", 0.001),
            "clip_range": ("linear", 0.2),
        },
    },
    "dqn": {
        "n_envs": 1,
        "n_timesteps": 50_000,
        "kwargs": {
            "learning_rate": 2.3e-3,
            "batch_size": 64,
            "buffer_size": 100_000,
            "learning_starts": 1000,
            "gamma": 0.99,
            "target_update_interval": 10,
            "train_freq": 256,
            "gradient_steps": 128,
            "exploration_fraction": 0.16,
            "exploration_final_eps": 0.04,
            "policy_kwargs": {"net_arch": [256, 256]},
        },
    },
    "sac": {
        "env": "Pendulum-v1",
        "n_envs": 1,
        "n_timesteps": 20_000,
        "kwargs": {"learning_rate": 1e-3},  # the rest: SB3's defaults, as the zoo leaves them
    },
    "td3": {  # hyperparams/td3.yml, Pendulum: its noise, buffer and net, stepped every step
        "env": "Pendulum-v1",
        "n_envs": 1,
        "n_timesteps": 20_000,
        "noise_std": 0.1,
        "kwargs": {
            "gamma": 0.98,
            "buffer_size": 200_000,
            "learning_starts": 10_000,
            "learning_rate": 1e-3,
            "policy_kwargs": {"net_arch": [400, 300]},
        },
    },
    # hyperparams/sac.yml, MuJoCo defaults: 10,000 random warm-up steps, SAC's defaults else
    "sac_halfcheetah": {
        "algo": "sac",
        "env": "HalfCheetah-v5",
        "n_envs": 1,
        "n_timesteps": 1_000_000,
        "kwargs": {"learning_starts": 10_000},
    },
    # hyperparams/td3.yml, MuJoCo: 10,000 warm-up steps, noise 0.1, 400x300, lr 1e-3
    "td3_hopper": {
        "algo": "td3",
        "env": "Hopper-v5",
        "n_envs": 1,
        "n_timesteps": 1_000_000,
        "noise_std": 0.1,
        "kwargs": {
            "learning_starts": 10_000,
            "learning_rate": 1e-3,
            "batch_size": 256,
            "train_freq": 1,
            "gradient_steps": 1,
            "policy_kwargs": {"net_arch": [400, 300]},
        },
    },
}
"""The zoo's entries: CartPole-v1 for PPO and DQN, Pendulum-v1 for SAC and TD3 (``env``),
and MuJoCo tasks under ``<algorithm>_<task>`` (``algo`` names the algorithm)."""


def _linear(start: float) -> Any:
    return lambda progress_remaining: progress_remaining * start


def run(
    algo: str, *, seed: int, target_return: float, max_seconds: float, window: int = 20
) -> dict[str, Any]:
    """Train SB3 ``algo`` on its zoo env; return time/steps to target and throughput."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    started = time.monotonic()
    zoo = ZOO[algo]
    kwargs = {k: _linear(v[1]) if isinstance(v, tuple) else v for k, v in zoo["kwargs"].items()}
    env = make_vec_env(zoo.get("env", "CartPole-v1"), n_envs=zoo["n_envs"], seed=seed)
    if "noise_std" in zoo:
        import numpy as np
        from stable_baselines3.common.noise import NormalActionNoise

        dim = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(dim), zoo["noise_std"] * np.ones(dim))
    cls = {"ppo": sb3.PPO, "dqn": sb3.DQN, "sac": sb3.SAC, "td3": sb3.TD3}[zoo.get("algo", algo)]
    model = cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    returns: collections.deque[float] = collections.deque(maxlen=window)
    state: dict[str, Any] = {
        "time_to_target_s": None,
        "env_steps_to_target": None,
        "target_reached_unix": None,
    }

    class Watch(BaseCallback):  # type: ignore[misc,unused-ignore]  # Any without SB3 stubs
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", ()):
                episode = info.get("episode")
                if episode is not None:
                    returns.append(float(episode["r"]))
            full = len(returns) == window
            if full and sum(returns) / window >= target_return:
                state["time_to_target_s"] = round(time.monotonic() - started, 3)
                state["target_reached_unix"] = time.time()
                state["env_steps_to_target"] = int(self.num_timesteps)
                return False
            return time.monotonic() - started < max_seconds

    model.learn(total_timesteps=zoo["n_timesteps"], callback=Watch())
    wall = time.monotonic() - started
    steps = int(model.num_timesteps)
    return {
        "system": "sb3",
        "algorithm": algo,
        "seed": seed,
        "env_steps": steps,
        "wall_s": round(wall, 3),
        "env_steps_per_s": round(steps / wall, 1),
        "env_steps_per_s_running": round(steps / wall, 1),
        "final_return": sum(returns) / len(returns) if returns else None,
        "target_return": target_return,
        **state,
        "stop_reason": (
            "target_return reached"
            if state["time_to_target_s"] is not None
            else "max_seconds reached"
            if wall >= max_seconds
            else "zoo n_timesteps reached"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/sb3.py", description=__doc__)
    p.add_argument("algo", choices=sorted(ZOO))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-return", type=float, required=True)
    p.add_argument("--max-seconds", type=float, default=300.0)
    p.add_argument("--window", type=int, default=20, help="episodes in the mean return")
    args = p.parse_args(argv)
    result = run(
        args.algo,
        seed=args.seed,
        target_return=args.target_return,
        max_seconds=args.max_seconds,
        window=args.window,
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
