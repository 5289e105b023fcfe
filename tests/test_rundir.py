"""Run directory, TensorBoard event files and the progress display (plain and live)."""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tianji.cli import build_parser
from tianji.cli.train import config_from_args
from tianji.rl.config import RunConfig, StopConfig
from tianji.run import progress
from tianji.run.config import load_config
from tianji.run.deploy import config_digest
from tianji.run.plan import RunPlan, TrainMonitor
from tianji.run.progress import RunFacts, Snapshot, take_snapshot
from tianji.run.rundir import RunDirectory, RunRecorder, TensorBoard, run_name, write_json_atomic
from tianji.runtime.controller import Controller, ServiceRecord
from tianji.runtime.errors import ConfigError
from tianji.runtime.events import Heartbeat

ROOT = Path(__file__).resolve().parents[1]
PPO = ROOT / "examples" / "cartpole_ppo.toml"
NOON = datetime.datetime(2026, 12, 3, 12, 0, 5)


# ------------------------------------------------------------------ the run directory
def test_a_run_directory_is_named_after_the_run_and_the_time(tmp_path: Path) -> None:
    d = RunDirectory.create(tmp_path / "runs", "ppo-CartPole-v1", NOON)
    assert d.path == tmp_path / "runs" / "ppo-CartPole-v1-20261203-120005"
    assert d.path.is_dir()
    assert d.config.name == "config.json" and d.summary.name == "summary.json"
    assert d.metrics.name == "metrics.jsonl" and d.tensorboard.name == "tb"
    assert d.checkpoints == d.path / "checkpoints"


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path: Path) -> None:
    paths = [RunDirectory.create(tmp_path, "run", NOON).path.name for _ in range(3)]
    assert paths == ["run-20261203-120005", "run-20261203-120005-2", "run-20261203-120005-3"]


def test_run_names_default_to_algorithm_and_env_and_are_safe_file_names() -> None:
    assert run_name(RunConfig()) == "ppo-CartPole-v1"
    custom = RunConfig(
        algorithm="examples/reinforce.py:Reinforce",
        env=dataclasses.replace(RunConfig().env, id="examples/custom_env.py:GuessTheSign"),
    )
    assert run_name(custom) == "Reinforce-GuessTheSign"
    assert run_name(RunConfig(name="my run/../1")) == "my_run_.._1"
    assert run_name(RunConfig(name="///")) == "run"


def test_a_run_directory_that_cannot_be_created_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError) as info:
        RunDirectory.create(blocker / "runs", "run")
    assert info.value.key == "run_dir" and str(blocker / "runs") in str(info.value)


