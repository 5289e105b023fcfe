"""``tianji bench scale``: its plan, its goals and tables from rows, the simulated run's
roles, and real control rows (direct and through heartbeat aggregators) and one real
fan-out row with a few services (the full figures come from ``tianji bench scale``;
``--quick`` runs in ``.ci/run``)."""

from __future__ import annotations

import pytest
from netns import Bridge

from tianji.bench.scale_control import measure_control, roles_of
from tianji.bench.scale_fanout import measure_fanout
from tianji.bench.scale_report import MB, goals, markdown, plan
from tianji.cli import main


def test_the_full_plan_covers_the_issue_s_counts_and_quick_stays_small() -> None:
    full, quick = plan(False, Bridge), plan(True, Bridge)
    assert full.services == (100, 1000, 10_000)
    assert full.actors == (1, 2, 4, 8, 16, 32)
    assert full.subscribers == (1, 8, 32, 64) and full.hosts == (2, 4)
    assert full.sizes == [MB, 10 * MB, 100 * MB]
    assert max(quick.services) <= 1000 and quick.hosts == () and max(quick.actors) <= 2
    assert plan(False).hosts == ()  # tianji bench scale: one host (no namespaces)


def test_a_simulated_run_has_its_four_fixed_services_and_actors() -> None:
    roles = roles_of(7)
    assert [r for _, r in roles].count("actor") == 3
    assert {"params", "buffer", "learner", "monitor"} <= {r for _, r in roles}
    with pytest.raises(ValueError, match="services=4"):
        roles_of(4)


def _rows() -> list[dict]:
    return [
        {"part": "control", "services": 1000, "aggregators": 0, "controller_cpu_share": 0.04,
         "decision_p50_ms": 2.0, "decision_p99_ms": 60.0, "register_p50_ms": 1.0,
         "register_p99_ms": 3.0, "join_s": 1.2, "controller_rss_mb": 300.0,
         "heartbeats_per_s": 1000.0},
        {"part": "control", "services": 1000, "aggregators": 2, "controller_cpu_share": 0.06,
         "aggregator_cpu_share": 0.05, "decision_p50_ms": 12.0, "decision_p99_ms": 40.0,
         "register_p50_ms": 1.0, "register_p99_ms": 3.0, "join_s": 1.2,
         "controller_rss_mb": 300.0, "heartbeats_per_s": 1000.0},
        {"part": "control", "services": 10_000, "aggregators": 0, "controller_cpu_share": 0.7,
         "decision_p50_ms": 20.0, "decision_p99_ms": 300.0, "register_p50_ms": 5.0,
         "register_p99_ms": 30.0, "join_s": 20.0, "controller_rss_mb": 900.0,
         "heartbeats_per_s": 10000.0},
        {"part": "actors", "actors": 1, "env_steps_per_s": 1000.0},
        {"part": "actors", "actors": 2, "env_steps_per_s": 1700.0},
        {"part": "actors", "actors": 32, "env_steps_per_s": 1500.0},
        {"part": "fanout", "subscribers": 1, "hosts": 1, "bytes": MB,
         "seconds_to_all": 0.01, "params_bytes_sent": MB},
        {"part": "fanout", "subscribers": 64, "hosts": 1, "bytes": MB,
         "seconds_to_all": 0.05, "params_bytes_sent": 64 * MB},
        {"part": "fanout", "subscribers": 8, "hosts": 2, "bytes": MB,
         "seconds_to_all": 0.02, "params_bytes_sent": 2 * MB},
        {"part": "fanout", "subscribers": 8, "hosts": 3, "bytes": MB,
         "seconds_to_all": 0.02, "params_bytes_sent": 2 * MB},
        {"part": "fanout", "label": "fanout 32", "error": "RuntimeError: boom"},
    ]  # fmt: skip


