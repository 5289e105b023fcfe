"""The controller's balance shell: heartbeats in, commands out; metrics and accounting."""

from __future__ import annotations

import asyncio

import pytest

from tianji.rl.algorithm import BufferSpec
from tianji.rl.balance import UNLIMITED, BalanceConfig
from tianji.rl.events import (
    GrantConsumption,
    GrantProduction,
)
from tianji.rl.run_balance import balance_config
from tianji.run.config import load_config
from tianji.runtime.errors import ConfigError
from tianji.runtime.events import Event, Heartbeat
from tianji.services.balancer import Balancer


def hb(name: str, role: str, counters: dict[str, int] = {}, **gauges: float) -> Heartbeat:  # noqa: B006
    return Heartbeat(
        name=name,
        role=role,
        state="running",
        counters=dict(counters),
        gauges=dict(gauges),
        queue_depths={},
        sent_at=0.0,
    )


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Event]] = []

    async def __call__(self, name: str, ev: Event) -> bool:
        self.sent.append((name, ev))
        return True

    def of(self, kind: type[Event]) -> list[str]:
        return [n for n, ev in self.sent if isinstance(ev, kind)]


def on_policy_run(inserted: int, consumed: int, version: int, actor_version: int) -> dict:
    return {
        "buffer-0": hb("buffer-0", "buffer", {"samples_inserted": inserted}),
        "learner-0": hb(
            "learner-0", "learner", {"samples_consumed": consumed, "learner_updates": version}
        ),
        "actor-0": hb("actor-0", "actor", policy_version=actor_version),
        "actor-1": hb("actor-1", "actor", policy_version=actor_version),
    }


def on_policy_actors(produced: int, sent: int, version: int) -> dict:
    return {
        f"actor-{i}": hb(
            f"actor-{i}",
            "actor",
            {"samples_produced": produced, "fragments_sent": sent},
            policy_version=version,
        )
        for i in range(2)
    }


def on_policy_balancer(send: Recorder, **kw: float) -> Balancer:
    """2 fragments of 512 per batch, lag target 1 within a bound of 2 (the PPO example's
    shape): 4 fragments may be outstanding."""
    cfg = BalanceConfig(
        on_policy=True,
        max_policy_lag=2,
        lag_target=1,
        batch_samples=1024,
        fragment_samples=512,
        **kw,  # type: ignore[arg-type]
    )
    return Balancer(cfg, send)


def test_on_policy_producers_get_production_grants_only_on_changes() -> None:
    async def scenario() -> None:
        send = Recorder()
        balancer = on_policy_balancer(send)
        start = {**on_policy_run(0, 0, 0, 0), **on_policy_actors(0, 0, 0)}
        await balancer.update(start, start)
        await balancer.update(start, start)  # unchanged: nothing sent again
        grants = [
            (n, ev.limit, ev.min_version) for n, ev in send.sent if isinstance(ev, GrantProduction)
        ]
        assert grants == [("actor-0", 2, 0), ("actor-1", 2, 0)]  # 4 = 2 batches outstanding
        assert balancer.idle == set()
        # each sent both: 4 fragments buffered, the learner at version 0: nothing more
        full = {**on_policy_run(4096, 0, 0, 0), **on_policy_actors(1024, 2, 0)}
        await balancer.update(full, full)
        assert len(send.of(GrantProduction)) == 2 and balancer.idle == {"actor-0", "actor-1"}
        # one batch consumed: two more, collected with weights 1 (consumed at version 2)
        later = {**on_policy_run(4096, 1024, 1, 1), **on_policy_actors(1024, 2, 1)}
        await balancer.update(later, later)
        new = [(n, ev.limit, ev.min_version) for n, ev in send.sent[2:]]
        assert new == [("actor-0", 3, 1), ("actor-1", 3, 1)]
        assert balancer.commands == {"grant_production": 4}

    asyncio.run(scenario())


def test_relaxed_off_policy_producers_get_grants_only_while_in_the_band() -> None:
    async def scenario() -> None:
        send = Recorder()
        cfg = BalanceConfig(
            replay_ratio=2.0,
            tolerance=0.5,
            min_replay_size=100,
            batch_samples=32,
            fragment_samples=16,
        )
        balancer = Balancer(cfg, send)

        def run(inserted: int, consumed: int) -> dict:
            return {
                "buffer-0": hb("buffer-0", "buffer", {"samples_inserted": inserted}),
                "learner-0": hb("learner-0", "learner", {"samples_consumed": consumed}),
                "actor-0": hb("actor-0", "actor", policy_version=1),
                "actor-1": hb("actor-1", "actor", policy_version=1),
            }

        ahead = run(1100, 1000)  # ratio 1.0, the band is [1.5, 2.5]: no grant
        await balancer.update(ahead, ahead)
        assert not send.of(GrantProduction) and balancer.idle == {"actor-0", "actor-1"}
        balanced = run(600, 1000)
        await balancer.update(balanced, balanced)
        await balancer.update(balanced, balanced)  # unchanged: nothing sent again
        assert sorted(send.of(GrantProduction)) == ["actor-0", "actor-1"]
        assert not balancer.idle and balancer.commands["grant_production"] == 2

    asyncio.run(scenario())


