"""The dashboard's HTTP side: an aiohttp app in the controller's event loop.

:class:`Dashboard` samples the controller and the monitor every ``interval`` seconds into
a :class:`~tianji.dashboard.model.MetricsHistory` and serves:

- ``/`` and ``/static/...``: one page with hand-written SVG plots (no request leaves it);
- ``/api/status``: run state, counters, accounting and the services table (JSON);
- ``/api/metrics``: the time series (JSON; ``?since=T`` for rows after ``T`` seconds);
- ``/metrics``: the same counters in the Prometheus text format.

Usage (inside the loop that runs the controller)::

    dash = Dashboard(controller, lambda: plan.monitor, title="ppo on CartPole-v1")
    url = await dash.start("127.0.0.1", 0)
    ...
    await dash.stop()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tianji.dashboard.model import Members, MetricsHistory, RunMonitor, sample, services, status
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError
from tianji.services.balancer import dropped_by_reason

__all__ = ["Dashboard", "make_app"]

log = logging.getLogger("tianji.dashboard")
STATIC = resources.files("tianji.dashboard") / "static"
RATE_WINDOW = 5.0  # seconds over which env steps per second are measured, as the balancer does
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


class Dashboard:
    """Samples the run and serves the dashboard; see the module docstring.

    Args:
        controller: the run's controller (in this event loop).
        monitor: returns the run's monitor, ``None`` until it exists.
        title: shown on the page (e.g. ``"ppo on CartPole-v1"``).
        on_policy: how :func:`~tianji.runtime.controller.accounting` counts consumed samples.
        expected: names of the run's services, listed as ``waiting`` until they join.
        interval: seconds between samples.
        capacity: samples kept (at 1 s, the last ~33 minutes).
        members: a population run's members (:data:`~tianji.dashboard.model.Members`),
            each drawn and accounted on its own; ``None`` for a single policy.
    """

    def __init__(
        self,
        controller: Controller,
        monitor: Callable[[], RunMonitor | None],
        *,
        title: str = "tianji run",
        on_policy: bool = False,
        expected: Sequence[str] = (),
        interval: float = 1.0,
        capacity: int = 2000,
        members: Callable[[], Members] | None = None,
    ) -> None:
        self.controller = controller
        self.members = members
        self.monitor = monitor
        self.title = title
        self.on_policy = on_policy
        self.expected = list(expected)
        self.interval = interval
        self.history = MetricsHistory(capacity)
        self.finished: str | None = None
        self.url = ""
        self.started = time.monotonic()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_RunCollector(self))
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None

    def elapsed(self) -> float:
        """Seconds since the dashboard was created."""
        return time.monotonic() - self.started

    def take_sample(self) -> None:
        """Append one sample of the run to the history now."""
        monitor = self.monitor()
        now = self.elapsed()
        start = self.history.window_start(now, RATE_WINDOW)
        members = self.members() if self.members is not None else None
        row = sample(self.controller, monitor, now, start, members)
        self.history.add(row, list(monitor.returns) if monitor is not None else ())

    def status(self) -> dict[str, Any]:
        """The body of ``/api/status``."""
        return status(
            self.controller,
            self.monitor(),
            title=self.title,
            on_policy=self.on_policy,
            expected=self.expected,
            finished=self.finished,
            elapsed=self.elapsed(),
            members=self.members() if self.members is not None else None,
        )

    async def start(self, host: str, port: int) -> str:
        """Listen on ``host:port`` (0: any free port), start sampling; return the page's URL.

        Raises:
            ConfigError: naming the address when it cannot be listened on.
        """
        runner = web.AppRunner(make_app(self), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError("--dashboard", f"{host}:{port}", f"a free address ({exc})") from exc
        self._runner = runner
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"http://{shown}:{bound[1]}/"
        self._sampler = asyncio.create_task(self._sample_loop())
        return self.url

    async def stop(self) -> None:
        """Stop sampling and serving (idempotent)."""
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.wait({self._sampler})
            if not self._sampler.cancelled():  # it had ended before: by failing, say so
                self._sampler.result()
            self._sampler = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _sample_loop(self) -> None:
        while True:
            try:
                self.take_sample()
            except Exception:  # a bug here must not end the run it watches
                log.exception("dashboard: cannot sample the run")
            await asyncio.sleep(self.interval)


def make_app(dashboard: Dashboard) -> web.Application:
    """The aiohttp application serving ``dashboard`` (see the module docstring)."""

    async def page(request: web.Request) -> web.Response:
        return _static("index.html")

    async def static(request: web.Request) -> web.Response:
        return _static(request.match_info["name"])

    async def api_status(request: web.Request) -> web.Response:
        return web.json_response(dashboard.status(), headers=NO_CACHE)

    async def api_metrics(request: web.Request) -> web.Response:
        since = request.query.get("since")
        try:
            after = float(since) if since is not None else None
        except ValueError:
            raise web.HTTPBadRequest(text=f"since={since!r}: expected seconds") from None
        body = dashboard.history.to_json(after)
        body["evaluations"] = list(getattr(dashboard.monitor(), "evaluations", ()))
        return web.json_response(body, headers=NO_CACHE)

    async def prometheus(request: web.Request) -> web.Response:
        body = generate_latest(dashboard.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/api/metrics", api_metrics)
    app.router.add_get("/metrics", prometheus)
    return app


NO_CACHE = {"Cache-Control": "no-store"}


def _static(name: str) -> web.Response:
    """A file of the package's ``static/`` folder (flat: no path separators)."""
    kind = CONTENT_TYPES.get("." + name.rsplit(".", 1)[-1])
    item = STATIC / name
    if "/" in name or name.startswith(".") or kind is None or not item.is_file():
        raise web.HTTPNotFound()
    return web.Response(body=item.read_bytes(), content_type=kind, headers=NO_CACHE)


