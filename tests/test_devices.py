"""Where learners and inference services compute: each of K learners takes its own GPU by
default, a device the host lacks is refused naming the service, and batches reach a CUDA
device through pinned memory. CUDA is simulated where the code only asks how many devices
there are; the same functions run on the CPU here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tianji.algorithms import _nets

from tianji.rl.config import EnvConfig, LearnerConfig, RunConfig, to_dict
from tianji.run.config import load_config
from tianji.run.train import train
from tianji.runtime.errors import ConfigError
from tianji.services.devices import resolve_device
from tianji.services.learner import LearnerService

ROOT = Path(__file__).resolve().parents[1]


def with_gpus(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_each_learner_takes_its_own_gpu_and_a_cpu_host_computes_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_gpus(monkeypatch, 2)
    assert [resolve_device(f"learner-{j}", "auto", index=j) for j in range(4)] == [
        "cuda:0", "cuda:1", "cuda:0", "cuda:1",
    ]  # fmt: skip
    assert resolve_device("learner-1", "cuda", index=1) == "cuda:1"
    assert resolve_device("learner-1", "cuda:0", index=1) == "cuda:0"  # as given
    assert resolve_device("learner-1", "cpu", index=1) == "cpu"
    with_gpus(monkeypatch, 0)
    assert resolve_device("learner-3", "auto", index=3) == "cpu"


def test_a_device_the_host_lacks_is_refused_naming_the_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_gpus(monkeypatch, 2)
    with pytest.raises(ConfigError, match=r"learner-1 device='cuda:2'.*2 CUDA devices"):
        resolve_device("learner-1", "cuda:2", index=1)
    with pytest.raises(ConfigError, match=r"inference-0 device='gpu'"):
        resolve_device("inference-0", "gpu")
    with_gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match=r"learner-0 device='cuda'.*no CUDA device"):
        resolve_device("learner-0", "cuda")


def test_a_learner_is_built_on_its_resolved_device() -> None:
    cfg = to_dict(RunConfig(algorithm="ppo", env=EnvConfig(id="CartPole-v1"),
                            learner=LearnerConfig(count=2, device="auto")))  # fmt: skip
    svc = LearnerService("learner-1", config=cfg, index=1)
    assert svc.device == "cpu" and svc.algo.device == torch.device("cpu")
    cfg["learner"]["device"] = "cuda:1"
    with pytest.raises(ConfigError, match="learner-1 device"):
        LearnerService("learner-1", config=cfg, index=1)


def test_a_local_run_asking_for_a_missing_device_stops_before_any_process_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_launch(*_: Any, **__: Any) -> None:
        raise AssertionError("a launcher was built for a device this host lacks")

    monkeypatch.setattr("tianji.run.train.LocalLauncher", no_launch)
    refused = [("learner.device=cuda:3", "learner-0"), ("inference.device=cuda", "inference-0")]
    for setting, who in refused:
        config = load_config(
            ROOT / "examples" / "cartpole_ppo.toml",
            ["learner.count=2", 'actors.inference="service"', setting],
        )
        with pytest.raises(ConfigError, match=rf"{who} device"):
            train(config)


def test_batches_go_to_a_cuda_device_through_pinned_memory_with_a_non_blocking_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, Any]] = []

    def pin(self: torch.Tensor) -> torch.Tensor:
        calls.append(("pin", self.dtype))
        return self

    original_to = torch.Tensor.to

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(("to", (str(args[0]), kwargs.get("non_blocking"))))
        return original_to(self, "cpu")

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    obs = np.arange(12, dtype=np.float64).reshape(3, 4)
    out = _nets.obs_tensor(obs, torch.device("cuda", 1))
    assert calls == [("pin", torch.float32), ("to", ("cuda:1", True))]
    assert out.dtype == torch.float32 and out.shape == (3, 4)
    calls.clear()
    cpu = _nets.host_to_device(np.ones(3, np.float32), torch.device("cpu"))
    assert calls == [] and cpu.device.type == "cpu"  # the CPU path copies nothing
