"""The layers' import rules hold (``tests/layers.py``), and the checker catches a planted
violation of each kind."""

from __future__ import annotations

import importlib

import pytest
from layers import ALLOWED, PUBLIC, REMOVED, ROOT, cycles, layer_of, sources, violations


@pytest.fixture(scope="module")
def modules() -> dict[str, str]:
    return sources()


def test_every_module_sits_in_a_layer(modules: dict[str, str]) -> None:
    layers = {layer_of(m) for m in modules}
    assert layers <= set(ALLOWED)
    assert {"runtime", "rl", "services", "run", "launch", "cli"} <= layers


def test_no_module_imports_across_the_layer_rules(modules: dict[str, str]) -> None:
    assert violations(modules) == []


def test_there_is_no_import_cycle(modules: dict[str, str]) -> None:
    assert cycles(modules) == []


def test_the_old_reexport_paths_are_gone(modules: dict[str, str]) -> None:
    for old in REMOVED:
        assert old not in modules, f"{old} (a removed re-export path) is back"
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_path_imports_and_is_documented(module: str) -> None:
    importlib.import_module(module)
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("### Public import paths")[1].split("\n## ")[0]
    assert f"`{module}`" in section, f"{module} is not listed in docs/architecture.md"


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        (
            "tianji.runtime.core",
            "from tianji.rl.balance import BalanceConfig",
            "runtime may not import rl",
        ),
        (
            "tianji.runtime.controller",
            "from tianji.services.balancer import Balancer",
            "runtime may not import services",
        ),
        ("tianji.rl.balance", "import asyncio", "rl uses no asyncio"),
        (
            "tianji.rl.envs",
            "from tianji.launch.spec import ServiceSpec",
            "rl may not import launch",
        ),
        (
            "tianji.algorithms.ppo",
            "from tianji.runtime.service import Service",
            "algorithms may not import runtime",
        ),
        (
            "tianji.transports.tcp",
            "from tianji.rl.events import SampleBatch",
            "transports may not import rl",
        ),
        (
            "tianji.services.actor",
            "from tianji.run.plan import RunPlan",
            "services may not import run",
        ),
        (
            "tianji.services.learner",
            "from tianji.launch.base import Launcher",
            "services may not import launch",
        ),
        (
            "tianji.run.plan",
            "from tianji.events import Heartbeat",
            "a removed re-export path",
        ),
    ],
)
def test_a_planted_violation_is_reported(
    modules: dict[str, str], module: str, line: str, expected: str
) -> None:
    planted = dict(modules)
    planted[module] = modules[module] + f"\n\ndef planted() -> None:\n    {line}\n"
    found = violations(planted)
    assert len(found) == 1 and expected in found[0] and found[0].startswith(module), found


def test_a_planted_cycle_is_reported(modules: dict[str, str]) -> None:
    planted = dict(modules)
    planted["tianji.rl.events"] = modules["tianji.rl.events"] + "\nimport tianji.rl.topics\n"
    assert ["tianji.rl.events", "tianji.rl.topics"] in cycles(planted)
    # one only the type checker sees counts too
    planted = dict(modules)
    planted["tianji.run.recovery"] = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from tianji.run.plan import RunPlan\n" + modules["tianji.run.recovery"]
    )
    assert ["tianji.run.plan", "tianji.run.recovery"] in cycles(planted)
