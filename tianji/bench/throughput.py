"""``tianji bench throughput``: steady-state env steps/s and frames/s, learning on.

One invocation measures, side by side on this machine, every cell of :func:`plan_cells`
for each env (``cartpole``: CartPole-v1; ``pong``: ALE/Pong-v5 with the Atari preset),
PPO with 2 env processes x 4 envs everywhere. Each row says which work it does
(``"work"``):

* ``tianji-defaults``: tianji's own configurations (its examples' PPO), local policies
  and the inference service (``[inference] count`` M = 1, 2; ``[actors] splits`` 1, 2),
  controller ``relaxed``; for Pong also ``sync``, and ``sampling``: the learner consumes
  without computing (:class:`tianji.bench.algos.SamplingPPO`, controller ``unbalanced``),
  so the cell measures the sampling path alone, against the bare ceiling. ``bare``, the
  ceiling: the same 8 envs in 2 processes of 4 (as tianji's 2 actors), each stepping its
  envs with the example network's forward pass on one torch thread
  (:mod:`tianji.bench.bare`): no learning, no runtime, no messages;
* ``peer-defaults``: Sample Factory 2.1.1 APPO with its own example's settings (2
  workers x 4 envs), run from a checkout by ``python benchmarks/peers.py throughput
  --peer-python PATH`` (its own environment: ``benchmarks/sf_runner.py`` says how to make
  it); ``tianji bench throughput`` runs no peer;
* ``equal``: a tianji cell and a Sample Factory run doing the same work
  (:mod:`tianji.bench.throughput_work`: the same network, batches, epochs, minibatches,
  rollout, normalizations, one learner thread, 2 env processes + 1 inference process + 1
  learner on both). The goals quote this pair's ratio.

Every cell is a fresh process. Rates are steady state, over ``--seconds`` after a
warm-up that starts when the first env steps arrive (tianji: from the run's metrics rows,
every 2 s). Two counts per row: ``env_steps_per_s``, what the actors stepped (tianji's
actors, the bare loop; Sample Factory reports none precise enough: null), and
``consumed_per_s``, the agent steps the learner trained on (tianji: the learners'
``samples_consumed``; Sample Factory: its learner's ``env_steps``; null for ``bare``).
Frames are a count x the frame skip (4 for the Atari preset), as Sample Factory counts
them: ``frames_per_s`` from the actors' count, ``consumed_frames_per_s`` from the
learner's. ``model_params`` is the trainable parameter count of the network each side
built, ``learner_threads`` the learner's torch threads, ``processes`` what computes (env,
inference, learner processes). Output: a markdown table with the ratios the goals name,
or ``--json``; ``--out DIR`` writes ``throughput.json`` and ``throughput.md``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tianji.bench.spawn import run_json_child
from tianji.bench.throughput_work import EQUAL, tianji_overrides
from tianji.bench.train import CONFIGS, machine

__all__ = [
    "ENVS",
    "WORKS",
    "Cell",
    "PeerCommand",
    "Steady",
    "plan_cells",
    "run_config",
    "steady_rate",
]

ENVS: dict[str, dict[str, Any]] = {
    "cartpole": {"id": "CartPole-v1"},
    # examples/pong_ppo.toml: deterministic, as Sample Factory's PongNoFrameskip-v4
    "pong": {"id": "ALE/Pong-v5", "preset": "atari", "preset_options": {"sticky_actions": 0.0}},
}
FRAME_SKIP = {"cartpole": 1, "pong": 4}
WORKERS, ENVS_PER_WORKER = 2, 4

ALGO: dict[str, dict[str, Any]] = {
    "cartpole": CONFIGS["ppo"]["algo"],  # examples/cartpole_ppo.toml
    "pong": {  # examples/pong_ppo.toml (Sample Factory's Atari schedule and normalizations)
        "fragments_per_batch": 2,
        "lr": 2.5e-4,
        "clip_coef": 0.1,
        "ent_coef": 0.01,
        "update_epochs": 4,
        "num_minibatches": 4,
        "normalize_obs": True,
        "normalize_returns": True,
        "clip_value_loss": False,
    },
}
FRAGMENT = {"cartpole": 64, "pong": 128}
LEARNER: dict[str, dict[str, Any]] = {"cartpole": {}, "pong": {"torch_threads": 2}}


WORKS = ("tianji-defaults", "peer-defaults", "equal")
"""A row's ``"work"``: tianji's own configurations (and the bare ceiling of them), Sample
Factory's own example settings, or an equal-work pair (see the module docstring)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Cell:
    """One measured configuration (a row of the report)."""

    system: str  # "tianji", "bare" or "sample-factory"
    env: str  # a key of ENVS
    inference: str = "local"  # "local" or "service"
    inference_count: int = 0
    splits: int = 1
    mode: str = "relaxed"
    work: str = "tianji-defaults"  # one of WORKS

    @property
    def label(self) -> str:
        if self.system == "sample-factory":
            return "sample-factory " + ("(equal work)" if self.work == "equal" else "(its example)")
        if self.system == "bare":
            return f"bare {WORKERS} x {ENVS_PER_WORKER} envs"
        where = "local" if self.inference == "local" else f"service M={self.inference_count}"
        equal = " (equal work)" if self.work == "equal" else ""
        return f"tianji {where} K={self.splits} {self.mode}{equal}"


