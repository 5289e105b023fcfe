"""The examples run as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pubsub.py"


@pytest.mark.parametrize(
    "args", [[], pytest.param(["--processes"], marks=pytest.mark.slow)], ids=["inproc", "processes"]
)
def test_pubsub_example_delivers_every_reading(args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--count", "120", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "printer: reading 100:" in out
    if args:
        assert "complete: {'seen': 120}" in out


@pytest.mark.parametrize(
    "config", sorted(p.name for p in EXAMPLE.parent.glob("*.toml")), ids=lambda name: name
)
def test_every_example_config_loads_and_builds_its_algorithm(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tianji.run.config import load_config
    from tianji.services.common import make_algorithm

    monkeypatch.chdir(EXAMPLE.parents[1])  # paths in configs are relative to the checkout
    run = load_config(EXAMPLE.parent / config)
    algo = make_algorithm(run, seed=0, device="cpu")
    assert algo.buffer_spec().batch_size > 0
