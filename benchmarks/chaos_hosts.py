"""``python benchmarks/hosts.py chaos CONFIG --backend hosts``: the chaos run deployed by
hand on two hosts.

Two network namespaces on one bridge (``netns.py``'s ``Bridge``; root and
iproute2) stand for two hosts: the head host runs ``tianji controller`` (with the monitor
and the dashboard) and the learner, buffer, parameter and evaluation services; the actors'
host runs the actors and inference services. Every service is started with ``tianji serve
ROLE CONFIG --index I --restart N`` (the learner with ``--restart`` only when it resumes),
so a killed service comes back on its host through its supervisor, and the controller counts
the restart. This namespace joins the bridge to read the dashboard; ``--cut-every`` takes the
actors' host off the network now and then (:meth:`ChaosRun.cut`).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from netns import Bridge

from tianji.bench.chaos_run import ChaosRun, start_logged
from tianji.rl.topics import index_of

__all__ = ["ACTOR_HOST_ROLES", "start_hosts"]

ACTOR_HOST_ROLES = ("actor", "inference")
"""The roles placed on the actors' host (the others run on the head host)."""
PORT = 7000


def start_hosts(
    config: str,
    sets: list[str],
    out: Path,
    seconds: float,
    restarts: int | None,
    learner_resumes: bool,
) -> ChaosRun:
    """Build the two hosts, start the controller and every service; the run to torment.

    Raises:
        NetnsError: when network namespaces cannot be made here.
        RuntimeError: when the controller printed no dashboard line.
    """
    from tianji.run.config import load_config
    from tianji.run.plan import RunPlan

    run_config = load_config(config, sets)
    specs = RunPlan.build(run_config).specs
    bridge = Bridge(2)
    bridge.create()
    supervisors: list[subprocess.Popen[bytes]] = []
    try:
        bridge.join_root()
        head = bridge.ip(0)
        controller = f"tcp://{head}:{PORT}"
        env = {**os.environ, "TIANJI_TOKEN": secrets.token_hex(16), "PYTHONUNBUFFERED": "1"}
        given = [arg for s in sets for arg in ("--set", s)]
        cmd = [*bridge.prefix(0), sys.executable, "-m", "tianji", "controller", config]
        cmd += ["--bind", controller, "--dashboard", f"{head}:0", "--run-dir", str(out)]
        cmd += ["--summary", str(out / "summary.json"), "--target-return", "1e9"]
        cmd += ["--max-seconds", str(seconds), "--join-timeout", "180", *given]
        proc, url, pump, log = start_logged(cmd, out / "controller.log", env)
        for spec in specs:
            host = 1 if spec.role in ACTOR_HOST_ROLES else 0
            index = str(index_of(spec.name))
            serve = [*bridge.prefix(host), sys.executable, "-m", "tianji", "serve", spec.role]
            serve += [config, "--index", index, "--controller", controller, *given]
            if spec.role != "learner" or learner_resumes:
                limit = run_config.recovery.limit(spec.role) if restarts is None else restarts
                serve += ["--restart", str(limit)]
            with (out / f"{spec.name}.log").open("wb") as sink:
                supervisors.append(
                    subprocess.Popen(serve, stdout=sink, stderr=subprocess.STDOUT, env=env)
                )
    except BaseException:
        for sup in supervisors:
            sup.kill()
        bridge.destroy()
        raise
    return ChaosRun(
        proc,
        url,
        out / "summary.json",
        pump,
        log,
        cut=lambda up: bridge.link(1, up),
        supervisors=supervisors,
        cleanup=bridge.destroy,
    )
