"""Data-parallel learners' gradients averaged by torch.distributed (gloo): K = 2 and 3
learner processes end with bit-identical weights (K = 2 after 1,000 Adam steps, K = 3
after 200), the average is the mean of their gradients, and a learner that dies fails
its peers' step, after which a group of the next generation forms with its
replacement."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tianji.bench.spawn import kill_leftovers
from tianji.services.collective import CollectiveGroup, Rendezvous, buckets, host_rendezvous
from tianji.testing import free_tcp_port

ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent(
    """
    import hashlib, json, os, sys
    import torch
    from tianji.runtime.errors import SyncFailed
    from tianji.services.collective import CollectiveGroup, Rendezvous, host_rendezvous

    rank, world, port, steps, die_at, generation = map(int, sys.argv[1:7])
    torch.manual_seed(0)  # the same initial weights on every learner
    net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    where = Rendezvous("127.0.0.1", port, generation)
    store = None
    if rank == 0:
        store, _ = host_rendezvous("127.0.0.1", world, port=port)
    group = CollectiveGroup(rank, world, where, store=store, timeout_s=20, bucket_bytes=1024)
    data = torch.Generator().manual_seed(100 + rank)  # each learner its own batches
    first = None
    try:
        for step in range(steps):
            if step == die_at:
                sys.exit(3)
            x = torch.randn(32, 8, generator=data)
            loss = net(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            grads = [p.grad for p in net.parameters()]
            local = [g.clone() for g in grads]
            group.all_reduce_mean(grads)
            if first is None:
                first = {"local": [g.tolist() for g in local], "mean": [g.tolist() for g in grads]}
            opt.step()
    except SyncFailed as exc:
        print(json.dumps({"failed": str(exc), "step": exc.step}), flush=True)
        os._exit(0)
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().numpy().tobytes())
    print(json.dumps({"digest": h.hexdigest(), "first": first}), flush=True)
    group.close()  # as a learner service leaves its group when it stops
    # (the result is out: the interpreter's teardown of torch's threads is not under test)
    os._exit(0)
    """
)


def _start(
    rank: int, world: int, port: int, steps: int, die_at: int = -1, gen: int = 0
) -> subprocess.Popen[str]:
    args = [str(a) for a in (rank, world, port, steps, die_at, gen)]
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _results(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr[-3000:]
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        kill_leftovers(procs)
    return out


def test_buckets_group_consecutive_tensors_within_the_byte_limit() -> None:
    assert buckets([10, 10, 10], 4, 80) == [range(0, 2), range(2, 3)]
    assert buckets([100, 5, 5], 4, 80) == [range(0, 1), range(1, 3)]  # too large: alone
    assert buckets([], 4, 80) == []
    assert buckets([1] * 5, 4, 1 << 20) == [range(0, 5)]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_learners_end_with_bit_identical_weights_and_average_their_gradients(world: int) -> None:
    port = free_tcp_port()
    steps = 1000 if world == 2 else 200  # (three processes on two cores take their time)
    results = _results([_start(rank, world, port, steps=steps) for rank in range(world)])
    assert len({r["digest"] for r in results}) == 1  # bit-identical after every Adam step
    locals_ = [r["first"]["local"] for r in results]
    for k, mean in enumerate(results[0]["first"]["mean"]):
        want = sum(torch.tensor(local[k]) for local in locals_) / world
        torch.testing.assert_close(torch.tensor(mean), want, rtol=1e-5, atol=1e-7)
        for r in results[1:]:
            assert r["first"]["mean"][k] == mean  # the same bytes on every learner


@pytest.mark.slow
def test_a_dead_learner_fails_the_step_and_the_next_generation_forms() -> None:
    port = free_tcp_port()
    survivor, dying = _start(0, 2, port, steps=50), _start(1, 2, port, steps=50, die_at=10)
    first = _results([survivor])
    assert dying.wait(timeout=60) == 3
    dying.communicate()
    assert "failed" in first[0] and first[0]["step"] == 10, first
    assert "learner-0 at all-reduce step 10" in first[0]["failed"]
    port = free_tcp_port()  # the run rebuilds the group: generation 1, a new learner-1
    again = _results([_start(rank, 2, port, steps=20, gen=1) for rank in range(2)])
    assert again[0]["digest"] == again[1]["digest"]


def test_bad_group_settings_are_refused_naming_them() -> None:
    from tianji.runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="learner index"):
        CollectiveGroup(2, 2, Rendezvous("127.0.0.1", 1))
    with pytest.raises(ConfigError, match="collective backend"):
        CollectiveGroup(0, 1, Rendezvous("127.0.0.1", 1), backend="mpi")
    store, where = host_rendezvous("127.0.0.1", 1)
    with pytest.raises(ConfigError, match=f"127.0.0.1:{where.port}"):
        host_rendezvous("127.0.0.1", 1, port=where.port)  # taken
    del store


@pytest.mark.slow
def test_the_allreduce_bench_runs_both_ways_and_every_learner_ends_with_the_same_bytes() -> None:
    from tianji.bench.allreduce import markdown, measure

    report = measure([2], params=10_000, steps=3, warmup=1)
    (row,) = report["rows"]
    assert row["alltoall"]["identical"] and row["collective"]["identical"], row
    assert row["alltoall"]["ms_per_step_median"] > 0 and row["ratio"] > 0
    assert "| 2 | 10000 |" in markdown(report)


def test_a_rendezvous_nobody_listens_on_fails_within_the_timeout_naming_the_address() -> None:
    from tianji.runtime.errors import SyncFailed

    port = free_tcp_port()  # free: nothing listens there
    started = time.monotonic()
    with pytest.raises(SyncFailed, match=f"127.0.0.1:{port}") as info:
        CollectiveGroup(1, 2, Rendezvous("127.0.0.1", port), timeout_s=2.0)
    assert info.value.learner == "learner-1" and "cannot join" in info.value.reason
    assert time.monotonic() - started < 15
