"""What a diff's why may say, and what its evidence must show first.

Each kind of sentence a why can say about a diff has a precondition on the evidence, written
here once: the rules consult it before they say the sentence (:meth:`Claim.holds`), and a
verdict can be checked against it afterwards (:func:`contradicted`: its why, next steps and
``where`` against what the rules saw, the ``saw`` of its ``diagnosis`` evidence).

| claim | said as | precondition (in ``saw``) |
|---|---|---|
| ``position`` | "position 32", ``where.position`` | a token axis was read at the tap whose positions are named (``token_axis``) |
| ``not-float16-range`` | "not float16's range" | the operations that made the NaN or Inf were traced (``float16_traced``), none shows float16 (``float16_seen`` empty), and the first operation that gave NaN or Inf on finite operands (``first_nonfinite``) neither takes nor gives float16 |
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Claim:
    """One kind of sentence a why can say, how it is recognized, and its precondition."""

    name: str
    says: re.Pattern[str]  # the sentence, in a why or a next step
    where_key: str | None  # the ``where`` key that says it too
    requires: str  # the precondition, in words
    holds: Callable[[Mapping[str, Any]], bool]  # the precondition, over what the rules saw

    def said(self, text: str, where: Mapping[str, Any]) -> bool:
        return bool(self.says.search(text)) or (self.where_key is not None and self.where_key in where)


def _token_axis_read(saw: Mapping[str, Any]) -> bool:
    return saw.get("token_axis") is not None


def _no_float16_made_it(saw: Mapping[str, Any]) -> bool:
    op = saw.get("first_nonfinite")
    dtypes = [*op.get("inputs", ()), op.get("output")] if isinstance(op, Mapping) else []
    return bool(saw.get("float16_traced")) and not saw.get("float16_seen") and "float16" not in dtypes


POSITION = Claim(
    "position", re.compile(r"\bpositions? \d+"), "position",
    "a token axis was read at the tap whose positions are named", _token_axis_read,
)
NOT_FLOAT16_RANGE = Claim(
    "not-float16-range", re.compile(r"not float16's range"), None,
    "the operations that made the NaN or Inf were traced, none shows float16, and the first that gave NaN or Inf "
    "on finite operands neither takes nor gives float16", _no_float16_made_it,
)
CLAIMS: tuple[Claim, ...] = (POSITION, NOT_FLOAT16_RANGE)


def contradicted(why: str, steps: Sequence[str], where: Mapping[str, Any], saw: Mapping[str, Any]) -> list[Claim]:
    """The claims a verdict makes (in its why, its next steps or its ``where``) whose
    precondition what the rules saw does not meet."""
    text = "\n".join([why, *steps])
    return [claim for claim in CLAIMS if claim.said(text, where) and not claim.holds(saw)]
