"""A verdict's next steps, as data: what to do, why, and the glmfb call that does it.

A :class:`Step` is either a glmfb command with its arguments (``command="bench"``,
``arguments={"baseline": "a.py:f", "candidate": "b.py:g", "shapes": ["8x4096"]}``) and why
to take it, or a plain instruction (``why`` only: "set allow_tf32=False in the candidate").
Arguments are keyed and written as the command's agent tool takes them and as a probe
definition writes its options: the TOML key of a declared option (``shapes``, ``budget``),
its value as a user would write it (``"5%"``, ``"2s"``, ``["8x4096"]``), and the fixed
arguments ``baseline``, ``candidate``, ``target``, ``command`` (a list), ``args``,
``baseline_args``, ``candidate_args`` (objects), ``name``, ``timeout``.

A step is never parsed back from text: :func:`glmfb.core.commandline.shell_line` renders it for
people, the agent server passes ``command`` and ``arguments`` on as a tool call.

A step says what it is for, as data (:class:`Intent`, declared where the probe builds it):
``deeper`` (a narrower question one layer down: the module diff of the served folder, gil on
the candidate; ``glmfb --follow`` runs these itself), ``confirm`` (the same question again, more
evidence: a quieter machine, more rounds), ``after_fix`` (rerun once the cause is fixed),
``reproduce`` (a minimal reproducer of what was found), ``other`` (the default: what a step
that does not say is, and what an older document's steps read as).

JSON: ``{"why": "...", "command": "bench", "arguments": {...}, "intent": "deeper"}``; a plain
step is ``{"why": "..."}``. ``intent`` is written only when it is not ``other``, so a step
without it reads as before. Readers of ``glmfb.verdict/1`` (steps as strings) read a string
as a plain step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from glmfb.contract.text import utf8_text


class Intent(str, Enum):
    """What a step is for (see the module docstring)."""

    DEEPER = "deeper"
    CONFIRM = "confirm"
    AFTER_FIX = "after_fix"
    REPRODUCE = "reproduce"
    OTHER = "other"


STEP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["why"],
    "properties": {
        "why": {"type": "string", "description": "what the step is for (the whole step when it is not a command)"},
        "command": {"type": "string", "minLength": 1,
                    "description": "the glmfb command: a probe kind, run, gate, or a command a probe brings"},
        "arguments": {"type": "object",
                      "description": "the command's arguments, keyed as its agent tool and a probe definition"},
        "intent": {"enum": [intent.value for intent in Intent],
                   "description": "what the step is for: deeper (one layer down; what --follow runs), confirm, "
                                  "after_fix, reproduce; other when left out"},
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Step:
    """One next step (see the module docstring)."""

    why: str
    command: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    intent: Intent = Intent.OTHER

    def __post_init__(self) -> None:
        if self.command is None and self.arguments:
            raise ValueError("a step with arguments needs a command")
        object.__setattr__(self, "intent", Intent(self.intent))
        object.__setattr__(self, "why", utf8_text(str(self.why)))
        object.__setattr__(self, "arguments", _plain(dict(self.arguments)))

    @property
    def is_call(self) -> bool:
        """Whether the step is a glmfb command (else an instruction for a person)."""
        return self.command is not None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"why": self.why}
        if self.command is not None:
            data["command"] = self.command
            data["arguments"] = dict(self.arguments)
        if self.intent is not Intent.OTHER:
            data["intent"] = self.intent.value
        return data

    @classmethod
    def from_json(cls, data: Any) -> Step:
        """A step from its JSON form, or from the string of a ``glmfb.verdict/1`` document."""
        if isinstance(data, str):
            return cls(why=data)
        return cls(why=data["why"], command=data.get("command"), arguments=data.get("arguments") or {},
                   intent=Intent(data.get("intent", Intent.OTHER.value)))


def as_step(item: Step | str) -> Step:
    """A step, from a step or a plain instruction."""
    return item if isinstance(item, Step) else Step(why=str(item))


def _plain(value: Any) -> Any:
    """Arguments as plain JSON data (tuples become lists, paths strings, a NaN or infinity
    its JSON-like text)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # JSON has no NaN: the text Python's JSON reads back ("NaN", "-Infinity")
    if isinstance(value, str):
        return utf8_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return utf8_text(str(value))
