"""``--backend ray``: services run as Ray actors and reach a CartPole target through killed
actors (restarted as new Ray actors); without a restart policy a killed actor ends the run
like a dead process. One local Ray instance (2 CPUs) serves the whole module."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tianji.launch.base import run_launcher
from tianji.launch.ray import RayLauncher, role_of
from tianji.launch.spec import ServiceSpec
from tianji.rl.config_ops import RayConfig
from tianji.run.config import load_config
from tianji.run.demo import demo_specs
from tianji.run.plan import build_specs
from tianji.run.train import train
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError, ServiceFailed

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PPO = EXAMPLES / "cartpole_ppo.toml"


def test_a_ray_address_nobody_answers_at_is_refused_at_once_naming_it() -> None:
    # (Ray itself retries such an address for many minutes)
    ray = pytest.importorskip("ray")
    from tianji.launch.ray import _check_reachable
    from tianji.testing import free_tcp_port

    address = f"127.0.0.1:{free_tcp_port()}"
    with pytest.raises(ConfigError) as info:
        _check_reachable(address)
    assert (info.value.key, info.value.value) == ("ray.address", address)
    if ray.is_initialized():  # (the module's local Ray, when an earlier test started it)
        return
    launcher = RayLauncher(
        [ServiceSpec(name="learner-0", factory="tianji.run.demo:Consumer")],
        until=lambda c: False,
        address=address,
    )
    with pytest.raises(ConfigError) as info:
        run_launcher(launcher)
    assert (info.value.key, info.value.value) == ("ray.address", address)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[ModuleType]:
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # never a running cluster
    try:
        yield ray
    finally:
        ray.shutdown()


def _gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive (not zombies) after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _running(p)]
    return alive


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------------- config, no Ray needed
@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("ray.num_cpus.learnr=1", "ray.num_cpus.learnr", 1),
        ("ray.num_cpus.actor=-0.5", "ray.num_cpus.actor", -0.5),
        ('ray.num_gpus.learner="one"', "ray.num_gpus.learner", "one"),
        ('ray.address=" "', "ray.address", " "),
    ],
    ids=["unknown-role", "negative-cpus", "non-numeric-gpus", "blank-address"],
)
def test_a_bad_ray_section_names_the_key_and_value(override: str, key: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(PPO, [override])
    assert (info.value.key, info.value.value) == (key, value)


def test_the_default_reservations_fit_the_example_run_on_two_cpus() -> None:
    specs = build_specs(load_config(PPO), {})  # params, buffer, learner, 2 actors
    assert sum(RayConfig().resources(role_of(s))[0] for s in specs) <= 2
    custom = RayConfig(num_cpus={"learner": 1})  # the other roles keep their defaults
    assert custom.resources("learner") == (1.0, 0.0) and custom.resources("actor") == (0.5, 0.0)


def test_without_ray_installed_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(ConfigError) as info:
        train(load_config(PPO), backend="ray")
    assert info.value.key == "backend" and 'pip install "tianji[ray]"' in str(info.value)


@pytest.mark.parametrize("transport", ["shm", "inproc"])
def test_ray_refuses_transports_that_cannot_cross_processes(transport: str) -> None:
    with pytest.raises(ConfigError) as info:
        train(load_config(PPO, [f'transport="{transport}"']), backend="ray")
    assert (info.value.key, info.value.value) == ("transport", transport)


def test_an_unknown_backend_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        train(load_config(PPO), backend="slurm")
    assert (info.value.key, info.value.value) == ("backend", "slurm")


# ---------------------------------------------------------------------- on a local Ray
class _Output(io.StringIO):
    """The run's output, read by the killing thread while ``train`` writes it."""

    def url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.getvalue().splitlines():
                if line.startswith("dashboard: "):
                    return line.split(" ", 1)[1].strip() + "api/status"
            time.sleep(0.2)
        raise AssertionError("no dashboard line")


def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read().decode())
        return body


def _kill_once_it_runs(out: _Output, names: list[str], back: dict[str, float]) -> None:
    """Once episodes are done, SIGKILL each service's Ray worker process (its pid as
    registered), a second apart; then record how long each took to run again."""
    url = out.url(120)
    deadline = time.monotonic() + 150
    pids: dict[str, int] = {}
    sent = 0.0
    while time.monotonic() < deadline and len(back) < len(names):
        try:
            status = _status(url)
        except urllib.error.URLError as error:
            if isinstance(error.reason, ConnectionRefusedError):
                return  # the run ended (the test then says what is missing)
            time.sleep(0.3)  # a busy machine's slow answer: ask again
            continue
        rows = {s["name"]: s for s in status["services"]}
        for name in names:
            row = rows.get(name, {})
            if not pids and status["counters"]["episodes"] > 5:
                for victim in names:
                    pids[victim] = rows[victim]["pid"]
                    os.kill(pids[victim], signal.SIGKILL)
                    time.sleep(1.0)
                sent = time.monotonic()
            elif pids and name not in back and _new_incarnation_runs(row, pids[name]):
                back[name] = time.monotonic() - sent
        time.sleep(0.3)


def _new_incarnation_runs(row: dict[str, Any], old_pid: int) -> bool:
    return bool(row.get("restarts") == 1 and row["state"] == "running" and row["pid"] != old_pid)


