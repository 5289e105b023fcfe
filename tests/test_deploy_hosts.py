"""A run deployed by hand over three hosts: network namespaces joined by veth links.

Host A runs ``tianji controller`` and the learner, buffer and params services; hosts B and
C run one actor each, all through the CLI (``tianji serve``), with a run token. The hosts
share one bridged subnet (the bridge lives in A). Root only (CI runs as root).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DQN = str(ROOT / "examples" / "cartpole_dqn.toml")
SUBNET = "10.77.{}.{}"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        sys.platform != "linux" or os.geteuid() != 0 or shutil.which("ip") is None,
        reason="needs Linux, root and iproute2 (network namespaces); CI runs as root",
    ),
]


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


class Hosts:
    """Three network namespaces ``a``, ``b``, ``c`` on one bridged /24."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.net = os.getpid() % 200 + 20
        self.ns = {h: f"tj{tag}{h}" for h in "abc"}
        self.ip = {h: SUBNET.format(self.net, i) for i, h in enumerate("abc", start=1)}
        self.veth = {h: (f"tj{tag}{h}0", f"tj{tag}{h}1") for h in "bc"}  # (in a, in h)
        self.procs: list[subprocess.Popen[bytes]] = []

    def create(self) -> None:
        for ns in self.ns.values():
            sh("ip", "netns", "add", ns)
            self.run("lo", "ip", "link", "set", "lo", "up", ns=ns)
        a = self.ns["a"]
        self.run("br", "ip", "link", "add", "br0", "type", "bridge", ns=a)
        for h, (near, far) in self.veth.items():
            sh("ip", "link", "add", near, "type", "veth", "peer", "name", far)
            sh("ip", "link", "set", near, "netns", a)
            sh("ip", "link", "set", far, "netns", self.ns[h])
            self.run("", "ip", "link", "set", near, "master", "br0", "up", ns=a)
            self.run("", "ip", "addr", "add", f"{self.ip[h]}/24", "dev", far, ns=self.ns[h])
            self.run("", "ip", "link", "set", far, "up", ns=self.ns[h])
        self.run("", "ip", "addr", "add", f"{self.ip['a']}/24", "dev", "br0", ns=a)
        self.run("", "ip", "link", "set", "br0", "up", ns=a)

    def run(self, _what: str, *argv: str, ns: str) -> None:
        sh("ip", "netns", "exec", ns, *argv)

    def link(self, host: str, up: bool) -> None:
        """Take host's only link down or up (from inside the host)."""
        self.run(
            "", "ip", "link", "set", self.veth[host][1], "up" if up else "down", ns=self.ns[host]
        )

    def start(self, host: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, "TIANJI_TOKEN": "netns-test-token", "PYTHONUNBUFFERED": "1"}
        argv = ["ip", "netns", "exec", self.ns[host], sys.executable, "-m", "tianji", *args]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def destroy(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for ns in self.ns.values():
            pids = subprocess.run(
                ["ip", "netns", "pids", ns], capture_output=True, text=True
            ).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    h = Hosts()
    try:
        h.create()
    except subprocess.CalledProcessError as exc:
        h.destroy()
        pytest.skip(f"cannot build network namespaces here: {exc.stderr.strip()}")
    try:
        yield h
    finally:
        h.destroy()


def start_run(hosts: Hosts, tmp: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    """Controller + learner + buffer + params on a, actor-0 on b, actor-1 on c."""
    ip = hosts.ip
    controller = f"tcp://{ip['a']}:7000"
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
            *extra,
        ],
        tmp / "controller.log",
    )
    placement = [("a", "params", 0), ("a", "buffer", 0), ("a", "learner", 0)]
    placement += [("b", "actor", 0), ("c", "actor", 1)]
    for host, role, index in placement:
        hosts.start(
            host,
            [
                "serve",
                role,
                DQN,
                "--index",
                str(index),
                "--controller",
                controller,
                "--bind",
                f"tcp://{ip[host]}:0",
                *extra,
            ],
            tmp / f"{role}-{index}.log",
        )
    return ctl


def finish(hosts: Hosts, ctl: subprocess.Popen[bytes], tmp: Path) -> dict[str, object]:
    try:
        code = ctl.wait(300)
    except subprocess.TimeoutExpired:
        code = None
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp.glob("*.log")))
    assert code == 0, f"controller exit code {code}\n{logs}"
    for proc in hosts.procs[1:]:
        assert proc.wait(30) == 0, f"a service exited with {proc.returncode}\n{logs}"
    summary: dict[str, object] = json.loads((tmp / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return reached", logs
    assert summary["final_return"] >= 300  # type: ignore[operator]
    assert summary["accounting"]["balanced"], summary["accounting"]  # type: ignore[index]
    return summary


def test_dqn_on_three_hosts_reaches_300_and_an_actor_host_cut_off_for_5_s_comes_back(
    hosts: Hosts, tmp_path: Path
) -> None:
    """One run shows both: DQN trains to 300 with its services on three hosts (``finish``
    checks the target, the exit codes and the books), and an actor host that loses its link
    for 5 s mid-run comes back."""
    ctl = start_run(hosts, tmp_path, [])
    metrics = tmp_path / "metrics.jsonl"
    outage: dict[str, float] = {}

    def cut_link() -> None:
        # Once the learner is learning (some updates), take host b off the network for 5 s.
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and ctl.poll() is None:
            rows = metrics.read_text().splitlines() if metrics.exists() else []
            if rows and json.loads(rows[-1])["learner_updates"] >= 200:
                hosts.link("b", up=False)
                outage["down"] = time.time()
                time.sleep(5)
                hosts.link("b", up=True)
                outage["up"] = time.time()
                return
            time.sleep(0.5)

    cutter = threading.Thread(target=cut_link)
    cutter.start()
    summary = finish(hosts, ctl, tmp_path)
    cutter.join()
    assert "up" in outage, "the run ended before the link could be cut"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    before = [r for r in rows if r["unix"] <= outage["down"]]
    during = [r for r in rows if outage["down"] + 1 < r["unix"] < outage["up"]]
    after = [r for r in rows if r["unix"] > outage["up"] + 2]
    assert before and after, "metrics rows around the outage"

    def steps(row: dict[str, dict[str, int]], actor: str = "actor-0") -> int:
        return row["env_steps_by_actor"].get(actor, 0)

    # During the outage nothing of host b's actor arrives while host c's keeps coming; after
    # it, host b's actor is back (its links survived the outage or were made again).
    assert during, "no metrics row fell inside the outage"
    assert len({steps(r) for r in during}) == 1, [steps(r) for r in during]
    assert steps(during[-1], "actor-1") > steps(before[-1], "actor-1")
    assert steps(after[-1]) > steps(during[-1])
    assert summary["env_steps_by_actor"]["actor-0"] > steps(during[-1])  # type: ignore[index]
    by_actor = summary["env_steps_by_actor"]
    assert set(by_actor) == {"actor-0", "actor-1"}  # type: ignore[arg-type]