class _RunCollector(Collector):
    """The run's counters as Prometheus metrics, computed at every scrape."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    def collect(self) -> Iterator[Metric]:
        dash = self.dashboard
        monitor = dash.monitor()
        now = sample(dash.controller, monitor, dash.elapsed())
        beats = dash.controller.heartbeats
        yield _counter("tianji_env_steps", "Env steps of all actors.", now.env_steps)
        yield _counter("tianji_episodes", "Episodes finished.", now.episodes)
        yield _counter("tianji_learner_updates", "Learner updates.", now.learner_updates)
        yield _counter("tianji_samples_produced", "Samples produced.", now.samples_produced)
        yield _counter("tianji_samples_inserted", "Samples inserted.", now.samples_inserted)
        yield _counter("tianji_samples_consumed", "Samples consumed.", now.samples_consumed)
        dropped = CounterMetricFamily(
            "tianji_samples_dropped", "Samples dropped, by reason.", labels=["reason"]
        )
        for reason, count in dropped_by_reason(beats).items():
            dropped.add_metric([reason], count)
        yield dropped
        if now.mean_return is not None:
            yield _gauge("tianji_mean_return", "Mean return, last episodes.", now.mean_return)
        if now.lag_mean is not None:
            yield _gauge("tianji_policy_lag_mean", "Mean policy lag consumed.", now.lag_mean)
        for name, value in (
            ("production", now.production_per_s),
            ("consumption", now.consumption_per_s),
        ):
            if value is not None:
                yield _gauge(f"tianji_{name}_per_second", f"Samples {name} rate.", value)
        yield _gauge("tianji_run_seconds", "Seconds since the dashboard started.", now.t)
        if monitor is not None and monitor.last_checkpoint is not None:
            yield _gauge(
                "tianji_checkpoint_policy_version",
                "Policy version of the newest checkpoint written.",
                monitor.checkpoint_version,
            )
        yield from _service_metrics(services(dash.controller, dash.expected))


def _service_metrics(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "tianji_service_up", "1 while a service is registered.", labels=["name", "role"]
    )
    depth = GaugeMetricFamily(
        "tianji_service_queue_depth", "Sum of a service's queue depths.", labels=["name", "role"]
    )
    for row in rows:
        labels = [row["name"], row["role"]]
        up.add_metric(labels, 0.0 if row["state"] in ("left", "waiting") else 1.0)
        if row["queue_depth"] is not None:
            depth.add_metric(labels, row["queue_depth"])
    yield up
    yield depth


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)
