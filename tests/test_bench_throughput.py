"""``tianji bench throughput``: its plan, its steady-state window, its goals and report, and
its run configs kept equal to the examples (the measuring itself runs in ``.ci/run``)."""

from __future__ import annotations

import itertools
import sys
import tomllib
from pathlib import Path

import pytest
from peers import build_parser as build_peers_parser
from torch import nn

from tianji.bench.spawn import run_json_child
from tianji.bench.throughput import (
    ALGO,
    ENVS,
    FRAGMENT,
    WORKS,
    Cell,
    model_params,
    plan_cells,
    run_config,
    steady_rate,
)
from tianji.bench.throughput_report import goals, markdown
from tianji.bench.throughput_work import EQUAL, EqualWork, sf_flags, tianji_overrides
from tianji.cli import main
from tianji.rl.config import RunConfig, build_dataclass

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_the_full_plan_has_every_inference_mode_both_envs_the_peer_and_the_ceiling() -> None:
    cells = plan_cells(["cartpole", "pong"], peer=True, quick=False)
    pong = [c for c in cells if c.env == "pong"]
    services = {(c.inference_count, c.splits) for c in pong if c.inference == "service"}
    assert services == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert {c.mode for c in pong if c.system == "tianji"} == {"relaxed", "sync", "sampling"}
    assert {c.system for c in cells} == {"tianji", "bare", "sample-factory"}
    for env in ("cartpole", "pong"):  # per env: one equal-work pair, the peer's own settings
        mine = [c for c in cells if c.env == env]
        assert sorted(c.system for c in mine if c.work == "equal") == ["sample-factory", "tianji"]
        assert [c.system for c in mine if c.work == "peer-defaults"] == ["sample-factory"]
        assert len({c.label for c in mine}) == len(mine)  # every row tells which it is
    assert {c.work for c in cells} == set(WORKS)
    quick = plan_cells(["cartpole"], peer=False, quick=True)
    assert {c.system for c in quick} == {"tianji", "bare"}
    assert {c.work for c in quick} == {"tianji-defaults"}


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


def test_the_equal_work_cell_is_the_example_with_one_learner_thread_and_one_inference_process() -> (
    None
):
    pong = run_config(Cell("tianji", "pong", "service", 1, 1, work="equal"), 30.0)
    assert pong["learner"]["torch_threads"] == 1  # the example's learner has 2
    assert pong["actors"]["inference"] == "service" and pong["inference"] == {"count": 1}
    assert pong["actors"]["fragment_length"] == 128
    assert pong["algo"]["fragments_per_batch"] * 128 * 4 == 1024
    assert pong["algo"]["update_epochs"] == 4 and pong["algo"]["num_minibatches"] == 4
    cartpole = run_config(Cell("tianji", "cartpole", "service", 1, 1, work="equal"), 30.0)
    assert cartpole["algo"]["hidden"] == [64, 64] and not cartpole["algo"]["shared_network"]
    assert cartpole["algo"]["update_epochs"] == 5 and cartpole["algo"]["num_minibatches"] == 2
    # the same cell of tianji's own settings keeps the example's learner
    assert (
        run_config(Cell("tianji", "pong", "service", 1, 1), 30.0)["learner"]["torch_threads"] == 2
    )
    with pytest.raises(ValueError, match="whole number"):
        tianji_overrides(
            EqualWork(
                torso="mlp",
                rollout=64,
                minibatch=100,
                minibatches=2,
                epochs=1,
                normalize_obs=False,
                normalize_returns=False,
            ),
            4,
        )


def _mlp(sizes: list[int]) -> int:
    return sum(a * b + b for a, b in itertools.pairwise(sizes))


def equal_net(env: str) -> tuple[int, set[type]]:
    """The equal-work tianji cell's network: trainable parameters, activation types."""
    cell = Cell("tianji", env, "service", 1, 1, work="equal")
    config: RunConfig = build_dataclass(RunConfig, run_config(cell, 10.0), "")
    from tianji.services.common import make_algorithm

    net = make_algorithm(config, seed=0, device="cpu").net
    acts = {type(m) for m in net.modules() if isinstance(m, nn.Tanh | nn.ReLU | nn.ELU)}
    return model_params(config), acts


