"""The package installs as one import root: tianji, tianji.transports, tianji.algorithms."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tianji
from tianji.cli import main

ROOT = Path(__file__).resolve().parents[1]
IMPORTS = "import tianji, tianji.transports.tcp, tianji.transports.inproc, tianji.runtime.codec"


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.slow
def test_a_regular_install_puts_transports_and_algorithms_under_tianji(tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",  # setuptools from this environment: no index needed
            "--target",
            str(site),
            str(ROOT),
        ],
        check=True,
    )
    assert (site / "tianji" / "transports" / "tcp.py").is_file()
    assert (site / "tianji" / "algorithms" / "__init__.py").is_file()
    assert not (site / "transports").exists() and not (site / "algorithms").exists()
    assert (site / "bin" / "tianji").is_file()
    for init in (ROOT / "tianji").rglob("__init__.py"):  # every subpackage is installed
        assert (site / init.relative_to(ROOT)).is_file(), init
    for name in ("index.html", "dashboard.js"):  # the dashboard's page is package data
        assert (site / "tianji" / "dashboard" / "static" / name).is_file(), name
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = _python(f"{IMPORTS}; print(tianji.transports.tcp.__file__)", tmp_path, env)
    assert where.startswith(str(site)), where


def test_the_development_install_imports_from_the_source_tree(tmp_path: Path) -> None:
    where = _python(f"{IMPORTS}; print(tianji.transports.tcp.__file__)", tmp_path)
    assert Path(where).resolve() == ROOT / "transports" / "tcp.py"


def test_cli_prints_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "demo" in capsys.readouterr().out
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"tianji {tianji.__version__}"


def test_cli_rejects_an_unknown_command_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["trian"])
    assert info.value.code == 2
    assert "trian" in capsys.readouterr().err
