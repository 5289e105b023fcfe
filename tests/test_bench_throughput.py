"""``tianji bench throughput``: its plan, its steady-state window, its goals and report, and
its run configs kept equal to the examples (the measuring itself runs in ``.ci/run``)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from tianji.bench.spawn import run_json_child
from tianji.bench.throughput import ALGO, ENVS, FRAGMENT, Cell, plan_cells, run_config, steady_rate
from tianji.bench.throughput_report import goals, markdown
from tianji.cli import main

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_the_full_plan_has_every_inference_mode_both_envs_the_peer_and_the_ceiling() -> None:
    cells = plan_cells(["cartpole", "pong"], peer=True, quick=False)
    pong = [c for c in cells if c.env == "pong"]
    services = {(c.inference_count, c.splits) for c in pong if c.inference == "service"}
    assert services == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert {c.mode for c in pong if c.system == "tianji"} == {"relaxed", "sync", "sampling"}
    assert {c.system for c in cells} == {"tianji", "bare", "sample-factory"}
    quick = plan_cells(["cartpole"], peer=False, quick=True)
    assert {c.system for c in quick} == {"tianji", "bare"}


def test_a_cell_config_is_the_example_with_the_cell_s_inference_and_mode() -> None:
    example = tomllib.loads((EXAMPLES / "pong_ppo.toml").read_text())
    data = run_config(Cell("tianji", "pong", "service", 2, 2, "sync"), 30.0)
    assert data["env"] == example["env"] == ENVS["pong"]
    assert ALGO["pong"] == example["algo"]
    assert FRAGMENT["pong"] == example["actors"]["fragment_length"]
    assert {k: v for k, v in data["learner"].items()} == example["learner"]
    assert data["actors"]["splits"] == 2 and data["inference"] == {"count": 2}
    assert data["controller"]["mode"] == "sync" and data["algo"]["fragments_per_batch"] == 2
    cartpole = tomllib.loads((EXAMPLES / "cartpole_ppo.toml").read_text())
    assert ALGO["cartpole"] == cartpole["algo"]


def rows_at(rate: float, times: list[float], start: float = 4.0) -> list[dict]:
    steps = [0 if t < start else int(rate * (t - start)) + 100 for t in times]
    return [
        {"t": t, "env_steps": s, "services": {"up": 7}} for t, s in zip(times, steps, strict=True)
    ]


def test_the_steady_rate_starts_after_the_warm_up_from_the_first_steps() -> None:
    rows = rows_at(500.0, [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0])
    rows.append({"t": 15.0, "env_steps": 10**6, "services": None})  # after the services left
    rate, seconds, last = steady_rate(rows, warmup=4.0)
    assert rate == pytest.approx(500.0, rel=0.01)
    assert seconds == pytest.approx(6.0) and last["t"] == 14.0
    with pytest.raises(ValueError, match="run longer"):
        steady_rate(rows, warmup=30.0)


def row(system: str, env: str, rate: float, inference: str = "local", mode: str = "relaxed"):
    return {
        "system": system,
        "env": env,
        "inference": inference if system == "tianji" else None,
        "mode": mode if system == "tianji" else None,
        "label": f"{system} {inference} {mode}",
        "env_steps_per_s": rate,
        "frames_per_s": rate * (4 if "Pong" in env else 1),
    }


def test_goals_compare_the_best_rows_of_each_side_and_say_when_one_is_missing() -> None:
    rows = [
        row("tianji", "ALE/Pong-v5", 300.0),
        row("tianji", "ALE/Pong-v5", 390.0, "service"),
        row("tianji", "ALE/Pong-v5", 500.0, "local", "sampling"),
        row("sample-factory", "ALE/Pong-v5", 200.0),
        row("bare", "ALE/Pong-v5", 700.0),
        row("tianji", "CartPole-v1", 1000.0),
    ]
    by_goal = {g["goal"]: g for g in goals(rows)}
    pong_sf = by_goal["ALE/Pong-v5: tianji best relaxed >= 1.5 x sample-factory frames/s"]
    assert pong_sf["measured"] == pytest.approx(1.95) and pong_sf["status"] == "PASS"
    service = by_goal["ALE/Pong-v5: inference service (best) >= 1.2 x local policies"]
    assert service["measured"] == pytest.approx(1.3) and service["status"] == "PASS"
    bare = by_goal["ALE/Pong-v5: tianji sampling (no learning) >= 0.8 x bare AsyncVectorEnv"]
    assert bare["measured"] == pytest.approx(0.714, abs=1e-3) and bare["status"] == "MISS"
    cartpole = by_goal["CartPole-v1: tianji best relaxed >= 2 x sample-factory env steps/s"]
    assert cartpole["status"] == "N/A"
    table = markdown({"seconds": 60, "warmup": 20, "rows": rows, "goals": goals(rows)})
    assert "| tianji service relaxed | 390 | 1,560 | 1.30x |" in table


def test_an_unknown_env_or_a_missing_peer_interpreter_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "throughput", "--envs", "cartpole,breakout"]) == 2
    assert "breakout" in capsys.readouterr().err
    assert main(["bench", "throughput", "--peer-python", "/no/such/python"]) == 2
    assert "/no/such/python" in capsys.readouterr().err


def test_a_bench_child_gives_its_last_json_line_or_its_exit_code_and_last_words() -> None:
    ok = run_json_child(
        [sys.executable, "-c", "import sys; print('{\"a\": 1}'); print(sys.stdin.read())"],
        '{"b": 2}',
        timeout=30,
    )
    assert ok.result == {"b": 2} and ok.error is None
    failed = run_json_child(
        [sys.executable, "-c", "import sys; print('{}'); sys.exit('the env blew up')"],
        None,
        timeout=30,
    )
    assert failed.result is None
    assert failed.error is not None and failed.error.startswith("exit 1:")
    assert "the env blew up" in failed.error
