"""Session-wide settings and checks.

* Runs started by tests write their run directories under a temporary directory
  (``TIANJI_RUN_DIR``), never into the checkout.
* The scripts of ``benchmarks/`` (run from a checkout, not in the package: the peers'
  runners, the network-namespace hosts) import as top-level modules (``from netns import
  Bridge``), as they do when run, from the end of ``sys.path``.
* Each test's wall and CPU seconds (its own process's and its waited-for children's,
  setup to teardown) are kept, and the summary lists those of over 5 s wall with their
  CPU share: a test that mostly waits could share the machine with another, one that
  keeps both cores busy could not (without pytest-xdist; its workers keep their own).
* After the whole session, no process started by it is left alive (every process inherits
  the session's ``TIANJI_TEST_SESSION`` marker) and no shared-memory segment of tianji is
  left in ``/dev/shm``: exit paths (Ctrl-C, SIGTERM, kill -9, crashed children) release
  everything.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from tianji.transports._shmring import PREFIX, SHM_DIR

from tianji.rl.config import RUN_DIR_ENV

pytest_plugins = ["transport_harness"]  # the transports as fixtures (scheme, raw_scheme)

MARKER = "TIANJI_TEST_SESSION"
BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.append(BENCHMARKS)


TIMES: list[tuple[str, float, float]] = []
"""Each test's node id, wall seconds and CPU seconds, in the order they ran."""


def _cpu_seconds() -> float:
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    wall, cpu = time.monotonic(), _cpu_seconds()
    yield
    TIMES.append((item.nodeid, time.monotonic() - wall, _cpu_seconds() - cpu))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    long = sorted((t for t in TIMES if t[1] > 5.0), key=lambda t: -t[1])
    if not long:
        return
    terminalreporter.section("wall and CPU seconds of the tests over 5 s")
    for nodeid, wall, cpu in long:
        line = f"{wall:8.2f} s wall {cpu:8.2f} s CPU {cpu / wall:5.2f}  {nodeid}"
        terminalreporter.write_line(line)


def _leftover_processes(marker: str) -> dict[int, str]:
    """Processes other than this one whose environment carries ``marker``."""
    found: dict[int, str] = {}
    needle = f"{MARKER}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            found[int(entry.name)] = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)}
    except OSError:
        return set()


@pytest.fixture(autouse=True, scope="session")
def _runs_in_a_temporary_directory() -> Iterator[None]:
    root = tempfile.mkdtemp(prefix="tianji-test-runs-")
    before = os.environ.get(RUN_DIR_ENV)
    os.environ[RUN_DIR_ENV] = root
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(RUN_DIR_ENV, None)
        else:
            os.environ[RUN_DIR_ENV] = before
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _nothing_of_the_session_outlives_it() -> Iterator[None]:
    if not Path("/proc/self/environ").exists():  # not Linux: nothing to check with
        yield
        return
    marker = uuid.uuid4().hex
    os.environ[MARKER] = marker
    segments_before = _segments()
    yield
    deadline = time.monotonic() + 15  # Ray's workers and stopping children take a moment
    while (left := _leftover_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:  # do not leave them running whatever the verdict
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    segments = _segments() - segments_before
    problems = [f"process {pid} still alive: {cmd}" for pid, cmd in sorted(left.items())]
    problems += [f"/dev/shm/{name} left behind" for name in sorted(segments)]
    assert not problems, "the test session leaked:\n" + "\n".join(problems)


@pytest.fixture(scope="session")
def ppo_example_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """One run of the README's demo config to 475 (``tianji train examples/cartpole_ppo.toml
    --target-return 475``) with a run directory and a summary copy, shared by the tests
    that check what such a run leaves (the CLI's target and accounting, the run directory).

    Returns (the ``--run-dir`` parent, the run's stdout + stderr, its exit code).
    """
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    parent = tmp_path_factory.mktemp("ppo-example")
    result = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "tianji.cli",
                "train",
                str(root / "examples/cartpole_ppo.toml"),
            ),
            *("--target-return", "475", "--max-seconds", "240", "--run-dir", str(parent)),
            *("--summary", str(parent / "copy.json")),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=root,
    )
    return parent, result.stdout + result.stderr, result.returncode
