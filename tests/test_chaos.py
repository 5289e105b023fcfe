"""`tianji bench chaos`: a training run that loses a random service every few seconds rides
through: every killed service comes back, the run keeps learning, the accounting holds in
every metrics row, nothing is left behind; and the report's per-role summary. (It replaces
the single-kill test of an actor that tests/test_recovery.py had.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tianji.bench.chaos import killable_roles, summarize_kills

ROOT = Path(__file__).resolve().parents[1]


def test_chaos_kills_the_learner_only_when_it_resumes() -> None:
    assert "learner" not in killable_roles(False) and "learner" in killable_roles(True)
    assert {"actor", "buffer", "params", "eval", "inference"} <= set(killable_roles(False))


def test_the_kills_are_summarized_per_role() -> None:
    kills = [
        {"role": "actor", "restart_s": 2.0},
        {"role": "actor", "restart_s": 4.0},
        {"role": "actor", "restart_s": 3.0},
        {"role": "params", "restart_s": None},
    ]
    roles = summarize_kills(kills)
    assert roles["actor"] == {
        "kills": 3, "restarted": 3, "restart_p50_s": 3.0, "restart_max_s": 4.0,
    }  # fmt: skip
    assert roles["params"]["restarted"] == 0 and roles["params"]["restart_p50_s"] is None


def _netns_possible() -> bool:
    return sys.platform == "linux" and os.geteuid() == 0 and shutil.which("ip") is not None


@pytest.mark.slow
def test_a_run_that_loses_a_service_every_few_seconds_rides_through(tmp_path: Path) -> None:
    """On two namespace hosts (every service under ``tianji serve --restart``, the actors'
    host cut off for 3 s once) where this machine allows it, as CI does; else locally."""
    hosts = ["--backend", "hosts", "--cut-every", "8", "--cut-seconds", "3"]
    where = [str(ROOT / "benchmarks/hosts.py")] if _netns_possible() else ["-m", "tianji", "bench"]
    cmd = [sys.executable, *where, "chaos", str(ROOT / "examples/cartpole_ppo.toml")]
    cmd += ["--every", "3", "--minutes", "0.25", "--warmup", "3", "--seed", "1"]
    cmd += ["--set", 'recovery.learner="resume"', "--set", "checkpoint.every_seconds=3"]
    cmd += ["--set", "eval.workers=1", "--out", str(tmp_path), "--json"]
    cmd += hosts if _netns_possible() else []
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report["kills"]) >= 4 and report["kills_survived"] == len(report["kills"])
    assert sum(report["restarts"].values()) == len(report["kills"])  # every restart counted
    assert report["unbalanced_rows"] == [] and report["summary_balanced"]
    assert report["leftover_processes"] == [] and report["leftover_shm"] == []
    assert report["exit_code"] == 0
    if _netns_possible():
        assert report["backend"] == "hosts" and len(report["cuts"]) == 1, report["cuts"]
    # it kept learning through the kills (actors, buffer, params, learner, eval worker)
    assert report["return_at_end"] >= report["return_before_first_kill"], report
