"""The PPO example on a Ray cluster of three nodes in network namespaces, against the local
backend, side by side in one run (root and iproute2)::

    sudo .venv/bin/python benchmarks/ray_cluster.py --seeds 0 1 2 --out docs/results/ray-cluster

The cluster is started as a user starts one (``ray start``): the head without task CPUs
(only the driver runs there: ``tianji train`` with its controller and monitor), a
``trainer`` node (2 CPUs; learner, params and buffer are placed on it by
``ray.custom_resources``) and an ``actors`` node (2 CPUs; the actors are placed there by
theirs). Each seed trains ``examples/cartpole_ppo.toml`` to its target once with
``--backend local`` (in this namespace, no Ray) and once on the cluster; the report has each
run's time to the target (the summary's ``time_to_target_s``, counted from the run's start,
start-up included), wall time and env steps, the medians and their ratio (cluster / local),
and the bytes the actors' node received, in copies of the weights per version, with the
params relays the launcher starts and without them (``ray.relays = false``).
``tests/test_ray_cluster.py`` uses :class:`RayCluster` too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from netns import Bridge

ROOT = Path(__file__).resolve().parents[1]
PPO = ROOT / "examples" / "cartpole_ppo.toml"
RAY_PORT = 6379
TRAINER_ROLES = ("learner", "params", "buffer")


class RayCluster(Bridge):
    """Host 0: the Ray head (no CPUs); host 1: the ``trainer`` node; hosts 2, 3, ...: the
    ``actor_nodes`` nodes of actors (2 CPUs and the ``actors`` resource each)."""

    HEAD, TRAINER, ACTORS = 0, 1, 2

    def __init__(self, actor_nodes: int = 1) -> None:
        # (two clusters of one process, e.g. two tests, get their own namespaces)
        super().__init__(2 + actor_nodes, tag=f"{os.getpid() % 100000}r{actor_nodes}")
        ray = Path(sys.executable).with_name("ray")
        self.ray = str(ray) if ray.exists() else "ray"
        # Ray's unix sockets live under it: a path of over ~100 bytes fails to bind
        self.temp_dir = Path(f"/tmp/tjray{self.tag}")
        # no usage stats and no cluster token: the namespaces are this machine's own network
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}

    @property
    def address(self) -> str:
        return f"{self.ip(self.HEAD)}:{RAY_PORT}"

    def start(self) -> None:
        """Start the three Ray nodes (each ``ray start`` returns once its node runs).

        Raises:
            RuntimeError: naming the node that did not start, with Ray's output.
        """
        for h in range(self.hosts):  # Ray finds a node's IP by its route out
            device = "br0" if h == 0 else self.veth[h][1]
            subprocess.run([*self.prefix(h), "ip", "route", "add", "default", "dev", device])
        self._ray_start(self.HEAD, "--head", f"--port={RAY_PORT}", "--num-cpus=0")
        self._ray_start(self.TRAINER, "--num-cpus=2", '--resources={"trainer": 4}')
        for host in range(self.ACTORS, self.hosts):
            self._ray_start(host, "--num-cpus=2", '--resources={"actors": 4}')

    def _ray_start(self, host: int, *args: str) -> None:
        join = [] if host == self.HEAD else [f"--address={self.address}"]
        argv = [*self.prefix(host), self.ray, "start", *join, *args]
        argv += [f"--node-ip-address={self.ip(host)}", "--disable-usage-stats"]
        if host == self.HEAD:
            argv += ["--include-dashboard=false", f"--temp-dir={self.temp_dir}"]
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"ray node {host}: {done.stdout[-2000:]} {done.stderr[-3000:]}")

    def train_args(self) -> list[str]:
        """``tianji train`` arguments that place the run's services on this cluster."""
        custom = ", ".join(f"{role} = {{trainer = 1}}" for role in TRAINER_ROLES)
        custom += ", actor = {actors = 1}"
        return [
            "--backend", "ray", "--ray-address", self.address,
            "--set", f"ray.custom_resources={{{custom}}}",
        ]  # fmt: skip

    def received_bytes(self, host: int) -> int:
        """Bytes host ``host`` received on its link to the bridge."""
        out = subprocess.run(
            [*self.prefix(host), "ip", "-j", "-s", "link", "show", "dev", self.veth[host][1]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return int(json.loads(out)[0]["stats64"]["rx"]["bytes"])

    def lose(self, host: int) -> None:
        """Lose node ``host``: every process of it (its raylet, its actors) is killed at
        once, as when the machine dies."""
        pids = subprocess.run(
            ["ip", "netns", "pids", self.ns[host]], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:  # gone meanwhile
                continue

    def destroy(self) -> None:
        """Kill every Ray process of the three nodes and remove them (never ``ray stop``,
        which stops every Ray instance of the machine)."""
        super().destroy()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def weights_bytes() -> int:
    """The bytes of one version of the PPO example's weights."""
    from tianji.run.config import load_config
    from tianji.services.common import make_algorithm

    algo = make_algorithm(load_config(str(PPO), []), seed=0, device="cpu")
    return sum(int(w.nbytes) for w in algo.get_weights().values())


def train(prefix: list[str], args: list[str], workdir: Path, env: dict[str, str]) -> dict[str, Any]:
    """One ``tianji train`` of the PPO example; its summary with the wall time added.

    Raises:
        RuntimeError: with the run's output when it failed.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    summary = workdir / "summary.json"
    argv = [*prefix, sys.executable, "-m", "tianji", "train", str(PPO), "--summary", str(summary)]
    started = time.monotonic()
    done = subprocess.run(
        [*argv, *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv + args)}: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    s: dict[str, Any] = json.loads(summary.read_text())
    s["wall_s"] = round(time.monotonic() - started, 2)
    return s


def _row(backend: str, seed: int, s: dict[str, Any]) -> dict[str, Any]:
    return {
        "backend": backend,
        "seed": seed,
        "time_to_target_s": s.get("time_to_target_s"),
        "wall_s": s["wall_s"],
        "env_steps": s.get("env_steps"),
        "stop_reason": s.get("stop_reason"),
    }


def measure(seeds: list[int], workdir: Path) -> dict[str, Any]:
    """Every seed on both backends (local first), and the cluster's byte counts."""
    rows: list[dict[str, Any]] = []
    crossings: list[dict[str, Any]] = []
    cluster = RayCluster()
    cluster.create()
    try:
        cluster.start()
        for seed in seeds:
            local = train([], ["--seed", str(seed)], workdir / f"local-{seed}", dict(os.environ))
            rows.append(_row("local", seed, local))
            for relays in ("true", "false"):
                backend = "ray-cluster" if relays == "true" else "ray-cluster-no-relays"
                before = cluster.received_bytes(cluster.ACTORS)
                args = [*cluster.train_args(), "--seed", str(seed), "--set", f"ray.relays={relays}"]
                where = workdir / f"{backend}-{seed}"
                s = train(cluster.prefix(cluster.HEAD), args, where, cluster.env)
                received = cluster.received_bytes(cluster.ACTORS) - before
                rows.append({**_row(backend, seed, s), "placement": s.get("placement")})
                versions = s["services"]["params-0"]["counters"]["params_version"]
                crossings.append(
                    {
                        "backend": backend,
                        "seed": seed,
                        "versions": versions,
                        "actors_node_received_bytes": received,
                    }
                )
            print(json.dumps(rows[-3:]), flush=True)
    finally:
        cluster.destroy()
    return {"rows": rows, "crossings": crossings}


def report(result: dict[str, Any]) -> dict[str, Any]:
    """Medians per backend, the ratio, and received bytes per version of the weights."""
    out: dict[str, Any] = {"weights_bytes": weights_bytes(), **result}
    for backend in ("local", "ray-cluster", "ray-cluster-no-relays"):
        times = [r["time_to_target_s"] for r in result["rows"] if r["backend"] == backend]
        out[f"{backend}_median_time_to_target_s"] = statistics.median(times)
    out["ratio_cluster_over_local"] = round(
        out["ray-cluster_median_time_to_target_s"] / out["local_median_time_to_target_s"], 3
    )
    for c in result["crossings"]:
        c["copies_per_version"] = round(
            c["actors_node_received_bytes"] / (c["versions"] * out["weights_bytes"]), 3
        )
    return out


def markdown(r: dict[str, Any]) -> str:
    lines = [
        "# PPO example: local backend vs a three-node Ray cluster (network namespaces)",
        "",
        "`sudo .venv/bin/python benchmarks/ray_cluster.py --seeds ... --out ...`",
        "",
        "| backend | seed | time to target (s) | wall (s) | env steps |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['backend']} | {row['seed']} | {row['time_to_target_s']} | "
            f"{row['wall_s']} | {row['env_steps']} |"
        )
    lines += [
        "",
        f"Median time to target: local {r['local_median_time_to_target_s']} s, cluster "
        f"{r['ray-cluster_median_time_to_target_s']} s; ratio {r['ratio_cluster_over_local']}.",
        "",
        f"Bytes the actors' node (two actors) received per version of the weights "
        f"({r['weights_bytes']} bytes), in copies of the weights:",
        "",
        "| run | seed | versions | received (bytes) | copies per version |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in r["crossings"]:
        lines.append(
            f"| {c['backend']} | {c['seed']} | {c['versions']} | "
            f"{c['actors_node_received_bytes']} | {c['copies_per_version']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/ray_cluster.py", description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="", help="write OUT.json and OUT.md")
    parser.add_argument("--workdir", default="/tmp/tianji-ray-cluster-bench")
    args = parser.parse_args()
    r = report(measure(args.seeds, Path(args.workdir)))
    text = markdown(r)
    print(text)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(r, indent=2) + "\n")
        Path(f"{args.out}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
