"""Dead services: restarts within a limit per period, a dead learner's stop or resume, and
the accounting across incarnations."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tianji.launch.restarts import RestartPolicy, restart_delay
from tianji.launch.spec import ServiceSpec
from tianji.rl.balance import BalanceConfig
from tianji.rl.config import RunConfig
from tianji.rl.config_ops import RecoveryConfig
from tianji.run.config import load_config
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError
from tianji.runtime.events import Heartbeat, RegisterService
from tianji.services.balancer import Balancer, accounting

ROOT = Path(__file__).resolve().parents[1]
PPO = ROOT / "examples" / "cartpole_ppo.toml"
DQN = ROOT / "examples" / "cartpole_dqn.toml"


def _hb(name: str, role: str, counters: dict[str, int], **gauges: float) -> Heartbeat:
    return Heartbeat(
        name=name,
        role=role,
        state="running",
        counters=counters,
        gauges=gauges,
        queue_depths={},
        sent_at=time.time(),
    )


# ----------------------------------------------------------------------------- units
def test_recovery_settings_are_checked_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"recovery\.restarts\.monitor"):
        RecoveryConfig(restarts={"monitor": 1})
    RecoveryConfig(restarts={"learner": 50})  # used with learner = "resume"
    with pytest.raises(ConfigError, match=r"recovery\.restarts\.actor"):
        RecoveryConfig(restarts={"actor": -1})
    with pytest.raises(ConfigError, match=r"recovery\.learner"):
        RecoveryConfig(learner="retry")
    with pytest.raises(ConfigError, match=r"recovery\.buffer"):
        load_config(PPO, ['recovery.buffer="snapshot"'])  # no replay snapshots
    with pytest.raises(ConfigError, match=r"recovery\.learner"):
        load_config(PPO, ['recovery.learner="resume"', "checkpoint.every_seconds=0"])
    with pytest.raises(ConfigError, match=r"recovery\.period_s.*-1"):
        load_config(PPO, ["recovery.period_s=-1"])
    with pytest.raises(ConfigError, match=r"recovery\.period_s"):
        RecoveryConfig(period_s=float("nan"))
    with pytest.raises(ConfigError, match=r"recovery\.period_s"):
        load_config(PPO, ['recovery.period_s="1m"'])
    # the table form of restarts still means N per role; left-out roles keep the default
    one_role = load_config(PPO, ["recovery.restarts={actor = 3}", "recovery.period_s=120"])
    assert one_role.recovery.limit("actor") == 3 and one_role.recovery.period_s == 120.0
    assert one_role.recovery.limit("buffer") == 5 and RecoveryConfig().limit("params") == 5
    assert RecoveryConfig().period_s == 50.0
    assert RecoveryConfig(period_s=float("inf")).period_s == float("inf")  # the whole run
    assert RecoveryConfig().limit("learner") == 0  # a learner dies or resumes: [recovery] learner
    assert RecoveryConfig(learner="resume", restarts={"learner": 2}).limit("learner") == 2
    assert ServiceSpec(name="actor-12", factory="m:f").role == "actor"
    assert ServiceSpec(name="learner-0", factory="m:f", role="learner").role == "learner"
    assert ServiceSpec(name="my-probe-0", factory="m:f", role="producer").role == "producer"
    assert RunConfig().recovery.learner == "stop"


SID = 4242  # actor-0's stream


def _actor(sent: int) -> Heartbeat:
    """actor-0, having sent ``sent`` samples on its stream (and produced as many)."""
    counters = {"samples_produced": sent, "samples_sent": sent}
    return _hb("actor-0", "actor", counters, **{f"sent/{SID}": float(sent)})


def _buffer(received: int, held: int, first: int = 0) -> Heartbeat:
    """A replay buffer-0 that has actor-0's stream from ``first`` to ``first + received``
    and holds ``held`` of it (the rest evicted)."""
    counters = {
        "samples_received": received,
        "samples_inserted": received,
        "dropped/evicted": received - held,
    }
    gauges = {"buffered_samples": float(held), f"recv/actor-0/{SID}": float(first + received)}
    if first:
        gauges[f"join/actor-0/{SID}"] = float(first)
    return _hb("buffer-0", "buffer", counters, **gauges)


def test_a_retired_incarnation_keeps_its_counts_and_what_it_held_is_lost_in_restart() -> None:
    controller = Controller(plugins=[Balancer(BalanceConfig())])
    controller.heartbeats = {
        "actor-0": _actor(1000),
        "buffer-0": _buffer(1000, held=1000),
        "learner-0": _hb(  # 2000 draws of the buffer's stream 77, consumed
            "learner-0",
            "learner",
            {"samples_received": 2000, "samples_consumed": 2000},
            **{"recv/buffer-0/77": 2000.0},
        ),
    }
    before = accounting(controller.heartbeats, on_policy=False)
    assert before["balanced"] and before["dropped"] == {}, before
    controller.retire("buffer-0")  # died holding 1000 samples
    assert controller.restarts["buffer-0"] == 1
    after = accounting(controller.heartbeats, on_policy=False)
    assert after["dropped"] == {"lost_in_restart": 1000} and after["buffered"] == 0
    assert after["balanced"], after
    # the new incarnation counts from zero, joining the stream where it was; totals go on
    controller.heartbeats["buffer-0"] = _buffer(300, held=300, first=1000)
    controller.heartbeats["actor-0"] = _actor(1300)
    final = accounting(controller.heartbeats, on_policy=False)
    assert final["produced"] == 1300 and final["buffered"] == 300 and final["balanced"], final
    assert final["lost_in_restart"] == {"reported": 1000, "derived": 0}
    assert "buffer-0#1" in controller.heartbeats


def test_a_buried_service_settles_what_was_on_its_way_to_it_in_the_final_books() -> None:
    """A run stops because a service died for good: what was sent to it after its last
    report is in flight while the run goes on, and lost with it (by name) once buried."""
    controller = Controller(plugins=[Balancer(BalanceConfig())])
    controller.heartbeats = {
        "actor-0": _actor(1000),  # the last 200 sent after the buffer's last report
        "buffer-0": _buffer(800, held=500),
    }
    live = accounting(controller.heartbeats, on_policy=False, final=True)
    assert live["balanced"] and live["in_flight"] == 200, live
    controller.bury("buffer-0")
    assert controller.heartbeats["buffer-0"].state == "dead" and not controller.restarts
    final = accounting(controller.heartbeats, on_policy=False, final=True)
    assert final["balanced"] and final["in_flight"] == 0 and final["buffered"] == 0, final
    # what it held (reported) and what was on its way to it (derived), named
    assert final["lost_in_restart"] == {"reported": 500, "derived": 200}
    assert final["hops"]["actor->buffer"]["lost_in_restart_by"] == {"buffer-0": 200}
    controller.bury("nobody")  # no heartbeat: nothing to settle


class _Conn:
    """A controller connection that takes whatever is sent to it."""

    peer = "test"

    async def send(self, frames: object) -> None:
        pass


def _register(name: str, role: str, pid: int) -> RegisterService:
    return RegisterService(
        name=name, role=role, address="tcp://127.0.0.1:1", publishes=(), host="h", pid=pid
    )


def test_a_service_back_as_a_new_process_is_retired_and_counted_as_a_restart() -> None:
    """Restarted where it runs (``tianji serve --restart``), no launcher retires the dead
    process: the controller does when the name registers from another pid. The same
    process reconnecting (a healed partition) is no restart."""

    async def main() -> tuple[Controller, list[tuple[str, str, int]]]:
        controller = Controller(plugins=[Balancer(BalanceConfig())])
        seen: list[tuple[str, str, int]] = []
        controller.reincarnated = lambda *args: seen.append(args)
        old, again, new = _Conn(), _Conn(), _Conn()
        held = _buffer(1000, held=1000)
        await controller.on_request(_register("buffer-0", "buffer", pid=100), old)  # type: ignore[arg-type]
        await controller.on_request(held, old)  # type: ignore[arg-type]
        await controller.on_request(_register("buffer-0", "buffer", pid=100), again)  # type: ignore[arg-type]
        assert controller.restarts["buffer-0"] == 0 and seen == []
        await controller.on_request(_register("buffer-0", "buffer", pid=200), new)  # type: ignore[arg-type]
        return controller, seen

    controller, seen = asyncio.run(main())
    assert controller.restarts["buffer-0"] == 1 and seen == [("buffer-0", "buffer", 1)]
    assert controller.heartbeats["buffer-0#1"].state == "dead"
    assert "buffer-0" not in controller.heartbeats  # the new process reports from zero
    books = accounting(controller.heartbeats, on_policy=False)
    assert books["dropped"] == {"lost_in_restart": 1000} and books["balanced"], books


def test_fragments_on_their_way_to_a_dead_buffer_are_counted_lost_when_it_is_back() -> None:
    """Actors sent 1,000 samples to replay buffer-0; it reported 700 received and died with
    300 in its sockets and queue. The balance policy counts those 300 as settled when the
    next incarnation registers (else an on-policy run's actors stayed paused behind them: a
    PPO chaos run on two hosts froze so); the books have them pending until the stream
    shows where the next incarnation joined, or the run ends (final: lost_in_restart)."""

    async def main() -> Controller:
        controller = Controller(plugins=[Balancer(BalanceConfig())])
        conns = [_Conn() for _ in range(4)]
        actor, old, new = conns[0], conns[1], conns[2]
        await controller.on_request(_register("actor-0", "actor", pid=1), actor)  # type: ignore[arg-type]
        await controller.on_request(_register("buffer-0", "buffer", pid=2), old)  # type: ignore[arg-type]
        await controller.on_request(_actor(1000), actor)  # type: ignore[arg-type]
        await controller.on_request(_buffer(700, held=700), old)  # type: ignore[arg-type]
        controller.retire("buffer-0")  # the launcher saw it die
        await controller.on_request(_register("buffer-0", "buffer", pid=3), new)  # type: ignore[arg-type]
        return controller

    controller = asyncio.run(main())
    balancer = controller.plugin(Balancer)
    assert balancer is not None and balancer.tally.settled == {"buffer-0#1": 300}
    books = accounting(controller.heartbeats, on_policy=False)
    assert books["in_flight"] == 300 and books["hops"]["actor->buffer"]["pending_restart"] == 300
    assert books["dropped"] == {"lost_in_restart": 700} and books["balanced"], books
    final = accounting(controller.heartbeats, on_policy=False, final=True)
    assert final["in_flight"] == 0, final
    assert final["dropped"] == {"lost_in_restart": 700 + 300} and final["balanced"], final
    assert final["lost_in_restart"] == {"reported": 700, "derived": 300}


def test_a_heartbeat_of_a_retired_process_is_ignored_and_its_successor_not_retired_again() -> None:
    """The local launcher retires a dead service before it starts the next one: a
    heartbeat still in flight from the dead process must not bring its counts back, and
    the next process (another pid) is not taken for a second restart."""

    async def main() -> Controller:
        controller = Controller(plugins=[Balancer(BalanceConfig())])
        old, new = _Conn(), _Conn()
        await controller.on_request(_register("actor-0", "actor", pid=100), old)  # type: ignore[arg-type]
        await controller.on_request(_hb("actor-0", "actor", {"samples_produced": 500}), old)  # type: ignore[arg-type]
        controller.retire("actor-0")
        await controller.on_request(_hb("actor-0", "actor", {"samples_produced": 600}), old)  # type: ignore[arg-type]
        assert "actor-0" not in controller.heartbeats
        await controller.on_request(_register("actor-0", "actor", pid=200), new)  # type: ignore[arg-type]
        await controller.on_request(_hb("actor-0", "actor", {"samples_produced": 7}), new)  # type: ignore[arg-type]
        return controller

    controller = asyncio.run(main())
    assert controller.restarts["actor-0"] == 1
    assert controller.heartbeats["actor-0#1"].counters["samples_produced"] == 500
    assert controller.heartbeats["actor-0"].counters["samples_produced"] == 7


def test_a_buffer_restored_from_a_snapshot_counts_only_its_own_evictions() -> None:
    """The snapshot's storage counts every eviction since the run began; those belong to
    the incarnations before (their retired heartbeats count them): counting them again
    broke the books of a DQN chaos run from its second buffer restart on."""
    from tianji.launch.spec import build_service
    from tianji.rl.checkpoint import pack_state
    from tianji.rl.events import RestoreCheckpoint
    from tianji.run.plan import RunPlan
    from tianji.services.buffer import BufferService

    config = load_config(
        DQN, ["algo.buffer_capacity=100", "algo.learning_starts=10", "checkpoint.replay=true"]
    )
    (spec,) = [s for s in RunPlan.build(config).specs if s.role == "buffer"]
    old, new = (
        build_service(dataclasses.replace(spec, options={**spec.options, "restore": r}))
        for r in (False, True)
    )
    assert isinstance(old, BufferService) and isinstance(new, BufferService)
    obs = np.zeros((10, 4, 4), np.float32)  # 10 steps x 4 envs of CartPole
    fragment = {"obs": obs, "action": np.zeros((10, 4), np.int64),
                "reward": np.ones((10, 4), np.float32), "done": np.zeros((10, 4), bool),
                "next_obs": obs}  # fmt: skip
    for _ in range(15):  # more than the 100 slots hold: evictions before the snapshot
        old.buffer.add(fragment, policy_version=0)
    before = old.buffer.statistics()
    assert before["size"] == 100 and before["evicted"] > 0, before
    state = np.frombuffer(pack_state(old.buffer.state_dict()), np.uint8)

    async def restore() -> None:
        await new.on_restore(RestoreCheckpoint(policy_version=3, state=state))

    asyncio.run(restore())
    new._count_evictions()
    assert new.counters["samples_restored"] == 100
    assert new.counters["dropped/evicted"] == 0
    new.buffer.add(fragment, policy_version=3)  # its own inserts evict as many
    added = new.buffer.statistics()["inserted"] - before["inserted"]
    new._count_evictions()
    assert added > 0 and new.counters["dropped/evicted"] == added
    # this incarnation's books: restored + inserted = stored + evicted
    assert 100 + added == len(new.buffer) + new.counters["dropped/evicted"]


# ---------------------------------------------------------------------- end to end
class Run:
    """A ``tianji train`` process with its dashboard (PPO unless ``config`` is given)."""

    def __init__(self, tmp_path: Path, *args: str, config: Path = PPO) -> None:
        cmd = [sys.executable, "-m", "tianji", "train", str(config)]
        cmd += ["--dashboard", "127.0.0.1:0", "--run-dir", str(tmp_path)]
        cmd += ["--summary", str(tmp_path / "summary.json"), *args]
        self.summary_path = tmp_path / "summary.json"
        self.proc = subprocess.Popen(
            cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert self.proc.stdout is not None
        for _ in range(40):
            line = self.proc.stdout.readline()
            if line.startswith("dashboard: "):
                self.url = line.split(" ", 1)[1].strip() + "api/status"
                return
        self.proc.kill()
        raise AssertionError("no dashboard line")

    def status(self) -> Any:
        try:
            with urllib.request.urlopen(self.url, timeout=10) as response:
                return json.loads(response.read().decode())
        except OSError as exc:  # (URLError too) the run is gone: say how it ended
            if self.proc.poll() is None:
                raise
            out, _ = self.proc.communicate()
            raise AssertionError(
                f"the run ended (exit {self.proc.returncode}) before the test was done: "
                f"{exc}\n{out[-3000:]}"
            ) from exc

    def wait_for(self, ok: Callable[[Any], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            body = self.status()
            if ok(body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; last status: {json.dumps(body)[:3000]}")
            time.sleep(0.3)

    def kill_and_await_restart(
        self, status: Any, name: str, sig: signal.Signals = signal.SIGKILL, timeout: float = 30
    ) -> tuple[int, float]:
        """Signal ``name``'s process; wait until a new one runs. Returns (old pid, seconds)."""
        pid = int(_service(status, name)["pid"])
        os.kill(pid, sig)
        sent = time.monotonic()
        self.wait_for(
            lambda s: (
                _service(s, name)["restarts"] == 1
                and _service(s, name)["state"] == "running"
                and _service(s, name)["pid"] not in (None, pid)
            ),
            timeout,
        )
        return pid, time.monotonic() - sent

    def stop(self, timeout: float = 120) -> tuple[int, str, dict[str, Any]]:
        """SIGTERM (a clean stop: summary written, exit code 0), then :meth:`finish`."""
        self.proc.terminate()
        return self.finish(timeout)

    def finish(self, timeout: float = 240) -> tuple[int, str, dict[str, Any]]:
        """Wait for the end: (exit code, output, summary or {})."""
        out, _ = self.proc.communicate(timeout=timeout)
        path = self.summary_path
        summary = json.loads(path.read_text()) if path.exists() else {}
        return self.proc.returncode, out, summary


