"""TCP links with mutual TLS: peers with certificates of the run's CA talk, others fail."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
from tianji.transports import tcp
from tianji.transports._tls import TlsFiles, tls_from_env

from tianji.runtime.core import Limits
from tianji.runtime.errors import BrokenByPeer, ConfigError, HandshakeRefused

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
LIMITS = Limits()


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    key, cert = d / f"{name}.key", d / f"{name}.pem"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
            str(cert), "-days", "2", "-subj", f"/CN={name}")  # fmt: skip
    return cert, key


def make_cert(d: Path, name: str, ca: tuple[Path, Path]) -> TlsFiles:
    key, csr, cert = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem"
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", f"/CN={name}")  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
            "-CAcreateserial", "-out", str(cert), "-days", "2")  # fmt: skip
    return TlsFiles(cert=str(cert), key=str(key), ca=str(ca[0]))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    d = tmp_path_factory.mktemp("pki")
    run_ca, rogue_ca = make_ca(d, "run-ca"), make_ca(d, "rogue-ca")
    return {
        "server": make_cert(d, "server", run_ca),
        "client": make_cert(d, "client", run_ca),
        "rogue": make_cert(d, "rogue", rogue_ca),
    }


async def exchange(server_tls: TlsFiles | None, client_tls: TlsFiles | None) -> bytes:
    server_side = tcp.TcpTransport(token="t", tls=server_tls)
    listener = await server_side.listen("tcp://127.0.0.1:0", limits=LIMITS)
    try:
        client = await tcp.TcpTransport(token="t", tls=client_tls).connect(
            listener.address, limits=LIMITS
        )
        server = await asyncio.wait_for(listener.accept(), 5)
        payload = bytes(range(256)) * 4096  # 1 MiB: the large-frame path under TLS
        await client.send([b"hi", payload])
        got = await asyncio.wait_for(server.recv(), 10)
        assert bytes(got[1]) == payload
        await server.send([b"back"])
        back = await asyncio.wait_for(client.recv(), 10)
        client.abort()
        server.abort()
        return bytes(got[0]) + bytes(back[0])
    finally:
        await listener.aclose()


def test_peers_with_certificates_of_the_run_ca_talk(pki: dict[str, TlsFiles]) -> None:
    assert asyncio.run(exchange(pki["server"], pki["client"])) == b"hiback"


@pytest.mark.parametrize("client", ["rogue", "plain"])
def test_a_client_without_a_certificate_of_the_run_ca_cannot_connect(
    pki: dict[str, TlsFiles], client: str
) -> None:
    with pytest.raises(BrokenByPeer):
        asyncio.run(exchange(pki["server"], pki.get(client)))


def test_a_client_refuses_a_server_of_another_ca(pki: dict[str, TlsFiles]) -> None:
    with pytest.raises(HandshakeRefused, match="TLS handshake failed") as info:
        asyncio.run(exchange(pki["rogue"], pki["client"]))
    assert "TLS" in info.value.hint  # the likely cause, for a person to act on


def test_tls_settings_from_the_environment_are_checked(
    pki: dict[str, TlsFiles], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("TIANJI_TLS_CERT", "TIANJI_TLS_KEY", "TIANJI_TLS_CA"):
        monkeypatch.delenv(var, raising=False)
    assert tls_from_env() is None
    monkeypatch.setenv("TIANJI_TLS_CERT", pki["client"].cert)
    with pytest.raises(ConfigError, match="TIANJI_TLS_KEY"):
        tls_from_env()
    monkeypatch.setenv("TIANJI_TLS_KEY", pki["client"].key)
    monkeypatch.setenv("TIANJI_TLS_CA", "/nonexistent/ca.pem")
    with pytest.raises(ConfigError, match=r"/nonexistent/ca\.pem"):
        tls_from_env()
    monkeypatch.setenv("TIANJI_TLS_CA", pki["client"].ca)
    assert tls_from_env() == pki["client"]


def test_tls_links_work_on_the_runtime_event_loop(pki: dict[str, TlsFiles]) -> None:
    from tianji.runtime.loop import (
        run,  # uvloop when installed: its TLS path differs from asyncio's
    )

    assert run(exchange(pki["server"], pki["client"])) == b"hiback"
