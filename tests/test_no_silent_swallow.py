"""No exception disappears without a word: every handler in ``tianji/``, ``transports/`` and
``algorithms/`` re-raises, logs the exception, counts it, or passes it on.

The rule, checked on the AST of every module of those trees:

* An ``except`` handler is **silent** unless its body (nested functions and classes aside)
  does at least one of:

  1. ``raise`` (re-raise, or raise another error ``from`` it);
  2. a logging call with the exception: ``<name>.<level>(...)`` where ``<name>`` is
     ``log``, ``logger``, ``logging`` or ends in ``_log``/``_logger``, ``<level>`` one of
     debug, info, warning, error, critical, exception or log, and the call either is
     ``.exception(...)``, passes ``exc_info=``, or passes the handler's bound exception
     (``except X as exc``) among its arguments;
  3. a named counter: an augmented assignment or assignment to a subscript of something
     named ``counters`` (``self.counters["bad_frames"] += 1``);
  4. passes the bound exception on as a value: any read of the name bound by ``as``
     (returned, stored, sent to a future, wrapped in a typed error or a result, printed to
     the user). A handler that binds the exception only to ignore it is silent;
  5. fails the service: ``self.fail(reason)`` (:meth:`tianji.runtime.service.Service.fail`
     logs the reason at error and makes the service's ``run`` raise ``ServiceFailed``);
  6. catches only exceptions that are the guarded call's ordinary answer, not a failure
     (:data:`CONTROL_FLOW`: would-block and interrupted non-blocking socket calls, the end
     of a stream or an iterator). These sit in per-message code, where a log would cost
     on the common path.

* ``contextlib.suppress(...)`` (or a bare ``suppress(...)``) is silent by construction: it
  can do none of the above.

A handler or ``suppress`` that truly cannot follow the rule is in :data:`ALLOWED`, by
``path:function``, with the reason.

Handlers of ``asyncio.CancelledError`` / ``GeneratorExit`` / ``KeyboardInterrupt`` follow
the same rule (they re-raise, or say why they end). The test also plants one violation of
each kind in a copy of a module and checks that the checker finds it.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tianji.runtime.loop import finished_within, wait_set

ROOT = Path(__file__).resolve().parents[1]
TREES = ("tianji", "transports", "algorithms")
LEVELS = {"debug", "info", "warning", "error", "critical", "exception", "log"}

CONTROL_FLOW = {"BlockingIOError", "InterruptedError", "EndOfStream", "StopIteration",
                "StopAsyncIteration"}  # fmt: skip
"""Exceptions that answer the call they guard (see the module docstring, 6)."""

ALLOWED: dict[str, str] = {
    "tianji/cli/__init__.py:main": "KeyboardInterrupt: Ctrl-C is the user's request, not a "
    "failure, and carries nothing to log; the CLI prints that every service stopped and "
    "exits 130, as documented",
}
"""``path:function`` -> why a handler or ``suppress`` there cannot follow the rule."""


def _is_logger(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return name in ("log", "logger", "logging") or name.endswith(("_log", "_logger"))


def _walk_body(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of ``body``, not descending into nested functions, lambdas or classes."""
    nested = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda
    stack: list[ast.AST] = [node for node in body if not isinstance(node, nested)]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, nested):
                stack.append(child)


def _counts(target: ast.expr) -> bool:
    if not isinstance(target, ast.Subscript):
        return False
    owner = target.value
    name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
    return name == "counters"


def _caught(handler: ast.ExceptHandler) -> set[str]:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return {getattr(k, "attr", getattr(k, "id", "?")) for k in kinds if k is not None}


def handles(handler: ast.ExceptHandler) -> bool:
    """Does this handler re-raise, log with the exception, count, pass it on, fail the
    service, or catch only control flow (the module docstring's rule)?"""
    if handler.type is not None and _caught(handler) <= CONTROL_FLOW:
        return True
    bound = handler.name
    for node in _walk_body(handler.body):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Name) and node.id == bound and isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.AugAssign) and _counts(node.target):
            return True
        if isinstance(node, ast.Assign) and any(_counts(t) for t in node.targets):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            with_info = func.attr == "exception" or any(k.arg == "exc_info" for k in node.keywords)
            if func.attr in LEVELS and _is_logger(func.value) and with_info:
                return True
            owner = func.value
            if func.attr == "fail" and isinstance(owner, ast.Name) and owner.id == "self":
                return True
    return False


def _suppress_calls(node: ast.With | ast.AsyncWith) -> bool:
    for item in node.items:
        call = item.context_expr
        if isinstance(call, ast.Call):
            func = call.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "suppress":
                return True
    return False


def violations(source: str, path: str) -> list[str]:
    """``path:line: what`` for every silent handler and unlisted suppress in ``source``."""
    tree = ast.parse(source)
    found: list[str] = []
    scopes: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            scopes.append((node.lineno, node.end_lineno or node.lineno, node.name))

    def where(line: int) -> str:
        inside = [s for s in scopes if s[0] <= line <= s[1]]
        return max(inside, key=lambda s: s[0])[2] if inside else "<module>"

    for node in ast.walk(tree):
        allowed = f"{path}:{where(getattr(node, 'lineno', 0))}" in ALLOWED
        if isinstance(node, ast.ExceptHandler) and not handles(node) and not allowed:
            caught = ast.unparse(node.type) if node.type is not None else "everything"
            found.append(f"{path}:{node.lineno}: except {caught} in {where(node.lineno)}()")
        elif isinstance(node, ast.With | ast.AsyncWith) and _suppress_calls(node) and not allowed:
            found.append(f"{path}:{node.lineno}: suppress in {where(node.lineno)}()")
    return found


