"""A training run started for ``tianji bench chaos``, however it was placed."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

__all__ = ["ChaosRun", "Logged", "StartHosts", "start_logged"]


@dataclasses.dataclass
class ChaosRun:
    """A training run started for chaos: its main process (``tianji train`` or ``tianji
    controller``), its dashboard's status URL, and for hosts the services' supervisors and
    how to cut the actors' host off the network."""

    proc: subprocess.Popen[str]
    url: str
    summary_path: Path
    pump: subprocess.Popen[bytes]
    log: IO[str]
    cut: Callable[[bool], None] | None = None
    supervisors: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)
    cleanup: Callable[[], None] = lambda: None


StartHosts = Callable[[str, list[str], Path, float, "int | None", bool], ChaosRun]
"""Starts the run on hosts: (config, ``--set`` overrides, run directory, seconds, restarts
per service or ``None``, whether the learner resumes) -> the run (``benchmarks/chaos_hosts.py``
is one: root and iproute2)."""

Logged = tuple[subprocess.Popen[str], str, subprocess.Popen[bytes], IO[str]]
"""A started process, its dashboard's status URL, the pump of its output and its log."""


def start_logged(cmd: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> Logged:
    """Start ``cmd``; read its output until the dashboard line, then pump the rest to the
    log file. Returns (process, status URL, pump, log file).

    Raises:
        RuntimeError: when no dashboard line came.
    """
    log = log_path.open("w")
    proc = subprocess.Popen(
        list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    url = ""
    for _ in range(60):
        line = proc.stdout.readline()
        log.write(line)
        if line.startswith("dashboard: "):
            url = line.split(" ", 1)[1].strip() + "api/status"
            break
    if not url:
        proc.kill()
        log.close()
        raise RuntimeError(f"no dashboard line from {' '.join(cmd)}; see {log_path}")
    # the rest of the output goes to the log file from a thread-free pump: a pipe must be read
    pump = subprocess.Popen(["cat"], stdin=proc.stdout, stdout=log)
    return proc, url, pump, log
