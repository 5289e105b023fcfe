"""``tianji bench allreduce``: one gradient all-reduce step of K data-parallel learners, two
ways side by side in one run: tianji's all-to-all over its own TCP transport
(:mod:`tianji.services.allreduce`) and PyTorch's collective (gloo,
:mod:`tianji.services.collective`); the learners take the faster one for their gradient's
size (``learner.allreduce = "auto"``, :mod:`tianji.services.learner_sync`).

For each K (``--learners 2 4``) it starts K learner processes per way on this host, each
holding a float32 gradient of ``--params`` values (10 M: a 10 M-parameter network), and
times ``--steps`` steps after ``--warmup`` (each learner's wall time per step, from its
vector in memory to the mean in memory; the median over steps, the slowest learner). It
checks that every learner ends each way with the same bytes (a digest of its last mean)
and prints a table and a JSON report: per K, the milliseconds per step of each way and
their ratio (the goal of issue 36: the collective at most 0.5x the all-to-all at K = 4).
Run it alone on the machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["add_parser", "measure", "run_way"]


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()[:16]


def _vector(rank: int, params: int) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(params).astype(np.float32)


def _collective_worker(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from tianji.services.collective import CollectiveGroup, Rendezvous, host_rendezvous

    rank, world = int(job["rank"]), int(job["world"])
    device = str(job.get("device", "cpu"))
    torch.set_num_threads(1)
    if device == "cuda":  # one GPU per learner
        torch.cuda.set_device(rank)
    store = None
    if rank == 0:
        store, _ = host_rendezvous("127.0.0.1", world, port=int(job["port"]))
    group = CollectiveGroup(
        rank, world, Rendezvous("127.0.0.1", int(job["port"])), store=store, timeout_s=120,
        backend=str(job.get("backend", "gloo")),
    )  # fmt: skip
    source = torch.from_numpy(_vector(rank, int(job["params"]))).to(device)
    times = []
    grad = source.clone()
    for step in range(int(job["warmup"]) + int(job["steps"])):
        grad.copy_(source)
        started = time.perf_counter()
        group.all_reduce_mean([grad])
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= int(job["warmup"]):
            times.append(time.perf_counter() - started)
    digest = _digest(grad.cpu().numpy())
    group.close()  # as a learner leaves its group when it stops
    return {"times": times, "digest": digest}


async def _alltoall_worker(job: dict[str, Any]) -> dict[str, Any]:
    from tianji.rl.topics import gradients_topic, learner_name
    from tianji.runtime.controller import Controller
    from tianji.runtime.service import Service
    from tianji.services.allreduce import AllReduce

    rank, world = int(job["rank"]), int(job["world"])
    controller = None
    address = f"tcp://127.0.0.1:{job['port']}"
    if rank == 0:  # learner-0's process hosts the controller the learners find each other by
        controller = Controller(bind=address)
        ctl_task = asyncio.create_task(controller.run())
        await controller.wait_ready()
    name = learner_name(rank)
    service = Service(name, bind="tcp://127.0.0.1:0", controller=address,
                      publishes=[gradients_topic(name)])  # fmt: skip
    ar = AllReduce(
        name, index=rank, count=world,
        publish=lambda ev: service.publish(ev, gradients_topic(name)), timeout=120.0,
    )  # fmt: skip
    for peer in ar.peers.values():
        service.subscribe(gradients_topic(peer), ar.received)
    task = asyncio.create_task(service.run())
    await service.wait_ready()
    await service.wait_subscribers(gradients_topic(name), world - 1)
    source = _vector(rank, int(job["params"]))
    times, mean = [], source
    for step in range(int(job["warmup"]) + int(job["steps"])):
        flat = source.copy()
        started = time.perf_counter()
        mean = await ar.reduce(flat)
        if step >= int(job["warmup"]):
            times.append(time.perf_counter() - started)
    await asyncio.sleep(1.0)  # let the peers take our last vector
    service.stop("done")
    await task
    if controller is not None:
        controller.stop("done")
        await ctl_task
    return {"times": times, "digest": _digest(mean)}


def _worker() -> int:
    job = json.loads(sys.stdin.readline())
    if job["way"] == "collective":
        result = _collective_worker(job)
    else:
        from tianji.runtime.loop import run

        result = run(_alltoall_worker(job))
    print(json.dumps(result), flush=True)
    return 0


def run_way(
    way: str,
    world: int,
    params: int,
    steps: int,
    warmup: int,
    *,
    device: str = "cpu",
    backend: str = "gloo",
) -> dict[str, Any]:
    """One way (``"alltoall"`` or ``"collective"``) with ``world`` learner processes: the
    slowest learner's milliseconds per step and whether they all ended with the same
    bytes. ``device``/``backend`` are the collective's (``"cuda"``/``"nccl"``: one GPU per
    learner, ``benchmarks/gpu_check.py``).

    Raises:
        RuntimeError: naming the learner process that failed.
    """
    from tianji.bench.spawn import kill_leftovers
    from tianji.runtime.plugins import free_tcp_port

    port = free_tcp_port()  # the learners' meeting point
    procs = []
    for rank in range(world):
        job = {"way": way, "rank": rank, "world": world, "port": port, "params": params,
               "steps": steps, "warmup": warmup, "device": device, "backend": backend}  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "tianji.bench.allreduce", "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()
        procs.append(proc)
    results = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"{way} learner-{rank} of {world} failed: {err[-2000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        kill_leftovers(procs)
    per_step = [max(r["times"][i] for r in results) for i in range(steps)]  # the slowest
    return {
        "ms_per_step_median": round(1000 * statistics.median(per_step), 2),
        "ms_per_step_p90": round(1000 * sorted(per_step)[int(0.9 * (steps - 1))], 2),
        "identical": len({r["digest"] for r in results}) == 1,
    }


def measure(
    learners: list[int], params: int, steps: int, warmup: int, out: Any = sys.stderr
) -> dict[str, Any]:
    """Both ways for each K, one after the other; the report (see the module docstring)."""
    rows = []
    for world in learners:
        row: dict[str, Any] = {"learners": world, "params": params}
        for way in ("alltoall", "collective"):
            print(f"K={world}: {way} ...", file=out, flush=True)
            row[way] = run_way(way, world, params, steps, warmup)
        row["ratio"] = round(
            row["collective"]["ms_per_step_median"] / row["alltoall"]["ms_per_step_median"], 3
        )
        rows.append(row)
    return {"benchmark": "allreduce", "steps": steps, "warmup": warmup, "rows": rows}


def markdown(report: dict[str, Any]) -> str:
    """The report as a table."""
    lines = [
        "| learners | params | all-to-all ms/step | collective (gloo) ms/step | ratio "
        "| same bytes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        a, c = r["alltoall"], r["collective"]
        same = a["identical"] and c["identical"]
        lines.append(
            f"| {r['learners']} | {r['params']} | {a['ms_per_step_median']} | "
            f"{c['ms_per_step_median']} | {r['ratio']} | {same} |"
        )
    return "\n".join(lines) + "\n"


def add_parser(bench: Any) -> None:
    """Add ``tianji bench allreduce`` to the bench subparsers."""
    b = bench.add_parser(
        "allreduce",
        help="a gradient all-reduce step of K learners: tianji's all-to-all vs gloo",
        description=__doc__,
    )
    b.add_argument("--learners", type=int, nargs="+", default=[2, 4], metavar="K")
    b.add_argument("--params", type=int, default=10_000_000)
    b.add_argument("--steps", type=int, default=30)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--out", metavar="DIR", help="also write allreduce.json and allreduce.md here")
    b.set_defaults(func=_cmd)


def _cmd(args: Any) -> int:
    report = measure(args.learners, args.params, args.steps, args.warmup)
    text = markdown(report)
    print(text)
    print(json.dumps(report))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "allreduce.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / "allreduce.md").write_text(text)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(_worker())
