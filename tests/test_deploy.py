"""Deployment by hand: placement (advertise, shm beside tcp), joining, refusals, errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_service_pubsub import Collector, arrays, running, until
from tianji.launch.hosts import HostLauncher
from tianji.launch.local import run_local
from tianji.run.config import load_config
from tianji.run.deploy import (
    config_digest,
    listen_where,
    require_token,
    route_source,
    serve,
    serve_spec,
)
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.runtime.events import ArraysPublished
from tianji.runtime.service import Service
from tianji.runtime.serving import advertised
from tianji.testing import free_tcp_port

ROOT = Path(__file__).resolve().parents[1]
PPO = str(ROOT / "examples" / "cartpole_ppo.toml")


def test_advertised_address_replaces_the_bind_host() -> None:
    assert advertised("tcp://0.0.0.0:5000", "10.0.0.7") == "tcp://10.0.0.7:5000"
    assert advertised("tcp://0.0.0.0:5000", "fe80::1") == "tcp://[fe80::1]:5000"
    assert advertised("tcp://127.0.0.1:5000", None) == "tcp://127.0.0.1:5000"
    assert advertised("inproc://x", "10.0.0.7") == "inproc://x"


def test_same_host_subscribers_get_the_shm_address_and_others_the_tcp_one() -> None:
    tcp = "tcp://127.0.0.1:0"

    async def main() -> None:
        ctl = Controller(bind=tcp)
        async with running(ctl):
            pub = Service(
                "pub",
                bind=tcp,
                local_bind="shm://",
                controller=ctl.address,
                publishes=[ArraysPublished],
            )
            near = Collector("near", bind=tcp, local_bind="shm://", controller=ctl.address)
            far = Collector("far", bind=tcp, controller=ctl.address)
            far.locality = "another-host/net:1"
            async with running(pub, near, far):
                await pub.wait_subscribers(ArraysPublished, 2)
                assert pub.local_address.startswith("shm://")
                assert set(near._subscriptions.links) == {pub.local_address}
                assert set(far._subscriptions.links) == {pub.address}
                for i in range(50):
                    await pub.publish(arrays(i))
                await until(lambda: len(near.seen) == 50 and len(far.seen) == 50)
                assert near.seen == far.seen == list(range(50))

    asyncio.run(main())


LOOPBACK = "tcp://127.0.0.1:0"


def test_serve_names_an_unknown_role_or_index() -> None:
    config = load_config(PPO, [])
    with pytest.raises(ConfigError, match=r"'trainer'.*roles"):
        serve_spec(config, "trainer", 0, controller="tcp://127.0.0.1:1", bind="tcp://127.0.0.1:0")
    with pytest.raises(ConfigError, match=r"--index.*0\.\.1"):
        serve_spec(config, "actor", 2, controller="tcp://127.0.0.1:1", bind="tcp://127.0.0.1:0")
    with pytest.raises(ConfigError, match="--advertise"):
        serve_spec(config, "actor", 0, controller="tcp://10.0.0.1:7000", bind="tcp://0.0.0.0:0")
    spec = serve_spec(
        config,
        "actor",
        1,
        controller="tcp://10.0.0.1:7000",
        bind="tcp://0.0.0.0:0",
        advertise="10.0.0.2",
        local="tcp",
    )
    assert (spec.name, spec.advertise, spec.local_bind) == ("actor-1", "10.0.0.2", "")
    assert spec.options["index"] == 1
    agg = serve_spec(config, "aggregator", 1, controller="tcp://127.0.0.1:1", bind=LOOPBACK)
    assert (agg.name, agg.role) == ("aggregator-1", "aggregator")
    assert agg.factory == "tianji.runtime.aggregator:HeartbeatAggregator"
    assert agg.options == {}  # the aggregator's own default flush interval
    where = {"controller": "tcp://127.0.0.1:1", "bind": LOOPBACK}
    slow = serve_spec(config, "aggregator", 0, flush_interval=0.05, **where)
    assert slow.options == {"flush_interval": 0.05}
    with pytest.raises(ConfigError, match=r"--flush-interval=0.05.*'aggregator'"):
        serve_spec(config, "actor", 0, flush_interval=0.05, **where)
    with pytest.raises(ConfigError, match=r"--flush-interval=0.*> 0"):
        serve_spec(config, "aggregator", 0, flush_interval=0.0, **where)
    with pytest.raises(ConfigError, match=r"--restart-period.*0"):
        serve(spec, "", restarts=2, restart_period=0, config=config)
    with pytest.raises(ConfigError, match=r"--restart.*-1"):
        serve(spec, "", restarts=-1, config=config)


def test_serve_listens_where_the_controller_can_reach_it_and_refuses_a_loopback_pair() -> None:
    assert listen_where("tcp://127.0.0.1:7000", None, None) == ("tcp://127.0.0.1:0", None)
    # a controller elsewhere: the interface that routes there, advertised as itself
    local = route_source("127.0.0.5")
    assert local == "127.0.0.1"
    assert listen_where("tcp://10.0.0.1:7000", None, "10.0.0.3") == ("tcp://0.0.0.0:0", "10.0.0.3")
    try:  # a machine with no route to 10/8 says so, naming the controller's host
        routed = route_source("10.0.0.1")
    except ConfigError as exc:
        assert "10.0.0.1" in str(exc)
    else:
        bind, advertise = listen_where("tcp://10.0.0.1:7000", None, None)
        assert bind == f"tcp://{routed}:0" and advertise == routed
        assert listen_where("tcp://10.0.0.1:7000", "tcp://0.0.0.0:0", None) == (
            "tcp://0.0.0.0:0",
            routed,
        )
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1:0.*advertised 10\.0\.0\.3"):
        listen_where("tcp://10.0.0.1:7000", "tcp://127.0.0.1:0", "10.0.0.3")
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1:0.*tcp://10\.0\.0\.1:7000"):
        listen_where("tcp://10.0.0.1:7000", "tcp://127.0.0.1:0", None)
    with pytest.raises(ConfigError, match=r"--controller.*nowhere\.invalid"):
        listen_where("tcp://nowhere.invalid:7000", None, None)
    explicit = ("tcp://0.0.0.0:5000", "10.0.0.3")
    assert listen_where("tcp://10.0.0.1:7000", *explicit) == explicit


def test_a_link_that_cannot_connect_is_reported_in_the_heartbeat_and_by_the_controller() -> None:
    tcp = "tcp://127.0.0.1:0"

    async def main() -> None:
        ctl = Controller(bind=tcp)
        async with running(ctl):
            # registered under 127.0.0.2 (loopback, but nothing listens there): unreachable
            pub = Service("pub", bind=tcp, advertise="127.0.0.2", controller=ctl.address,
                          publishes=[ArraysPublished])  # fmt: skip
            sub = Collector("sub", bind=tcp, controller=ctl.address)
            async with running(pub, sub):
                await until(lambda: pub.address in sub.links_down())
                why = sub.links_down()[pub.address]
                assert "connect failed" in why and "never up" in why
                assert sub.counters["link_connect_failures"] >= 1
                await until(lambda: ctl.failing_links().get("sub"), timeout=5)
                assert ctl.failing_links() == {
                    "sub": {
                        f"pub {pub.address}": ctl.registry["sub"].last_heartbeat.links_down[
                            pub.address
                        ]
                    }
                }
                assert pub.heartbeat().links_down == {}

    asyncio.run(main())


def test_listening_beyond_loopback_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIANJI_TOKEN", raising=False)
    require_token("tcp://127.0.0.1:7000", None)  # loopback only: fine without
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0.*TIANJI_TOKEN"):
        require_token("tcp://0.0.0.0:7000", None)
    monkeypatch.setenv("TIANJI_TOKEN", "t")
    require_token("tcp://0.0.0.0:7000", None)


def test_the_config_digest_ignores_stop_conditions_and_host_local_settings_only() -> None:
    base = config_digest(load_config(PPO, []))
    assert base == config_digest(load_config(PPO, ["stop.max_seconds=5"]))
    host_local = [
        'learner.device="cpu"', "learner.torch_threads=2", "actors.torch_threads=2",
        'inference.device="cpu"', "inference.torch_threads=3", "ray.num_cpus={learner = 2}",
    ]  # fmt: skip
    for setting in host_local:  # one host's own device, threads or placement: accepted
        assert base == config_digest(load_config(PPO, [setting])), setting
    assert base == config_digest(load_config(PPO, host_local))
    for setting in ["actors.count=3", "algo.lr=0.001", "learner.count=2", "seed=7"]:
        assert base != config_digest(load_config(PPO, [setting])), setting  # the math: refused


def test_a_service_that_never_joins_fails_the_run_naming_it() -> None:
    launcher = HostLauncher(
        ["actor-0"], join_timeout=0.5, until=lambda c: False, progress_interval=0.2
    )
    started = time.monotonic()
    with pytest.raises(ServiceFailed, match="actor-0 never joined"):
        run_local(launcher)
    assert time.monotonic() - started < 10


def tianji(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tianji", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
    )


def _dashboard(ctl: subprocess.Popen[str]) -> str:
    """The URL of a ``tianji controller``'s dashboard, from its output."""
    assert ctl.stdout is not None
    for _ in range(20):
        line = ctl.stdout.readline()
        if line.startswith("dashboard: "):
            return line.split(" ", 1)[1].strip()
    raise AssertionError("no dashboard line")


