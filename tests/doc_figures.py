"""Every figure published in README.md and docs/*.md is held by a result file in docs/results/.

The convention, for whoever writes a figure
--------------------------------------------
A measured figure is published together with the command that measured it and the result file
that holds it: the text names the file as ``docs/results/NAME.json`` (or ``.md``; braces as in
``docs/results/NAME.{md,json}`` name both). This test reads README.md and docs/*.md and checks
that every named file exists and that every number quoted in the blocks it covers appears in
one of the files covering them.

Blocks and what covers them
---------------------------
The text is cut into *blocks*: a heading line, a paragraph, one list item (with its
continuation lines, up to the next item), a table, or a fenced block whose info string is
empty or ``text`` (program output). Fenced blocks tagged with a language (``bash``,
``python``, ``toml``, ...) are commands or code and are skipped. A block is covered by the
result files it names; a block that names none is covered by the files named in the closest
earlier block under the same heading that names any (so a paragraph naming the file covers
the table and the list items that follow it, up to the next heading or the next paragraph
naming other files).

Which numbers are checked
-------------------------
The *figures* of a block are checked: numbers with a unit (s, ms, µs, min, h, %, x, msg/s
and other /s rates, MB, GB, KiB, ...), numbers with a decimal part, a thousands separator,
a ``k``/``M`` suffix or a sign, and every number that is a whole table cell outside the
first column. In a covered block each figure must be held by a covering file; in a block
that no file covers, every figure is reported. A bare integer in prose (``2 actors``, ``60
kills``, ``a GRU core of 64``) is a count of things or a setting and is not a figure. These
are excluded everywhere by rule, because they are not measurements:

1. text in inline code spans (commands, flags, config keys and values, paths) and in fenced
   blocks tagged with a language;
2. commit hashes (7-40 hex digits with a letter), dates (``2026-12-04``), dotted versions
   (``2.13.0``) and a version after a package name (``Python 3.11``, ``pyzmq 27.3``);
3. numbers that are part of a name: glued to a letter, an underscore, a slash or a dot on the
   left or a letter on the right (``v5``, ``mpe2``, ``issue19``, ``K=1``), after ``=``, and
   the number after ``issue``, ``issues``, ``#``, ``seed``, ``seeds`` (``seeds 0-9``) or
   ``kill`` (``kill -9``);
4. markdown link targets.

A number printed with d decimals matches a file value that rounds to it (9.2 matches 9.18);
thousands separators are ignored; ``k``/``M`` suffixes scale by 1e3/1e6; a percentage also
matches the fraction (60 % matches 0.6); MB/GB/KiB/MiB, ms/µs and min also match the value in
bytes, seconds or seconds respectively; ratios are printed numbers like any other (0.85x).

Figures that are not measurements
---------------------------------
A setting, a spec or an estimate quoted with a unit (``a 20 s warm-up``, ``25-step
episodes``, ``20 s at 10 Gb/s``) is exempted only by naming it in the block, exactly as
printed, in a marker comment::

    <!-- not measured: 20 s; 25-step (settings of the bench) -->

The list before the parenthesis names each exempted figure (``;``-separated); the reason in
parentheses is required. A marker whose figure no longer appears in its block fails the
test, and the marker exempts nothing else, so changing an exempted figure makes it checked
again. A fenced output block takes its marker from the line just above its opening fence. There is
no marker for a whole block.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def published_docs() -> list[Path]:
    """README.md and docs/*.md, the files whose figures are checked."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True, slots=True)
class Block:
    """One block of a document: see the module docstring."""

    line: int
    level: int  # of the heading the block is under (0 before the first)
    kind: str  # "heading", "paragraph", "item", "table" or "output"
    text: str


@dataclass(frozen=True, slots=True)
class Figure:
    """A number as printed, with what it may match in a result file."""

    token: str
    value: float
    decimals: int
    scales: tuple[float, ...]
    unit: str


@dataclass(frozen=True, slots=True)
class Problem:
    """Something the checker reports, with where it is."""

    doc: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.message}"


# --- cutting a document into blocks ---------------------------------------------------------

_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
_OUTPUT_TAGS = {"", "text", "console", "output"}


def split_blocks(text: str) -> list[Block]:
    """Cut markdown into heading, paragraph, list-item, table and output blocks."""
    blocks: list[Block] = []
    level = 0
    lines: list[str] = []
    kind = ""
    start = 0
    fence = ""
    fence_tag = ""

    def flush() -> None:
        nonlocal lines, kind
        if lines and kind:
            blocks.append(Block(start, level, kind, "\n".join(lines)))
        lines, kind = [], ""

    for number, line in enumerate(text.splitlines(), start=1):
        if fence:
            if line.strip().startswith(fence):
                if fence_tag in _OUTPUT_TAGS:
                    flush()
                else:
                    lines, kind = [], ""
                fence = ""
            else:
                lines.append(line)
            continue
        opened = _FENCE.match(line)
        stripped = line.strip()
        if opened:
            # A marker on the line just above a fence belongs to the fenced block.
            carried = lines.pop() if lines and _MARKER.fullmatch(lines[-1].strip()) else None
            flush()
            fence, fence_tag = opened.group(1), opened.group(2).lower()
            kind, start = "output", number
            lines = [carried] if carried else []
            continue
        if not stripped:
            flush()
            continue
        if stripped.startswith("#"):
            flush()
            level = len(stripped) - len(stripped.lstrip("#"))
            blocks.append(Block(number, level, "heading", stripped.lstrip("#").strip()))
            continue
        if stripped.startswith("|") or _ITEM.match(line):  # a table row, or a list item
            row = stripped.startswith("|")
            if not row or kind != "table":  # (a table goes on; each item starts a block)
                flush()
                kind, start = ("table" if row else "item"), number
            lines.append(line)
            continue
        if kind == "table":
            flush()
        if not kind:
            kind, start = "paragraph", number
        lines.append(line)
    flush()
    return blocks


# --- citations and markers -------------------------------------------------------------------

_CITE = re.compile(r"docs/results/([\w.-]+?)(?:\.\{([\w,]+)\}|\.(json|md))(?![\w.])")
_MARKER = re.compile(r"<!--\s*not measured:\s*(.*?)\s*-->", re.S)


def cited_files(text: str) -> list[str]:
    """The result files a block names, as paths relative to the repository."""
    found: list[str] = []
    for match in _CITE.finditer(text):
        stem, braces, ext = match.groups()
        for suffix in braces.split(",") if braces else [ext]:
            found.append(f"docs/results/{stem}.{suffix}")
    return found


def markers(text: str) -> tuple[list[str], list[str]]:
    """The figures a block's markers exempt, and the problems with the markers themselves."""
    exempt: list[str] = []
    problems: list[str] = []
    for match in _MARKER.finditer(text):
        body = match.group(1)
        reason = re.search(r"\(([^()]+)\)\s*$", body)
        if not reason or not reason.group(1).strip():
            problems.append(f"marker without a reason in parentheses: {match.group(0)!r}")
            continue
        names = [n.strip() for n in body[: reason.start()].split(";") if n.strip()]
        if not names:
            problems.append(f"marker that names no figure: {match.group(0)!r}")
        exempt.extend(names)
    return exempt, problems


# --- numbers in the text ---------------------------------------------------------------------

_PACKAGES = (
    r"C?Python|torch|pyzmq|Ray|uvloop|gymnasium|numpy|SB3|Stable-Baselines3|ale-py|"
    r"opencv-python|sample-factory|Sample Factory|msgspec|mpe2|pettingzoo"
)
_NOT_NUMBERS = [
    re.compile(r"<!--.*?-->", re.S),  # markers (checked on their own)
    re.compile(r"`[^`]*`"),  # rule 1
    re.compile(r"\]\([^)]*\)"),  # rule 4
    re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),  # rule 2: hashes
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),  # rule 2: dates
    re.compile(r"\b\d+(?:\.\d+){2,}\b"),  # rule 2: dotted versions
    re.compile(rf"\b(?:{_PACKAGES})\s*[≥>=<]*\s*\d+(?:\.\d+)+"),  # rule 2
    re.compile(
        r"(?:\b(?:issues?|seeds?|kill)\s+|#)[\u2212-]?\d+(?:\s*(?:[-\u2013,]|and)\s*\d+)*", re.I
    ),  # rule 3
    re.compile(r"=\s*[\u2212-]?\d[\d.,]*"),  # rule 3: after '='
]

# A unit after a number: the longest spellings first. Each maps to the scales by which a
# file value may be divided to give the printed number.
_UNITS: dict[str, tuple[float, ...]] = {
    "GB/s": (1.0, 1e9),
    "MB/s": (1.0, 1e6),
    "Gb/s": (1.0, 1e9),
    "GiB": (1.0, 2.0**30),
    "MiB": (1.0, 2.0**20),
    "KiB": (1.0, 2.0**10),
    "GB": (1.0, 1e9),
    "MB": (1.0, 1e6),
    "KB": (1.0, 1e3),
    "kB": (1.0, 1e3),
    "µs": (1.0, 1e-6),
    "us": (1.0, 1e-6),
    "ms": (1.0, 1e-3),
    "minutes": (1.0, 60.0),
    "minute": (1.0, 60.0),
    "min": (1.0, 60.0),
    "hours": (1.0, 3600.0),
    "hour": (1.0, 3600.0),
    "h": (1.0, 3600.0),
    "seconds": (1.0,),
    "second": (1.0,),
    "s": (1.0,),
    "%": (1.0, 0.01),
    "x": (1.0,),
    "\u00d7": (1.0,),  # the multiplication sign
    "msg/s": (1.0,),
    "/s": (1.0,),
}
_UNIT_RE = "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
_NUMBER = re.compile(
    r"(?<![\w./\\^])"  # rule 3: not glued to a name on the left
    r"(?P<sign>[\u2212-](?=\d))?"
    r"(?P<int>\d{1,3}(?:,\d{3})+|\d+)"
    r"(?:\.(?P<frac>\d+))?"
    r"(?P<suffix>[kM](?![\w]))?"
    r"(?:[ -]?(?P<unit>" + _UNIT_RE + r")(?![A-Za-z0-9]))?"
)


def _strip_rules(text: str) -> str:
    for pattern in _NOT_NUMBERS:
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)
    return text


def numbers(text: str, rules: bool = True) -> list[tuple[Figure, int]]:
    """Every number in ``text`` (that the exclusion rules leave), with its offset, in order."""
    if rules:
        text = _strip_rules(text)
    found: list[tuple[Figure, int]] = []
    for match in _NUMBER.finditer(text):
        end = match.end()
        if end < len(text) and (text[end].isalpha() or text[end] == "_") and not match["unit"]:
            continue  # glued to a name on the right: `2x4`-style ids, `4f67924`
        # A minus sign counts only at the start of a word ("7-11" is a range).
        sign_ok = match["sign"] and (match.start() == 0 or not text[match.start() - 1].isalnum())
        digits = match["int"].replace(",", "")
        frac = match["frac"] or ""
        value = float(f"{digits}.{frac}" if frac else digits)
        if sign_ok:
            value = -value
        unit = match["unit"] or ""
        scales: tuple[float, ...] = _UNITS.get(unit, (1.0,))
        if match["suffix"]:
            scales = (1e3,) if match["suffix"] == "k" else (1e6,)
        fig = Figure(match.group(0).strip(), value, len(frac), scales, unit)
        found.append((fig, match.start()))
    return found


def is_figure(fig: Figure, alone_in_cell: bool) -> bool:
    """Whether a number in a block that no result file covers counts as a measured figure."""
    return bool(
        alone_in_cell
        or fig.unit
        or fig.decimals
        or "," in fig.token
        or fig.token[-1:] in "kM"
        or fig.value < 0
    )


# --- numbers in the result files -------------------------------------------------------------


def _walk(obj: object) -> list[float]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [float(obj)] if math.isfinite(obj) else []
    if isinstance(obj, dict):
        return [v for item in obj.values() for v in _walk(item)]
    if isinstance(obj, list):
        return [v for item in obj for v in _walk(item)]
    if isinstance(obj, str):
        return [f.value for f, _ in numbers(obj, rules=False)]
    return []


@cache
def file_values(path: str) -> tuple[float, ...]:
    """Every number a result file holds, sorted (JSON values and numbers in its strings)."""
    text = (ROOT / path).read_text()
    if path.endswith(".json"):
        values = _walk(json.loads(text))
    else:
        values = [f.value for f, _ in numbers(text, rules=False)]
    return tuple(sorted(values))


def prints_as(fig: Figure, value: float) -> bool:
    """Whether ``value`` (as a result file holds it) prints as ``fig``."""
    half = 0.5 * 10.0 ** (-fig.decimals) + 1e-9
    return any(abs(value / scale - fig.value) <= half for scale in fig.scales)


def held(fig: Figure, paths: list[str]) -> bool:
    """Whether a file holds a value that prints as ``fig`` (rounding, units, separators)."""
    half = 0.5 * 10.0 ** (-fig.decimals) + 1e-9
    for path in paths:
        values = file_values(path)
        for scale in fig.scales:
            low = (fig.value - half) * scale
            high = (fig.value + half) * scale
            low, high = min(low, high), max(low, high)
            i = bisect_left(values, low - 1e-9 * abs(low))
            if i < len(values) and values[i] <= high and prints_as(fig, values[i]):
                return True
    return False


_CELL = re.compile(r"\|\s*\**\s*(?=[\u2212-]?\d)")


def table_cells(text: str) -> set[int]:
    """Offsets of the numbers that make up a whole table cell, outside the first column."""
    offsets: set[int] = set()
    line_start = 0
    for line in text.splitlines(keepends=True):
        for match in _CELL.finditer(line):
            if line[: match.start()].strip() == "":
                continue  # the first column names the row
            rest = line[match.end() :].split("|", 1)[0]
            if re.fullmatch(r"[\u2212-]?[\d.,]+\s*\**\s*", rest):
                offsets.add(line_start + match.end())
        line_start += len(line)
    return offsets


# --- the check -------------------------------------------------------------------------------


def check(doc: str, text: str) -> list[Problem]:
    """Every problem with the figures of one document (see the module docstring)."""
    problems: list[Problem] = []
    # covering[level]: the files named last under the open heading of that level
    covering_at: dict[int, list[str]] = {}
    for block in split_blocks(text):
        if block.kind == "heading":
            covering_at = {k: v for k, v in covering_at.items() if k < block.level}
        own = cited_files(block.text)
        for path in own:
            if not (ROOT / path).is_file():
                problems.append(Problem(doc, block.line, f"cites {path}, which does not exist"))
        own = [p for p in own if (ROOT / p).is_file()]
        if own and block.kind != "heading":
            covering_at[block.level] = own
        covering = covering_at[max(covering_at)] if covering_at else own
        exempt, marker_problems = markers(block.text)
        problems += [Problem(doc, block.line, m) for m in marker_problems]
        visible = _MARKER.sub(" ", block.text)
        stripped = _strip_rules(visible)
        for name in exempt:
            if name not in stripped:
                problems.append(
                    Problem(doc, block.line, f"marker names {name!r}, not in its block")
                )
                continue
        exempt_spans = [
            (m.start(), m.end()) for name in exempt for m in re.finditer(re.escape(name), stripped)
        ]
        cells = table_cells(stripped) if block.kind == "table" else set()
        for fig, start in numbers(visible):
            if any(a <= start < b for a, b in exempt_spans):
                continue
            if not is_figure(fig, start in cells):
                continue
            if covering:
                if not held(fig, covering):
                    problems.append(
                        Problem(
                            doc,
                            block.line,
                            f"{fig.token!r} is in none of {', '.join(covering)}",
                        )
                    )
            else:
                problems.append(
                    Problem(doc, block.line, f"{fig.token!r} has no result file ({block.kind})")
                )
    return problems


def all_problems() -> list[Problem]:
    """The problems of every published document."""
    return [
        problem
        for path in published_docs()
        for problem in check(str(path.relative_to(ROOT)), path.read_text())
    ]
