"""``tianji bench chaos``: kill -9 a random service every few seconds during a training run.

A ``tianji train CONFIG`` run (``--backend local`` or ``ray``, with its dashboard) trains for
``--minutes`` minutes; after ``--warmup`` seconds, every ``--every`` seconds one running
service of a restartable role (actors, inference services, buffers, evaluation workers, the
parameter service, and the learner when ``[recovery] learner = "resume"``; never the
controller or the monitor) chosen at random (``--seed``) gets SIGKILL. Every role gets
``--restarts`` restarts per service. At the end the run is stopped cleanly (SIGTERM) and the
report says:

* kills, how many of them came back (restart latency per role: p50 and max, from the kill to
  the new incarnation's first heartbeat) and the samples lost per kill
  (``dropped/lost_in_restart``);
* the mean return before the first kill and at the end;
* whether the accounting identity held in every metrics row and in the summary;
* leftovers: processes of the run still alive after it ended, new files in ``/dev/shm``;
* RSS growth of the services that were never killed (from ``/proc/PID/status``), from the
  first kill to the end and over the second half (a run still filling its replay buffer
  grows at first; a leak keeps growing).

Goal (issue 22): one kill every 10 s for 10 min on the PPO example with ``learner =
"resume"``: the run keeps learning, the accounting balanced in every row, no leftovers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["killable_roles", "run_chaos", "summarize_kills"]

SHM_DIR = Path("/dev/shm")


def killable_roles(learner_resumes: bool) -> tuple[str, ...]:
    """The roles chaos may kill: every restartable one, the learner only when it resumes."""
    roles = ("actor", "inference", "buffer", "eval", "params")
    return (*roles, "learner") if learner_resumes else roles


def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read().decode())
        return body


def _rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purpose
    with contextlib.suppress(OSError):
        if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return False
    return True


def summarize_kills(kills: list[dict[str, Any]]) -> dict[str, Any]:
    """Per role: kills, restarted, restart latency p50/max (seconds)."""
    roles: dict[str, Any] = {}
    for role in sorted({k["role"] for k in kills}):
        mine = [k for k in kills if k["role"] == role]
        took = sorted(k["restart_s"] for k in mine if k["restart_s"] is not None)
        roles[role] = {
            "kills": len(mine),
            "restarted": len(took),
            "restart_p50_s": round(statistics.median(took), 2) if took else None,
            "restart_max_s": round(took[-1], 2) if took else None,
        }
    return roles


def run_chaos(
    config: str,
    *,
    every: float,
    minutes: float,
    warmup: float,
    seed: int,
    restarts: int,
    sets: list[str],
    out: Path,
    backend: str = "local",
) -> dict[str, Any]:
    """Run the chaos (see the module docstring) and return its report."""
    from tianji.run.config import load_config

    learner_resumes = load_config(config, sets).recovery.learner == "resume"  # checks it too
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    shm_before = set(os.listdir(SHM_DIR)) if SHM_DIR.is_dir() else set()
    budget = [f"recovery.restarts.{r}={restarts}" for r in killable_roles(learner_resumes)]
    cmd = [sys.executable, "-m", "tianji", "train", config, "--dashboard", "127.0.0.1:0"]
    cmd += ["--run-dir", str(out), "--summary", str(summary_path)]
    cmd += ["--target-return", "1e9", "--max-seconds", str(warmup + minutes * 60 + 120)]
    cmd += ["--backend", backend]
    for s in [*budget, *sets]:
        cmd += ["--set", s]
    log = (out / "train.log").open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        raise RuntimeError(f"no dashboard line from {' '.join(cmd)}")
    # the rest of the output goes to the log file from a thread-free pump: a pipe must be read
    pump = subprocess.Popen(["cat"], stdin=proc.stdout, stdout=log)
    pids_seen: set[int] = set()
    kills: list[dict[str, Any]] = []
    try:
        status = _wait(url, lambda s: s["counters"]["episodes"] > 0, 180)
        roles = killable_roles(learner_resumes)
        time.sleep(warmup)
        status = _status(url)
        return_before = status["counters"]["mean_return"]
        first = {s["name"]: s["pid"] for s in status["services"] if s["pid"]}
        pids_seen.update(first.values())
        rss_first = {name: _rss_mb(pid) for name, pid in first.items()}
        print(f"chaos: first kill at {warmup:.0f} s, return {return_before}", file=sys.stderr)
        deadline = time.monotonic() + minutes * 60
        next_kill = time.monotonic()
        pending: dict[str, dict[str, Any]] = {}  # service -> its kill, until it is back
        halfway = time.monotonic() + minutes * 30
        rss_mid: dict[str, float | None] = {}
        while time.monotonic() < deadline:
            try:
                status = _status(url)
            except OSError:  # the run ended (or its dashboard is busy): the report says which
                if proc.poll() is not None:
                    break
                time.sleep(0.5)
                continue
            rows = {s["name"]: s for s in status["services"]}
            pids_seen.update(s["pid"] for s in rows.values() if s["pid"])
            now = time.monotonic()
            if not rss_mid and now >= halfway:
                rss_mid = {n: _rss_mb(p) for n, p in first.items()}
            for name, kill in list(pending.items()):
                row = rows.get(name)
                if row and row["state"] == "running" and row["pid"] not in (None, kill["pid"]):
                    kill["restart_s"] = round(now - kill["at"], 2)
                    del pending[name]
            if now >= next_kill:
                candidates = [
                    s for s in rows.values()
                    if s["role"] in roles and s["state"] == "running" and s["pid"]
                    and s["name"] not in pending
                ]  # fmt: skip
                if candidates:
                    victim = rng.choice(sorted(candidates, key=lambda s: s["name"]))
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim["pid"], signal.SIGKILL)
                    kill = {
                        "t": round(now - deadline + minutes * 60, 1),
                        "service": victim["name"],
                        "role": victim["role"],
                        "pid": victim["pid"],
                        "at": now,
                        "restart_s": None,
                    }
                    kills.append(kill)
                    pending[victim["name"]] = kill
                    print(f"chaos: [{kill['t']:6.1f} s] killed {victim['name']}", file=sys.stderr)
                next_kill = now + every
            if proc.poll() is not None:
                break
            time.sleep(0.25)
        settle = time.monotonic() + 60  # let the last kills come back (backoff <= 30 s)
        while pending and time.monotonic() < settle and proc.poll() is None:
            with contextlib.suppress(OSError):
                status = _status(url)
            rows = {s["name"]: s for s in status["services"]}
            for name, kill in list(pending.items()):
                row = rows.get(name)
                if row and row["state"] == "running" and row["pid"] not in (None, kill["pid"]):
                    kill["restart_s"] = round(time.monotonic() - kill["at"], 2)
                    del pending[name]
            time.sleep(0.25)
        killed = {k["service"] for k in kills}
        rss_end = {
            s["name"]: _rss_mb(s["pid"])
            for s in status["services"]
            if s["pid"] and s["name"] not in killed
        }
        return_end = status["counters"]["mean_return"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        pump.wait(timeout=30)
        log.close()
    time.sleep(2)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    rows_file = next(out.glob("*/metrics.jsonl"), None)
    metric_rows = (
        [json.loads(x) for x in rows_file.read_text().splitlines() if x.strip()]
        if rows_file
        else []
    )
    unbalanced = [
        r["t"] for r in metric_rows if r.get("accounting") and not r["accounting"]["balanced"]
    ]
    shm_after = set(os.listdir(SHM_DIR)) if SHM_DIR.is_dir() else set()
    for k in kills:
        k.pop("at", None)
    return {
        "config": config,
        "backend": backend,
        "every_s": every,
        "minutes": minutes,
        "seed": seed,
        "exit_code": code,
        "stop_reason": summary.get("stop_reason"),
        "kills": kills,
        "roles": summarize_kills(kills),
        "kills_survived": sum(k["restart_s"] is not None for k in kills),
        "restarts": summary.get("restarts"),
        "lost_in_restart": (summary.get("samples_dropped") or {}).get("lost_in_restart", 0),
        "return_before_first_kill": return_before,
        "return_at_end": return_end,
        "metrics_rows": len(metric_rows),
        "unbalanced_rows": unbalanced,
        "summary_balanced": (summary.get("accounting") or {}).get("balanced"),
        "leftover_processes": sorted(p for p in pids_seen if _alive(p)),
        "leftover_shm": sorted(shm_after - shm_before),
        "rss_growth_mb": _growth(rss_first, rss_end),
        "rss_growth_second_half_mb": _growth(rss_mid, rss_end),
    }


def _growth(first: dict[str, float | None], end: dict[str, float | None]) -> dict[str, float]:
    """MB each service grew by, for those measured at both ends."""
    out = {}
    for name, start in first.items():
        stop = end.get(name)
        if start is not None and stop is not None:
            out[name] = round(stop - start, 1)
    return out


def _wait(url: str, ok: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            body = _status(url)
            if ok(body):
                return body
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run did not start within {timeout:.0f} s")
        time.sleep(0.5)


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| role | kills | restarted | restart p50 s | restart max s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for role, r in report["roles"].items():
        lines.append(
            f"| {role} | {r['kills']} | {r['restarted']} | {r['restart_p50_s']} "
            f"| {r['restart_max_s']} |"
        )
    kills = len(report["kills"])
    lost = report["lost_in_restart"]
    lines += [
        "",
        f"- kills: {kills}, survived (restarted): {report['kills_survived']}; samples lost "
        f"in restarts: {lost} ({lost / kills if kills else 0:.0f} per kill)",
        f"- mean return before the first kill: {report['return_before_first_kill']}, at the "
        f"end: {report['return_at_end']}; stop: {report['stop_reason']} (exit "
        f"{report['exit_code']})",
        f"- accounting balanced in every metrics row: {not report['unbalanced_rows']} "
        f"({report['metrics_rows']} rows; unbalanced at t = {report['unbalanced_rows'][:5]}); "
        f"summary: {report['summary_balanced']}",
        f"- leftover processes: {report['leftover_processes']}, leftover /dev/shm files: "
        f"{report['leftover_shm']}",
        f"- RSS growth of the services never killed (MB): {report['rss_growth_mb']} from "
        f"the first kill, {report['rss_growth_second_half_mb']} over the second half",
    ]
    return "\n".join(lines) + "\n"


def add_parser(bench: Any) -> None:
    """Add ``tianji bench chaos`` to the ``bench`` subparsers."""
    b = bench.add_parser(
        "chaos",
        help="kill -9 a random service every few seconds during a training run",
        description=(__doc__ or "").split("\n\n")[1],
    )
    b.add_argument("config", help="the run's TOML config (e.g. examples/cartpole_ppo.toml)")
    b.add_argument("--every", type=float, default=10.0, help="seconds between kills (10)")
    b.add_argument("--minutes", type=float, default=10.0, help="minutes of kills (10)")
    b.add_argument("--warmup", type=float, default=20.0, help="seconds before the first (20)")
    b.add_argument("--seed", type=int, default=0, help="which services are picked (0)")
    b.add_argument("--restarts", type=int, default=1000, help="restarts per service (1000)")
    b.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="where the services run: processes here, or Ray actors (a local Ray)",
    )
    b.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="passed to tianji train"
    )
    b.add_argument("--out", metavar="DIR", help="the run directory and chaos.json/chaos.md")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    b.set_defaults(func=_cmd)


def _cmd(args: Any) -> int:
    from tianji.runtime.errors import ConfigError

    if args.every <= 0 or args.minutes <= 0 or args.warmup < 0:
        raise ConfigError("--every/--minutes/--warmup", (args.every, args.minutes), "> 0")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tianji-chaos-"))
    report = run_chaos(
        args.config,
        every=args.every,
        minutes=args.minutes,
        warmup=args.warmup,
        seed=args.seed,
        restarts=args.restarts,
        sets=list(args.set),
        out=out,
        backend=args.backend,
    )
    table = markdown(report)
    (out / "chaos.json").write_text(json.dumps(report, indent=2))
    (out / "chaos.md").write_text(table)
    print(json.dumps(report) if args.json else table)
    failed = (
        report["unbalanced_rows"]
        or report["leftover_processes"]
        or report["kills_survived"] < len(report["kills"])
    )
    return 1 if failed else 0
