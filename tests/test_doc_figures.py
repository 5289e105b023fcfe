"""The published figures and the checker that holds them to their result files
(``tests/doc_figures.py``, whose docstring gives the convention)."""

from __future__ import annotations

import pytest
from doc_figures import (
    ROOT,
    all_problems,
    check,
    numbers,
    prints_as,
)


def test_every_published_figure_is_held_by_its_result_file() -> None:
    problems = all_problems()
    assert not problems, "\n".join(map(str, problems))


# --- the checker can fail ----------------------------------------------------------------------

MUTATIONS = [
    # (document, text as published, the same with one quoted number changed)
    ("README.md", "1.68x Sample", "1.66x Sample"),
    ("docs/benchmarks.md", "70.6, 248.2 and", "70.6, 248.9 and"),
    ("docs/benchmarks.md", "| gru | local | 442.0 |", "| gru | local | 442.6 |"),
    ("docs/scaling.md", "(32 actors: 0.896x", "(32 actors: 0.886x"),
]


@pytest.mark.parametrize(("doc", "published", "changed"), MUTATIONS)
def test_changing_one_quoted_number_is_reported(doc: str, published: str, changed: str) -> None:
    text = (ROOT / doc).read_text()
    assert text.count(published) == 1, f"{published!r} is no longer in {doc}: pick another"
    assert not check(doc, text)
    problems = check(doc, text.replace(published, changed))
    assert len(problems) == 1, problems
    assert "is in none of" in problems[0].message


SECTION = "## A run\n\n"


def test_a_figure_with_no_result_file_is_reported() -> None:
    problems = check("x.md", SECTION + "It reached 475 in 9.2 s, 0.85x sync's time.\n")
    assert [p.message for p in problems] == [
        "'9.2 s' has no result file (paragraph)",
        "'0.85x' has no result file (paragraph)",
    ]


def test_a_result_file_covers_its_section_and_must_exist() -> None:
    cited = (
        SECTION + "Run (`docs/results/scale-issue20.json`): 0.896x.\n\n| a | b |\n| 1 | 0.136 |\n"
    )
    assert check("x.md", cited) == []
    missing = check("x.md", SECTION + "Run (`docs/results/nothing-here.json`).\n")
    assert [p.message for p in missing] == [
        "cites docs/results/nothing-here.json, which does not exist"
    ]
    # a new heading ends the coverage
    assert check("x.md", cited + "\n## Next\n\nIt took 0.896x.\n")


def test_a_marker_exempts_only_the_figures_it_names() -> None:
    marked = SECTION + "A 20 s warm-up.\n<!-- not measured: 20 s (the bench's setting) -->\n"
    assert check("x.md", marked) == []
    changed = check("x.md", marked.replace("A 20 s", "A 21 s"))
    assert sorted(p.message for p in changed) == [
        "'21 s' has no result file (paragraph)",
        "marker names '20 s', not in its block",
    ]
    reasonless = check("x.md", SECTION + "A 20 s warm-up. <!-- not measured: 20 s -->\n")
    assert [p.message.split(":")[0] for p in reasonless] == [
        "marker without a reason in parentheses",
        "'20 s' has no result file (paragraph)",
    ]


def test_settings_names_and_versions_are_not_figures() -> None:
    text = SECTION + (
        "`--seconds 40` at commit 4f67924 (2026-12-04), torch 2.13.0, Python 3.11, "
        "Pong-v5 with K=1, issue 19, seeds 0-9, `kill -9`; 2 actors x 4 envs.\n"
    )
    assert check("x.md", text) == []


@pytest.mark.parametrize(
    ("printed", "value", "ok"),
    [
        ("9.2 s", 9.18, True),
        ("9.2 s", 9.26, False),
        ("14,816", 14815.73, True),
        ("104k", 103839.0, True),
        ("60 %", 0.6, True),
        ("4.28 GB/s", 4.28e9, True),
        ("3.3 min", 198.0, True),
        ("0.85x", 0.8534, True),
        ("-20.2", 20.2, False),
    ],
)
def test_printed_rounding_and_units(printed: str, value: float, ok: bool) -> None:
    [(fig, _)] = numbers(printed)
    assert prints_as(fig, value) is ok
