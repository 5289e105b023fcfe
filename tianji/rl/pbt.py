"""Population-based training (Jaderberg et al. 2017), as pure logic: who copies whom, and
how the copy's hyperparameters move.

Every ``interval`` env steps of its own, a member is *ready*. The members are ranked by
their objective (e.g. the mean training return); a ready member in the bottom ``fraction``
*exploits* — takes the weights and optimizer state of a member drawn from the top
``fraction`` — and *explores*: each hyperparameter it copied is, with probability
``resample_prob``, drawn anew from its declared range, else multiplied by one of
``factors`` (on the scale the range declares), and kept inside the range. A ready member
outside the bottom keeps training as it is. Only hyperparameters that the algorithm
declares perturbable (``Algorithm.perturbable``, a name -> :class:`HyperRange` mapping)
are touched; asking for another is refused by :func:`check_hyperparameters`.

The controller's PBT plug-in owns the members' states and the generator, calls
:func:`plan` when members become ready, carries out each :class:`Exploit` (the learner
loads the source's weights and optimizer state and the new hyperparameters) and writes
:meth:`Exploit.record` to the run's ``population.jsonl``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from tianji.runtime.errors import ConfigError

__all__ = [
    "OBJECTIVES",
    "SCALES",
    "Exploit",
    "HyperRange",
    "MemberState",
    "PBTRules",
    "PopulationConfig",
    "check_hyperparameters",
    "explore",
    "initial_hyperparameters",
    "member_name",
    "plan",
]

SCALES: Final = ("log", "linear", "complement_log")
"""How a hyperparameter is perturbed: ``log`` multiplies the value, ``linear`` moves it by
the factor's excess times its range's width, ``complement_log`` multiplies ``1 - value``
(for discount factors and lambdas close to 1)."""


@dataclasses.dataclass(frozen=True, slots=True)
class HyperRange:
    """The range a perturbable hyperparameter stays in, and its perturbation scale."""

    low: float
    high: float
    scale: str = "log"
    integer: bool = False

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"HyperRange scale {self.scale!r}: one of {SCALES}")
        if not self.low < self.high:
            raise ValueError(f"HyperRange [{self.low}, {self.high}]: low < high needed")
        if self.scale == "log" and self.low <= 0:
            raise ValueError(f"HyperRange [{self.low}, {self.high}]: a log scale needs low > 0")
        if self.scale == "complement_log" and self.high >= 1:
            raise ValueError(f"HyperRange [{self.low}, {self.high}]: complement_log needs high < 1")

    def clip(self, value: float) -> float:
        value = min(max(value, self.low), self.high)
        return float(round(value)) if self.integer else value

    def sample(self, rng: np.random.Generator) -> float:
        """A value drawn uniformly on the range's scale."""
        u = float(rng.random())
        if self.scale == "log":
            return self.clip(math.exp(_lerp(math.log(self.low), math.log(self.high), u)))
        if self.scale == "complement_log":
            a, b = math.log(1 - self.high), math.log(1 - self.low)
            return self.clip(1 - math.exp(_lerp(a, b, u)))
        return self.clip(_lerp(self.low, self.high, u))

    def perturb(self, value: float, factor: float) -> float:
        """``value`` moved by ``factor`` on the range's scale, kept in the range."""
        if self.scale == "log":
            return self.clip(value * factor)
        if self.scale == "complement_log":
            return self.clip(1 - (1 - value) * factor)
        return self.clip(value + (factor - 1) * (self.high - self.low))


def _lerp(a: float, b: float, u: float) -> float:
    return a + (b - a) * u


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PBTRules:
    """When members exploit and how they explore (``[population]`` holds these)."""

    interval: int = 50_000
    """A member is ready every this many of its own env steps."""
    fraction: float = 0.25
    """The bottom (and top) share of the ranked members: the bottom copies the top."""
    factors: tuple[float, ...] = (0.8, 1.25)
    """A copied hyperparameter is multiplied by one of these (on its scale) ..."""
    resample_prob: float = 0.25
    """... or, with this probability, drawn anew from its declared range."""
    hyperparameters: tuple[str, ...] = ()
    """The hyperparameters explored (empty: every one the algorithm declares)."""

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ConfigError("population.interval", self.interval, "env steps >= 1")
        if not 0 < self.fraction <= 0.5:
            raise ConfigError("population.fraction", self.fraction, "a share in (0, 0.5]")
        if not self.factors or any(not f > 0 for f in self.factors):
            raise ConfigError("population.factors", self.factors, "numbers > 0")
        if not 0 <= self.resample_prob <= 1:
            raise ConfigError("population.resample_prob", self.resample_prob, "in [0, 1]")