def _joined(status_url: str, name: str) -> bool:
    with urllib.request.urlopen(status_url, timeout=10) as response:
        services = json.loads(response.read().decode())["services"]
    return any(s["name"] == name and s["state"] not in ("waiting", "left") for s in services)


@pytest.mark.slow
def test_a_service_with_another_config_or_the_wrong_token_is_refused_and_exits_2() -> None:
    port = free_tcp_port()
    ctl = tianji("controller", PPO, "--bind", f"tcp://127.0.0.1:{port}", "--max-seconds", "60",
                 env={"TIANJI_TOKEN": "right"})  # fmt: skip
    try:
        assert ctl.stdout is not None
        assert "tianji controller:" in ctl.stdout.readline()  # it listens from now on
        odd = tianji("serve", "actor", PPO, "--controller", f"tcp://127.0.0.1:{port}",
                     "--set", "actors.envs_per_actor=3", "--restart", "2",
                     env={"TIANJI_TOKEN": "right"})  # fmt: skip
        out, _ = odd.communicate(timeout=60)
        assert odd.returncode == 2, out
        assert "refused" in out and "differs from the controller's" in out
        assert "restart 1 (" not in out, out  # a refusal is final, even with --restart
        # a host's own threads (a host-local setting, outside the digest) are accepted
        status = _dashboard(ctl) + "api/status"
        own = tianji("serve", "actor", PPO, "--controller", f"tcp://127.0.0.1:{port}",
                     "--set", "actors.torch_threads=2", env={"TIANJI_TOKEN": "right"})  # fmt: skip
        deadline = time.monotonic() + 60
        while not _joined(status, "actor-0"):
            assert own.poll() is None and time.monotonic() < deadline, own.communicate()[0]
            time.sleep(0.3)
        own.terminate()
        out, _ = own.communicate(timeout=30)
        assert "refused" not in out and "differs" not in out, out
        started = time.monotonic()
        intruder = tianji("serve", "actor", PPO, "--controller", f"tcp://127.0.0.1:{port}",
                          env={"TIANJI_TOKEN": "wrong"})  # fmt: skip
        out, _ = intruder.communicate(timeout=60)
        took = time.monotonic() - started
        assert intruder.returncode == 2, out
        assert "refused the handshake 3 times" in out and "different run token" in out, out
        assert took < 10, f"a refused service took {took:.1f} s to exit"
    finally:
        ctl.terminate()
        ctl_out, _ = ctl.communicate(timeout=30)
    assert "auth_failed" in ctl_out and "different token" in ctl_out


