"""The live dashboard: its model without I/O, its endpoints in-process, and a real run
watched over HTTP and in headless Chromium."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, cast

import aiohttp
import msgspec
import pytest

from tianji.dashboard import parse_address
from tianji.dashboard.model import MetricsHistory, run_state, sample, services, status
from tianji.dashboard.server import Dashboard
from tianji.rl.balance import BalanceConfig
from tianji.runtime.controller import Controller, ServiceRecord
from tianji.runtime.errors import ConfigError
from tianji.runtime.events import Heartbeat
from tianji.services.balancer import Balancer

ROOT = Path(__file__).resolve().parents[1]


class FakeMonitor:
    """What the dashboard reads of TrainMonitor."""

    def __init__(self) -> None:
        self.episodes = 0
        self.returns: collections.deque[float] = collections.deque(maxlen=20)
        self.steps = 0
        self.reason: str | None = None
        self.checkpoint_version = -1
        self.last_checkpoint: Path | None = None
        self.env_steps_by_actor: dict[str, int] = {}  # what the progress line reads too

    @property
    def env_steps(self) -> int:
        return self.steps

    def mean_return(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None

    def done(self) -> str | None:
        return self.reason

    def finish(self, steps: int, *returns: float) -> None:
        self.steps = steps
        self.returns.extend(returns)
        self.episodes += len(returns)


def hb(name: str, role: str, counters: dict[str, int], **depths: int) -> Heartbeat:
    return Heartbeat(
        name=name,
        role=role,
        state="running",
        counters=counters,
        gauges={},
        queue_depths=dict(depths),
        sent_at=time.time(),
    )


def register(controller: Controller, name: str, role: str, pid: int) -> None:
    controller.registry[name] = ServiceRecord(
        name=name,
        role=role,
        address=f"tcp://127.0.0.1:{pid}",
        publishes=(),
        host="box",
        pid=pid,
        conn=cast(Any, None),
        registered_at=time.monotonic(),
        last_seen=time.monotonic(),
    )


def beat(controller: Controller, ev: Heartbeat) -> None:
    controller.heartbeats[ev.name] = ev
    if ev.name in controller.registry:
        controller.registry[ev.name].last_heartbeat = ev


def a_run(step: int) -> Controller:
    """A controller whose actor, buffer and learner have reported ``step`` times."""
    cfg = BalanceConfig(on_policy=True, max_policy_lag=2, batch_samples=512, fragment_samples=256)
    controller = Controller(plugins=[Balancer(cfg)])
    for pid, (name, role) in enumerate(
        [("actor-0", "actor"), ("buffer-0", "buffer"), ("learner-0", "learner")], start=100
    ):
        register(controller, name, role, pid)
    advance(controller, step)
    return controller


def advance(controller: Controller, step: int) -> None:
    n = 256 * step
    beat(controller, hb("actor-0", "actor", {"samples_produced": n}, **{"to:buffer": 7}))
    beat(controller, hb("buffer-0", "buffer", {"samples_inserted": n, "samples_sent": n}))
    lags = {"lag/0": n // 2, "lag/1": n - n // 2, "lag_sum": n - n // 2, "lag_max": 1}
    learner = {"samples_received": n, "samples_consumed": n, "learner_updates": step, **lags}
    beat(controller, hb("learner-0", "learner", learner))


# ---------------------------------------------------------------- the model, no I/O
def test_history_keeps_the_last_rows_and_new_episode_returns() -> None:
    controller, monitor = a_run(1), FakeMonitor()
    history = MetricsHistory(capacity=3)
    for i in range(5):
        monitor.finish(100 * (i + 1), float(i), float(i) + 0.5)
        history.add(sample(controller, monitor, float(i), history.last), monitor.returns)
    assert [r.t for r in history.rows] == [2.0, 3.0, 4.0]
    assert history.last is not None and history.last.env_steps_per_s == 100.0
    assert len(history.episodes) == 10 and history.episodes[-1] == (500, 4.5)
    assert history.window_start(4.0, 1.5) is history.rows[1]  # t=3.0
    assert history.window_start(9.0, 1.0) is history.last
    assert MetricsHistory().window_start(1.0, 5.0) is None
    body = history.to_json(since=3.0)
    assert [r["t"] for r in body["rows"]] == [4.0] and "mean_return" in body["columns"]
    assert body["episodes"][0] == {"env_steps": 100, "return": 0.0}


def test_a_sample_reads_the_heartbeats_and_the_monitor() -> None:
    controller, monitor = a_run(4), FakeMonitor()
    monitor.finish(900, 10.0, 20.0)
    row = sample(controller, monitor, 2.0)
    assert (row.env_steps, row.episodes, row.mean_return) == (900, 2, 15.0)
    assert (row.learner_updates, row.samples_produced, row.samples_consumed) == (4, 1024, 1024)
    assert row.lag_mean == 0.5 and row.production_per_s == 0.0  # no balance window yet


def test_services_lists_live_left_and_waiting_services() -> None:
    controller = a_run(1)
    del controller.registry["buffer-0"]  # it left; its last heartbeat stays
    rows = {r["name"]: r for r in services(controller, ["actor-0", "actor-1", "buffer-0"])}
    assert sorted(rows) == ["actor-0", "actor-1", "buffer-0", "learner-0"]
    actor = rows["actor-0"]
    assert actor["state"] == "running" and actor["index"] == 0 and actor["pid"] == 100
    assert actor["queue_depth"] == 7 and actor["restarts"] == 0 and actor["host"] == "box"
    assert actor["last_heartbeat_age_s"] is not None and actor["last_heartbeat_age_s"] < 5
    assert rows["buffer-0"]["state"] == "left" and rows["buffer-0"]["role"] == "buffer"
    assert rows["actor-1"]["state"] == "waiting" and rows["actor-1"]["role"] == "actor"


def test_status_has_the_run_state_counters_accounting_and_services() -> None:
    controller, monitor = a_run(2), FakeMonitor()
    assert run_state(None, None) == ("starting", None)
    assert run_state(monitor, None) == ("running", None)
    monitor.reason = "target_return reached"
    body = status(controller, monitor, title="t", on_policy=True)
    assert (body["state"], body["stop_reason"]) == ("stopping", "target_return reached")
    assert body["counters"]["learner_updates"] == 2 and body["counters"]["samples_dropped"] == {}
    assert body["lag_histogram"] == {"0": 256, "1": 256}
    assert body["accounting"]["produced"] == 512 and body["controller"]["mode"] == "relaxed"
    assert [s["name"] for s in body["services"]] == ["actor-0", "buffer-0", "learner-0"]
    assert run_state(monitor, "complete") == ("finished", "complete")


def test_status_and_the_progress_line_name_a_link_that_cannot_connect() -> None:
    from tianji.run.progress import RunFacts, plain_line, take_snapshot

    controller, monitor = a_run(1), FakeMonitor()
    buffer = controller.registry["buffer-0"]
    down = {"tcp://127.0.0.1:100": "connect failed: Connection refused (down 3 s, never up)"}
    beat(controller, msgspec.structs.replace(buffer.last_heartbeat, links_down=down))
    body = status(controller, monitor)
    assert body["links_down"] == [
        {
            "subscriber": "buffer-0",
            "publisher": "actor-0 tcp://127.0.0.1:100",
            "error": "connect failed: Connection refused (down 3 s, never up)",
        }
    ]
    facts = RunFacts(services=("actor-0", "buffer-0", "learner-0"))
    line = plain_line(take_snapshot(controller, monitor, 1.0, facts))
    assert "links down: buffer-0 -> actor-0 tcp://127.0.0.1:100: connect failed" in line
    assert status(a_run(1), monitor)["links_down"] == []


@pytest.mark.parametrize("bad", ["nohost", "127.0.0.1", ":80", "host:http", "h:70000", "::1:80"])
def test_a_bad_dashboard_address_is_a_config_error_naming_it(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_address(bad)
    assert bad in str(info.value)


def test_good_dashboard_addresses() -> None:
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_address("localhost:8765") == ("localhost", 8765)
    assert parse_address("[::1]:9000") == ("::1", 9000)


@pytest.mark.parametrize("command", ["train", "controller"])
def test_a_bad_dashboard_is_refused_before_anything_runs(command: str) -> None:
    config = str(ROOT / "examples" / "cartpole_ppo.toml")
    cmd = [sys.executable, "-m", "tianji.cli", command, config, "--dashboard", "nohost"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--dashboard='nohost'" in done.stderr
    assert "env steps" not in done.stdout and "dashboard:" not in done.stdout


# ---------------------------------------------------------------- the endpoints, in-process
async def _get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        assert response.status == 200, url
        if response.content_type == "application/json":
            return await response.json()
        return await response.text()


def test_the_endpoints_serve_a_run_as_it_advances() -> None:
    async def scenario() -> None:
        controller, monitor = a_run(1), FakeMonitor()
        dash = Dashboard(controller, lambda: monitor, title="ppo", expected=["actor-0"])
        dash.interval = 0.05
        url = await dash.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as s:
                page = await _get(s, url)
                assert 'data-plot="return"' in page and "static/dashboard.js" in page
                assert "function linePlot" in await _get(s, url + "static/dashboard.js")
                assert (await s.get(url + "static/..%2Fserver.py")).status == 404
                first = await _get(s, url + "api/status")
                monitor.finish(1000, 50.0)
                monitor.checkpoint_version = 3
                monitor.last_checkpoint = Path("runs/x/checkpoints/ckpt-0000000003.tjc")
                advance(controller, 3)
                await asyncio.sleep(0.2)
                second = await _get(s, url + "api/status")
                metrics = await _get(s, url + "api/metrics")
                prom = await _get(s, url + "metrics")
                assert (await s.get(url + "api/metrics?since=x")).status == 400
        finally:
            await dash.stop()
            await dash.stop()  # idempotent
        for key in ("state", "stop_reason", "counters", "accounting", "services", "controller"):
            assert key in second
        assert first["checkpoint"] is None
        assert second["checkpoint"] == {
            "path": "runs/x/checkpoints/ckpt-0000000003.tjc",
            "policy_version": 3,
        }
        for key in ("env_steps", "learner_updates", "samples_produced", "samples_consumed"):
            assert second["counters"][key] > first["counters"][key], key
        assert {s["name"] for s in second["services"]} == {"actor-0", "buffer-0", "learner-0"}
        assert metrics["rows"] and metrics["episodes"] == [{"env_steps": 1000, "return": 50.0}]
        assert "tianji_env_steps_total 1000.0" in prom
        assert "tianji_learner_updates_total 3.0" in prom and "tianji_mean_return 50.0" in prom
        assert 'tianji_service_up{name="actor-0",role="actor"} 1.0' in prom
        assert "tianji_checkpoint_policy_version 3.0" in prom

    asyncio.run(scenario())


def test_a_port_in_use_is_a_config_error() -> None:
    async def scenario() -> None:
        first = Dashboard(Controller(), lambda: None)
        url = await first.start("127.0.0.1", 0)
        port = int(url.rsplit(":", 1)[1].strip("/"))
        try:
            with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
                await Dashboard(Controller(), lambda: None).start("127.0.0.1", port)
        finally:
            await first.stop()

    asyncio.run(scenario())


# ---------------------------------------------------------------- a real run
def _fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    return json.loads(body) if "/api/" in url else body


def _wait_for(url: str, ok: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        body = _fetch(url)
        if ok(body) or time.monotonic() > deadline:
            return body
        time.sleep(0.5)


def _chromium(*args: str, profile: Path) -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser is not None
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ]
    done = subprocess.run(
        [browser, *flags, *args], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def _check_in_browser(url: str, names: set[str], tmp_path: Path) -> Path:
    """The page, rendered by headless Chromium, has drawn returns and lists every service."""
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", url, profile=tmp_path / "p1")
    svg = re.search(r'<svg id="plot-return".*?</svg>', dom, re.S)
    assert svg is not None, dom[:2000]
    dots = re.search(r'data-series="episodes" data-points="(\d+)"', svg.group(0))
    assert dots is not None and int(dots.group(1)) > 0, svg.group(0)[:2000]
    assert svg.group(0).count("<circle") == int(dots.group(1))
    assert 'data-series="mean_return"' in svg.group(0)
    evals = re.search(r'<svg id="plot-eval".*?</svg>', dom, re.S)
    assert evals is not None, dom[:2000]
    line = re.search(r'<polyline[^>]*data-series="eval_return" data-points="(\d+)"', evals.group(0))
    assert line is not None and int(line.group(1)) >= 2, evals.group(0)[:2000]  # the eval curve
    listed = set(re.findall(r'<tr class="service [a-z]+" data-name="([^"]+)"', dom))
    assert listed == names, (listed, names)
    shot = tmp_path / "dashboard.png"
    _chromium(
        "--virtual-time-budget=5000",
        "--window-size=1280,1000",
        f"--screenshot={shot}",
        url,
        profile=tmp_path / "p2",
    )
    assert shot.stat().st_size > 10_000
    return shot


@pytest.mark.slow
def test_a_training_run_is_watched_over_http_and_in_chromium(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tianji.cli", "train", str(ROOT / "examples/cartpole_ppo.toml")]
    cmd += ["--dashboard", "127.0.0.1:0", "--target-return", "1e9", "--max-seconds", "120"]
    cmd += ["--set", "eval.workers=1", "--set", "eval.every_seconds=2", "--set", "eval.episodes=3"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while len(lines) < 20 and lines[-1:] != [""]:  # printed before services start
            lines.append(proc.stdout.readline())
            if lines[-1].startswith("dashboard: "):
                break
        assert lines[-1].startswith("dashboard: http://127.0.0.1:"), lines
        url = lines[-1].split(" ", 1)[1].strip()
        first = _wait_for(url + "api/status", lambda s: s["counters"]["episodes"] > 0)
        keys = ("env_steps", "episodes", "learner_updates", "samples_produced", "samples_consumed")
        second = _wait_for(  # actors may be paused for a while: wait until every one grew
            url + "api/status",
            lambda s: all(s["counters"][k] > first["counters"][k] for k in keys),
        )
        for key in keys:
            assert second["counters"][key] > first["counters"][key], (key, first, second)
        assert second["state"] == "running" and second["stop_reason"] is None
        names = {s["name"] for s in second["services"]}
        assert names == {
            "params-0", "buffer-0", "learner-0", "actor-0", "actor-1", "eval-0", "monitor",
        }  # fmt: skip
        assert all(s["state"] == "running" and s["pid"] > 0 for s in second["services"])
        metrics = _wait_for(url + "api/metrics", lambda m: len(m["evaluations"]) >= 2)
        rows = metrics["rows"]
        assert len(rows) >= 2 and rows[-1]["env_steps"] >= rows[0]["env_steps"]
        assert metrics["evaluations"][-1]["episodes"] == 3
        prom = _fetch(url + "metrics")
        steps = re.search(r"^tianji_env_steps_total (\S+)$", prom, re.M)
        assert steps is not None and float(steps.group(1)) >= second["counters"]["env_steps"]
        if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
            pytest.skip("chromium is not installed (.ci/run installs it): browser part skipped")
        shot = _check_in_browser(url, names, tmp_path)
        print(f"screenshot: {shot}")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-3000:]


# ------------------------------------------------- the lag chart, drawn by Chromium
STATIC = Path(__file__).resolve().parents[1] / "tianji" / "dashboard" / "static"


def _bars_in_chromium(histogram: dict[str, int], tmp_path: Path) -> str:
    """The SVG ``barPlot`` draws for ``histogram``, rendered by headless Chromium."""
    page = tmp_path / "bars.html"
    page.write_text(
        '<!doctype html><html><body><svg id="x" viewBox="0 0 560 240"></svg>'
        f'<script src="{(STATIC / "dashboard.js").as_uri()}"></script>'
        f"<script>barPlot(document.getElementById('x'), {json.dumps(histogram)}, 'age');"
        "</script></body></html>"
    )
    dom = _chromium(
        "--allow-file-access-from-files", "--virtual-time-budget=2000", "--dump-dom",
        page.as_uri(), profile=tmp_path / "p",
    )  # fmt: skip
    svg = re.search(r'<svg id="x".*?</svg>', dom, re.S)
    assert svg is not None, dom[:2000]
    return svg.group(0)


@pytest.mark.parametrize(
    "histogram",
    [
        {str(2**k): 1000 + 37 * k for k in range(5, 13)},  # a replay run's ages, 32 ... 4096
        {"0": 980, "1": 15, "2": 5},  # an on-policy run's lags, one bucket dominating
        {str(k): 1 for k in range(40)},  # many small buckets
    ],
    ids=["replay-ages", "on-policy-lags", "forty-buckets"],
)
def test_the_lag_chart_reads_well_for_any_range_of_buckets(
    histogram: dict[str, int], tmp_path: Path
) -> None:
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    svg = _bars_in_chromium(histogram, tmp_path)
    rects = re.findall(r'<rect class="bar" x="([\d.]+)" y="[\d.]+" width="([\d.]+)" '
                       r'height="([\d.]+)"', svg)  # fmt: skip
    assert len(rects) == len(histogram)  # one visible bar per bucket
    assert all(float(w) >= 4 and float(h) >= 1 for _, w, h in rects), rects
    starts = [float(x) for x, _, _ in rects]
    assert starts == sorted(starts) and all(b - a >= 4 for a, b in itertools.pairwise(starts))
    ticks = re.findall(r'<text class="tick" x="([\d.]+)"[^>]*>([^<]+)</text>', svg)
    xs = [float(x) for x, _ in ticks]
    assert 1 <= len(ticks) <= 12 and all(56 <= x <= 560 - 12 for x in xs), ticks
    assert all(b - a >= 30 for a, b in itertools.pairwise(xs)), ticks  # no labels pile up
    axis = re.findall(r'text-anchor="end">([^<]+%)</text>', svg)
    assert len(axis) == 5 and len(set(axis)) == 5, axis  # no tick label printed twice