def _modules() -> list[Path]:
    return sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py"))


def test_no_handler_swallows_an_exception_silently() -> None:
    found = [
        v for path in _modules() for v in violations(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "silent handlers (see this module's docstring):\n" + "\n".join(found)


def test_every_allowed_entry_is_still_needed_and_says_why() -> None:
    """An entry whose handler was fixed or removed goes from the list."""
    for key, reason in list(ALLOWED.items()):
        assert reason.strip(), key
        rel = key.rsplit(":", 1)[0]
        source = (ROOT / rel).read_text()
        saved = ALLOWED.pop(key)
        try:
            assert violations(source, rel), f"{key} follows the rule now: drop it from ALLOWED"
        finally:
            ALLOWED[key] = saved


PLANTED = {
    "pass": "try:\n    f()\nexcept OSError:\n    pass\n",
    "bound and ignored": "try:\n    f()\nexcept OSError as exc:\n    x = 1\n",
    "logged without the exception": (
        "try:\n    f()\nexcept OSError:\n    log.warning('it failed')\n"
    ),
    "a return of a constant": "def g():\n    try:\n        f()\n    except OSError:\n"
    "        return None\n",
    "a counter of something else": "try:\n    f()\nexcept OSError:\n    self.seen[k] += 1\n",
    "suppress": "import contextlib\nwith contextlib.suppress(OSError):\n    f()\n",
    "bare suppress": "from contextlib import suppress\nwith suppress(OSError):\n    f()\n",
    "control flow mixed with an error": (
        "try:\n    f()\nexcept (BlockingIOError, OSError):\n    return\n"
    ),
    "another object's fail": "try:\n    f()\nexcept OSError:\n    other.fail('x')\n",
    "a raise only in a nested function": (
        "try:\n    f()\nexcept OSError:\n    def h():\n        raise\n"
    ),
}

HANDLED = {
    "re-raise": "try:\n    f()\nexcept OSError:\n    cleanup()\n    raise\n",
    "typed error": "try:\n    f()\nexcept OSError as exc:\n    raise Broken('x') from exc\n",
    "logged with it": "try:\n    f()\nexcept OSError as exc:\n    log.debug('gone: %s', exc)\n",
    "exc_info": "try:\n    f()\nexcept OSError:\n    logger.warning('x', exc_info=True)\n",
    "log.exception": "try:\n    f()\nexcept OSError:\n    log.exception('x')\n",
    "counted": "try:\n    f()\nexcept OSError:\n    self.counters['bad'] += 1\n",
    "passed on": "try:\n    f()\nexcept OSError as exc:\n    fut.set_exception(exc)\n",
    "the service fails": "try:\n    f()\nexcept TimeoutError:\n    self.fail('late')\n",
    "would block": "try:\n    f()\nexcept (BlockingIOError, InterruptedError):\n    return\n",
    "end of stream": "try:\n    f()\nexcept EndOfStream:\n    return n\n",
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_the_checker_finds_a_planted_silent_handler(kind: str) -> None:
    assert violations(PLANTED[kind], "planted.py"), kind


@pytest.mark.parametrize("kind", sorted(HANDLED))
def test_the_checker_accepts_each_way_of_handling(kind: str) -> None:
    assert violations(HANDLED[kind], "ok.py") == [], kind


def test_the_two_handlers_issue_32_named_made_silent_again_are_found() -> None:
    """The launcher's wait for the controller under ``suppress(Exception)`` and the accept
    loop ending on a ``TianjiError`` without a word, planted back into their modules."""
    base = (ROOT / "tianji/launch/base.py").read_text()
    service = (ROOT / "tianji/runtime/serving.py").read_text()
    assert violations(base, "base.py") == [] and violations(service, "serving.py") == []
    silent_wait = base.replace(
        "            await self._controller_ended(ctl_task)\n",
        "            with contextlib.suppress(Exception):\n"
        "                await asyncio.wait_for(ctl_task, self.grace)\n",
    )
    start = service.index("            except ClosedByUs as exc:")
    end = service.index("            if local:\n", start)
    silent_accept = service[:start] + "            except TianjiError:\n                return\n"
    silent_accept += service[end:]
    assert silent_wait != base and silent_accept != service
    assert [v.split(": ", 1)[1] for v in violations(silent_wait, "base.py")] == [
        "suppress in _run_controlled()"
    ]
    assert [v.split(": ", 1)[1] for v in violations(silent_accept, "serving.py")] == [
        "except TianjiError in accept()"
    ]


def test_timed_waits_answer_without_raising_and_cancel_what_timed_out() -> None:
    """:func:`wait_set` / :func:`finished_within` replaced ``suppress(TimeoutError)``
    around ``wait_for``: the timeout is a ``False``, a failure still raises."""

    async def main() -> None:
        event = asyncio.Event()
        assert not await wait_set(event, 0.01)
        assert not await wait_set(event, -1.0)  # a deadline already passed
        event.set()
        assert await wait_set(event, 0.0)
        slow = asyncio.ensure_future(asyncio.sleep(10))
        assert not await finished_within(slow, 0.01)
        assert slow.cancelled()
        assert await finished_within(asyncio.sleep(0), None)

        async def broken() -> None:
            raise OSError("boom")

        with pytest.raises(OSError, match="boom"):
            await finished_within(broken(), 1.0)

    asyncio.run(main())
