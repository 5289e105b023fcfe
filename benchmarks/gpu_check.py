"""What tianji's accelerator paths do on this machine, as one JSON report.

    python benchmarks/gpu_check.py [--seconds 5] [--out DIR]

Without CUDA it reports ``"cuda": false`` and exits 0. With CUDA it measures, each for
``--seconds``, the same code a run executes:

* ``learner``: updates per second of the Pong CNN policy (``examples/pong_ppo.toml``'s PPO,
  a batch of 1,024 transitions of 4x84x84 frames) on CUDA and on the CPU, and their ratio;
* ``inference``: the batched forward pass (``act`` on 64 observations, as the inference
  service makes it) per second on CUDA;
* ``collective``: with two or more GPUs, a gradient all-reduce of 10 M values between two
  learner processes over NCCL, one GPU each (:mod:`tianji.services.collective`);

and exits 1 when CUDA is present but a path fails (its error is in the report under
``failures``). The measuring functions take the device as an argument;
``tests/test_gpu_check.py`` runs them on the CPU, so the code path is tested on machines
without a GPU too.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PONG = ROOT / "examples" / "pong_ppo.toml"


def pong_learner(device: str) -> tuple[Any, Any]:
    """The Pong example's PPO on ``device``, and its observation space."""
    from tianji.rl.envs import env_spaces_and_state
    from tianji.run.config import load_config
    from tianji.services.common import make_algorithm

    config = load_config(str(PONG), [])
    obs_space, _, _ = env_spaces_and_state(config.env)
    return make_algorithm(config, seed=0, device=device), obs_space


def rollout(algo: Any, obs_space: Any, steps: int, envs: int) -> dict[str, np.ndarray]:
    """A ``[steps, envs]`` fragment of random frames, acted on by ``algo`` (what a learner
    consumes)."""
    rng = np.random.default_rng(0)
    shape = (steps, envs, *obs_space.shape)
    obs = rng.integers(0, 256, shape, dtype=np.uint8)
    out = algo.act(obs.reshape(steps * envs, *obs_space.shape), explore=True)
    fragment = {
        "obs": obs,
        "next_obs": rng.integers(0, 256, shape, dtype=np.uint8),
        "reward": rng.standard_normal((steps, envs)).astype(np.float32),
        "terminated": rng.random((steps, envs)) < 0.01,
        "truncated": np.zeros((steps, envs), bool),
        **{k: v.reshape(steps, envs, *v.shape[1:]) for k, v in out.items()},
    }
    return dict(algo.postprocess(fragment))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def updates_per_s(device: str, seconds: float, steps: int = 128, envs: int = 8) -> float:
    """Learner updates per second of the Pong CNN on ``device`` (a warm-up update first)."""
    algo, space = pong_learner(device)
    batch = rollout(algo, space, steps, envs)
    algo.update(batch)
    _sync(device)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or done == 0:
        algo.update(batch)
        done += 1
    _sync(device)
    return done / (time.perf_counter() - started)


def forwards_per_s(device: str, seconds: float, batch: int = 64) -> float:
    """Batched forward passes (``act`` on ``batch`` observations) per second on ``device``."""
    algo, space = pong_learner(device)
    obs = np.random.default_rng(1).integers(0, 256, (batch, *space.shape), dtype=np.uint8)
    algo.act(obs, explore=True)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or done == 0:
        algo.act(obs, explore=True)
        done += 1
    _sync(device)
    return done / (time.perf_counter() - started)


def nccl_allreduce(steps: int = 20) -> dict[str, Any]:
    """Two learner processes, one GPU each, averaging 10 M values over NCCL."""
    from tianji.bench.allreduce import run_way

    return run_way("collective", 2, 10_000_000, steps, 3, device="cuda", backend="nccl")


def check(seconds: float) -> dict[str, Any]:
    """The report (see the module docstring)."""
    import torch

    report: dict[str, Any] = {
        "cuda": torch.cuda.is_available(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "checks": {},
        "failures": {},
    }
    if not report["cuda"]:
        report["note"] = "no CUDA: nothing to measure (the CPU paths run in tests)"
        return report
    report["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    steps = {
        "learner": lambda: {
            "cuda_updates_per_s": updates_per_s("cuda", seconds),
            "cpu_updates_per_s": updates_per_s("cpu", seconds),
        },
        "inference": lambda: {"cuda_forwards_per_s": forwards_per_s("cuda", seconds)},
    }
    if torch.cuda.device_count() >= 2:
        steps["collective"] = nccl_allreduce
    for name, measure in steps.items():
        try:
            report["checks"][name] = measure()
        except Exception as exc:  # report every failing path, then exit 1
            report["failures"][name] = f"{type(exc).__name__}: {exc}"
    learner = report["checks"].get("learner")
    if learner:
        learner["cuda_over_cpu"] = learner["cuda_updates_per_s"] / learner["cpu_updates_per_s"]
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__)
    p.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    p.add_argument("--out", type=Path, default=None, help="also write gpu-check.json here")
    args = p.parse_args(argv)
    report = check(args.seconds)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-check.json").write_text(text + "\n")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