def test_summaries_are_replaced_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"v": 1})
    write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}

    def broken(src: Any, dst: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", broken)
    with pytest.raises(OSError, match="disk full"):
        write_json_atomic(path, {"v": 3})
    assert json.loads(path.read_text()) == {"v": 2}  # the old summary, intact
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left


def test_the_saved_config_loads_back_as_the_same_config(tmp_path: Path) -> None:
    config = load_config(PPO, [f'run_dir="{tmp_path}"', "stop.target_return=150", "seed=7"])
    out = io.StringIO()
    recorder = RunRecorder.open(config, out)
    recorder.close()
    recorder.close()  # idempotent
    assert recorder.directory is not None
    assert f"run directory: {recorder.directory.path}" in out.getvalue()
    assert load_config(recorder.directory.config) == config
    assert (recorder.directory.tensorboard).is_dir()


def test_no_run_directory_when_run_dir_is_empty(tmp_path: Path) -> None:
    recorder = RunRecorder.open(RunConfig(run_dir=""), io.StringIO())
    recorder.close()
    assert recorder.directory is None


def test_the_cli_sets_or_disables_the_run_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIANJI_RUN_DIR")
    parser = build_parser()
    args = parser.parse_args(["train", str(PPO), "--run-dir", "/tmp/x"])
    assert config_from_args(args).run_dir == "/tmp/x"
    args = parser.parse_args(["controller", str(PPO), "--no-run-dir"])
    assert config_from_args(args).run_dir == ""
    assert config_from_args(parser.parse_args(["train", str(PPO)])).run_dir == "runs"
    monkeypatch.setenv("TIANJI_RUN_DIR", "/data/runs")  # the default's default
    assert config_from_args(parser.parse_args(["train", str(PPO)])).run_dir == "/data/runs"
    with pytest.raises(SystemExit):
        parser.parse_args(["train", str(PPO), "--run-dir", "x", "--no-run-dir"])


def test_services_joining_by_hand_need_not_repeat_the_run_directory() -> None:
    assert config_digest(RunConfig(run_dir="a")) == config_digest(RunConfig(run_dir="b"))


def test_the_records_are_closed_when_a_run_is_interrupted(tmp_path: Path) -> None:
    plan = RunPlan.build(load_config(PPO, [f'run_dir="{tmp_path}"']), io.StringIO())
    with pytest.raises(KeyboardInterrupt), plan.recording() as recorder:
        raise KeyboardInterrupt
    assert recorder.directory is not None and recorder.directory.config.is_file()
    assert list(recorder.directory.tensorboard.iterdir())  # the event file, closed
    recorder.record(_snapshot())  # after close: shown, but no file is written any more
    assert recorder.directory.metrics.read_text() == ""
    events = EventAccumulator(str(recorder.directory.tensorboard))
    events.Reload()
    assert events.Tags()["scalars"] == []


# ------------------------------------------------------------------ TensorBoard
def test_tensorboard_scalars_are_written_and_read_back(tmp_path: Path) -> None:
    tb = TensorBoard(tmp_path / "tb")
    written = {512: 21.5, 1024: 37.25, 4096: 150.0}
    for step, value in written.items():
        tb.add({"return/mean": value, "rate/env_steps_per_s": step / 2}, step)
    tb.close()
    tb.close()  # idempotent
    tb.add({"return/mean": 1.0}, 9999)  # ignored after close
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"return/mean", "rate/env_steps_per_s"} <= set(events.Tags()["scalars"])
    read = {e.step: e.value for e in events.Scalars("return/mean")}
    assert read == pytest.approx(written)
    assert [e.value for e in events.Scalars("rate/env_steps_per_s")] == [256, 512, 2048]


# ------------------------------------------------------------------ snapshots
def _hb(name: str, role: str, counters: dict[str, int], **gauges: float) -> Heartbeat:
    return Heartbeat(
        name=name,
        role=role,
        state="running",
        counters=counters,
        gauges=gauges,
        queue_depths={},
        sent_at=0.0,
    )


def _register(controller: Controller, name: str, role: str, seen: float) -> None:
    controller.registry[name] = ServiceRecord(
        name=name,
        role=role,
        address="inproc://x",
        publishes=(),
        host="h",
        pid=1,
        conn=None,  # type: ignore[arg-type]
        registered_at=seen,
        last_seen=seen,
    )


def _run(updates: int, lag_1: int, actor_steps: int) -> tuple[Controller, TrainMonitor]:
    controller = Controller()
    learner = {"learner_updates": updates, "samples_consumed": 100 * updates}
    learner |= {"lag/0": 100, "lag/1": lag_1, "lag_sum": lag_1}
    controller.heartbeats["learner-0"] = _hb("learner-0", "learner", learner, loss=0.5)
    controller.heartbeats["buffer-0"] = _hb("buffer-0", "buffer", {}, size=8.0)
    monitor = TrainMonitor("monitor", stop=StopConfig())
    monitor.env_steps_by_actor = {"actor-0": actor_steps, "actor-1": actor_steps}
    monitor.returns.extend([10.0, 20.0])
    monitor.episodes = 2
    return controller, monitor


