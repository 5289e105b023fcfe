"""``tianji bench chaos``: kill -9 a random service every few seconds during a training run.

A ``tianji train CONFIG`` run (``--backend local`` or ``ray``, with its dashboard; or with
``--backend hosts``, from a checkout with ``python benchmarks/hosts.py chaos``, a run
deployed by hand on two network-namespace hosts, every service under ``tianji serve
--restart``: ``benchmarks/chaos_hosts.py``) trains for
``--minutes`` minutes; after ``--warmup`` seconds, every ``--every`` seconds one running
service of a restartable role (actors, inference services, buffers, evaluation workers, the
parameter service, and the learner when ``[recovery] learner = "resume"``; never the
controller or the monitor) chosen at random (``--seed``) gets SIGKILL. Every service keeps
the run's own restart limit (``[recovery] restarts`` within ``period_s``), so the chaos
checks it too, unless ``--restarts N`` sets N for every role. With hosts, ``--cut-every S``
also takes the actors' host off the network for ``--cut-seconds`` every S seconds. At the
end the run is stopped cleanly (SIGTERM) and the report says:

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

import functools
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tianji.bench.chaos_loop import KillLoop
from tianji.bench.chaos_run import ChaosRun, StartHosts, start_logged
from tianji.rl.stats import Dropped

__all__ = ["final_books", "killable_roles", "run_chaos", "summarize_kills"]

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")


def killable_roles(learner_resumes: bool) -> tuple[str, ...]:
    """The roles chaos may kill: every restartable one, the learner only when it resumes."""
    roles = ("actor", "inference", "buffer", "eval", "params")
    return (*roles, "learner") if learner_resumes else roles


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        status = Path(f"/proc/{pid}/status").read_text()
    except PermissionError as exc:  # another user's process under that pid: alive
        log.debug("pid %d: %r", pid, exc)
        return True
    except OSError as exc:  # no such process (or it went between the two calls)
        log.debug("pid %d: %r", pid, exc)
        return False
    return "State:\tZ" not in status  # a zombie is dead for our purpose


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


def _start_train(config: str, sets: list[str], out: Path, backend: str, seconds: float) -> ChaosRun:
    summary_path = out / "summary.json"
    cmd = [sys.executable, "-m", "tianji", "train", config, "--dashboard", "127.0.0.1:0"]
    cmd += ["--run-dir", str(out), "--summary", str(summary_path)]
    cmd += ["--target-return", "1e9", "--max-seconds", str(seconds), "--backend", backend]
    for s in sets:
        cmd += ["--set", s]
    proc, url, pump, log = start_logged(cmd, out / "train.log")
    return ChaosRun(proc, url, summary_path, pump, log)


def run_chaos(
    config: str,
    *,
    every: float,
    minutes: float,
    warmup: float,
    seed: int,
    restarts: int | None,
    sets: list[str],
    out: Path,
    backend: str = "local",
    cut_every: float = 0.0,
    cut_seconds: float = 5.0,
    start_hosts: StartHosts | None = None,
) -> dict[str, Any]:
    """Run the chaos (see the module docstring) and return its report (``backend`` hosts:
    the run is started by ``start_hosts``, ``benchmarks/chaos_hosts.py``'s)."""
    from tianji.run.config import load_config

    learner_resumes = load_config(config, sets).recovery.learner == "resume"  # checks it too
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    shm_before = _shm_files()
    roles = killable_roles(learner_resumes)
    budget = [] if restarts is None else [f"recovery.restarts.{r}={restarts}" for r in roles]
    seconds = warmup + minutes * 60 + 120
    if backend != "hosts":
        run = _start_train(config, [*budget, *sets], out, backend, seconds)
    elif start_hosts is not None:
        run = start_hosts(config, [*budget, *sets], out, seconds, restarts, learner_resumes)
    else:
        raise ValueError("backend hosts needs start_hosts (benchmarks/hosts.py chaos)")
    try:
        cut = cut_every if run.cut is not None else 0.0
        found = KillLoop(run, rng, roles, every, cut, cut_seconds).watch(minutes, warmup)
    finally:
        code = _stop(run)
    found["leftover_processes"] = sorted(p for p in found.pop("pids_seen") if _alive(p))
    run.cleanup()
    time.sleep(2)
    summary = json.loads(run.summary_path.read_text()) if run.summary_path.exists() else {}
    found["leftover_shm"] = sorted(_shm_files() - shm_before)
    settings = {"config": config, "backend": backend, "every_s": every, "minutes": minutes}
    return _report({**settings, "seed": seed, "exit_code": code}, summary, found, out)


def _report(
    settings: dict[str, Any], summary: dict[str, Any], found: dict[str, Any], out: Path
) -> dict[str, Any]:
    """The chaos report: the run's ``settings``, what the kill loop ``found`` (and the
    leftovers), the run's ``summary`` and metrics rows (under ``out``)."""
    kills = found["kills"]
    return {
        **settings,
        "stop_reason": summary.get("stop_reason"),
        "kills": kills,
        "roles": summarize_kills(kills),
        "kills_survived": sum(k["restart_s"] is not None for k in kills),
        "cuts": found["cuts"],
        "restarts": summary.get("restarts"),
        "lost_in_restart": (summary.get("samples_dropped") or {}).get("lost_in_restart", 0),
        "return_before_first_kill": found["return_before"],
        "return_at_end": found["return_end"],
        **_rows_balanced(out),
        "summary_balanced": (summary.get("accounting") or {}).get("balanced"),
        **final_books(summary),
        "leftover_processes": found["leftover_processes"],
        "leftover_shm": found["leftover_shm"],
        "rss_growth_mb": _growth(found["rss_first"], found["rss_end"]),
        "rss_growth_second_half_mb": _growth(found["rss_mid"], found["rss_end"]),
        "rss_per_minute_mb": found["rss_series"],
    }


def _shm_files() -> set[str]:
    return set(os.listdir(SHM_DIR)) if SHM_DIR.is_dir() else set()


def _rows_balanced(out: Path) -> dict[str, Any]:
    """How many metrics rows the run wrote, and the times of those whose accounting did not
    balance."""
    rows_file = next(out.glob("*/metrics.jsonl"), None)
    metric_rows = (
        [json.loads(x) for x in rows_file.read_text().splitlines() if x.strip()]
        if rows_file
        else []
    )
    unbalanced = [
        r["t"] for r in metric_rows if r.get("accounting") and not r["accounting"]["balanced"]
    ]
    return {"metrics_rows": len(metric_rows), "unbalanced_rows": unbalanced}


def final_books(summary: dict[str, Any]) -> dict[str, Any]:
    """What the run's final books say: ``in_flight`` after its drain (and the drain's
    report), the restart losses split into what dead services held at their last report
    and what the survivors' stream numbers show was sent to or by them after it, and every
    dead incarnation's loss by name."""
    books = summary.get("accounting") or {}
    by_name: dict[str, int] = {}
    for name, service in (summary.get("services") or {}).items():
        held = service.get("counters", {}).get(Dropped.LOST_IN_RESTART, 0)
        if held:
            by_name[name] = by_name.get(name, 0) + held
    for hop in (books.get("hops") or {}).values():
        for name, n in (hop.get("lost_in_restart_by") or {}).items():
            by_name[name] = by_name.get(name, 0) + n
    return {
        "final_in_flight": books.get("in_flight"),
        "drain": books.get("drain"),
        "lost_in_restart_split": books.get("lost_in_restart"),
        "lost_in_restart_by_incarnation": dict(sorted(by_name.items())),
        "books_errors": books.get("errors"),
    }


def _stop(run: ChaosRun) -> int | None:
    """Stop the run cleanly (SIGTERM to its main process); its exit code."""
    if run.proc.poll() is None:
        run.proc.send_signal(signal.SIGTERM)
    try:
        code = run.proc.wait(timeout=120)
    except subprocess.TimeoutExpired as exc:
        log.warning("the run did not stop: %s; killing it", exc)
        run.proc.kill()
        code = run.proc.wait()
    for sup in run.supervisors:  # they end when the controller tells their services to stop
        try:
            sup.wait(timeout=60)
        except subprocess.TimeoutExpired as exc:
            log.warning("a supervisor did not stop: %s; killing it", exc)
            sup.kill()
    run.pump.wait(timeout=30)
    run.log.close()
    return code


def _growth(first: dict[str, float | None], end: dict[str, float | None]) -> dict[str, float]:
    """MB each service grew by, for those measured at both ends."""
    out = {}
    for name, start in first.items():
        stop = end.get(name)
        if start is not None and stop is not None:
            out[name] = round(stop - start, 1)
    return out


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
        f"summary: {report['summary_balanced']}; final in flight: "
        f"{report.get('final_in_flight')} (drain: {report.get('drain')}); lost in restarts "
        f"{report.get('lost_in_restart_split')}, by incarnation: "
        f"{report.get('lost_in_restart_by_incarnation')}",
        f"- leftover processes: {report['leftover_processes']}, leftover /dev/shm files: "
        f"{report['leftover_shm']}",
        f"- backend: {report['backend']}; cuts of the actors' host's link: "
        f"{len(report['cuts'])} ({', '.join(str(c['seconds']) + ' s' for c in report['cuts'])})",
        f"- RSS growth of the services never killed (MB): {report['rss_growth_mb']} from "
        f"the first kill, {report['rss_growth_second_half_mb']} over the second half",
    ]
    for name, series in report.get("rss_per_minute_mb", {}).items():
        shown = series if len(series) <= 12 else series[:: max(1, len(series) // 12)] + series[-1:]
        lines.append(
            f"- RSS of {name} (MB) by minute: " + ", ".join(f"{m:g}: {mb:g}" for m, mb in shown)
        )
    return "\n".join(lines) + "\n"


def add_parser(bench: Any, start_hosts: StartHosts | None = None) -> None:
    """Add ``tianji bench chaos`` to the ``bench`` subparsers (with ``start_hosts``, also
    ``--backend hosts`` and its cuts: ``benchmarks/hosts.py``)."""
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
    b.add_argument(
        "--restarts",
        type=int,
        help="restarts per service within [recovery] period_s (default: the run's own "
        "[recovery] restarts, so the chaos tests the run's limits; e.g. 1000: no limit)",
    )
    hosts = start_hosts is not None
    b.add_argument(
        "--backend",
        choices=["local", "ray", "hosts"] if hosts else ["local", "ray"],
        default="local",
        help="where the services run: processes here, Ray actors (a local Ray)"
        + (", or two network-namespace hosts with tianji serve --restart" if hosts else ""),
    )
    if hosts:
        b.add_argument(
            "--cut-every",
            type=float,
            default=0.0,
            metavar="S",
            help="with --backend hosts: take the actors' host off the network every S seconds",
        )
        b.add_argument("--cut-seconds", type=float, default=5.0, help="how long each cut lasts (5)")
    b.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="passed to tianji train"
    )
    b.add_argument("--out", metavar="DIR", help="the run directory and chaos.json/chaos.md")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    b.set_defaults(func=functools.partial(_cmd, start_hosts=start_hosts))


def _cmd(args: Any, start_hosts: StartHosts | None = None) -> int:
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
        cut_every=getattr(args, "cut_every", 0.0),  # only with hosts
        cut_seconds=getattr(args, "cut_seconds", 5.0),
        start_hosts=start_hosts,
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