def test_tianji_s_equal_work_networks_are_the_ones_sample_factory_is_told_to_build() -> None:
    # CartPole: separate 4-64-64 actor (2 logits) and critic (1 value), tanh; SF built 9,155
    # parameters from the same flags in the smoke run
    params, acts = equal_net("cartpole")
    assert params == _mlp([4, 64, 64, 2]) + _mlp([4, 64, 64, 1]) == 9155
    assert acts == {nn.Tanh} and EQUAL["cartpole"].activation == "tanh"
    cartpole = " ".join(sf_flags(EQUAL["cartpole"]))
    assert "--encoder_mlp_layers 64 64 --nonlinearity=tanh" in cartpole
    assert "--actor_critic_share_weights=False" in cartpole
    assert "--batch_size=256 --num_batches_per_epoch=2 --num_epochs=5" in cartpole
    # Pong: SF's convnet_atari (32x8/4, 64x4/2, 64x3/1) + 512, ReLU, shared, two heads
    pytest.importorskip("ale_py")
    params, acts = equal_net("pong")
    convs = (4 * 8 * 8 * 32 + 32) + (32 * 4 * 4 * 64 + 64) + (64 * 3 * 3 * 64 + 64)
    assert params == convs + _mlp([7 * 7 * 64, 512]) + _mlp([512, 6]) + _mlp([512, 1])
    assert acts == {nn.ReLU} and EQUAL["pong"].activation == "relu"
    pong = " ".join(sf_flags(EQUAL["pong"]))
    assert "--encoder_conv_architecture=convnet_atari --encoder_conv_mlp_layers 512" in pong
    assert "--nonlinearity=relu --actor_critic_share_weights=True" in pong