def test_a_snapshot_has_interval_rates_lag_and_service_health() -> None:
    facts = RunFacts(services=("actor-0", "actor-1", "learner-0"), buffer_capacity=32)
    controller, monitor = _run(updates=2, lag_1=0, actor_steps=500)
    for name in ("actor-0", "learner-0"):
        _register(controller, name, name.split("-")[0], seen=100.0)
    first = take_snapshot(controller, monitor, 10.0, facts, now=101.0)
    assert first.env_steps == 1000 and first.env_steps_per_s == 100  # since the start
    assert first.services_up == 2 and first.missing == ("actor-1",) and not first.stale
    controller, monitor = _run(updates=6, lag_1=300, actor_steps=1500)
    for name in facts.services:
        _register(controller, name, name.split("-")[0], seen=100.0)
    controller.registry["actor-1"].last_seen = 90.0
    second = take_snapshot(controller, monitor, 12.0, facts, first, now=101.0)
    assert second.env_steps_per_s == 1000 and second.updates_per_s == 2  # over 2 s
    assert second.lag == {"mean": 1.0, "p50": 1.0, "p95": 1.0, "max": 1.0}  # only new ones
    assert second.stale == {"actor-1": 11.0} and second.services_up == 2
    assert second.mean_return == 15.0 and second.learner == {"loss": 0.5}


def _snapshot(**changes: Any) -> Snapshot:
    base = Snapshot(
        elapsed=12.0,
        unix=0.0,
        env_steps=12345,
        env_steps_by_actor={"actor-0": 12345},
        episodes=67,
        window=20,
        mean_return=150.25,
        updates=89,
        consumed=8900,
        env_steps_per_s=1234.0,
        updates_per_s=4.5,
        lag_counts={0: 5, 1: 5},
        lag_sum=5,
        lag={"mean": 0.5, "p50": 0.0, "p95": 1.0, "max": 1.0},
        learner={"loss": 0.25, "entropy": 0.6},
        buffer_size=8.0,
        buffer_capacity=32,
        buffer_unit="fragments",
        controller={
            "production_per_s": 2048.0,
            "consumption_per_s": 1024.0,
            "paused_now": ["actor-1"],
            "ratio": 0.5,
        },
        accounting={"balanced": True},
        services_up=4,
        services_total=5,
        stale={"actor-1": 7.0},
        missing=(),
    )
    return dataclasses.replace(base, **changes)


def test_the_plain_line_keeps_its_fields() -> None:
    line = progress.plain_line(_snapshot())
    pattern = (
        r"\[ +12\.0s\] env steps +12345 \( +1234/s\) \| episodes +67 \| return\(last 20\) +150\.2"
        r" \| updates +89 \| lag +0\.5 \| buffer +8 \| in/out +2048/ +1024 per s \| paused 1"
        r" \| services 4/5 up, actor-1 stale 7s$"
    )
    assert re.match(pattern, line), line
    empty = progress.plain_line(_snapshot(mean_return=None, lag=None, controller=None))
    assert "return(last 20)       - |" in empty and "lag    - |" in empty


def test_a_replay_run_shows_updates_per_env_step_and_sample_age_not_a_lag() -> None:
    lag = {"mean": 4592.5, "p50": 4096.0, "p95": 8192.0, "max": 9000.0}
    replay = _snapshot(buffer_unit="transitions", lag=lag, updates_per_s=100.0,
                       env_steps_per_s=125.0)  # fmt: skip
    line = progress.plain_line(replay)
    assert "| upd/step 0.80 | age  4.6k |" in line and "lag" not in line, line
    out = io.StringIO()
    Console(file=out, force_terminal=False, width=200).print(progress.render(replay, "run"))
    table = out.getvalue()
    assert "sample age" in table and "4.6k" in table and "policy lag" not in table


def test_a_stalled_run_says_so_in_the_line_and_the_table() -> None:
    stalled = {"seconds": 31.4, "state": "actor-0 waits for a grant (sent 4 of 4 granted)"}
    controller = {**(_snapshot().controller or {}), "stalled": stalled}
    snap = _snapshot(controller=controller)
    line = progress.plain_line(snap)
    assert line.endswith("| STALLED 31s: actor-0 waits for a grant (sent 4 of 4 granted)"), line
    out = io.StringIO()
    Console(file=out, force_terminal=False, width=200).print(progress.render(snap, "run"))
    assert "stalled" in out.getvalue() and "31 s: actor-0 waits for a grant" in out.getvalue()
    assert "STALLED" not in progress.plain_line(_snapshot())