def test_goals_compare_rows_of_one_run() -> None:
    by_goal = {g["goal"]: g for g in goals(_rows())}
    cpu = by_goal["controller CPU share at 1,000 services, direct <= 0.05 core"]
    assert (cpu["measured"], cpu["status"]) == (0.04, "PASS")
    agg = by_goal["controller CPU share at 1,000 services, with aggregators <= 0.05 core"]
    assert (agg["measured"], agg["status"]) == (0.06, "MISS")
    big = "controller CPU share at 10,000 services, {} <= 0.5 core"
    assert by_goal[big.format("direct")]["status"] == "MISS"
    assert by_goal[big.format("with aggregators")]["status"] == "N/A"  # no such row
    late = "decision latency p99 at 1,000 services, {} <= 50 ms"
    assert by_goal[late.format("direct")]["status"] == "MISS"
    assert by_goal[late.format("with aggregators")]["status"] == "PASS"
    fan = by_goal["weights of 1 MB to 64 local actors <= 2 x to 1"]
    assert (fan["measured"], fan["status"]) == (5.0, "MISS")
    local = next(g for g in by_goal.values() if "64 subscribers on 1 host(s)" in g["goal"])
    assert (local["measured"], local["status"]) == (64.0, "MISS")
    # 2 hosts: the publisher's and one with the 8 subscribers, which got 2 copies
    hosts = next(g for g in by_goal.values() if "8 subscribers on 1 host(s)" in g["goal"])
    assert (hosts["measured"], hosts["status"]) == (2.0, "MISS")
    two = next(g for g in by_goal.values() if "8 subscribers on 2 host(s)" in g["goal"])
    assert (two["measured"], two["status"]) == (1.0, "PASS")  # one copy per host
    assert by_goal["sampling: 2 actor processes >= 1.6 x one"]["status"] == "PASS"
    assert by_goal["sampling: 32 actor processes >= 0.9 x the best count"]["measured"] == 0.8824
    assert all(g["status"] == "N/A" for g in goals([]))


def test_the_table_shows_every_part_and_the_failed_cell() -> None:
    rows = _rows()
    text = markdown({"rows": rows, "goals": goals(rows)})
    assert "| 10,000 | none | 0.700 | 20.0 / 300.0 |" in text
    assert "| 1,000 | 2 (0.050 core) | 0.060 | 12.0 / 40.0 |" in text
    assert "| 2 | 1,700 |" in text
    assert "| 64 | 1 | 1 | 0.0500 | 64.0 |" in text
    assert "error: RuntimeError: boom" in text and "| MISS |" in text


def test_an_unknown_part_is_a_usage_error_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "scale", "--parts", "control,everything"]) == 2
    assert "everything" in capsys.readouterr().err


def test_bridge_hosts_get_distinct_addresses_and_a_spare_one() -> None:
    b = Bridge(4, tag="t")
    ips = [b.ip(h) for h in range(4)]
    assert len(set(ips)) == 4 and b.spare_ip() not in ips
    assert b.prefix(2) == ["ip", "netns", "exec", "tjth2"]
    with pytest.raises(ValueError, match="hosts=0"):
        Bridge(0)


def test_a_small_control_row_and_fanout_row_are_measured_for_real() -> None:
    row = measure_control(12, seconds=2.0, warmup=0.5)
    assert row["part"] == "control" and row["registered"] == 12
    assert row["heartbeats_per_s"] > 5 and row["decision_p99_ms"] is not None
    assert row["register_p50_ms"] is not None and 0 < row["controller_cpu_share"] < 2
    through = measure_control(12, seconds=2.0, warmup=0.5, aggregators=True)
    assert through["aggregators"] == 2 and through["registered"] == 14  # the services, and them
    assert through["batches_per_s"] > 0 and through["heartbeats_per_s"] > 5
    assert through["aggregator_heartbeats_out"] > 0 and through["decision_p99_ms"] is not None
    (fan,) = measure_fanout(2, [100_000])
    assert fan["subscribers"] == 2 and fan["hosts"] == 1 and fan["seconds_to_all"] > 0
    assert fan["params_bytes_sent"] >= 2 * 100_000