def equal_cells(env: str) -> list[Cell]:
    """The equal-work pair of ``env``: tianji with as many inference processes as Sample
    Factory's policy workers, and Sample Factory."""
    m = EQUAL[env].inference_processes
    return [
        Cell("tianji", env, "service", m, 1, work="equal"),
        Cell("sample-factory", env, work="equal"),
    ]


def plan_cells(envs: list[str], *, peer: bool, quick: bool, brief: bool = False) -> list[Cell]:
    """The cells of one run, per env in order (see the module docstring); ``brief``: of
    tianji's own cells only the local one (the rows the README quotes)."""
    cells: list[Cell] = []
    for env in envs:
        cells.append(Cell("tianji", env))
        variants = [(1, 1), (2, 2)] if quick else [(1, 1), (1, 2), (2, 1), (2, 2)]
        if not brief:
            cells += [Cell("tianji", env, "service", m, k) for m, k in variants]
        if env == "pong" and not quick and not brief:
            cells += [
                Cell("tianji", env, mode="sync"),
                Cell("tianji", env, "service", 1, 2, "sync"),
            ]
            cells += [Cell("tianji", env, mode="sampling")]
            cells += [Cell("tianji", env, "service", m, k, "sampling") for m, k in ((1, 2), (2, 2))]
        cells.append(Cell("bare", env))
        if peer:
            cells += equal_cells(env)
            cells.append(Cell("sample-factory", env, work="peer-defaults"))
    return cells


