"""A run deployed by hand over three hosts: network namespaces joined by veth links.

Host A runs ``tianji controller`` and the learner, buffer and params services; hosts B and
C run one actor each, all through the CLI (``tianji serve``), with a run token. The hosts
share one bridged subnet (the bridge lives in A). Root only (CI runs as root).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import Bridge, NetnsError

from tianji.launch.supervisor import serving_pids

ROOT = Path(__file__).resolve().parents[1]
DQN = str(ROOT / "examples" / "cartpole_dqn.toml")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        sys.platform != "linux" or os.geteuid() != 0 or shutil.which("ip") is None,
        reason="needs Linux, root and iproute2 (network namespaces); CI runs as root",
    ),
]


class Hosts(Bridge):
    """Three network namespaces ``a``, ``b``, ``c`` (hosts 0, 1, 2 of a bridge)."""

    NAMES = "abc"

    def __init__(self) -> None:
        super().__init__(3)
        self.ip_of = {h: self.ip(i) for i, h in enumerate(self.NAMES)}
        self.procs: list[subprocess.Popen[bytes]] = []

    def cut(self, host: str, up: bool) -> None:
        self.link(self.NAMES.index(host), up)

    def start(self, host: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, "TIANJI_TOKEN": "netns-test-token", "PYTHONUNBUFFERED": "1"}
        argv = [*self.prefix(self.NAMES.index(host)), sys.executable, "-m", "tianji", *args]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def destroy(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        super().destroy()


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    h = Hosts()
    try:
        h.create()
    except NetnsError as exc:
        pytest.skip(f"cannot build network namespaces here: {exc}")
    try:
        yield h
    finally:
        h.destroy()


def start_run(
    hosts: Hosts,
    tmp: Path,
    extra: list[str],
    placement: list[tuple[str, str, int, list[str]]] | None = None,
    port: int = 7000,
) -> tuple[subprocess.Popen[bytes], list[subprocess.Popen[bytes]]]:
    """The controller on a, then every service with the natural command (no ``--bind``:
    each listens where its route to the controller leaves): by default learner, buffer
    and params on a, actor-0 on b (with ``--advertise``, as the issue's new user typed it)
    and actor-1 on c (with nothing). Files (logs, summary, metrics) go to ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    ip = hosts.ip_of
    controller = f"tcp://{ip['a']}:{port}"
    ctl = hosts.start(
        "a",
        [
            "controller",
            DQN,
            "--bind",
            controller,
            "--target-return",
            "300",
            "--max-seconds",
            "240",
            "--join-timeout",
            "120",
            "--summary",
            str(tmp / "summary.json"),
            "--metrics",
            str(tmp / "metrics.jsonl"),
            "--run-dir",
            str(tmp / "runs"),
            *extra,
        ],
        tmp / "controller.log",
    )
    if placement is None:  # buffer-0, learner-0, actor-1 under a supervisor (serve --restart)
        placement = [("a", "params", 0, []), ("a", "buffer", 0, ["--restart", "2"])]
        placement += [("a", "learner", 0, ["--restart", "1"])]
        placement += [("b", "actor", 0, ["--advertise", ip["b"]])]
        placement += [("c", "actor", 1, ["--restart", "2"])]
    services = [
        hosts.start(
            host,
            ["serve", role, DQN, "--index", str(index), "--controller", controller, *flags, *extra],
            tmp / f"{role}-{index}.log",
        )
        for host, role, index, flags in placement
    ]
    return ctl, services


def finish(
    ctl: subprocess.Popen[bytes], services: list[subprocess.Popen[bytes]], tmp: Path
) -> dict[str, object]:
    try:
        code = ctl.wait(300)
    except subprocess.TimeoutExpired:
        code = None
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp.glob("*.log")))
    assert code == 0, f"controller exit code {code}\n{logs}"
    for proc in services:
        assert proc.wait(30) == 0, f"a service exited with {proc.returncode}\n{logs}"
    summary: dict[str, object] = json.loads((tmp / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return reached", logs
    assert summary["final_return"] >= 300  # type: ignore[operator]
    assert summary["accounting"]["balanced"], summary["accounting"]  # type: ignore[index]
    return summary


def _serving_pid(log: Path) -> int:
    """The pid of the service process a ``tianji serve --restart`` supervisor runs now."""
    return serving_pids(log.read_text())[-1]


def test_dqn_on_three_hosts_reaches_300_through_kills_and_a_cut_and_a_run_with_no_actor_stops(
    hosts: Hosts, tmp_path: Path
) -> None:
    """Two runs on the same hosts at once, each with the natural command. The first shows
    that DQN trains to 300 with its services on three hosts (``finish`` checks the target,
    the exit codes and the books), that the replay buffer (host a) and an actor (host c)
    killed with SIGKILL come back through ``tianji serve --restart`` and are counted as
    restarts, and that an actor host that loses its link for 5 s mid-run comes back. The
    second plants the issue's trap: its only actor registers an address nobody can reach;
    every service joins, no env step can happen, and that run stops within 90 s with the
    address in its message and its summary (it idles, so it costs the first run little)."""
    wrong = hosts.spare_ip()  # on the subnet, but no host has it
    placement = [("a", "params", 0, []), ("a", "buffer", 0, []), ("a", "learner", 0, [])]
    placement.append(("c", "actor", 0, ["--advertise", wrong]))
    launched = time.monotonic()
    trap, trap_services = start_run(
        hosts, tmp_path / "trap", ["--set", "actors.count=1"], placement, port=7001
    )
    resume = ["--set", 'recovery.learner="resume"', "--set", "checkpoint.every_seconds=3"]
    # The example reaches 300 in about 10 s here, and with a quarter of its learning rate
    # it once did so before the outage (which comes after three kills and a resume) had
    # ended (seen in CI). Epsilon follows the learner's updates (restored on resume), so a
    # slower decay puts a floor under the time to 300 that a faster learner cannot lower:
    # the training return stays low while a third or more of the actions are random.
    resume += ["--set", "algo.epsilon_decay_updates=6000"]
    ctl, services = start_run(hosts, tmp_path, resume)
    metrics = tmp_path / "metrics.jsonl"
    outage: dict[str, float] = {}

    killed: list[str] = []
    cutter = threading.Thread(
        target=_kill_then_cut, args=(hosts, tmp_path, ctl, metrics, killed, outage)
    )
    cutter.start()
    try:
        trap_code = trap.wait(120)
    except subprocess.TimeoutExpired:
        trap_code = None
    took = time.monotonic() - launched
    summary = finish(ctl, services, tmp_path)
    cutter.join()

    _check_the_trap(tmp_path / "trap", trap_code, took, trap_services, wrong)
    assert "up" in outage, "the run ended before the link could be cut"
    assert killed == ["buffer-0", "actor-1", "learner-0"]
    restarts = {"buffer-0": 1, "actor-1": 1, "learner-0": 1}
    assert summary["restarts"] == restarts, summary["restarts"]
    learner = summary["services"]["learner-0"]["counters"]  # type: ignore[index]
    assert learner["restored_version"] > 0, learner  # resumed from the checkpoint
    lost = summary["accounting"]["dropped"].get("lost_in_restart", 0)  # type: ignore[index]
    assert lost > 0, summary["accounting"]  # what the dead buffer held, counted
    _check_the_outage(metrics, outage, summary)


def _kill_then_cut(
    hosts: Hosts,
    tmp_path: Path,
    ctl: subprocess.Popen[bytes],
    metrics: Path,
    killed: list[str],
    outage: dict[str, float],
) -> None:
    """Once the learner is learning, kill the buffer's and actor-1's processes, and once a
    checkpoint is there the learner's (their supervisors start new ones; the learner
    resumes from the checkpoint); later take host b off the network for 5 s."""
    deadline = time.monotonic() + 200
    at_kill = 0  # learner updates when the learner was killed
    while time.monotonic() < deadline and ctl.poll() is None:
        rows = metrics.read_text().splitlines() if metrics.exists() else []
        updates = json.loads(rows[-1])["learner_updates"] if rows else 0
        if updates >= 50 and not killed:
            for name in ("buffer-0", "actor-1"):
                os.kill(_serving_pid(tmp_path / f"{name}.log"), signal.SIGKILL)
                killed.append(name)
        checkpoints = list(tmp_path.glob("runs/*/checkpoints/ckpt-*.tjc"))
        if updates >= 100 and checkpoints and "learner-0" not in killed:
            os.kill(_serving_pid(tmp_path / "learner-0.log"), signal.SIGKILL)
            killed.append("learner-0")
            at_kill = updates
        # the cut comes once the new learner learns (actors wait while it resumes)
        if "learner-0" in killed and updates >= at_kill + 30:
            hosts.cut("b", up=False)
            outage["down"] = time.time()
            time.sleep(5)
            hosts.cut("b", up=True)
            outage["up"] = time.time()
            return
        time.sleep(0.5)


def _check_the_trap(
    trap: Path,
    code: int | None,
    took: float,
    services: list[subprocess.Popen[bytes]],
    wrong: str,
) -> None:
    """The run whose only actor registered an unreachable address stopped within 90 s,
    naming the address, with no env step and every service stopped cleanly."""
    log = (trap / "controller.log").read_text()
    assert code == 2, f"trap controller exit code {code}\n{log[-4000:]}"
    assert took < 90, f"the trap run took {took:.0f} s to stop\n{log[-2000:]}"
    assert "no env step" in log and f"tcp://{wrong}:" in log, log[-4000:]
    summary = json.loads((trap / "summary.json").read_text())
    assert f"tcp://{wrong}:" in summary["stop_reason"], summary["stop_reason"]
    assert summary["env_steps"] == 0
    for proc in services:
        assert proc.wait(30) == 0, "a service of the trap run did not stop cleanly"


def _check_the_outage(metrics: Path, outage: dict[str, float], summary: Any) -> None:
    """During the outage nothing of host b's actor arrives while host c's keeps coming;
    after it, host b's actor is back (its links survived the outage or were made again)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    before = [r for r in rows if r["unix"] <= outage["down"]]
    during = [r for r in rows if outage["down"] + 1 < r["unix"] < outage["up"]]
    after = [r for r in rows if r["unix"] > outage["up"] + 2]
    assert before and after, "metrics rows around the outage"

    def steps(row: dict[str, dict[str, int]], actor: str = "actor-0") -> int:
        return row["env_steps_by_actor"].get(actor, 0)

    assert during, "no metrics row fell inside the outage"
    assert len({steps(r) for r in during}) == 1, [steps(r) for r in during]

    # (host c's actor may be held by the controller meanwhile, e.g. while the learner
    # catches up with the replay ratio: its paused_s grows while it waits). Compared within
    # one incarnation: actor-1 was killed earlier, and its new incarnation's first counts
    # may reach the metrics only now, lower than the old one's (seen in CI).
    def paused_s(row: dict[str, Any]) -> float:
        return float(row["controller"]["pause_s"].get("actor-1", 0.0))

    same = steps(during[-1], "actor-1") >= steps(before[-1], "actor-1")
    start = before[-1] if same else during[0]
    advanced = steps(during[-1], "actor-1") > steps(start, "actor-1")
    held = paused_s(during[-1]) > paused_s(start)
    seen = [(steps(r, "actor-1"), paused_s(r)) for r in before[-3:] + during]
    assert advanced or held or (not same and len(during) == 1), seen  # (1 row: no baseline)
    assert steps(after[-1]) > steps(during[-1])
    assert summary["env_steps_by_actor"]["actor-0"] > steps(during[-1])
    by_actor = summary["env_steps_by_actor"]
    assert set(by_actor) == {"actor-0", "actor-1"}
