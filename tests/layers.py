"""The import rules of tianji's layers, checked on the sources (an AST walk; no import).

Layers, bottom up: ``runtime`` (the event runtime) < ``rl`` (the RL vocabulary) <
``algorithms`` / ``transports`` (plug-ins) < ``services`` < ``launch`` < ``dashboard`` <
``run`` < ``bench`` < ``cli``. See ``docs/architecture.md``, "Layers and import rules".
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"tianji": "tianji", "transports": "tianji.transports", "algorithms": "tianji.algorithms"}

# layer -> the layers it may import (besides itself)
ALLOWED: dict[str, frozenset[str]] = {
    "root": frozenset(),
    "runtime": frozenset({"root"}),
    "rl": frozenset({"root", "runtime"}),
    "transports": frozenset({"root", "runtime"}),
    "algorithms": frozenset({"rl"}),
    "services": frozenset({"root", "runtime", "rl", "algorithms", "transports"}),
    "launch": frozenset({"root", "runtime", "rl", "transports"}),
    "dashboard": frozenset({"root", "runtime", "rl", "services", "launch"}),
    "run": frozenset(
        {"root", "runtime", "rl", "algorithms", "transports", "services", "launch", "dashboard"}
    ),
    "bench": frozenset(
        {"root", "runtime", "rl", "algorithms", "transports", "services", "launch", "run"}
    ),
    "cli": frozenset(
        {
            "root",
            "runtime",
            "rl",
            "algorithms",
            "transports",
            "services",
            "launch",
            "dashboard",
            "run",
            "bench",
        }
    ),
    "testing": frozenset({"root", "runtime", "rl"}),
}
FORBIDDEN_STDLIB: dict[str, frozenset[str]] = {"rl": frozenset({"asyncio"})}
# the re-export paths of 0.1.0, removed: nothing may import them (they no longer exist)
REMOVED = frozenset(
    f"tianji.{n}"
    for n in (
        "buffers",
        "checkpoint",
        "codec",
        "config",
        "controller",
        "core",
        "envs",
        "errors",
        "events",
        "service",
    )
)
# the public import paths (docs/architecture.md, "Public import paths"): each must import
PUBLIC = (
    "tianji.run.train",
    "tianji.run.config",
    "tianji.rl.config",
    "tianji.rl.config_ops",
    "tianji.run.evaluate",
    "tianji.rl.algorithm",
    "tianji.rl.errors",
    "tianji.rl.buffers",
    "tianji.rl.checkpoint",
    "tianji.rl.envs",
    "tianji.algorithms",
    "tianji.runtime.service",
    "tianji.runtime.events",
    "tianji.rl.events",
    "tianji.rl.topics",
    "tianji.runtime.controller",
    "tianji.services.balancer",
    "tianji.services.common",
    "tianji.runtime.loop",
    "tianji.launch.local",
    "tianji.launch.spec",
    "tianji.runtime.core",
    "tianji.runtime.errors",
    "tianji.runtime.codec",
    "tianji.transports",
    "tianji.testing",
)


@dataclasses.dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (resolved to a module where the name is one)
    line: int
    lazy: bool  # inside a function (runs on call, not on import)


def sources(root: Path = ROOT) -> dict[str, str]:
    """Every module of the installed layout -> its source text."""
    found: dict[str, str] = {}
    for folder, package in SOURCES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [package, *path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path.read_text()
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if module in REMOVED:
        return "removed"
    second = parts[1]
    if second in ALLOWED:
        return second
    if second == "__main__":
        return "cli"
    raise ValueError(f"{module} is in no layer: add it to tests/layers.py")


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(
    module: str, text: str, known: Iterable[str], *, type_checking: bool = False
) -> list[Import]:
    """The tianji modules ``module`` imports (``TYPE_CHECKING`` blocks only with
    ``type_checking``) and its other top-level imports (as ``stdlib:name``)."""
    known = set(known)
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child) and not type_checking:
                for sub in child.orelse:
                    visit(sub, lazy)
                continue
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child.lineno, lazy)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for alias in child.names:
                    sub = f"{child.module}.{alias.name}"
                    add(sub if sub in known else child.module, child.lineno, lazy)
            visit(child, inner)

    def add(target: str, line: int, lazy: bool) -> None:
        if target.split(".")[0] == "tianji":
            found.append(Import(module, target, line, lazy))
        else:
            found.append(Import(module, "stdlib:" + target.split(".")[0], line, lazy))

    visit(ast.parse(text), False)
    return found


def violations(modules: Mapping[str, str]) -> list[str]:
    """Every import that breaks a layer rule, as ``module:line imports target (why)``."""
    problems: list[str] = []
    for module, text in sorted(modules.items()):
        own = layer_of(module)
        for imp in imports(module, text, modules):
            where = f"{module}:{imp.line} imports {imp.target.removeprefix('stdlib:')}"
            if imp.target.startswith("stdlib:"):
                if imp.target[7:] in FORBIDDEN_STDLIB.get(own, ()):
                    problems.append(f"{where} ({own} uses no {imp.target[7:]})")
                continue
            theirs = layer_of(imp.target)
            if theirs == "removed":
                problems.append(f"{where} (a removed re-export path: import the module itself)")
            elif theirs != own and theirs not in ALLOWED[own]:
                problems.append(f"{where} ({own} may not import {theirs})")
    return problems


def cycles(modules: Mapping[str, str]) -> list[list[str]]:
    """Import cycles among the modules (every import counted: lazy ones and those for the
    type checker too)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, text in modules.items():
        for imp in imports(module, text, modules, type_checking=True):
            if imp.target in graph and imp.target != module:
                graph[module].add(imp.target)
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return found