def test_the_watchdog_names_who_waits_for_what_when_nothing_moves() -> None:
    async def scenario() -> None:
        send = Recorder()
        balancer = on_policy_balancer(send, watchdog_s=0.05)
        start = {**on_policy_run(0, 0, 0, 0), **on_policy_actors(0, 0, 0)}
        await balancer.update(start, start)  # 2 fragments granted to each
        stuck = {**on_policy_run(4096, 0, 0, 0), **on_policy_actors(1024, 2, 0)}
        await balancer.update(stuck, stuck)  # the learner does not consume them
        assert balancer.metrics(stuck)["stalled"] is None
        await asyncio.sleep(0.06)
        await balancer.update(stuck, stuck)
        stalled = balancer.metrics(stuck)["stalled"]
        assert stalled is not None and stalled["seconds"] >= 0.05
        assert "actor-0 waits for a grant (sent 2 of 2 granted)" in stalled["state"]
        assert "learner-0 v0 consumed 0" in stalled["state"]
        assert "buffer-0" in stalled["state"] and balancer.stalls == 1
        moving = {**on_policy_run(4096, 1024, 1, 0), **on_policy_actors(1024, 2, 0)}
        await balancer.update(moving, moving)
        assert balancer.metrics(moving)["stalled"] is None and balancer.stalls == 1

    asyncio.run(scenario())


def test_an_off_policy_learner_gets_a_consumption_grant_that_follows_inserts() -> None:
    async def scenario() -> None:
        send = Recorder()
        cfg = BalanceConfig(
            replay_ratio=2.0,
            tolerance=0.5,
            min_replay_size=100,
            batch_samples=32,
            fragment_samples=16,
        )
        balancer = Balancer(cfg, send)
        for inserted in (50, 1100, 2100):
            run = {
                "buffer-0": hb("buffer-0", "buffer", {"samples_inserted": inserted}),
                "learner-0": hb("learner-0", "learner", {"samples_consumed": 0}),
                "actor-0": hb("actor-0", "actor", policy_version=0),
            }
            await balancer.update(run, run)
        grants = [ev.limit for _, ev in send.sent if isinstance(ev, GrantConsumption)]
        assert grants[0] == 0  # filling: the learner waits
        assert grants[1] < grants[2]  # more inserted, more may be consumed
        # the band's upper edge: ratio x inserted + tolerance x one round of inserts
        # (1 actor x 16) + one step of each side (2.0 x 16 + 32)
        assert grants[2] == int((2100 - 100) * 2.0 + 0.5 * 16 + 2.0 * 16 + 32)

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", ["sync", "unbalanced"])
def test_on_policy_sync_and_unbalanced_runs_grant_production_and_never_limit_learners(
    mode: str,
) -> None:
    async def scenario() -> Recorder:
        send = Recorder()
        cfg = BalanceConfig(mode=mode, on_policy=True, batch_samples=1024, fragment_samples=512)
        balancer = Balancer(cfg, send)
        start = {**on_policy_run(0, 0, 4, 4), **on_policy_actors(0, 0, 4)}
        await balancer.update(start, start)
        return send

    send = asyncio.run(scenario())
    grants = [(n, ev.limit, ev.min_version) for n, ev in send.sent]
    if mode == "sync":  # one fragment each, with the learner's weights
        assert grants == [("actor-0", 1, 4), ("actor-1", 1, 4)]
    else:
        assert grants == [("actor-0", UNLIMITED, 0), ("actor-1", UNLIMITED, 0)]
    assert not send.of(GrantConsumption)


