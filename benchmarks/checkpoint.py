"""What a checkpoint costs: state size, pack time on the learner, unpack + load on resume.

    python benchmarks/checkpoint.py [--repeat N] [--replay-capacity N]

Measures the example configs' learner state (networks + Adam moments, as
``tianji.rl.checkpoint.algorithm_state`` packs it) and a full replay buffer of CartPole
transitions (``[checkpoint] replay``). Packing runs on learner-0's event loop between two
updates, so its time is what a checkpoint adds to one update.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from tianji.rl.buffers import ReplayBuffer
from tianji.rl.checkpoint import algorithm_state, pack_state, restore_algorithm, unpack_state
from tianji.run.config import load_config
from tianji.services.common import make_algorithm

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _timed(fn: object, repeat: int) -> float:
    assert callable(fn)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def learner_state(config_name: str, repeat: int) -> str:
    config = load_config(EXAMPLES / config_name)
    algo = make_algorithm(config, seed=0, device="cpu")
    optimizer = algo.optimizer
    for group in optimizer.param_groups:  # one step, so Adam's moments exist
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    blob = pack_state(algorithm_state(algo))
    pack = _timed(lambda: pack_state(algorithm_state(algo)), repeat)
    load = _timed(lambda: restore_algorithm(algo, unpack_state(blob), 0), repeat)
    return (
        f"{config_name:22} learner state {len(blob) / 1e6:6.2f} MB   "
        f"pack {pack * 1e3:6.2f} ms   unpack+load {load * 1e3:6.2f} ms"
    )


def replay_state(capacity: int, repeat: int) -> str:
    rng = np.random.default_rng(0)
    buffer = ReplayBuffer(capacity)
    chunk = 1000
    for v in range(capacity // chunk):
        buffer.add(
            {
                "obs": rng.random((chunk, 4), np.float32),
                "next_obs": rng.random((chunk, 4), np.float32),
                "action": np.zeros(chunk, np.int64),
                "reward": np.ones(chunk, np.float32),
                "discount": np.full(chunk, 0.98, np.float32),
            },
            policy_version=v,
        )
    blob = pack_state(buffer.state_dict())
    pack = _timed(lambda: pack_state(buffer.state_dict()), repeat)
    load = _timed(lambda: ReplayBuffer(capacity).load_state_dict(unpack_state(blob)), repeat)
    return (
        f"replay {capacity:,} CartPole transitions {len(blob) / 1e6:6.2f} MB   "
        f"pack {pack * 1e3:6.1f} ms   unpack+load {load * 1e3:6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=50, help="timings averaged over N runs")
    parser.add_argument("--replay-capacity", type=int, default=100_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in ("cartpole_ppo.toml", "cartpole_dqn.toml"):
        print(learner_state(name, args.repeat), flush=True)
    print(replay_state(args.replay_capacity, max(1, args.repeat // 10)), flush=True)


if __name__ == "__main__":
    main()
