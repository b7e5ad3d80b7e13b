"""Finding and validating the actions in an LLM's reply. Pure functions, no actor.

LLMs wrap JSON in many ways; all of these are accepted::

    >>> text = 'Sure! ```json\\n{"actions": [{"type": "bash", "payload": {"command": "df -h"}}]}\\n```'
    >>> found = extract_actions(text, allowed=["terminal", "message_console"])
    >>> [a.type for a in found.actions], found.errors
    (['terminal'], ())

Anything wrong becomes a one-line error the LLM can act on. A reply that
carries a ``system_message`` is an echo of runtime data: nothing in it runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from autoresponse.actors.limits import MAX_YOUR_REPLY_CHARS
from autoresponse.actors.prompts import ERROR_RETRY_POLICY
from autoresponse.messages import (
    BaseAction,
    PromptRequest,
    SystemMessage,
    action_model,
    canonical_action_type,
    parse_action,
)

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
_decoder = json.JSONDecoder()


@dataclass(frozen=True)
class Extraction:
    """The valid actions of a reply, and one line per problem found."""

    actions: tuple[BaseAction, ...]
    errors: tuple[str, ...]


def _json_values(text: str) -> tuple[list[Any], str | None]:
    """Every JSON object or list in ``text``, and the first decoding error seen."""
    stripped = text.strip()
    try:
        return [json.loads(stripped)], None
    except ValueError as exc:
        first_error: str | None = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    fenced = _FENCE.findall(text)
    values: list[Any] = []
    for block in fenced or [text]:
        values.extend(_scan(block))
    return values, (None if values else first_error)


def _scan(text: str) -> Iterator[Any]:
    """JSON values embedded in prose, left to right, skipping what they span."""
    i = 0
    while True:
        starts = [p for p in (text.find("{", i), text.find("[", i)) if p >= 0]
        if not starts:
            return
        start = min(starts)
        try:
            value, end = _decoder.raw_decode(text, start)
        except ValueError:
            i = start + 1
            continue
        if isinstance(value, (dict, list)):
            yield value
        i = end


def _carries_system_message(value: Any) -> bool:
    if isinstance(value, dict):
        return "system_message" in value or any(_carries_system_message(v) for v in value.values())
    if isinstance(value, list):
        return any(_carries_system_message(v) for v in value)
    return False


def _raw_actions(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, dict) and isinstance(value.get("actions"), list):
        return value["actions"]
    return [value]


def _compact(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"][1:]) or "action"  # [0] is the union tag
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def extract_actions(text: str, allowed: Collection[str]) -> Extraction:
    """The valid actions in ``text`` that this turn allows, and the errors of the rest."""
    values, decode_error = _json_values(text)
    if not values:
        reason = f"invalid JSON ({decode_error})" if decode_error and "{" in text else "no JSON found"
        return Extraction((), (f"your reply is not an action list: {reason}",))
    if any(_carries_system_message(v) for v in values):
        return Extraction((), (
            "your reply carries a system_message; that is runtime data and is never executed",
        ))
    raws = [raw for value in values for raw in _raw_actions(value)]
    if not raws:
        return Extraction((), ("your reply holds no action",))
    allowed_text = ", ".join(sorted(allowed))
    actions: list[BaseAction] = []
    errors: list[str] = []
    for n, raw in enumerate(raws, 1):
        if not isinstance(raw, dict):
            errors.append(f"action {n}: expected an object, got {type(raw).__name__}")
            continue
        kind = raw.get("type")
        if not isinstance(kind, str):
            errors.append(f"action {n}: missing \"type\"")
            continue
        canonical = canonical_action_type(kind)
        if action_model(canonical) is None:
            errors.append(f"action {n}: unknown action type {kind!r}; allowed: {allowed_text}")
            continue
        if canonical not in allowed:
            errors.append(f"action {n}: {kind!r} is not allowed in this turn; allowed: {allowed_text}")
            continue
        try:
            actions.append(parse_action(raw))
        except ValidationError as exc:
            errors.append(f"action {n} ({kind}): invalid payload: {_compact(exc)}")
    return Extraction(tuple(actions), tuple(errors))


def rejection(prompt: PromptRequest, reply: str, errors: Collection[str]) -> SystemMessage:
    """The error system message that tells the LLM what was wrong with ``reply``: every
    error; the re-ask decides how many to show (``prompts.truncate_errors``)."""
    return SystemMessage(
        type="error",
        original_context=prompt.original_context,
        full_json_instructions=prompt.full_json_instructions,
        errors=tuple(errors),
        your_reply=reply[:MAX_YOUR_REPLY_CHARS],
        error_retry_policy=ERROR_RETRY_POLICY,
    )
