"""``--backend ray --ray-address HEAD:PORT`` on a real Ray cluster of three nodes, each in
its own network namespace on one bridge, started as a user starts one (``ray start``;
``benchmarks/ray_cluster.py``'s :class:`RayCluster`): the head without task CPUs (only the
driver: ``tianji train`` and its controller), a ``trainer`` node (learner, params and
buffer, placed there by ``ray.custom_resources``) and an ``actors`` node (the actors,
placed by theirs). The PPO example reaches its target; the summary says which node ran
which service (none on the head); the launcher started one params relay, on the actors'
node, so each version of the weights crossed into that node once (its link's received
bytes against the weights' bytes; without the relay it takes two copies, one per actor),
not once per actor. With ``ray.aggregate_from = 1`` it also started one heartbeat
aggregator on each node that hosts services, and the services heartbeat through it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import NetnsError
from ray_cluster import PPO, RayCluster, weights_bytes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        sys.platform != "linux" or os.geteuid() != 0 or shutil.which("ip") is None,
        reason="needs Linux, root and iproute2 (network namespaces); CI runs as root",
    ),
]


@contextlib.contextmanager
def running_cluster(actor_nodes: int = 1) -> Iterator[RayCluster]:
    """A started :class:`RayCluster`, destroyed after (skips where namespaces cannot be
    made)."""
    pytest.importorskip("ray")
    c = RayCluster(actor_nodes)
    try:
        c.create()
    except NetnsError as exc:
        pytest.skip(f"cannot build network namespaces here: {exc}")
    try:
        c.start()
        yield c
    finally:
        c.destroy()


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    with running_cluster() as c:
        yield c


def test_ppo_trains_on_a_three_node_cluster_nothing_on_the_head_one_relay_per_actor_node(
    cluster: RayCluster, tmp_path: Path
) -> None:
    summary_path = tmp_path / "summary.json"
    argv = [*cluster.prefix(cluster.HEAD), sys.executable, "-m", "tianji", "train", str(PPO)]
    argv += [*cluster.train_args(), "--summary", str(summary_path), "--max-seconds", "240"]
    argv += ["--set", "ray.aggregate_from=1"]  # a node's heartbeats go through its aggregator
    before = cluster.received_bytes(cluster.ACTORS)
    started = time.monotonic()
    done = subprocess.run(
        argv, cwd=tmp_path, env=cluster.env, capture_output=True, text=True, timeout=400
    )
    out = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, out
    received = cluster.received_bytes(cluster.ACTORS) - before
    s = json.loads(summary_path.read_text())
    assert s["stop_reason"] == "target_return reached", (s["stop_reason"], out)
    trainer, actors = cluster.ip(cluster.TRAINER), cluster.ip(cluster.ACTORS)
    placement = dict(s["placement"])
    aggregators = {n: placement.pop(n) for n in list(placement) if n.startswith("aggregator-")}
    assert sorted(aggregators.values()) == sorted([trainer, actors]), aggregators
    for name in ("actor-0", "learner-0"):  # on each node, through that node's aggregator
        assert s["services"][name]["counters"].get("heartbeats_via_aggregator", 0) > 0, name
    assert placement == {
        "learner-0": trainer, "params-0": trainer, "buffer-0": trainer,
        "actor-0": actors, "actor-1": actors, "relay-0": actors,
    }, placement  # fmt: skip
    params = s["services"]["params-0"]["counters"]
    versions, version_bytes = params["params_version"], weights_bytes()
    relay = s["services"]["relay-0"]["counters"]
    assert 0 < relay["received"] <= params["published"], relay  # at most once per version
    # each version once into the actors' node; the rest of what it received is the
    # controller's and the buffer's small messages
    assert received < 1.5 * versions * version_bytes, (received, versions, version_bytes)
    print(
        f"three-node Ray cluster: target in {s.get('time_to_target_s')} s "
        f"(run {time.monotonic() - started:.1f} s); {versions} versions of "
        f"{version_bytes / 1e3:.1f} kB; the actors' node received {received / 1e6:.2f} MB"
    )


def test_a_lost_nodes_services_restart_on_another_node_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    """Two nodes of actors; the one that runs actor-0 is lost mid-run (every process of
    it killed, its raylet too). Ray reports its actors dead; the launcher restarts them
    (the run's ``[recovery]``) and Ray places them on the other node; the run reaches its
    env-step budget with its books closed."""
    with running_cluster(actor_nodes=2) as cluster:
        _lose_a_node_mid_run(cluster, tmp_path)


def _lose_a_node_mid_run(cluster: RayCluster, tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    argv = [*cluster.prefix(cluster.HEAD), sys.executable, "-m", "tianji", "train", str(PPO)]
    argv += [*cluster.train_args(), "--summary", str(summary_path), "--max-seconds", "240"]
    argv += ["--target-return", "1e9", "--set", "stop.max_env_steps=150000"]
    env = {**cluster.env, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("placed on Ray nodes:"):
                break
        assert lines and lines[-1].startswith("placed on Ray nodes:"), "".join(lines)[-3000:]
        placed = _placement(lines[-1])
        lost_ip = placed["actor-0"]
        lost = next(h for h in range(cluster.hosts) if cluster.ip(h) == lost_ip)
        on_lost = sorted(name for name, ip in placed.items() if ip == lost_ip)
        cluster.lose(lost)
        out, _ = proc.communicate(timeout=300)
        lines.append(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(lines)
    assert proc.returncode == 0, text[-4000:]
    s = json.loads(summary_path.read_text())
    assert "max_env_steps" in s["stop_reason"], (s["stop_reason"], text[-3000:])
    assert s["env_steps"] >= 150000
    actors = [name for name in on_lost if name.startswith("actor-")]
    assert actors and all(s["restarts"].get(name, 0) >= 1 for name in actors), (on_lost, s)
    survivors = {cluster.ip(h) for h in range(cluster.ACTORS, cluster.hosts)} - {lost_ip}
    assert all(s["placement"][name] in survivors for name in actors), s["placement"]
    assert s["accounting"]["balanced"], s["accounting"]


def _placement(line: str) -> dict[str, str]:
    """``placed on Ray nodes: IP: a, b; IP: c`` -> {service: IP}."""
    out = {}
    for part in line.split(":", 1)[1].split(";"):
        ip, _, names = part.strip().partition(": ")
        out.update({name.strip(): ip for name in names.split(",")})
    return out
