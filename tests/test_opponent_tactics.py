"""Self-play opponents with one-move tactics (``[selfplay] opponent_tactics``): a snapshot
takes a winning move and blocks a single threat whatever its policy prefers, plays as
itself elsewhere, keeps its id for the ratings, and every policy opponent of an actor's
pool (snapshots and the live policy) gets the tactics; bad kinds and games without
tactics are refused naming the value."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.test_selfplay_game import _view
from tests.test_selfplay_services import C4, Constant, snapshot
from tianji.rl.config import RunConfig, to_dict
from tianji.rl.events import SnapshotTaken
from tianji.rl.league import LIVE, SelfPlayConfig
from tianji.rl.selfplay import PolicyOpponent, connect_four_tactic
from tianji.rl.tactics import TacticalOpponent, Tactics, TacticsTally, game_tactic
from tianji.runtime.errors import ConfigError
from tianji.services.opponents import OpponentPool

pytest.importorskip("pettingzoo.classic")

WIN = _view([(5, 0), (5, 1), (5, 2)], [(4, 0), (4, 1), (4, 2)])  # 3 wins; 3 also blocks
BLOCK = _view([(5, 6), (4, 6)], [(5, 2), (5, 3), (5, 4)])  # they win at 1 or 5: no rule
VERTICAL = _view([(5, 0), (5, 1)], [(5, 5), (4, 5), (3, 5)])  # only 5 stops them
OPEN = _view([(5, 3)], [(5, 2)])  # nothing to win, block or give away


class Leftmost:
    """A policy that plays the leftmost legal column and keeps the masks it was shown."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        self.seen.append(obs[:, -7:].copy())
        return np.array([int(np.flatnonzero(row[-7:] > 0.5)[0]) for row in obs])


class MaskedConstant(Constant):
    """:class:`Constant`, honouring the mask as every algorithm of a masked game does:
    its version's column where legal, else the leftmost legal one."""

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        legal = [np.flatnonzero(row[-7:] > 0.5) for row in obs]
        moves = [self.column if self.column in cols else int(cols[0]) for cols in legal]
        return {"action": np.array(moves, np.int64)}


def tactical(kinds: tuple[str, ...]) -> tuple[TacticalOpponent, Leftmost]:
    policy = Leftmost()
    return TacticalOpponent(PolicyOpponent("v7", policy), connect_four_tactic, kinds, 7), policy


def test_a_tactical_snapshot_wins_and_blocks_whatever_its_policy_prefers() -> None:
    opponent, policy = tactical(("win", "block"))
    moves = opponent.act_batch(np.stack([WIN, VERTICAL, BLOCK, OPEN]))
    assert moves.tolist() == [3, 5, 0, 0]  # two threats or none: the policy's own move
    assert policy.seen[0][2].tolist() == BLOCK[-7:].tolist()  # masks left alone there
    assert opponent.tally == TacticsTally({"win": 1, "block": 1}, moves=4)
    assert opponent.id == "v7" and opponent.act(WIN) == 3


def test_only_the_kinds_asked_for_narrow_the_moves() -> None:
    opponent, _ = tactical(("win",))
    assert opponent.act_batch(np.stack([WIN, VERTICAL])).tolist() == [3, 0]
    safe, _ = tactical(("safe",))
    # their three on row 4 wins at (4, 0) or (4, 4) once a piece lies under either
    under = _view([(5, 1), (5, 3), (5, 6), (4, 6)], [(5, 2), (4, 1), (4, 2), (4, 3)])
    assert connect_four_tactic(under) == ("safe", {1, 2, 3, 5, 6})
    assert safe.act(under) == 1  # not 0, which its policy prefers
    assert safe.tally.narrowed == {"safe": 1}


def test_an_unknown_kind_or_a_game_without_tactics_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="fork"):
        TacticalOpponent(PolicyOpponent("v1", Leftmost()), connect_four_tactic, ["fork"], 7)
    with pytest.raises(ConfigError, match=r"selfplay\.opponent_tactics.*fork"):
        SelfPlayConfig(opponent_tactics=("win", "fork"))
    with pytest.raises(ConfigError, match=r"selfplay\.opponent_tactics"):
        SelfPlayConfig(opponent_tactics=("win", "win"))
    tic_tac_toe = to_dict(RunConfig(algorithm="ppo", env=C4))["env"] | {
        "id": "pettingzoo.classic.tictactoe_v3"
    }
    with pytest.raises(ConfigError, match="tictactoe_v3"):
        RunConfig(algorithm="ppo", env=type(C4)(**tic_tac_toe), selfplay=SelfPlayConfig(
            opponent_tactics=("win",)))  # fmt: skip
    assert game_tactic("pettingzoo.classic.tictactoe_v3") is None
    with pytest.raises(ValueError, match="declares none"):
        Tactics(None, ("win",), 7)
    with pytest.raises(ValueError, match="fork"):
        Tactics(connect_four_tactic, ("fork",), 7)


def test_every_policy_opponent_of_the_pool_plays_the_tactics() -> None:
    live = PolicyOpponent(LIVE, Leftmost())
    wrap = Tactics(connect_four_tactic, ("win", "block"), 7)
    pool = OpponentPool(MaskedConstant, pool_size=2, explore=True, seed=0, live=live, tactics=wrap)
    asyncio.run(pool.on_snapshot(snapshot(1)))  # it plays its version's column: 1
    held = pool._opponent("v1")
    assert isinstance(held, TacticalOpponent) and held.id == "v1"
    assert held.act(OPEN) == 1 and held.act(VERTICAL) == 5
    played_live = pool._opponent(LIVE)
    assert isinstance(played_live, TacticalOpponent) and played_live.act(WIN) == 3
    assert wrap.tally == TacticsTally({"win": 1, "block": 1}, moves=3)  # one tally for all
    plain = OpponentPool(MaskedConstant, pool_size=2, explore=True, seed=0, live=live)
    asyncio.run(plain.on_snapshot(snapshot(1)))
    assert plain._opponent("v1").act(VERTICAL) == 1 and plain._opponent(LIVE) is live


def test_an_actor_of_a_run_with_opponent_tactics_plays_tactical_snapshots() -> None:
    from tianji.services.actor import ActorService

    settings = SelfPlayConfig(opponent_tactics=("win", "block"), live_prob=0.5)
    config = RunConfig(algorithm="ppo", transport="inproc", run_dir="", env=C4, selfplay=settings)
    actor = ActorService("actor-0", config=to_dict(config), index=0)
    assert actor.opponents is not None
    weights = actor.algo.get_weights()
    asyncio.run(actor.opponents.on_snapshot(SnapshotTaken(policy_version=4, weights=weights)))
    for opponent in (actor.opponents._opponent("v4"), actor.opponents._opponent(LIVE)):
        assert isinstance(opponent, TacticalOpponent) and opponent.kinds == {"win", "block"}
        assert all(opponent.act(VERTICAL) == 5 for _ in range(10))  # sampled, yet narrowed
    actor.publish = lambda *a, **k: asyncio.sleep(0)  # type: ignore[method-assign]
    asyncio.run(actor._publish_games([]))
    assert actor.counters["opponent_moves"] == actor.counters["opponent_block"] == 20
    assert actor.counters["opponent_win"] == 0  # reported in the summary's services
