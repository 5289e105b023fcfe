"""``tianji controller --resume RUN_DIR``: a run deployed by hand continues from its newest
checkpoint. The services are started as before (``tianji serve``, same config): the
controller tells them at registration that the run resumes, and the learner waits for
the checkpoint's state instead of starting from scratch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tianji.run.config import load_config
from tianji.run.plan import RunPlan
from tianji.testing import free_tcp_port

ROOT = Path(__file__).resolve().parents[1]
PPO = str(ROOT / "examples" / "cartpole_ppo.toml")
SETS = ["--set", "checkpoint.every_updates=2", "--set", "stop.target_return=1e9"]


def tianji(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tianji", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TIANJI_TOKEN": "resume-test"},
    )


def deploy(controller_args: list[str], summary: Path) -> tuple[str, dict[str, object]]:
    """A controller and every service of the PPO example as separate ``tianji serve``
    processes; waits for the run to end. Returns (controller output, summary)."""
    port = free_tcp_port()
    address = f"tcp://127.0.0.1:{port}"
    ctl = tianji("controller", *controller_args, "--bind", address, "--summary", str(summary))
    services: list[subprocess.Popen[str]] = []
    try:
        assert ctl.stdout is not None
        first = ctl.stdout.readline()
        assert "tianji controller:" in first  # it listens from now on
        specs = RunPlan.build(load_config(PPO, [s for s in SETS if s != "--set"])).specs
        for spec in specs:
            index = spec.name.rsplit("-", 1)[1]
            services.append(
                tianji("serve", spec.role, PPO, *SETS, "--index", index, "--controller", address)
            )
        out, _ = ctl.communicate(timeout=180)
        assert ctl.returncode == 0, out[-3000:]
        for proc in services:
            proc.communicate(timeout=60)
    finally:
        for proc in [ctl, *services]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return first + out, json.loads(summary.read_text())


@pytest.mark.slow
def test_a_hand_deployed_run_resumes_from_its_checkpoint_under_a_new_controller(
    tmp_path: Path,
) -> None:
    first_args = [PPO, *SETS, "--max-env-steps", "6000", "--run-dir", str(tmp_path)]
    _, first = deploy(first_args, tmp_path / "first.json")
    run_dir = Path(str(first["run_dir"]))
    updates = int(first["learner_updates"])  # type: ignore[call-overload]
    assert updates >= 2 and any(run_dir.joinpath("checkpoints").iterdir())
    # the config comes from the run directory; only the stop moves on (outside the digest)
    out, second = deploy(
        ["--resume", str(run_dir), "--max-env-steps", "12000"], tmp_path / "second.json"
    )
    assert f"resuming {run_dir}" in out, out[-3000:]
    assert second["run_dir"] == str(run_dir)
    assert second["resumed_from"] is not None and second["resumed_from"]["policy_version"] >= 2
    learner = second["services"]["learner-0"]  # type: ignore[index]
    assert learner["counters"]["restored_version"] == second["resumed_from"]["policy_version"]
    assert second["learner_updates"] > learner["counters"]["restored_version"]
    assert second["env_steps"] >= 12000 and second["accounting"]["balanced"], second