def rows_at(rate: float, times: list[float], start: float = 4.0) -> list[dict]:
    steps = [0 if t < start else int(rate * (t - start)) + 100 for t in times]
    return [
        # the learner consumes 80% of what the actors step
        {"t": t, "env_steps": s, "samples_consumed": s * 4 // 5, "services": {"up": 7}}
        for t, s in zip(times, steps, strict=True)
    ]


def test_the_steady_rate_starts_after_the_warm_up_from_the_first_steps() -> None:
    rows = rows_at(500.0, [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0])
    after = {"t": 15.0, "env_steps": 10**6, "samples_consumed": 10**6, "services": None}
    rows.append(after)  # after the services left
    steady = steady_rate(rows, warmup=4.0)
    assert steady.env_steps_per_s == pytest.approx(500.0, rel=0.01)
    assert steady.consumed_per_s == pytest.approx(400.0, rel=0.01)
    assert steady.seconds == pytest.approx(6.0) and steady.last["t"] == 14.0
    with pytest.raises(ValueError, match="run longer"):
        steady_rate(rows, warmup=30.0)


def row(
    system: str,
    env: str,
    rate: float | None,
    inference: str = "local",
    mode: str = "relaxed",
    work: str = "tianji-defaults",
    consumed: float | None = None,
):
    skip = 4 if "Pong" in env else 1
    return {
        "system": system,
        "env": env,
        "inference": inference if system == "tianji" else None,
        "mode": mode if system == "tianji" else None,
        "work": work,
        "label": f"{system} {inference} {mode} {work}",
        "env_steps_per_s": rate,
        "frames_per_s": None if rate is None else rate * skip,
        "consumed_per_s": consumed,
        "consumed_frames_per_s": None if consumed is None else consumed * skip,
    }


def test_goals_compare_the_best_rows_of_each_side_and_say_when_one_is_missing() -> None:
    pong = "ALE/Pong-v5"
    rows = [
        row("tianji", pong, 300.0, consumed=290.0),
        row("tianji", pong, 390.0, "service", consumed=380.0),
        row("tianji", pong, 500.0, "local", "sampling", consumed=480.0),
        # the equal-work pair: tianji steps more than its learner consumes, and a better
        # equal-work rate than its own best row must not enter the other goals
        row("tianji", pong, 450.0, "service", work="equal", consumed=240.0),
        row("sample-factory", pong, None, work="equal", consumed=200.0),
        row("sample-factory", pong, None, work="peer-defaults", consumed=100.0),
        row("bare", pong, 700.0),
        row("tianji", "CartPole-v1", 1000.0, consumed=1000.0),
        row("sample-factory", "CartPole-v1", None, work="peer-defaults", consumed=100.0),
    ]
    by_goal = {g["goal"]: g for g in goals(rows)}
    pong_sf = by_goal[f"{pong}: tianji >= 1.5 x sample-factory consumed frames/s, equal work"]
    assert pong_sf["measured"] == pytest.approx(1.2) and pong_sf["status"] == "MISS"
    assert "equal" in pong_sf["note"] and "peer-defaults" not in pong_sf["note"]
    service = by_goal[f"{pong}: inference service (best) >= 1.2 x local policies"]
    assert service["measured"] == pytest.approx(1.3) and service["status"] == "PASS"
    bare = by_goal[f"{pong}: tianji sampling (no learning) >= 0.8 x bare (2 processes x 4 envs)"]
    assert bare["measured"] == pytest.approx(0.714, abs=1e-3) and bare["status"] == "MISS"
    # the peer's own settings alone do not make a goal: no equal-work pair, no ratio
    cartpole = by_goal["CartPole-v1: tianji >= 2 x sample-factory consumed env steps/s, equal work"]
    assert cartpole["status"] == "N/A"
    table = markdown({"seconds": 60, "warmup": 20, "rows": rows, "goals": goals(rows)})
    # consumed/s 380 against tianji local's 290
    assert "| 390 | 380 | 1,520 | 1.31x |" in table
    assert "| sample-factory local relaxed equal | equal |" in table
    assert "|  | 200 | 800 | 0.69x |" in table  # Sample Factory: its learner's count only


def test_an_unknown_env_or_a_missing_peer_interpreter_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "throughput", "--envs", "cartpole,breakout"]) == 2
    assert "breakout" in capsys.readouterr().err
    peers = build_peers_parser()  # benchmarks/peers.py: Sample Factory beside tianji
    assert main(["throughput", "--peer-python", "/no/such/python"], peers) == 2
    assert "/no/such/python" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # tianji bench throughput alone runs no peer
        main(["bench", "throughput", "--peer-python", sys.executable])
    assert main(["bench", "throughput", "--work", "equal,same-ish"]) == 2
    assert "same-ish" in capsys.readouterr().err


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


def test_a_brief_plan_keeps_the_quoted_rows_of_each_env() -> None:
    from tianji.bench.throughput import plan_cells

    cells = plan_cells(["cartpole", "pong"], peer=True, quick=False, brief=True)
    for env in ("cartpole", "pong"):
        mine = [(c.system, c.work) for c in cells if c.env == env]
        assert mine == [
            ("tianji", "tianji-defaults"),
            ("bare", "tianji-defaults"),
            ("tianji", "equal"),
            ("sample-factory", "equal"),
            ("sample-factory", "peer-defaults"),
        ]


def test_the_checkout_s_peers_script_runs_sample_factory_with_the_equal_work_flags() -> None:
    from peers import sample_factory

    from tianji.bench.throughput import Cell

    command = sample_factory("/sf/bin/python")
    cmd = command(Cell("sample-factory", "pong", work="equal"), 60.0, 20.0, "/tmp/x")
    assert cmd[0] == "/sf/bin/python" and Path(cmd[1]).name == "sf_runner.py"
    assert Path(cmd[1]).is_file()
    assert cmd[-1] == "--sf-args=" + " ".join(sf_flags(EQUAL["pong"]))
    mine = command(Cell("sample-factory", "cartpole", work="peer-defaults"), 60.0, 20.0, "/t")
    assert not any(c.startswith("--sf-args") for c in mine)
