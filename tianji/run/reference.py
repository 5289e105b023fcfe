"""The run config reference (``docs/config.md``), generated from the config dataclasses.

Every section of :class:`tianji.rl.config.RunConfig` and every in-tree algorithm's
``Config`` (its ``[algo]`` keys) becomes a table of key, type, default and meaning; the
meaning is the field's docstring in the source (a field a subclass re-declares without one
keeps its base class's). Regenerate after changing a config::

    python -m tianji.run.reference > docs/config.md

``tests/test_config_reference.py`` fails while the file and the dataclasses disagree.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import sys
import textwrap
import typing
from typing import Any

from tianji import algorithms
from tianji.rl.config import RunConfig

__all__ = ["field_docs", "reference"]

HEADER = """\
# Run config reference

Every key of a run config file (TOML, see `examples/`) and of `--set KEY=VALUE`, with its
type, default and meaning. Generated from the config dataclasses by
`python -m tianji.run.reference > docs/config.md`; `tests/test_config_reference.py` fails
when this file and the code disagree. Unknown keys are refused naming the allowed ones.
"""


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Each field's docstring (the string literal after its annotation), searched through
    ``cls``'s bases so a field re-declared without one keeps its base class's."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        source = textwrap.dedent(inspect.getsource(klass))
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, after in zip(body.body, [*body.body[1:], None], strict=True):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docs[stmt.target.id] = inspect.cleandoc(str(after.value.value))
    return docs


def _type_name(hint: Any) -> str:
    text = str(hint) if not isinstance(hint, type) else hint.__name__
    return text.replace("typing.", "").replace("collections.abc.", "").replace("NoneType", "None")


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        if dataclasses.is_dataclass(value):
            return "(table)"
    else:
        return "(required)"
    if field.name == "run_dir":
        return '`$TIANJI_RUN_DIR` or `"runs"`'
    if isinstance(value, float) and math.isinf(value):
        return "`inf`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(cls: type[Any], *, skip_tables: bool = True) -> list[str]:
    """The markdown rows of ``cls``'s fields (nested config tables left out)."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if skip_tables and dataclasses.is_dataclass(hints[f.name]):
            continue
        if f.name == "algo" and cls is RunConfig:
            continue
        meaning = _cell(docs.get(f.name, ""))
        rows.append(f"| `{f.name}` | `{_type_name(hints[f.name])}` | {_default(f)} | {meaning} |")
    return rows


def reference() -> str:
    """The whole ``docs/config.md``."""
    out = [HEADER, "## Top level", "", *table(RunConfig), ""]
    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        section: type[Any] = hints[f.name]
        if dataclasses.is_dataclass(section):
            doc = inspect.cleandoc(section.__doc__ or "")
            out += [f"## [{f.name}]", "", _cell(doc), "", *table(section), ""]
    out += [
        "## [algo]",
        "",
        "The fields of the algorithm's own `Config` (checked against it). The in-tree ones:",
        "",
    ]
    for name in algorithms.names():
        cls = algorithms.get(name)
        if not cls.__module__.startswith("tianji.algorithms."):
            continue  # a plugin registered in this environment: its own docs
        config = cls.Config
        out += [f'### `algorithm = "{name}"`', "", *table(config, skip_tables=False), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
