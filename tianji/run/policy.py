"""Trained policies outside a run: load one in Python, or export it for programs without tianji.

Usage::

    from tianji.run.policy import load_policy

    policy = load_policy("runs/sac-Pendulum-v1-20261205-134014")   # the newest checkpoint
    actions = policy(obs_batch)                  # greedy actions, numpy [N, ...]
    policy.export("pendulum.onnx", "onnx")      # or "torchscript" (.pt)

``tianji export RUN_OR_CHECKPOINT --format torchscript|onnx`` does the same from the shell.
The exported file maps a batch of observations (float32 ``[N, ...]``; uint8 images as they
are) to greedy actions (int64 ``[N]`` or float32 ``[N, ...]`` within the action space's
bounds), exactly as ``policy(obs)`` and ``tianji eval`` choose them; a JSON file beside it
(``<file>.json``) names the run, algorithm, env, policy version, input and output. A program
loads it with torch alone (``torch.jit.load``) or with onnxruntime (``InferenceSession``).
Recurrent and multi-agent policies are refused with the reason (exit status 2 from the CLI).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np

from tianji.rl.checkpoint import Checkpoint
from tianji.rl.config import RunConfig
from tianji.run.evaluate import load_algorithm, open_run, resolve_checkpoint
from tianji.runtime.errors import ConfigError

__all__ = ["FORMATS", "Policy", "load_policy"]

FORMATS = {"torchscript": ".pt", "onnx": ".onnx"}
"""Export formats and their file suffixes."""


class Policy:
    """A trained policy: greedy actions for batches of observations.

    Attributes:
        algorithm, env_id: what the run trained.
        policy_version: the learner updates behind these weights.
        observation_space, action_space: the env's (gymnasium spaces).
        checkpoint: the checkpoint file the weights came from.
    """

    def __init__(self, config: RunConfig, ckpt: Checkpoint, algo: Any, spaces: Any) -> None:
        self.algorithm, self.env_id = config.algorithm, config.env.id
        self.policy_version = ckpt.policy_version
        self.checkpoint = ckpt.path
        self.observation_space, self.action_space = spaces
        self.algo = algo

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions for ``obs [N, ...]`` (``act(obs, explore=False)``)."""
        if getattr(self.algo, "recurrent", False):
            why = "a feed-forward policy: a recurrent one needs a state per env (tianji eval)"
            raise ConfigError("algorithm", self.algorithm, why)
        out: np.ndarray = self.algo.act(np.asarray(obs), explore=False)["action"]
        return out

    def module(self) -> Any:
        """The greedy policy as one ``torch.nn.Module`` (in eval mode, on the CPU).

        Raises:
            ConfigError: for an algorithm without ``greedy_module()`` (e.g. multi-agent
                ones) or a policy that one module cannot hold (recurrent).
        """
        build = getattr(self.algo, "greedy_module", None)
        if build is None:
            why = "an algorithm with greedy_module() (dqn, ppo, impala, sac, td3) to export"
            raise ConfigError("algorithm", self.algorithm, why)
        return build().eval()

    def example(self, n: int = 2) -> Any:
        """A batch of ``n`` observations of the env's shape and dtype (zeros), as a tensor."""
        import torch

        space = self.observation_space
        dtype = np.uint8 if space.dtype == np.uint8 else np.float32
        return torch.as_tensor(np.zeros((n, *space.shape), dtype))

    def export(self, path: str | Path, fmt: str) -> Path:
        """Write the greedy policy to ``path`` as ``fmt`` ("torchscript" or "onnx"), with
        ``<path>.json`` beside it; returns ``path``.

        Raises:
            ConfigError: for an unknown format, a policy the format cannot hold, or ONNX
                without the ``onnx`` package (naming how to install it).
        """
        if fmt not in FORMATS:
            raise ConfigError("--format", fmt, " | ".join(FORMATS))
        module, example, path = self.module(), self.example(), Path(path)
        import torch

        with torch.no_grad():
            if fmt == "torchscript":
                traced = torch.jit.trace(module, example)  # type: ignore[no-untyped-call]
                traced.save(str(path))
            else:
                _export_onnx(module, example, path)
        meta = {
            "format": fmt,
            "algorithm": self.algorithm,
            "env_id": self.env_id,
            "policy_version": self.policy_version,
            "checkpoint": str(self.checkpoint),
            "input": {"name": "obs", "dtype": str(example.dtype).removeprefix("torch."),
                      "shape": ["N", *self.observation_space.shape]},
            "output": {"name": "action", "action_space": repr(self.action_space)},
        }  # fmt: skip
        Path(f"{path}.json").write_text(json.dumps(meta, indent=2) + "\n")
        return path


def _export_onnx(module: Any, example: Any, path: Path) -> None:
    import torch

    if importlib.util.find_spec("onnx") is None:  # torch's exporter needs it
        why = "the onnx package installed: pip install 'tianji[export]' (make setup installs it)"
        raise ConfigError("--format", "onnx", why)
    torch.onnx.export(
        module, (example,), str(path), input_names=["obs"], output_names=["action"],
        dynamic_axes={"obs": {0: "N"}, "action": {0: "N"}}, opset_version=17, dynamo=False,
    )  # fmt: skip


def load_policy(
    source: str | Path, *, checkpoint: str | Path | None = None, device: str = "cpu"
) -> Policy:
    """The greedy policy of a run directory (its newest checkpoint, or ``checkpoint``) or of
    a checkpoint file inside one (``<run>/checkpoints/ckpt-*.tjc``).

    Raises:
        ConfigError: naming ``source`` when it is neither.
        CheckpointError: when there is no checkpoint, or it is damaged or does not fit.
    """
    from tianji.rl.envs import env_spaces

    path = Path(source)
    if path.is_file():
        run_dir, checkpoint = path.parent.parent, path
        if not (run_dir / "config.json").is_file():
            why = "a checkpoint inside a run directory (<run>/checkpoints/ckpt-*.tjc)"
            raise ConfigError("RUN_OR_CHECKPOINT", str(source), why)
    else:
        run_dir = path
    run, config = open_run(run_dir)
    ckpt = resolve_checkpoint(run, checkpoint)
    algo = load_algorithm(config, ckpt, device=device)
    return Policy(config, ckpt, algo, env_spaces(config.env))