def _service(status: dict[str, Any], name: str) -> dict[str, Any]:
    (row,) = [s for s in status["services"] if s["name"] == name]
    return row


@contextlib.contextmanager
def training(tmp_path: Path, *args: str, config: Path = PPO) -> Iterator[Run]:
    run = Run(tmp_path, *args, config=config)
    try:
        yield run
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


@pytest.mark.slow
def test_a_killed_learner_without_resume_stops_the_run_with_a_clear_message(
    tmp_path: Path,
) -> None:
    with training(tmp_path, "--target-return", "1e9", "--max-seconds", "240") as run:
        status = run.wait_for(lambda s: s["counters"]["learner_updates"] >= 3, timeout=120)
        os.kill(_service(status, "learner-0")["pid"], signal.SIGKILL)
        killed = time.monotonic()
        code, out, summary = run.finish(timeout=60)
        took = time.monotonic() - killed
    assert code != 0
    assert "learner-0" in out and "exited with code -9" in out, out[-3000:]
    assert took < 10, f"{took:.1f} s to stop after the learner died"
    # the failed run can be read afterwards: its summary names the failure, with the counts
    assert "learner-0" in summary["stop_reason"], summary.get("stop_reason")
    assert summary["learner_updates"] >= 3 and summary["env_steps"] > 0
    books = summary["accounting"]
    assert books["balanced"], json.dumps(books)
    # what was on its way to the dead learner is lost with it, by name, not left in flight
    # (a failed run does not drain: between live services some may still be in flight)
    to_learner = books["hops"]["buffer->learner"]
    assert to_learner["in_flight"] == 0, json.dumps(books)
    assert set(to_learner.get("lost_in_restart_by", {})) <= {"learner-0"}, to_learner