def test_serve_restart_brings_a_killed_service_back_until_its_limit_is_reached(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``tianji serve --restart 1 --restart-period 600``: the supervisor starts the service
    again after a kill; a second kill within 600 s finds the limit reached and it exits 1,
    naming the limit and the period."""
    from tianji.launch.spec import ServiceSpec
    from tianji.launch.supervisor import serving_pids, supervise

    spec = ServiceSpec(name="relay-0", factory="tianji.run.demo:Relay")  # needs no controller
    lines: list[str] = []

    class Out:
        def write(self, text: str) -> None:
            lines.extend(t for t in text.splitlines() if t)

        def flush(self) -> None:
            pass

    def pids() -> list[int]:
        return serving_pids("\n".join(lines))

    async def main() -> int:
        out = Out()
        task = asyncio.create_task(supervise(spec, "", 1, period=600, out=out, backoff=0.1))  # type: ignore[arg-type]
        for incarnation in (1, 2):
            await until(lambda n=incarnation: len(pids()) >= n, timeout=30)
            os.kill(pids()[-1], 9)
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(main()) == 1
    assert len(set(pids())) == 2, lines
    assert any(
        "exited with code -9; restart 1 (1 of at most 1 within 600 s) in 0.1 s" in x for x in lines
    ), lines
    err = capsys.readouterr().err
    assert "no restart: 1 restart within 600 s is its limit (--restart 1" in err, err


class _Registry(dict):  # type: ignore[type-arg]
    """A controller's registry and failing links, as the start check reads them."""

    def __init__(self, names: list[str], down: dict[str, dict[str, str]]) -> None:
        super().__init__((n, object()) for n in names)
        self.registry = self
        self.down = down

    def failing_links(self) -> dict[str, dict[str, str]]:
        return self.down


class _Monitor:
    def __init__(self) -> None:
        self.started = time.monotonic()  # as TrainMonitor's: the run's clock
        self.first_data: float | None = None  # seconds to the first env steps reported
        self.run_failure: str | None = None

    def fail_run(self, reason: str) -> None:
        self.run_failure = self.run_failure or reason

    def done(self) -> str | None:
        return self.run_failure


def test_a_run_with_no_env_step_after_everyone_joined_fails_naming_the_dead_links(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tianji.run.plan import RunPlan

    plan = RunPlan.build(load_config(PPO, ["stop.start_timeout=30"]))
    names = [s.name for s in plan.specs]
    down = {"buffer-0": {"actor-1 tcp://10.9.9.9:4100": "connect failed: No route to host"}}
    clock = [1000.0]
    monkeypatch.setattr("tianji.run.plan.time.monotonic", lambda: clock[0])
    monitor = _Monitor()
    plan.monitor = monitor  # type: ignore[assignment]
    assert not plan.until(_Registry(names[:-1], down))  # not everyone joined: no clock yet
    clock[0] += 100
    assert not plan.until(_Registry(names, down))  # everyone joined: the clock starts
    clock[0] += 29
    assert not plan.until(_Registry(names, down))
    clock[0] += 1
    assert plan.until(_Registry(names, down))
    assert monitor.run_failure is not None
    assert "no env step 30 s after every service joined" in monitor.run_failure
    assert "buffer-0 -> actor-1 tcp://10.9.9.9:4100: connect failed" in monitor.run_failure
    # a run that stepped once is never failed by this check
    stepped = RunPlan.build(load_config(PPO, ["stop.start_timeout=30"]))
    stepped.monitor = _Monitor()  # type: ignore[assignment]
    stepped.monitor.first_data = 2.5  # type: ignore[attr-defined]
    assert not stepped.until(_Registry(names, down))
    clock[0] += 1000
    assert not stepped.until(_Registry(names, down))
    with pytest.raises(ConfigError, match=r"stop\.start_timeout"):
        load_config(PPO, ["stop.start_timeout=-1"])
