"""A population run on the dashboard: each member's counters, books and balance metrics on
their own (its view of the controller), the members' curves drawn one line each."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from test_dashboard import STATIC, FakeMonitor, _chromium, advance, beat, hb, register

from tianji.dashboard.model import member_samples, sample, status
from tianji.rl.balance import BalanceConfig
from tianji.run.members import MemberController, PopulationMonitor
from tianji.runtime.controller import Controller
from tianji.runtime.scope import full_name
from tianji.services.balancer import Balancer


def _population(steps: dict[str, int]) -> tuple[Controller, dict[str, MemberController]]:
    """One controller with each member's actor, buffer and learner under full names, having
    reported ``steps[member]`` times; each member's view has its own balancer."""
    controller = Controller()
    views = {}
    for k, (scope, step) in enumerate(steps.items()):
        cfg = BalanceConfig(
            on_policy=True, max_policy_lag=2, batch_samples=512, fragment_samples=256
        )
        views[scope] = MemberController(controller, scope, [Balancer(cfg)])
        for pid, (name, role) in enumerate(
            [("actor-0", "actor"), ("buffer-0", "buffer"), ("learner-0", "learner")]
        ):
            register(controller, full_name(scope, name), role, 100 * k + pid)
        local = Controller()
        advance(local, step)
        for name, ev in local.heartbeats.items():
            beat(controller, hb(full_name(scope, name), ev.role, dict(ev.counters)))
    return controller, views


def test_each_members_counters_and_books_are_its_own() -> None:
    controller, views = _population({"m0": 2, "m1": 5})
    monitors = {"m0": FakeMonitor(), "m1": FakeMonitor()}
    monitors["m0"].finish(512, -100.0, -80.0)
    monitors["m1"].finish(1280, -60.0)
    members = {m: (views[m], monitors[m]) for m in views}
    rows = member_samples(members, 1.0)
    assert rows["m0"]["env_steps"] == 512 and rows["m0"]["mean_return"] == -90.0
    assert rows["m1"]["learner_updates"] == 5 and rows["m1"]["episodes"] == 1
    body = status(controller, PopulationMonitor(lambda: list(monitors.values())),
                  on_policy=True, members=members)  # fmt: skip
    books = body["accounting"]
    assert books["balanced"] is all(b["balanced"] for b in books["members"].values())
    assert books["members"]["m0"]["produced"] == 512 and books["members"]["m1"]["produced"] == 1280
    assert books["members"]["m1"]["consumed"] == 1280  # m0's learner's samples are not in it
    assert set(body["controller"]["members"]) == {"m0", "m1"}
    counters = body["counters"]
    assert counters["env_steps"] == 1792 and counters["mean_return"] == -60.0  # the best member
    assert set(counters["members"]) == {"m0", "m1"}
    assert sample(controller, None, 0.0).members is None  # a single policy has none
    assert {s["name"] for s in body["services"]} >= {"m0.learner-0", "m1.actor-0"}


def test_the_members_chart_draws_one_line_per_member(tmp_path: Path) -> None:
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    rows = [
        {"members": {m: {"env_steps": 1000 * t, "mean_return": -500.0 + 40 * t + 10 * k}
                     for k, m in enumerate(["m0", "m1", "m2"])}}
        for t in range(1, 6)
    ]  # fmt: skip
    page = tmp_path / "members.html"
    page.write_text(
        '<!doctype html><html><head><meta charset="utf-8"></head><body>'
        '<figure id="members-figure" hidden>'
        '<span id="members-legend"></span><svg id="plot-members" viewBox="0 0 560 240"></svg>'
        f'</figure><script src="{(STATIC / "dashboard.js").as_uri()}"></script>'
        f"<script>drawMembers({json.dumps(rows)});</script></body></html>"
    )
    dom = _chromium(
        "--allow-file-access-from-files", "--virtual-time-budget=2000", "--dump-dom",
        page.as_uri(), profile=tmp_path / "p",
    )  # fmt: skip
    lines = re.findall(r'<polyline class="(c\d)"[^>]*data-series="(m\d)" data-points="(\d+)"', dom)
    assert lines == [("c0", "m0", "5"), ("c1", "m1", "5"), ("c2", "m2", "5")], dom[:3000]
    assert "— m2" in dom and 'id="members-figure" hidden' not in dom