@pytest.mark.slow
def test_ppo_reaches_150_with_every_service_a_ray_actor_through_a_killed_actor_and_buffer(
    local_ray: ModuleType, tmp_path: Path
) -> None:
    """The Ray worker processes of actor-0 and buffer-0 are killed mid-run: each comes
    back as a new Ray actor (within the run's restart budget, with the same accounting as
    locally) and the run still reaches its target. With one actor the run makes no
    progress until both are back, so the target cannot be reached before the killing
    thread sees them run again (with two, the other actor could finish the run first)."""
    config = load_config(PPO, ["actors.count=1", "stop.target_return=150", "stop.max_seconds=240"])
    out = _Output()
    back: dict[str, float] = {}
    killer = threading.Thread(
        target=_kill_once_it_runs, args=(out, ["actor-0", "buffer-0"], back), daemon=True
    )
    killer.start()
    summary = train(
        config,
        backend="ray",
        summary_path=str(tmp_path / "summary.json"),
        out=out,
        dashboard="127.0.0.1:0",
    )
    killer.join(30)
    assert set(back) == {"actor-0", "buffer-0"}, (back, out.getvalue()[-3000:])
    assert summary["backend"] == "ray" and summary["transport"] == "tcp"
    assert summary["stop_reason"] == "target_return reached", out.getvalue()[-3000:]
    assert summary["time_to_target_s"] is not None, summary
    assert summary["restarts"] == {"actor-0": 1, "buffer-0": 1}
    assert summary["learner_updates"] > 0
    assert summary["accounting"]["balanced"], summary["accounting"]


@pytest.mark.slow
def test_a_killed_ray_actor_fails_the_run_and_leaves_no_actor_process(
    local_ray: ModuleType,
) -> None:
    killed: list[str] = []

    def kill_relay_once_all_registered(controller: Controller, elapsed: float) -> None:
        if not killed and len(controller.registry) == 3:
            local_ray.kill(launcher.children["relay-0"].actor)  # type: ignore[attr-defined]
            killed.append("relay-0")

    launcher = RayLauncher(
        demo_specs(count=10**9, size=16),  # would run for hours
        until=lambda c: False,
        timeout=120,
        grace=5,
        progress=kill_relay_once_all_registered,
        progress_interval=0.2,
    )
    with pytest.raises(ServiceFailed) as info:
        run_launcher(launcher)
    assert killed == ["relay-0"]
    assert info.value.service == "relay-0"
    assert "Ray actor died" in info.value.reason, info.value.reason
    codes = {n: h.returncode for n, h in launcher.children.items()}
    assert codes == {"consumer-0": 0, "relay-0": -9, "producer-0": 0}
    pids = [h.pid for h in launcher.children.values()]  # type: ignore[attr-defined]
    assert all(pids) and _gone(pids, 10.0) == []
    assert os.getpid() not in pids


@pytest.mark.slow
def test_a_run_that_cannot_be_placed_is_refused_before_it_starts(local_ray: ModuleType) -> None:
    launcher = RayLauncher(
        [ServiceSpec(name="learner-0", factory="tianji.run.demo:Consumer")],
        until=lambda c: False,
        resources=RayConfig(num_gpus={"learner": 1}),  # the local Ray has no GPU
    )
    with pytest.raises(ConfigError) as info:
        run_launcher(launcher)
    assert (info.value.key, info.value.value) == ("ray.num_gpus", 1.0)
    launcher = RayLauncher(
        [ServiceSpec(name="learner-0", factory="tianji.run.demo:Consumer")],
        until=lambda c: False,
        resources=RayConfig(custom_resources={"learner": {"trainer": 1}}),  # no node has it
    )
    with pytest.raises(ConfigError) as info:
        run_launcher(launcher)
    assert (info.value.key, info.value.value) == ("ray.custom_resources", "trainer = 1 in all")


@pytest.mark.slow
def test_stop_reaches_a_service_actor_while_it_runs(local_ray: ModuleType) -> None:
    # run() holds one actor thread for the whole run; stop() must get the other
    # (an async method on the class would make Ray serve both on one blocked loop)
    from tianji.launch.ray import ServiceActor

    actor = local_ray.remote(ServiceActor).options(max_concurrency=2, num_cpus=0.1).remote()
    spec = ServiceSpec(name="relay-0", factory="tianji.run.demo:Relay")  # no controller needed
    done = actor.run.remote(spec.to_json())
    assert local_ray.get(actor.where.remote(), timeout=60)[0] > 0
    ready, _ = local_ray.wait([done], timeout=1.0)
    assert ready == []  # still running
    local_ray.get(actor.stop.remote("test"), timeout=30)
    assert local_ray.get(done, timeout=30) == 0
    local_ray.kill(actor)


def test_ray_addresses_keep_the_port_and_refuse_what_cannot_cross_hosts() -> None:
    from tianji.launch.ray import _with_host

    pytest.importorskip("ray")  # RayLauncher needs it before it looks at the specs
    assert _with_host("tcp://127.0.0.1:0", "0.0.0.0") == "tcp://0.0.0.0:0"
    assert _with_host("tcp://127.0.0.1:5000", "10.0.0.7") == "tcp://10.0.0.7:5000"
    with pytest.raises(ConfigError) as info:
        RayLauncher([ServiceSpec(name="a-0", factory="m:f", bind="shm://")], until=bool)
    assert (info.value.key, info.value.value) == ("a-0.bind", "shm://")
