"""Two-player zero-sum games from the learner's seat: the env of self-play.

A turn-based PettingZoo AEC game (``pettingzoo.classic.connect_four_v3``, ...) is seen by
tianji's actors as one single-agent gymnasium env, :class:`TwoPlayerGame`: the learner's
moves are the env's actions, and the other seat's moves are made inside ``step`` by an
:class:`Opponent` (a past snapshot of the learner, the uniform random policy or a scripted
player) that the actor sets before each game. Observations are the mover's view with its
action mask (:class:`~tianji.rl.masks.MaskedObs`), so the algorithm must honour masks; an
illegal move is refused (:class:`IllegalMove`), never played.

The learner sits first in even games and second in odd ones (``seat = "alternate"``), so
it learns, and is measured, on both sides. The reward is the game's outcome for the
learner at the end (+1 win, 0 draw, -1 loss) and 0 before; the last step's info holds
``outcome``, ``opponent`` (its id) and ``seat`` for the league's ratings.

Usage::

    game = TwoPlayerGame(connect_four_v3.env(), name="connect_four_v3")
    game.set_opponent(RandomOpponent(seed=0))
    obs, info = game.reset(seed=0)
    obs, reward, terminated, truncated, info = game.step(3)
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any, Final, Protocol

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from tianji.rl.masks import MaskedObs, flatten_masked, has_mask_keys, uniform_legal
from tianji.runtime.errors import ConfigError

__all__ = [
    "FIXED_OPPONENTS",
    "SEATS",
    "TACTICS",
    "ConnectFourScripted",
    "IllegalMove",
    "Opponent",
    "PolicyOpponent",
    "RandomOpponent",
    "TwoPlayerGame",
    "connect_four_tactic",
    "fixed_opponent",
    "play_games",
    "two_player_factory",
]


class IllegalMove(ValueError):
    """A move the game's action mask forbids.

    Attributes:
        action: the move.
        legal: the legal moves at that point.
    """

    def __init__(self, who: str, action: int, legal: list[int]) -> None:
        super().__init__(f"{who} played the illegal move {action}; legal moves: {legal}")
        self.action, self.legal = action, legal


class Opponent(Protocol):
    """The other seat: its id (the league's name for it) and a move for one masked
    observation ``[D + n]`` of its own view."""

    id: str

    def act(self, obs: np.ndarray) -> int: ...


class RandomOpponent:
    """Uniform over the legal moves."""

    id = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.n = 0  # set by the game: the number of actions

    def act(self, obs: np.ndarray) -> int:
        return int(uniform_legal(obs[None, -self.n :] > 0.5, self.rng)[0])


class PolicyOpponent:
    """A policy (e.g. a snapshot of the learner) as an opponent: ``act`` maps a batch of
    masked observations ``[1, D + n]`` to actions ``[1]``."""

    def __init__(self, id: str, act: Callable[[np.ndarray], np.ndarray]) -> None:
        self.id, self._act = id, act

    def act(self, obs: np.ndarray) -> int:
        return int(np.asarray(self._act(obs[None]))[0])

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        """Moves ``[B]`` for ``B`` games' views ``[B, D + n]`` in one call of the policy
        (:class:`~tianji.rl.selfplay_vector.TwoPlayerVectorEnv` batches by opponent)."""
        return np.asarray(self._act(obs)).reshape(len(obs))


ROWS, COLS = 6, 7
SEATS: Final = ("alternate", "first", "second")
"""Where the learner sits: first in even games and second in odd ones (training and
evaluation), or always first or second."""
CENTER_FIRST: Final = np.array([1, 2, 3, 4, 3, 2, 1], np.float64)
"""The scripted player's preference between otherwise equal columns."""


class ConnectFourScripted:
    """A connect-four player by rules: win now if it can; else block a column where the
    opponent would win next; else avoid a column that lets the opponent win on top of its
    piece; among what is left, prefer central columns (drawn with weights 1-2-3-4-3-2-1).

    Reads the PettingZoo ``connect_four_v3`` view: ``[6, 7, 2]`` with the mover's pieces in
    channel 0 and the other's in channel 1, row 0 on top, then the 7-entry mask.
    """

    id = "scripted"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray) -> int:
        mine, theirs = _pieces(obs)
        legal = [c for c in range(COLS) if obs[ROWS * COLS * 2 + c] > 0.5]
        for me, other in ((mine, theirs), (theirs, mine)):  # win, else block
            for c in legal:
                if _wins_by(me, other, c):
                    return c
        safe = [c for c in legal if not _gives_away(mine, theirs, c)] or legal
        weights = CENTER_FIRST[safe]
        return int(safe[int(self.rng.choice(len(safe), p=weights / weights.sum()))])