@pytest.mark.slow
def test_killed_learners_resume_together_from_one_checkpoint(tmp_path: Path) -> None:
    """Two data-parallel learners averaging in a torch.distributed (gloo) group,
    ``learner = "resume"``: learner-1 is killed; the launcher kills learner-0 too (their
    weights must stay identical) and both resume from the newest checkpoint in a group
    formed anew, with the policy version continuing; the run still reaches its target."""
    resume = ("--set", 'recovery.learner="resume"', "--set", "checkpoint.every_updates=5")
    resume += ("--set", "learner.count=2", "--set", 'learner.allreduce="collective"')
    with training(tmp_path, "--target-return", "300", "--max-seconds", "240", *resume) as run:
        status = run.wait_for(
            lambda s: (s["checkpoint"] or {}).get("policy_version", 0) >= 10, timeout=120
        )
        run.kill_and_await_restart(status, "learner-1")
        run.wait_for(lambda s: _service(s, "learner-0")["restarts"] == 1, timeout=30)
        code, out, summary = run.finish()
    assert code == 0, out[-3000:]
    assert "learner-1 died: resuming from ckpt-" in out
    assert "learner-0 died: resuming from ckpt-" in out  # killed by the launcher with it
    assert summary["stop_reason"] == "target_return reached"
    assert summary["restarts"] == {"learner-0": 1, "learner-1": 1}
    versions = [summary["services"][f"learner-{i}"]["counters"]["restored_version"] for i in (0, 1)]
    assert versions[0] == versions[1] >= 10, versions
    for i in (0, 1):  # the new incarnations averaged in their new group
        counters = summary["services"][f"learner-{i}"]["counters"]
        assert counters["allreduce/steps"] > 0 and counters["learner_updates"] > 0, counters
    assert summary["accounting"]["balanced"], json.dumps(summary["accounting"])


