"""Dead services: restarts within a budget, a dead learner's stop or resume, and the
accounting across incarnations."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tianji.config import RecoveryConfig, RunConfig, load_config
from tianji.controller import Controller, accounting
from tianji.errors import ConfigError
from tianji.events import Heartbeat
from tianji.recovery import role_of

ROOT = Path(__file__).resolve().parents[1]
PPO = ROOT / "examples" / "cartpole_ppo.toml"


def _hb(name: str, role: str, counters: dict[str, int], **gauges: float) -> Heartbeat:
    return Heartbeat(
        name=name,
        role=role,
        state="running",
        counters=counters,
        gauges=gauges,
        queue_depths={},
        sent_at=time.time(),
    )


# ----------------------------------------------------------------------------- units
def test_recovery_settings_are_checked_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"recovery\.restarts\.learner"):
        RecoveryConfig(restarts={"learner": 1})
    with pytest.raises(ConfigError, match=r"recovery\.restarts\.actor"):
        RecoveryConfig(restarts={"actor": -1})
    with pytest.raises(ConfigError, match=r"recovery\.learner"):
        RecoveryConfig(learner="retry")
    with pytest.raises(ConfigError, match=r"recovery\.buffer"):
        load_config(PPO, ['recovery.buffer="snapshot"'])  # no replay snapshots
    with pytest.raises(ConfigError, match=r"recovery\.learner"):
        load_config(PPO, ['recovery.learner="resume"', "checkpoint.every_seconds=0"])
    assert RecoveryConfig(restarts={"actor": 5}).budget("actor") == 5
    assert RecoveryConfig().budget("buffer") == 3 and RecoveryConfig().budget("params") == 0
    assert role_of("actor-12") == "actor" and role_of("learner-0") == "learner"
    assert RunConfig().recovery.learner == "stop"


def test_a_retired_incarnation_keeps_its_counts_and_what_it_held_is_lost_in_restart() -> None:
    controller = Controller()
    controller.heartbeats = {
        "actor-0": _hb("actor-0", "actor", {"samples_produced": 1000}),
        "buffer-0": _hb("buffer-0", "buffer", {"samples_inserted": 1000}, buffered_samples=1000),
        "learner-0": _hb("learner-0", "learner", {"samples_consumed": 2000}),
    }
    before = accounting(controller.heartbeats, on_policy=False)
    assert before["balanced"] and before["dropped"] == {}
    controller.retire("buffer-0")  # died holding 1000 samples
    assert controller.restarts["buffer-0"] == 1
    after = accounting(controller.heartbeats, on_policy=False)
    assert after["dropped"] == {"lost_in_restart": 1000} and after["buffered"] == 0
    assert after["balanced"], after
    # the new incarnation counts from zero; the totals go on
    controller.heartbeats["buffer-0"] = _hb(
        "buffer-0", "buffer", {"samples_inserted": 300}, buffered_samples=300
    )
    controller.heartbeats["actor-0"] = _hb("actor-0", "actor", {"samples_produced": 1300})
    final = accounting(controller.heartbeats, on_policy=False)
    assert final["produced"] == 1300 and final["buffered"] == 300 and final["balanced"]
    assert "buffer-0#1" in controller.heartbeats


# ---------------------------------------------------------------------- end to end
def _fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read().decode())


def _wait_for(url: str, ok: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        body = _fetch(url)
        if ok(body):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; last status: {json.dumps(body)[:3000]}")
        time.sleep(0.3)


def _service(status: dict[str, Any], name: str) -> dict[str, Any]:
    (row,) = [s for s in status["services"] if s["name"] == name]
    return row


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """``tianji train`` (PPO unless the first argument is another config) with a dashboard."""
    config = args[0] if args and args[0].endswith(".toml") else str(PPO)
    args = args[1:] if args and args[0] == config else args
    cmd = [sys.executable, "-m", "tianji", "train", config, "--dashboard", "127.0.0.1:0"]
    cmd += ["--run-dir", str(tmp_path), "--summary", str(tmp_path / "summary.json"), *args]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for _ in range(40):
        line = proc.stdout.readline()
        if line.startswith("dashboard: "):
            return proc, line.split(" ", 1)[1].strip()
    proc.kill()
    raise AssertionError("no dashboard line")


@pytest.mark.slow
def test_a_killed_actor_is_restarted_and_the_run_reaches_its_target(tmp_path: Path) -> None:
    proc, url = _start(tmp_path, "--target-return", "300", "--max-seconds", "240")
    try:
        status = _wait_for(
            url + "api/status",
            lambda s: s["counters"]["episodes"] > 20 and _service(s, "actor-1")["pid"],
            timeout=120,
        )
        pid = _service(status, "actor-1")["pid"]
        os.kill(pid, signal.SIGKILL)
        status = _wait_for(
            url + "api/status",
            lambda s: (
                _service(s, "actor-1")["restarts"] == 1
                and _service(s, "actor-1")["state"] == "running"
                and _service(s, "actor-1")["pid"] not in (None, pid)
            ),
            timeout=30,
        )
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return reached"
    assert summary["restarts"] == {"actor-1": 1}
    assert summary["services"]["actor-1"]["restarts"] == 1
    assert "actor-1#1" in summary["services"]  # the dead incarnation's counts are kept
    assert summary["accounting"]["balanced"], summary["accounting"]


@pytest.mark.slow
def test_a_killed_learner_without_resume_stops_the_run_with_a_clear_message(
    tmp_path: Path,
) -> None:
    proc, url = _start(tmp_path, "--target-return", "1e9", "--max-seconds", "240")
    try:
        status = _wait_for(
            url + "api/status", lambda s: s["counters"]["learner_updates"] >= 3, timeout=120
        )
        pid = _service(status, "learner-0")["pid"]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "learner-0" in out and "exited with code -9" in out, out[-3000:]
    assert took < 10, f"{took:.1f} s to stop after the learner died"


@pytest.mark.slow
def test_a_killed_learner_with_resume_continues_from_its_checkpoint(tmp_path: Path) -> None:
    proc, url = _start(
        tmp_path,
        *("--target-return", "300", "--max-seconds", "240"),
        *("--set", 'recovery.learner="resume"', "--set", "checkpoint.every_updates=5"),
    )
    try:
        status = _wait_for(
            url + "api/status",
            lambda s: (s["checkpoint"] or {}).get("policy_version", 0) >= 10,
            timeout=120,
        )
        pid = _service(status, "learner-0")["pid"]
        os.kill(pid, signal.SIGKILL)
        _wait_for(
            url + "api/status",
            lambda s: (
                _service(s, "learner-0")["restarts"] == 1
                and _service(s, "learner-0")["state"] == "running"
            ),
            timeout=30,
        )
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "learner-0 died: resuming from ckpt-" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return reached"
    assert summary["restarts"] == {"learner-0": 1}
    learner = summary["services"]["learner-0"]["counters"]
    assert learner["restored_version"] >= 10


@pytest.mark.slow
def test_a_killed_replay_buffer_is_restarted_and_what_it_held_is_counted_lost(
    tmp_path: Path,
) -> None:
    """DQN: the replay buffer dies holding thousands of transitions; it restarts empty,
    refills, the learner goes on updating, and the lost transitions are in the accounting."""
    proc, url = _start(
        tmp_path, str(ROOT / "examples" / "cartpole_dqn.toml"), "--max-seconds", "45"
    )
    try:
        status = _wait_for(
            url + "api/status", lambda s: s["counters"]["learner_updates"] >= 50, timeout=120
        )
        pid = _service(status, "buffer-0")["pid"]
        os.kill(pid, signal.SIGKILL)
        updates_at_kill = _fetch(url + "api/status")["counters"]["learner_updates"]
        _wait_for(
            url + "api/status",
            lambda s: (
                _service(s, "buffer-0")["restarts"] == 1
                and s["counters"]["learner_updates"] > updates_at_kill + 20
            ),
            timeout=90,
        )
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["restarts"] == {"buffer-0": 1}
    lost = summary["accounting"]["dropped"].get("lost_in_restart", 0)
    assert lost >= 1000, summary["accounting"]  # learning_starts were stored at least
    assert summary["accounting"]["balanced"], summary["accounting"]


@pytest.mark.slow
def test_a_silent_actor_is_declared_dead_killed_and_restarted(tmp_path: Path) -> None:
    """SIGSTOP: the process lives but sends nothing; after ``missed_heartbeats`` heartbeat
    intervals the launcher kills it and starts a new one."""
    proc, url = _start(
        tmp_path,
        *("--target-return", "1e9", "--max-seconds", "60"),
        *("--set", "recovery.missed_heartbeats=3"),
    )
    try:
        status = _wait_for(
            url + "api/status", lambda s: s["counters"]["episodes"] > 10, timeout=120
        )
        pid = _service(status, "actor-0")["pid"]
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        _wait_for(
            url + "api/status",
            lambda s: (
                _service(s, "actor-0")["restarts"] == 1
                and _service(s, "actor-0")["pid"] not in (None, pid)
            ),
            timeout=30,
        )
        took = time.monotonic() - stopped
        os.kill(proc.pid, signal.SIGTERM)  # a clean stop
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert 3 <= took < 15, f"restarted {took:.1f} s after it went silent"
    assert "actor-0 declared dead: no heartbeat for" in out, out[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["restarts"] == {"actor-0": 1}