TACTICS: Final = ("win", "block", "safe")
"""The kinds of :func:`connect_four_tactic`'s positions."""


def connect_four_tactic(view: np.ndarray) -> tuple[str, set[int]] | None:
    """Which one-move rule of :class:`ConnectFourScripted` decides a position, and the
    columns that follow it; None where none does or every legal column would.

    ``view`` is the mover's masked observation, as the scripted player reads it. The
    kinds: "win" (columns that win at once), "block" (the opponent threatens to win in
    exactly one column: that one), "safe" (neither; the columns that do not let the
    opponent win on top of the mover's piece).
    """
    mine, theirs = _pieces(view)
    legal = [c for c in range(COLS) if _drop_row(mine, theirs, c) is not None]
    wins = {c for c in legal if _wins_by(mine, theirs, c)}
    if wins:
        return ("win", wins) if len(wins) < len(legal) else None
    threats = {c for c in legal if _wins_by(theirs, mine, c)}
    if threats:
        return ("block", threats) if len(threats) == 1 and len(legal) > 1 else None
    safe = {c for c in legal if not _gives_away(mine, theirs, c)}
    return ("safe", safe) if 0 < len(safe) < len(legal) else None


def _pieces(view: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mover's and the other's pieces (``[6, 7]`` booleans) of a connect-four view."""
    board = np.asarray(view[: ROWS * COLS * 2]).reshape(ROWS, COLS, 2) > 0.5
    return board[..., 0], board[..., 1]


def _drop_row(mine: np.ndarray, theirs: np.ndarray, col: int) -> int | None:
    """The row a piece dropped in ``col`` lands in (None: the column is full)."""
    empty = np.flatnonzero(~(mine[:, col] | theirs[:, col]))
    return int(empty[-1]) if len(empty) else None


def _four(pieces: np.ndarray, row: int, col: int) -> bool:
    """Whether ``pieces`` hold four in a line through ``(row, col)``."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, col + sign * dc
            while 0 <= r < ROWS and 0 <= c < COLS and pieces[r, c]:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


def _wins_by(me: np.ndarray, other: np.ndarray, col: int) -> bool:
    row = _drop_row(me, other, col)
    if row is None:
        return False
    placed = me.copy()
    placed[row, col] = True
    return _four(placed, row, col)


def _gives_away(mine: np.ndarray, theirs: np.ndarray, col: int) -> bool:
    """Whether playing ``col`` lets the opponent win by playing on top of it."""
    row = _drop_row(mine, theirs, col)
    if row is None or row == 0:
        return False
    placed = mine.copy()
    placed[row, col] = True
    return _wins_by(theirs, placed, col)


class TwoPlayerGame(gym.Env[np.ndarray, int]):
    """A two-player AEC game from the learner's seat (see the module doc).

    Args:
        game: a PettingZoo AEC env with exactly two agents, each with the same
            ``Dict(observation, action_mask)`` observation space and ``Discrete`` actions.
        name: how the game is named in errors (the configured id).
        seat: "alternate" (first in even games), "first" or "second".

    Raises:
        ConfigError: naming the game if it is not such a two-player game.
    """

    def __init__(self, game: Any, *, name: str = "", seat: str = "alternate") -> None:
        self.metadata = {"render_modes": []}
        self.game, self.name = without_checks(game), name or type(game).__name__
        if seat not in SEATS:
            raise ValueError(f"seat {seat!r}: one of {', '.join(SEATS)}")
        self.seat_rule = seat
        agents = list(getattr(game, "possible_agents", []))
        if len(agents) != 2:
            raise ConfigError("env.id", self.name, f"a two-player game, got agents {agents}")
        self.agents = agents
        obs_space, act_space = game.observation_space(agents[0]), game.action_space(agents[0])
        if not has_mask_keys(obs_space) or not isinstance(act_space, spaces.Discrete):
            why = "a game with Dict(observation, action_mask) views and Discrete moves"
            raise ConfigError("env.id", self.name, f"{why}, got {obs_space!r}, {act_space!r}")
        self.n = int(act_space.n)
        self.observation_space = MaskedObs(obs_space["observation"], self.n)
        self.action_space = spaces.Discrete(self.n)  # type: ignore[assignment]
        self.opponent: Opponent = RandomOpponent()
        self.set_opponent(self.opponent)  # (the random player needs the move count)
        self.opponent_source: Callable[[], Opponent] | None = None
        """Called at every reset for the next game's opponent (an actor's league draw);
        ``None``: the one :meth:`set_opponent` set."""
        self.games = 0
        self.seat = 0
        self.opening = 0
        """Up to this many random moves start each game (``[selfplay] random_opening``)."""

    def set_opponent(self, opponent: Opponent) -> None:
        """Who plays the other seat from the next :meth:`reset` on."""
        if isinstance(opponent, RandomOpponent):
            opponent.n = self.n
        self.opponent = opponent

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        info = self.start(seed=seed)
        self._opponent_moves()
        return self.view(), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.play(action)
        self._opponent_moves()
        return self.outcome()

    # The phases of reset and step, for a vector env that batches the opponents' moves
    # (tianji.rl.selfplay_vector): start / play, then the opponent's move while
    # awaits_opponent(), then outcome (or view, the learner's, after start).

    def start(self, *, seed: int | None = None) -> dict[str, Any]:
        """Begin a game: the next opponent drawn, the learner seated; the reset's info.
        The opponent moves first (:meth:`awaits_opponent`) when the learner sits second."""
        super().reset(seed=seed)
        self.game.reset(seed=seed)
        if self.opponent_source is not None:
            self.set_opponent(self.opponent_source())
        first = {"alternate": self.games % 2 == 0, "first": True, "second": False}
        self.seat = 0 if first[self.seat_rule] else 1
        self.games += 1
        self.me = self.agents[self.seat]
        if self.opening:
            self._random_opening(seed)
        return {"seat": self.seat, "opponent": self.opponent.id}

    def _random_opening(self, seed: int | None) -> None:
        """Uniformly random moves for both sides, from 0 to :attr:`opening` of them (the
        game begun again without them in the rare case that they end it)."""
        for _ in range(int(self.np_random.integers(0, self.opening + 1))):
            legal = np.flatnonzero(self._view(self.game.agent_selection)[-self.n :] > 0.5)
            self.game.step(int(self.np_random.choice(legal)))
            if self._over():
                self.game.reset(seed=seed)
                return

    def play(self, action: int) -> None:
        """The learner's move (refused if illegal: :class:`IllegalMove`)."""
        self._move(self.view(), action, "the learner")

    def awaits_opponent(self) -> bool:
        """The game goes on and the other seat is to move."""
        return not self._over() and self.game.agent_selection != self.me

    def view(self) -> np.ndarray:
        """The learner's masked observation ``[D + n]``."""
        return self._view(self.me)

    def opponent_view(self) -> np.ndarray:
        """The masked observation ``[D + n]`` of the seat to move (the opponent's)."""
        return self._view(self.game.agent_selection)

    def opponent_plays(self, action: int, view: np.ndarray) -> None:
        """The opponent's move, chosen from ``view`` (:meth:`opponent_view`, whose mask
        checks it: an illegal one is refused, :class:`IllegalMove`)."""
        self._move(view, action, f"opponent {self.opponent.id!r}")

    def _opponent_moves(self) -> None:
        """The opponent's move now, if it is to move (one game stepped on its own)."""
        if self.awaits_opponent():
            view = self.opponent_view()
            self.opponent_plays(self.opponent.act(view), view)

    def outcome(self) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """The step's result from the learner's seat: its view, the reward (the outcome
        at the game's end, else 0), terminated, truncated and info (``outcome``,
        ``opponent`` and ``seat`` at the end)."""
        over = self._over()
        reward = float(self.game.rewards[self.me]) if over else 0.0
        info: dict[str, Any] = {}
        if over:
            info = {"outcome": reward, "opponent": self.opponent.id, "seat": self.seat}
        truncated = over and not any(self.game.terminations.values())
        return self.view(), reward, over and not truncated, truncated, info

    def _move(self, view: np.ndarray, action: int, who: str) -> None:
        """``who`` plays ``action`` if ``view``'s mask allows it, else :class:`IllegalMove`."""
        action = int(action)
        legal = np.flatnonzero(view[-self.n :] > 0.5)
        if action not in legal:
            raise IllegalMove(who, action, legal.tolist())
        self.game.step(action)

    def _over(self) -> bool:
        g = self.game
        return any(g.terminations.values()) or any(g.truncations.values())

    def _view(self, agent: str) -> np.ndarray:
        obs = self.game.observe(agent)
        return flatten_masked(obs["observation"], obs["action_mask"])

    def close(self) -> None:
        self.game.close()


CHECK_WRAPPERS: Final = frozenset(
    {"OrderEnforcingWrapper", "AssertOutOfBoundsWrapper", "TerminateIllegalWrapper"}
)
"""PettingZoo's wrappers that only check moves (a step before reset, a move out of range
or illegal), which :class:`TwoPlayerGame` checks itself against the mask before each move."""


def without_checks(game: Any) -> Any:
    """``game`` with PettingZoo's outer checking wrappers (:data:`CHECK_WRAPPERS`) taken
    off: each adds a call layer to every step and observation (a self-play actor steps
    1.21 times as fast without them, ``benchmarks/selfplay_actor.py``). Other wrappers,
    which may change what the game does or shows, stay, and so does everything under them."""
    while type(game).__name__ in CHECK_WRAPPERS and type(game).__module__.startswith(
        "pettingzoo.utils.wrappers"
    ):
        game = game.env
    return game


def two_player_factory(
    env_id: str, kwargs: dict[str, Any], seat: str
) -> Callable[[], TwoPlayerGame]:
    """A factory of :class:`TwoPlayerGame` for a PettingZoo AEC game named by its module
    (``"pettingzoo.classic.connect_four_v3"``; its ``env(**kwargs)`` makes it).

    Raises:
        ConfigError: naming the id if the module cannot be imported (with the install
            hint for PettingZoo's classic games) or is not a two-player masked game.
    """
    try:
        with warnings.catch_warnings():  # PettingZoo 1.27 warns of its module-level env()
            warnings.filterwarnings("ignore", "The old environment creation API")
            module = importlib.import_module(env_id)
    except ImportError as exc:
        hint = "pip install 'pettingzoo[classic]'" if "pettingzoo" in env_id else str(exc)
        raise ConfigError("env.id", env_id, f"an importable AEC game module ({hint})") from None
    if not callable(getattr(module, "env", None)):
        raise ConfigError("env.id", env_id, "a module with an env() that makes an AEC game")

    def build() -> TwoPlayerGame:
        return TwoPlayerGame(module.env(**kwargs), name=env_id, seat=seat)

    build().close()  # refused here, before any service starts, if it is no such game
    return build


def play_games(
    make: Callable[[], TwoPlayerGame],
    policy: Callable[[np.ndarray], np.ndarray],
    opponent: Opponent,
    games: int,
    seed: int = 0,
    seat: str = "alternate",
) -> dict[str, float]:
    """Play ``games`` games of ``policy`` (masked observations ``[B, D + n]`` -> moves
    ``[B]``) against ``opponent``: half of them first and half second (``seat`` "first" or
    "second": all from that seat).

    Returns:
        ``{"win": share, "draw": share, "loss": share, "games": games}``.
    """
    if games < 1:
        raise ValueError(f"games must be >= 1, got {games}")
    if seat not in SEATS:
        raise ValueError(f"seat {seat!r}: one of {', '.join(SEATS)}")
    env = make()
    env.seat_rule = seat
    env.set_opponent(opponent)
    tally = {1.0: 0, 0.0: 0, -1.0: 0}
    try:
        for k in range(games):
            obs, _ = env.reset(seed=seed + k)
            done = False
            while not done:
                action = int(np.asarray(policy(obs[None]))[0])
                obs, _, terminated, truncated, info = env.step(action)
                done = terminated or truncated
            tally[float(np.sign(info["outcome"]))] += 1
    finally:
        env.close()
    return {
        "win": tally[1.0] / games,
        "draw": tally[0.0] / games,
        "loss": tally[-1.0] / games,
        "games": float(games),
    }


FIXED_OPPONENTS: Final = ("random", "connect_four_scripted")
"""The built-in fixed opponents by name (``[selfplay] eval_opponents``)."""


def fixed_opponent(name: str, seed: int, key: str = "selfplay.eval_opponents") -> Opponent:
    """A fixed opponent by name: "random", "connect_four_scripted" or ``"module:Class"``
    (built as ``Class(seed=seed)``, with an ``id`` and ``act(obs)``).

    Raises:
        ConfigError: naming ``name`` (under ``key``) if it is none of those.
    """
    if name == "random":
        return RandomOpponent(seed=seed)
    if name == "connect_four_scripted":
        return ConnectFourScripted(seed=seed)
    from tianji.runtime.plugins import load_factory

    expected = f'one of {", ".join(FIXED_OPPONENTS)} or "module:Class"'
    if ":" not in name:
        raise ConfigError(key, name, expected)
    try:
        opponent = load_factory(name)(seed=seed)
    except ConfigError as exc:
        raise ConfigError(key, name, exc.expected) from None
    if not callable(getattr(opponent, "act", None)) or not isinstance(
        getattr(opponent, "id", None), str
    ):
        raise ConfigError(key, name, "an object with id and act(obs)")
    return opponent  # type: ignore[no-any-return]
