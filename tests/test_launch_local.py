"""Services as separate processes: data arrives intact, and no process is ever left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tianji.launch.local import LocalLauncher, run_local
from tianji.launch.spec import ServiceSpec, build_service
from tianji.run.demo import demo_specs
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.testing import processes_with_arg

pytestmark = pytest.mark.slow


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if os.path.exists(f"/proc/{p}") and _not_zombie(p)]
    return alive


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_three_processes_pass_10000_numpy_events_intact_over_tcp() -> None:
    launcher = LocalLauncher(
        demo_specs(count=10_000, size=256),
        until=lambda c: "consumer-0" in c.reports,
        timeout=120,
    )
    result = run_local(launcher)
    report = result.reports["consumer-0"]
    assert report.status == "ok", report.summary
    assert report.summary == {"checked": 10_000, "corrupt": 0, "out_of_order": 0}
    assert result.reason == "complete"
    assert result.exit_codes == {"consumer-0": 0, "relay-0": 0, "producer-0": 0}


def test_a_child_that_dies_stops_the_run_and_leaves_no_process() -> None:
    specs = demo_specs(count=10**9, size=16)  # would run for hours
    launcher = LocalLauncher(specs, until=lambda c: False, timeout=120, grace=5)

    import threading

    def kill_relay() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            child = launcher.children.get("relay-0")
            if child is not None and len(launcher.controller.registry) == 3:
                time.sleep(0.5)
                assert child.proc is not None
                os.kill(child.proc.pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    threading.Thread(target=kill_relay, daemon=True).start()
    with pytest.raises(ServiceFailed) as info:
        run_local(launcher)
    assert info.value.service == "relay-0"
    assert "-9" in info.value.reason
    pids = [c.proc.pid for c in launcher.children.values() if c.proc is not None]
    assert wait_gone(pids, 1.0) == []
    assert processes_with_arg("--run", launcher.controller.run_id) == []


def _start_demo_cli() -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tianji.cli", "demo", "--events", "1000000000", "--size", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until progress shows the services running
        line = proc.stdout.readline()
        if "producer-0:" in line and "starting" not in line:
            return proc
    proc.kill()
    raise AssertionError("demo did not start")


def test_ctrl_c_on_the_launcher_stops_every_child() -> None:
    proc = _start_demo_cli()
    children = processes_with_arg("--parent", str(proc.pid))
    assert len(children) == 3
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert wait_gone(children, 1.0) == []


def test_children_die_with_a_killed_launcher() -> None:
    proc = _start_demo_cli()
    children = processes_with_arg("--parent", str(proc.pid))
    assert len(children) == 3
    proc.kill()
    proc.wait(timeout=10)
    assert wait_gone(children, 20.0) == []


def test_a_spec_naming_an_unknown_factory_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        build_service(ServiceSpec(name="x", factory="tianji.run.demo:NoSuchService"))
    assert info.value.value == "tianji.run.demo:NoSuchService"
    with pytest.raises(ConfigError):
        ServiceSpec(name="x", factory="no-colon")
    with pytest.raises(ConfigError):
        LocalLauncher([ServiceSpec(name="a", factory="m:f")] * 2, until=lambda c: True)


def test_a_child_failing_at_startup_fails_the_run() -> None:
    specs = [ServiceSpec(name="bad-0", factory="tianji.run.demo:Producer", options={"nope": 1})]
    launcher = LocalLauncher(specs, until=lambda c: False, timeout=60)
    with pytest.raises(ServiceFailed) as info:
        run_local(launcher)
    assert info.value.service == "bad-0"