def check_hyperparameters(
    names: Sequence[str], declared: Mapping[str, HyperRange], algorithm: str
) -> tuple[str, ...]:
    """The hyperparameters to explore: ``names`` (all of ``declared`` when empty).

    Raises:
        ConfigError: a name the algorithm does not declare perturbable (naming those it
            does), or an algorithm that declares none.
    """
    if not declared:
        raise ConfigError("algorithm", algorithm, "an algorithm that declares perturbable ones")
    unknown = [n for n in names if n not in declared]
    if unknown:
        expected = f"hyperparameters {algorithm} declares perturbable: {', '.join(declared)}"
        raise ConfigError("population.hyperparameters", unknown, expected)
    return tuple(names) or tuple(declared)


def explore(
    hparams: Mapping[str, float],
    declared: Mapping[str, HyperRange],
    rules: PBTRules,
    rng: np.random.Generator,
) -> dict[str, float]:
    """The explored copy of ``hparams`` (see the module doc); keys outside the explored
    set (``rules.hyperparameters``, else every declared one) stay as they are."""
    names = rules.hyperparameters or tuple(declared)
    out = dict(hparams)
    for name in names:
        spec = declared[name]
        if rng.random() < rules.resample_prob:
            out[name] = spec.sample(rng)
        else:
            factor = rules.factors[int(rng.integers(len(rules.factors)))]
            out[name] = spec.perturb(float(hparams[name]), factor)
    return out


@dataclasses.dataclass(slots=True)
class MemberState:
    """What the planner knows of one member."""

    name: str
    hparams: dict[str, float]
    env_steps: int = 0
    objective: float | None = None
    """Its current objective (None until it has one, e.g. before its first episodes)."""
    ready_at: int = 0
    """The env step of this member from which it is ready again."""


@dataclasses.dataclass(frozen=True, slots=True)
class Exploit:
    """One exploit/explore step: ``member`` takes ``source``'s weights and optimizer state
    and the hyperparameters ``after`` (explored from the source's ``source_hparams``)."""

    member: str
    source: str
    step: int
    before: dict[str, float]
    source_hparams: dict[str, float]
    after: dict[str, float]
    objective: float
    source_objective: float

    def record(self) -> dict[str, Any]:
        """The line written to ``population.jsonl``."""
        return {
            "step": self.step,
            "member": self.member,
            "copied_from": self.source,
            "objective": self.objective,
            "source_objective": self.source_objective,
            "hyperparameters_before": self.before,
            "source_hyperparameters": self.source_hparams,
            "hyperparameters_after": self.after,
        }


def plan(
    members: Sequence[MemberState],
    declared: Mapping[str, HyperRange],
    rules: PBTRules,
    rng: np.random.Generator,
) -> list[Exploit]:
    """The exploits due now, and every ready member's next ``ready_at`` moved on (a member
    with no objective yet is neither ranked nor ready). Members rank by objective, ties
    by name, so a plan depends on the states and ``rng`` only."""
    ranked = sorted(
        (m for m in members if m.objective is not None),
        key=lambda m: (m.objective, m.name),
    )
    if len(ranked) < 2:
        return []
    cut = max(1, math.floor(rules.fraction * len(ranked)))
    bottom, top = {m.name for m in ranked[:cut]}, ranked[-cut:]
    exploits = []
    for m in ranked:
        if m.env_steps < m.ready_at:
            continue
        m.ready_at = m.env_steps + rules.interval
        if m.name not in bottom:
            continue
        source = top[int(rng.integers(len(top)))]
        after = explore(source.hparams, declared, rules, rng)
        exploits.append(
            Exploit(
                member=m.name,
                source=source.name,
                step=m.env_steps,
                before=dict(m.hparams),
                source_hparams=dict(source.hparams),
                after=after,
                objective=float(m.objective),  # type: ignore[arg-type]
                source_objective=float(source.objective),  # type: ignore[arg-type]
            )
        )
    return exploits