@pytest.mark.slow
def test_a_killed_replay_buffer_restarts_from_its_snapshot(tmp_path: Path) -> None:
    """DQN, ``recovery.buffer = "snapshot"``: the replay buffer dies holding thousands of
    transitions (counted ``lost_in_restart``); the new one starts with those of its newest
    snapshot (``samples_restored``), the learner goes on, and the accounting closes."""
    snapshots = ("--set", "checkpoint.replay=true", "--set", "checkpoint.every_seconds=4")
    from_snapshot = ("--set", 'recovery.buffer="snapshot"')

    def snapshot_files() -> list[Path]:
        return list(tmp_path.glob("*/checkpoints/replay-buffer-0.tjc"))

    # the test stops the run itself; the budget only bounds a run left behind (a loaded
    # CI machine took over 45 s to reach the kill)
    with training(tmp_path, "--max-seconds", "150", *snapshots, *from_snapshot, config=DQN) as run:
        deadline = time.monotonic() + 120
        while not snapshot_files():
            assert time.monotonic() < deadline, "no replay snapshot in 120 s"
            time.sleep(0.5)
        status = run.wait_for(lambda s: s["counters"]["learner_updates"] >= 50, timeout=120)
        # the first snapshot may predate the first transition (taken 4 s after start): kill
        # only once one written after learning began is there (a CI run restored 0 samples)
        learning = time.time()
        while max(p.stat().st_mtime for p in snapshot_files()) <= learning:
            assert time.time() < learning + 60, "no replay snapshot after learning began"
            time.sleep(0.5)
        status = run.status()
        run.kill_and_await_restart(status, "buffer-0", timeout=60)
        updates = run.status()["counters"]["learner_updates"]
        run.wait_for(lambda s: s["counters"]["learner_updates"] > updates + 20, timeout=90)
        code, out, summary = run.stop()
    assert code == 0, out[-3000:]
    assert summary["restarts"] == {"buffer-0": 1}
    restored = summary["services"]["buffer-0"]["counters"]["samples_restored"]
    assert restored > 0 and summary["accounting"]["restored"] == restored
    lost = summary["accounting"]["dropped"].get("lost_in_restart", 0)
    assert lost >= 1000, summary["accounting"]  # learning_starts were stored at least
    assert summary["accounting"]["balanced"], json.dumps(summary["accounting"])


