"""Deployment by hand: placement (advertise, shm beside tcp), joining, refusals, errors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_service_pubsub import Collector, arrays, running, until
from tianji.launch.hosts import HostLauncher
from tianji.launch.local import run_local
from tianji.run.config import load_config
from tianji.run.deploy import config_digest, require_token, serve_spec
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.runtime.events import ArraysPublished
from tianji.runtime.service import Service, advertised
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
                assert set(near._links) == {pub.local_address}
                assert set(far._links) == {pub.address}
                for i in range(50):
                    await pub.publish(arrays(i))
                await until(lambda: len(near.seen) == 50 and len(far.seen) == 50)
                assert near.seen == far.seen == list(range(50))

    asyncio.run(main())


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


def test_listening_beyond_loopback_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIANJI_TOKEN", raising=False)
    require_token("tcp://127.0.0.1:7000", None)  # loopback only: fine without
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0.*TIANJI_TOKEN"):
        require_token("tcp://0.0.0.0:7000", None)
    monkeypatch.setenv("TIANJI_TOKEN", "t")
    require_token("tcp://0.0.0.0:7000", None)


def test_the_config_digest_ignores_stop_conditions_only() -> None:
    base = load_config(PPO, [])
    assert config_digest(base) == config_digest(load_config(PPO, ["stop.max_seconds=5"]))
    assert config_digest(base) != config_digest(load_config(PPO, ["actors.count=3"]))


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


@pytest.mark.slow
def test_the_controller_refuses_a_service_with_another_config() -> None:
    port = free_tcp_port()
    env = {"TIANJI_TOKEN": "digest-test"}
    ctl = tianji("controller", PPO, "--bind", f"tcp://127.0.0.1:{port}", "--max-seconds", "60",
                 env=env)  # fmt: skip
    try:
        odd = tianji("serve", "actor", PPO, "--controller", f"tcp://127.0.0.1:{port}",
                     "--set", "actors.envs_per_actor=3", env=env)  # fmt: skip
        out, _ = odd.communicate(timeout=60)
        assert odd.returncode == 2, out
        assert "refused" in out and "differs from the controller's" in out
    finally:
        ctl.terminate()
        ctl.communicate(timeout=30)


@pytest.mark.slow
def test_a_service_with_the_wrong_token_cannot_join() -> None:
    port = free_tcp_port()
    ctl = tianji("controller", PPO, "--bind", f"tcp://127.0.0.1:{port}", "--max-seconds", "60",
                 env={"TIANJI_TOKEN": "right"})  # fmt: skip
    try:
        intruder = tianji("serve", "actor", PPO, "--controller", f"tcp://127.0.0.1:{port}",
                          env={"TIANJI_TOKEN": "wrong"})  # fmt: skip
        out, _ = intruder.communicate(timeout=60)
        assert intruder.returncode == 1, out
        assert "unreachable" in out and "closed during the handshake" in out
    finally:
        ctl.terminate()
        ctl_out, _ = ctl.communicate(timeout=30)
    assert "auth_failed" in ctl_out and "different token" in ctl_out