def test_metrics_report_rates_ratio_pauses_drops_and_lag() -> None:
    async def scenario() -> dict:
        cfg = BalanceConfig(replay_ratio=2.0, tolerance=1.0, batch_samples=32, fragment_samples=16)
        balancer = Balancer(cfg, Recorder(), window=60)
        run = {}
        for step in range(1, 4):
            run = {
                "buffer-0": hb(
                    "buffer-0", "buffer", {"samples_inserted": 1000 * step, "dropped/evicted": 10}
                ),
                "learner-0": hb(
                    "learner-0",
                    "learner",
                    {
                        "samples_consumed": 2000 * step,
                        "lag/0": 5,
                        "lag/3": 5,
                        "lag_sum": 15,
                        "lag_max": 3,
                    },
                    waiting_s=0.5,
                ),
                "actor-0": hb("actor-0", "actor", policy_version=1, paused_s=1.25),
            }
            await balancer.update(run, run)
            await asyncio.sleep(0.01)
        gauges = balancer.gauges()
        assert gauges["balance/production_per_s"] > 0 and gauges["balance/decisions"] == 3
        return balancer.metrics(run)

    m = asyncio.run(scenario())
    assert m["ratio"] == 2.0 and m["ratio_target"] == 2.0
    assert m["production_per_s"] > 0 and m["consumption_per_s"] == pytest.approx(
        2 * m["production_per_s"]
    )
    assert m["pause_s"] == {"actor-0": 1.25} and m["learner_wait_s"] == 0.5
    assert m["dropped"] == {"evicted": 10}
    assert m["lag"] == {"mean": 1.5, "p50": 0.0, "p95": 3.0, "max": 3.0}


def test_sync_mode_settings_that_could_never_progress_are_config_errors(tmp_path) -> None:
    ppo = load_config(
        "examples/cartpole_ppo.toml", ['controller.mode="sync"', "algo.fragments_per_batch=3"]
    )
    with pytest.raises(ConfigError, match=r"fragments_per_batch|actors\.count"):
        balance_config(ppo, BufferSpec(kind="rollout", capacity=64, batch_size=3, min_size=3))
    dqn = load_config(
        "examples/cartpole_dqn.toml",
        ['controller.mode="sync"', "controller.replay_ratio=0.5", "controller.tolerance=0.1"],
    )  # 0.5 x 2 actors x 32 samples a fragment: 32 per round, less than one batch of 128
    with pytest.raises(ConfigError, match=r"controller\.replay_ratio"):
        balance_config(dqn, BufferSpec(kind="replay", capacity=1000, batch_size=128, min_size=100))
    interval = load_config(
        "examples/cartpole_ppo.toml", ['controller.mode="sync"', "learner.publish_interval=2"]
    )
    with pytest.raises(ConfigError, match=r"learner\.publish_interval"):
        balance_config(interval, BufferSpec(kind="rollout", capacity=8, batch_size=2, min_size=2))


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ('controller.mode="chaotic"', "controller.mode"),
        ("controller.tolerance=-0.5", "controller.tolerance"),
        ("controller.lag_target=-1", "controller.lag_target"),
        ("controller.report_interval=5", "controller.report_interval"),
        ("controller.ratio=2", "controller.ratio"),
    ],
)
def test_bad_controller_settings_name_the_key(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config("examples/cartpole_dqn.toml", [override])


def test_data_parallel_learners_are_each_granted_their_share_of_the_limit() -> None:
    async def scenario() -> list[tuple[str, int]]:
        send = Recorder()
        cfg = BalanceConfig(
            replay_ratio=1.0, tolerance=0.5, batch_samples=2 * 32, fragment_samples=16, learners=2
        )
        balancer = Balancer(cfg, send)
        run = {
            "buffer-0": hb("buffer-0", "buffer", {"samples_inserted": 1000}),
            "learner-0": hb("learner-0", "learner", {"samples_consumed": 320}),
            "learner-1": hb("learner-1", "learner", {"samples_consumed": 320}),
            "actor-0": hb("actor-0", "actor", policy_version=0),
        }
        await balancer.update(run, run)
        return [(n, ev.limit) for n, ev in send.sent if isinstance(ev, GrantConsumption)]

    limit = int(1000 * 1.0 + 0.5 * 16 + 1.0 * 16 + 64)  # the band's upper edge for both
    assert asyncio.run(scenario()) == [("learner-0", limit // 2), ("learner-1", limit // 2)]


def test_the_balance_counts_a_batch_from_every_learner_per_version() -> None:
    run = load_config("examples/cartpole_ppo.toml", ["learner.count=2"])
    spec = BufferSpec(kind="rollout", capacity=8, batch_size=2, min_size=2)
    cfg = balance_config(run, spec)  # 64 steps x 4 envs a fragment
    assert cfg.learners == 2 and cfg.batch_samples == 2 * 2 * 256
    with pytest.raises(ConfigError, match="2 learner"):
        balance_config(
            load_config("examples/cartpole_ppo.toml", ["learner.count=2", "controller.mode=sync"]),
            spec,
        )