def run_config(
    cell: Cell, seconds: float, overrides: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The tianji run config (as data) of a cell, stopping after ``seconds``, with
    ``overrides`` (section -> settings) applied last."""
    actors: dict[str, Any] = {
        "count": WORKERS,
        "envs_per_actor": ENVS_PER_WORKER,
        "fragment_length": FRAGMENT[cell.env],
        "inference": cell.inference,
        "splits": cell.splits,
    }
    sampling = cell.mode == "sampling"
    data: dict[str, Any] = {
        "algorithm": "tianji.bench.algos:SamplingPPO" if sampling else "ppo",
        "transport": "tcp",
        "run_dir": "",
        "env": dict(ENVS[cell.env]),
        "actors": actors,
        "learner": {"max_policy_lag": 2, "prefetch": 1, **LEARNER[cell.env]},
        "controller": {"mode": "unbalanced" if sampling else cell.mode, "lag_target": 1},
        "algo": dict(ALGO[cell.env]),
        "stop": {"max_seconds": seconds},
    }
    if cell.inference == "service":
        data["inference"] = {"count": cell.inference_count}
    if cell.mode == "sync":  # the learner's batch: one fragment per actor
        data["algo"]["fragments_per_batch"] = WORKERS
    if cell.work == "equal":
        for section, settings in tianji_overrides(EQUAL[cell.env], ENVS_PER_WORKER).items():
            data.setdefault(section, {}).update(settings)
    for section, settings in (overrides or {}).items():
        data.setdefault(section, {}).update(settings)
    return data


@dataclasses.dataclass(frozen=True, slots=True)
class Steady:
    """The steady-state window of a tianji run (see :func:`steady_rate`)."""

    env_steps_per_s: float
    """What the actors stepped (the metrics rows' ``env_steps``)."""
    consumed_per_s: float
    """What the learners trained on (the metrics rows' ``samples_consumed``: the sum of
    every learner's ``LearnerStat.SAMPLES_CONSUMED`` heartbeat counter)."""
    seconds: float
    last: dict[str, Any]


def steady_rate(rows: list[dict[str, Any]], warmup: float) -> Steady:
    """Both rates over the metrics rows from ``warmup`` seconds after the first row with
    env steps to the last row (with services watched).

    Raises:
        ValueError: if fewer than two rows fall in that window.
    """
    started = next((r["t"] for r in rows if r["env_steps"] > 0), None)
    if started is None:
        raise ValueError("no env steps were reported")
    window = [r for r in rows if r["t"] >= started + warmup and r.get("services")]
    if len(window) < 2:
        raise ValueError(f"{len(window)} metrics rows after the warm-up: run longer")
    first, last = window[0], window[-1]
    seconds = last["t"] - first["t"]
    return Steady(
        env_steps_per_s=(last["env_steps"] - first["env_steps"]) / seconds,
        consumed_per_s=(last["samples_consumed"] - first["samples_consumed"]) / seconds,
        seconds=seconds,
        last=last,
    )


class CpuSampler:
    """This process's CPU seconds (every thread: the controller, the monitor, the
    launcher) sampled against the wall clock, so a window of the run can be cut out."""

    def __init__(self, every: float = 0.5) -> None:
        import threading

        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import resource

        while not self._stop.is_set():
            r = resource.getrusage(resource.RUSAGE_SELF)
            self.samples.append((time.time(), r.ru_utime + r.ru_stime))
            self._stop.wait(self._every)

    def share(self, start: float, end: float) -> float | None:
        """CPU seconds per wall second between the samples nearest ``start`` and ``end``
        (unix times), or ``None`` without two samples in between."""
        self._stop.set()
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return None
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / (t1 - t0)


def model_params(config: Any) -> int:
    """Trainable parameters of the network the run's algorithm builds for its env (running
    statistics are buffers, not parameters, as in Sample Factory's count)."""
    from tianji.services.common import make_algorithm

    net = make_algorithm(config, seed=config.seed, device="cpu").net
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


def processes(config: Any) -> dict[str, int]:
    """The processes that compute: env processes (the actors), inference services (0:
    the actors run their own forward passes), learners."""
    service = config.actors.inference == "service"
    return {
        "env": config.actors.count,
        "inference": config.inference.count if service else 0,
        "learner": config.learner.count,
    }


def _tianji_worker() -> int:
    """Run one tianji cell from ``{"config", "warmup"}`` on stdin; print its JSON row."""
    import io

    from tianji.rl.config import RunConfig, build_dataclass
    from tianji.run.train import train

    job = json.loads(sys.stdin.read())
    config: RunConfig = build_dataclass(RunConfig, job["config"], "")
    cpu = CpuSampler()
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        summary = train(config, out=io.StringIO(), metrics_path=str(metrics))
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steady = steady_rate(rows, job["warmup"])
    last = steady.last
    share = cpu.share(last["unix"] - steady.seconds, last["unix"])
    services = summary.get("services") or {}
    inference = [s.get("counters", {}) for n, s in services.items() if n.startswith("inference")]
    rss: dict[str, float] = {}
    for s in services.values():
        if s.get("max_rss_mb") is not None:
            rss[s["role"]] = max(rss.get(s["role"], 0.0), float(s["max_rss_mb"]))
    print(
        json.dumps(
            {
                "env_steps_per_s": steady.env_steps_per_s,
                "consumed_per_s": steady.consumed_per_s,
                "seconds": steady.seconds,
                "model_params": model_params(config),  # after the run: not in its window
                "learner_threads": config.learner.torch_threads,
                "processes": processes(config),
                "controller_cpu_share": None if share is None else round(share, 4),
                "max_rss_mb_by_role": rss,
                "policy_lag_mean": (last.get("lag") or {}).get("mean"),
                "learner_updates": last.get("learner_updates"),
                "requests_per_pass": [
                    round(c.get("requests", 0) / max(1, c.get("forward_passes", 0)), 2)
                    for c in inference
                ],
                "stop_reason": summary.get("stop_reason"),
            }
        )
    )
    return 0


def _run_process(cmd: list[str], stdin: str | None, timeout: float) -> dict[str, Any]:
    run = run_json_child(cmd, stdin, timeout)
    return run.result if run.result is not None else {"error": run.error}


PeerCommand = Callable[["Cell", float, float, str], list[str]]
"""The command line of the peer's process for a Sample Factory cell, from (cell, seconds,
warmup, train directory); ``benchmarks/peers.py`` gives it (the runner is not in tianji)."""


def measure(
    cell: Cell,
    seconds: float,
    warmup: float,
    peer: PeerCommand | None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run one cell in a fresh process; its report row (``overrides``: see
    :func:`run_config`; ``peer`` runs the Sample Factory cells)."""
    budget = seconds + warmup
    if cell.system == "tianji":
        job = {"config": run_config(cell, budget + 15.0, overrides), "warmup": warmup}
        cmd = [sys.executable, "-m", "tianji.bench.throughput", "--worker"]
        out = _run_process(cmd, json.dumps(job), budget + 180)
    elif cell.system == "bare":
        cmd = [sys.executable, "-m", "tianji.bench.bare", "--env", cell.env]
        cmd += ["--processes", str(WORKERS), "--envs", str(ENVS_PER_WORKER)]
        cmd += ["--seconds", str(seconds), "--warmup", str(min(warmup, 5.0))]
        out = _run_process(cmd, None, budget + 120)
    else:
        assert peer is not None
        with tempfile.TemporaryDirectory() as tmp:
            out = _run_process(peer(cell, seconds, warmup, tmp), None, budget + 300)
        if "consumed_per_s" in out:  # its learner's count; the rollout side's is too coarse
            out["env_steps_per_s"] = None
            out["peer_env_steps"] = out.pop("env_steps")
            out["peer_frames"] = out.pop("frames")
            out.pop("frames_per_s", None)
    if "env" in out:  # the peer's own id for the env (e.g. PongNoFrameskip-v4)
        out["peer_env"] = out.pop("env")
    if "policy_lag" in out:  # Sample Factory's mean lag, in its own units
        out["policy_lag_mean"] = out.pop("policy_lag")
    row: dict[str, Any] = {
        "system": cell.system,
        "env": ENVS[cell.env]["id"],
        "inference": cell.inference if cell.system == "tianji" else None,
        "inference_count": cell.inference_count if cell.inference == "service" else 0,
        "splits": cell.splits,
        "mode": cell.mode if cell.system == "tianji" else None,
        "work": cell.work,
        "label": cell.label,
        **out,
    }
    for rate, frames in (
        ("env_steps_per_s", "frames_per_s"),
        ("consumed_per_s", "consumed_frames_per_s"),
    ):
        value = row.setdefault(rate, None)
        row[frames] = None if value is None else value * FRAME_SKIP[cell.env]
    return row


def run_bench(
    envs: list[str],
    seconds: float,
    warmup: float,
    peer: PeerCommand | None,
    quick: bool,
    works: list[str] | None = None,
    brief: bool = False,
) -> dict[str, Any]:
    """Measure every cell (only those of ``works``, default all; progress on stderr); the
    report as JSON data (its goals are added by
    :func:`tianji.bench.throughput_report.goals`; ``peer``: see :func:`measure`)."""
    cells = plan_cells(envs, peer=peer is not None, quick=quick, brief=brief)
    cells = [c for c in cells if works is None or c.work in works]
    rows = []
    for i, cell in enumerate(cells, 1):
        started = time.monotonic()
        print(f"[{i}/{len(cells)}] {cell.env}: {cell.label} ...", file=sys.stderr, flush=True)
        row = measure(cell, seconds, warmup, peer)
        took = time.monotonic() - started
        shown = (
            f"error: {row['error']}"
            if "error" in row
            else ", ".join(
                f"{row[key]:,.0f} {name}/s"
                for key, name in (("env_steps_per_s", "env steps"), ("consumed_per_s", "consumed"))
                if row.get(key) is not None
            )
        )
        print(f"    {shown} ({took:.0f} s)", file=sys.stderr, flush=True)
        rows.append(row)
    return {
        "benchmark": "throughput",
        "seconds": seconds,
        "warmup": warmup,
        "machine": machine(),
        "rows": rows,
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(_tianji_worker())
    sys.exit(f"usage: python -m {__spec__.name if __spec__ else __name__} --worker")
