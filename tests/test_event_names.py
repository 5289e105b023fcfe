"""Events are named by the rule at the top of ``tianji/runtime/events.py``: facts in the
past tense, commands in the imperative, and each says which it is."""

from __future__ import annotations

import re

import tianji.rl.events  # noqa: F401  (registers the RL events)
from tianji.runtime.events import event_types

# facts named by what they carry
NOUN_FACTS = frozenset({"Heartbeat", "HeartbeatBatch", "SampleBatch"})


def test_every_event_says_whether_it_is_a_command_or_a_fact() -> None:
    vague = [
        n
        for n, i in event_types().items()
        if not re.match(r"(Command|Fact)\b", i.cls.__doc__ or "")
    ]
    assert vague == []


def test_commands_are_imperative_and_facts_past_tense() -> None:
    wrong = []
    for name, info in sorted(event_types().items()):
        command = (info.cls.__doc__ or "").startswith("Command")
        past = bool(re.search(r"(ed|en|Taken)$", name)) or name.endswith("Finished")
        if command and (past or name.endswith("Ready")):
            wrong.append(f"{name}: a command named as a fact")
        if not command and not past and name not in NOUN_FACTS:
            wrong.append(f"{name}: a fact not in the past tense")
    assert wrong == []
