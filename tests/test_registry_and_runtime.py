"""Transports are found by scheme, including third-party ones from entry points."""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tianji import transports
from tianji.runtime import plugins
from tianji.runtime.core import Limits, Transport
from tianji.runtime.errors import ConfigError, RegistryError
from tianji.runtime.loop import loop_factory, run

THIRD_PARTY = '''
from tianji.transports.inproc import InprocTransport

class LoopTransport(InprocTransport):
    """A third-party transport: inproc under another scheme."""
    scheme = "loop"

    async def listen(self, address, *, limits):
        return await super().listen(address.replace("loop://", "inproc://", 1), limits=limits)

    async def connect(self, address, *, limits):
        return await super().connect(address.replace("loop://", "inproc://", 1), limits=limits)
'''


@pytest.fixture
def third_party_package(tmp_path: Path) -> Iterator[None]:
    """Install (on sys.path) a distribution declaring a `tianji.transports` entry point."""
    (tmp_path / "tianji_loop.py").write_text(THIRD_PARTY)
    dist = tmp_path / "tianji_loop-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tianji-loop\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[tianji.transports]\nloop = tianji_loop:LoopTransport\n"
    )
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("tianji_loop", None)
        plugins._transports.pop("loop", None)
        plugins.TRANSPORTS._registered.pop("loop", None)


def test_in_tree_transports_are_registered() -> None:
    assert {"inproc", "tcp"} <= set(transports.names())
    for scheme in ("inproc", "tcp"):
        t = transports.get(scheme)
        assert isinstance(t, Transport) and t.scheme == scheme
    assert transports.for_address("tcp://127.0.0.1:1").scheme == "tcp"


def test_a_third_party_transport_is_found_through_its_entry_point(
    third_party_package: None,
) -> None:
    assert "loop" in transports.names()
    transport = transports.for_address("loop://x")
    assert transport.scheme == "loop"

    async def roundtrip() -> bytes:
        listener = await transport.listen("loop://ep-test", limits=Limits())
        conn = await transport.connect("loop://ep-test", limits=Limits())
        server = await listener.accept()
        await conn.send([b"hello"])
        frames = await server.recv()
        await listener.aclose()
        return bytes(frames[0])

    assert asyncio.run(roundtrip()) == b"hello"


def test_an_unknown_scheme_is_a_registry_error_naming_it() -> None:
    with pytest.raises(RegistryError) as info:
        transports.for_address("carrier-pigeon://roof")
    assert info.value.name == "carrier-pigeon" and "tcp" in info.value.known


def test_an_address_without_scheme_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError) as info:
        transports.for_address("127.0.0.1:5555")
    assert info.value.value == "127.0.0.1:5555"


def test_uvloop_is_the_default_loop_unless_asyncio_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    monkeypatch.delenv("TIANJI_LOOP", raising=False)
    assert run(loop_module()).startswith("uvloop")
    monkeypatch.setenv("TIANJI_LOOP", "asyncio")
    assert loop_factory() is None
    assert run(loop_module()).startswith("asyncio")
    monkeypatch.setenv("TIANJI_LOOP", "trio")
    with pytest.raises(ConfigError) as info:
        loop_factory()
    assert info.value.value == "trio"
