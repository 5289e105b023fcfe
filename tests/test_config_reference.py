"""``docs/config.md`` is the config reference: generated from the config dataclasses, it
names every key of every section and of every in-tree algorithm, each with its meaning."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from tianji import algorithms
from tianji.rl.config import RunConfig
from tianji.run.reference import field_docs, reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def test_the_config_reference_in_docs_is_what_the_dataclasses_generate() -> None:
    assert DOC.read_text() == reference(), (
        "docs/config.md is out of date: python -m tianji.run.reference > docs/config.md"
    )


def sections() -> list[tuple[str, type]]:
    hints = typing.get_type_hints(RunConfig)
    out: list[tuple[str, type]] = [("", RunConfig)]
    out += [(f.name, hints[f.name]) for f in dataclasses.fields(RunConfig)
            if dataclasses.is_dataclass(hints[f.name])]  # fmt: skip
    for name in algorithms.names():
        cls = algorithms.get(name)
        if cls.__module__.startswith("tianji.algorithms."):
            out.append((f"algo:{name}", cls.Config))
    return out


def test_every_key_of_every_section_is_documented_with_its_meaning() -> None:
    text = DOC.read_text()
    missing = []
    for section, cls in sections():
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name]) or f.name == "algo":
                continue
            if not docs.get(f.name) or f"| `{f.name}` |" not in text:
                missing.append(f"{section}.{f.name}")
    assert not missing, f"keys without a documented meaning: {missing}"
    for key in ("[actors]", "[learner]", "[controller]", "[stop]", 'algorithm = "sac"'):
        assert key in text
