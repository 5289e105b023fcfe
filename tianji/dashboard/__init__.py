"""The live dashboard of a run, served by the controller's process.

``tianji train`` and ``tianji controller`` serve it by default on ``127.0.0.1`` and a free
port (``--dashboard HOST:PORT`` to choose, ``--no-dashboard`` to turn it off) and print
``dashboard: http://HOST:PORT/`` at start. See ``docs/dashboard.md`` for the page and the
endpoints; :mod:`tianji.dashboard.server` serves them, :mod:`tianji.dashboard.model`
computes them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TextIO

from tianji.dashboard.model import Members, RunMonitor
from tianji.launch.base import Launcher, LaunchResult, run_launcher
from tianji.rl.config import RunConfig
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError
from tianji.runtime.loop import run

__all__ = [
    "DEFAULT",
    "PlannedRun",
    "add_dashboard_options",
    "launch_plan",
    "parse_address",
    "run_with_dashboard",
]

DEFAULT = "127.0.0.1:0"
EXPECTED = "HOST:PORT, e.g. 127.0.0.1:8765 or [::1]:0 (port 0: any free port)"


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as ``(host, port)``.

    Raises:
        ConfigError: naming ``text`` when it is not such an address.
    """
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError("--dashboard", text, EXPECTED) from None
    elif ":" in host:
        raise ConfigError("--dashboard", text, EXPECTED)
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError("--dashboard", text, EXPECTED)
    return host, int(port)


def add_dashboard_options(p: Any) -> None:
    """Add ``--dashboard HOST:PORT`` and ``--no-dashboard`` to a run's CLI parser."""
    p.add_argument(
        "--dashboard",
        default=DEFAULT,
        metavar="HOST:PORT",
        help=f"serve the live dashboard here (default {DEFAULT}: a free port, printed)",
    )
    p.add_argument(
        "--no-dashboard",
        dest="dashboard",
        action="store_const",
        const=None,
        help="do not serve the dashboard",
    )


def run_with_dashboard(
    launcher: Launcher,
    address: str | None,
    *,
    monitor: Callable[[], RunMonitor | None],
    title: str,
    on_policy: bool,
    expected: Sequence[str],
    out: TextIO,
    members: Callable[[Controller], Members] | None = None,
) -> LaunchResult:
    """Run ``launcher`` to its end (blocking) with the dashboard served at ``address``
    during the run (none when ``None``); print its URL to ``out`` once it listens.

    Args:
        launcher: the run's launcher; its controller is the dashboard's source.
        address: ``HOST:PORT`` or ``None``.
        monitor: returns the run's monitor (``None`` until it exists).
        title: the page's title.
        on_policy: how accounting counts consumed samples.
        expected: the names of the run's services.
        out: where the URL is printed.
        members: a population run's members, from the run's controller (each drawn and
            accounted on its own).

    Raises:
        ConfigError: for a bad address or one that cannot be listened on, before the run.
    """
    if address is None:
        return run_launcher(launcher)
    host, port = parse_address(address)

    async def main() -> LaunchResult:
        from tianji.dashboard.server import Dashboard

        controller = launcher.controller
        dash = Dashboard(
            controller,
            monitor,
            title=title,
            on_policy=on_policy,
            expected=expected,
            members=None if members is None else lambda: members(controller),
        )
        url = await dash.start(host, port)
        print(f"dashboard: {url}", file=out, flush=True)
        try:
            return await launcher.run()
        finally:
            await dash.stop()

    return run(main())


class PlannedRun(Protocol):
    """What :func:`launch_plan` reads of a :class:`~tianji.run.plan.RunPlan`."""

    config: RunConfig
    out: TextIO
    dashboard: str | None

    @property
    def on_policy(self) -> bool:
        """Whether the run's algorithm is on-policy (what the lag chart shows)."""

    @property
    def specs(self) -> Sequence[Any]:
        """The run's service specs (each with a ``name``)."""

    @property
    def monitor(self) -> RunMonitor | None:
        """The run's monitor, once it exists."""


def launch_plan(plan: PlannedRun, launcher: Launcher) -> LaunchResult:
    """Run a planned run's ``launcher`` to its end (blocking), with the live dashboard at
    ``plan.dashboard`` when that is set (see :func:`run_with_dashboard`); a population
    plan's members (``dashboard_members``) are drawn each on its own."""
    size = plan.config.population.size
    title = f"{plan.config.algorithm} on {plan.config.env.id}"
    return run_with_dashboard(
        launcher,
        plan.dashboard,
        monitor=lambda: plan.monitor,
        title=title + (f", population of {size}" if size > 1 else ""),
        on_policy=plan.on_policy,
        expected=[s.name for s in plan.specs],
        out=plan.out,
        members=getattr(plan, "dashboard_members", None),
    )
