"""benchmarks/gpu_check.py: without CUDA it says so and exits 0; the paths it measures on a
GPU (the Pong CNN learner's updates, the batched forward pass) run here on the CPU through
the same functions."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: it measures")
def test_without_cuda_the_check_says_so_and_exits_0(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "0.1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["cuda"] is False and report["failures"] == {} and "no CUDA" in report["note"]


def test_the_measured_paths_run_on_the_cpu() -> None:
    check = _module()
    assert check.updates_per_s("cpu", 0.01, steps=8, envs=2) > 0
    assert check.forwards_per_s("cpu", 0.01, batch=4) > 0
    algo, space = check.pong_learner("cpu")
    assert space.shape == (4, 84, 84) and str(algo.device) == "cpu"