def test_rows_and_scalars_come_from_the_same_numbers() -> None:
    snap = _snapshot()
    row = progress.metrics_row(snap)
    old_keys = {"t", "unix", "env_steps", "env_steps_by_actor", "episodes", "mean_return"}
    old_keys |= {"learner_updates", "samples_consumed", "learner", "controller", "accounting"}
    assert old_keys <= set(row)
    assert row["services"] == {
        "up": 4,
        "total": 5,
        "stale": {"actor-1": 7.0},
        "missing": [],
        "links_down": {},
    }
    tags = progress.scalars(snap)
    assert tags["return/mean"] == row["mean_return"] == 150.25
    assert tags["rate/env_steps_per_s"] == row["env_steps_per_s"] == 1234.0
    assert tags["lag/mean"] == 0.5 and tags["lag/p95"] == 1.0
    assert tags["learner/loss"] == 0.25 and tags["learner/entropy"] == 0.6
    assert tags["balance/ratio"] == 0.5 and tags["balance/paused_producers"] == 1.0
    assert tags["balance/production_per_s"] == 2048.0
    bare = progress.scalars(_snapshot(mean_return=None, lag=None, controller=None))
    assert not {"return/mean", "lag/mean", "balance/ratio"} & set(bare)


def test_the_live_table_shows_every_field() -> None:
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=120).print(progress.render(_snapshot(), "run"))
    text = out.getvalue()
    for expected in (
        "env steps",
        "12,345 (1,234/s)",
        "89 (4.5/s)",
        "return (last 20)",
        "150.2",
        "mean 0.50, p95 1",
        "8 / 32 fragments (25%)",
        "2,048 / 1,024 samples/s, ratio 0.50",
        "paused",
        "4/5 up",
        "actor-1 stale 7s",
    ):
        assert expected in text, (expected, text)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_live_table_and_other_output_plain_lines() -> None:
    assert isinstance(progress.make_display(io.StringIO()), progress.PlainDisplay)
    out = _Terminal()
    display = progress.make_display(out, "tianji: ppo")
    assert isinstance(display, progress.LiveDisplay)
    stdout = sys.stdout
    display.show(_snapshot())
    display.show(_snapshot(env_steps=20000))
    display.close()
    display.close()
    assert sys.stdout is stdout  # the live display gave stdout back
    assert "tianji: ppo" in out.getvalue() and "20,000" in out.getvalue()


def test_a_recorder_writes_rows_to_every_metrics_file_and_tensorboard(tmp_path: Path) -> None:
    extra = tmp_path / "extra.jsonl"
    recorder = RunRecorder.open(RunConfig(run_dir=str(tmp_path)), io.StringIO(), str(extra))
    for steps in (100, 200):
        recorder.record(_snapshot(env_steps=steps))
    recorder.write_summary({"done": True}, str(tmp_path / "s.json"))
    recorder.close()
    assert recorder.directory is not None
    rows = [json.loads(x) for x in recorder.directory.metrics.read_text().splitlines()]
    assert [r["env_steps"] for r in rows] == [100, 200]
    assert extra.read_text() == recorder.directory.metrics.read_text()
    assert json.loads(recorder.directory.summary.read_text()) == {"done": True}
    assert json.loads((tmp_path / "s.json").read_text()) == {"done": True}
    events = EventAccumulator(str(recorder.directory.tensorboard))
    events.Reload()
    assert [e.step for e in events.Scalars("learner/loss")] == [100, 200]


# ------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_a_training_run_leaves_a_complete_run_directory(
    ppo_example_run: tuple[Path, str, int],
) -> None:
    tmp_path, output, code = ppo_example_run  # one run, shared with test_train_cli
    assert code == 0, output[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert run.name.startswith("ppo-CartPole-v1-")
    assert f"run directory: {run}" in output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["run_dir"] == str(run) and summary["time_to_target_s"] is not None
    assert json.loads((tmp_path / "copy.json").read_text()) == summary
    assert load_config(run / "config.json").stop.target_return == 475
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["env_steps"] == summary["env_steps"]
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    last = events.Scalars("return/mean")[-1]  # recorded at the end, as in the summary
    assert last.step == summary["env_steps"]
    assert last.value == pytest.approx(summary["final_return"], rel=1e-6)
    assert {"rate/env_steps_per_s", "lag/mean", "balance/production_per_s"} <= set(
        events.Tags()["scalars"]
    )