OBJECTIVES: Final = ("train", "eval")
"""What members are ranked by: the mean training return (``[stop] window`` episodes) or
the newest evaluation's mean return (needs ``[eval] workers``)."""


def member_name(index: int) -> str:
    """The scope of population member ``index`` (``m0``, ``m1``, ...)."""
    return f"m{index}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PopulationConfig:
    """``[population]``: several policies in one run, each with its own learners, buffers,
    parameter service and share of the actors, and population-based training among them
    (``docs/populations.md``)."""

    size: int = 1
    """Members (policies) trained side by side; 1: a single-policy run."""
    pbt: bool = True
    """Population-based training: every ``interval`` env steps of its own, a member in the
    bottom ``fraction`` copies a top member's weights and optimizer state and explores its
    hyperparameters. False: the members only train side by side (independent runs under
    one controller, e.g. the baseline PBT is measured against)."""
    objective: str = "train"
    """What members are ranked by: "train" (the mean training return of the last
    ``[stop] window`` episodes) or "eval" (the newest evaluation's mean return)."""
    interval: int = 50_000
    """A member is ready to exploit every this many of its own env steps."""
    fraction: float = 0.25
    """The bottom (and top) share of the ranked members: the bottom copies the top."""
    factors: tuple[float, ...] = (0.8, 1.25)
    """A copied hyperparameter is multiplied by one of these (on its declared scale) ..."""
    resample_prob: float = 0.25
    """... or, with this probability, drawn anew from its declared range."""
    hyperparameters: tuple[str, ...] = ()
    """The hyperparameters explored (empty: every one the algorithm declares perturbable,
    ``Algorithm.perturbable``)."""
    init: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Each member's starting hyperparameters: ``name = [v0, v1, ...]`` (one value per
    member) or ``name = {low = a, high = b}`` (drawn per member on the declared scale from
    the seed). Unnamed ones start at ``[algo]``'s value. Names must be perturbable."""

    def __post_init__(self) -> None:
        if type(self.size) is not int or self.size < 1:
            raise ConfigError("population.size", self.size, "an integer >= 1")
        if self.objective not in OBJECTIVES:
            raise ConfigError("population.objective", self.objective, " | ".join(OBJECTIVES))
        self.rules()  # the PBT fields, checked now
        for name, values in self.init.items():
            if isinstance(values, list):
                if len(values) != self.size or not all(type(v) in (int, float) for v in values):
                    why = f"a list of {self.size} numbers (one per member)"
                    raise ConfigError(f"population.init.{name}", values, why)
            elif not (isinstance(values, dict) and set(values) == {"low", "high"}):
                why = "a list of numbers, one per member, or {low = a, high = b}"
                raise ConfigError(f"population.init.{name}", values, why)

    def rules(self) -> PBTRules:
        """The exploit/explore rules these settings give."""
        return PBTRules(
            interval=self.interval,
            fraction=self.fraction,
            factors=tuple(self.factors),
            resample_prob=self.resample_prob,
            hyperparameters=tuple(self.hyperparameters),
        )


def initial_hyperparameters(
    population: PopulationConfig,
    declared: Mapping[str, HyperRange],
    algorithm: str,
    seed: int,
) -> list[dict[str, float]]:
    """Each member's starting values of the hyperparameters ``population.init`` names.

    Raises:
        ConfigError: a name the algorithm does not declare perturbable, or a range outside
            the declared one.
    """
    names = list(population.init)
    if names:
        check_hyperparameters(names, declared, algorithm)
    rng = np.random.default_rng([seed, 7057])
    members: list[dict[str, float]] = [{} for _ in range(population.size)]
    for name in names:
        values = population.init[name]
        spec = declared[name]
        if isinstance(values, dict):
            try:
                spec = HyperRange(
                    float(values["low"]), float(values["high"]), spec.scale, spec.integer
                )
            except ValueError as exc:
                raise ConfigError(f"population.init.{name}", values, str(exc)) from None
            values = [spec.sample(rng) for _ in range(population.size)]
        for m, value in enumerate(values):
            if not declared[name].low <= value <= declared[name].high:
                where = f"in {name}'s declared range [{declared[name].low}, {declared[name].high}]"
                raise ConfigError(f"population.init.{name}", value, where)
            members[m][name] = float(value)
    return members