@pytest.mark.slow
def test_a_silent_actor_the_params_service_and_an_eval_worker_are_restarted(
    tmp_path: Path,
) -> None:
    """SIGSTOP: the process lives but sends nothing; after ``missed_heartbeats`` heartbeat
    intervals the launcher kills it and starts a new one. The parameter service and an
    evaluation worker killed with SIGKILL come back too: the new parameter service gets the
    newest weights from the learner, and newer versions reach the new eval worker."""
    silent = ("--set", "recovery.missed_heartbeats=3", "--set", "eval.workers=1")
    silent += ("--set", "eval.every_seconds=1", "--set", "eval.episodes=2")
    with training(tmp_path, "--target-return", "1e9", "--max-seconds", "60", *silent) as run:
        status = run.wait_for(
            lambda s: s["counters"]["episodes"] > 10 and _service(s, "eval-0")["pid"], timeout=120
        )
        try:
            _, took = run.kill_and_await_restart(status, "actor-0", signal.SIGSTOP)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(_service(status, "actor-0")["pid"], signal.SIGKILL)
        run.kill_and_await_restart(run.status(), "params-0")
        run.kill_and_await_restart(run.status(), "eval-0")
        before = run.status()["counters"]
        run.wait_for(
            lambda s: (
                s["counters"]["eval_policy_version"] > before["eval_policy_version"]
                and s["counters"]["learner_updates"] > before["learner_updates"]
            ),
            timeout=30,
        )
        run.proc.send_signal(signal.SIGTERM)  # a clean stop
        code, out, summary = run.finish(timeout=60)
    assert 3 <= took < 15, f"restarted {took:.1f} s after it went silent"
    assert "actor-0 declared dead: no heartbeat for" in out, out[-3000:]
    assert code == 0 and summary["restarts"] == {"actor-0": 1, "params-0": 1, "eval-0": 1}
    assert summary["services"]["eval-0"]["counters"]["evaluations"] >= 1  # the new incarnation
    assert summary["services"]["learner-0"]["counters"]["params_resent"] >= 1
    assert summary["accounting"]["balanced"], json.dumps(summary["accounting"])


def test_the_restart_backoff_doubles_in_a_crash_loop_and_resets_after_a_stable_run() -> None:
    policy = RestartPolicy(limit=lambda spec: 100, period=50.0, backoff=1.0, backoff_max=30.0)
    quick, delays = 0, []
    for _ in range(7):  # each incarnation dies 2 s after its start
        delay, quick = restart_delay(policy, 2.0, quick)
        delays.append(delay)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert restart_delay(policy, 45.0, quick) == (1.0, 1)  # it had lived past stable_after
    assert restart_delay(policy, 2.0, 5000)[0] == 30.0  # hours of crash loop: no overflow
