"""Finding and validating the actions in an LLM's reply. Pure functions, no actor.

LLMs wrap JSON in many ways; all of these are accepted::

    >>> import autoresponse.interfaces  # the built-in platforms register their actions
    >>> text = 'Sure! ```json\\n{"actions": [{"type": "bash", "payload": {"command": "df -h"}}]}\\n```'
    >>> found = extract_actions(text, allowed=["terminal", "message_console"])
    >>> [a.type for a in found.actions], found.errors
    (['terminal'], ())

Anything wrong becomes a one-line error the LLM can act on. A reply that
carries a ``system_message`` is an echo of runtime data: nothing in it runs.

A reply is untrusted input, so its cost is bounded: it is read in one pass that
finds the balanced bracket groups (minding JSON strings), and only those groups
are decoded, each at most a few times; a reply too long, nested too deeply or
holding too many actions is rejected with an error saying so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import ValidationError

from autoresponse.actors.limits import (
    MAX_ACTIONS_PER_REPLY,
    MAX_JSON_DEPTH,
    MAX_REPLY_CHARS,
    MAX_YOUR_REPLY_CHARS,
)
from autoresponse.actors.prompts import error_retry_policy
from autoresponse.messages.actions import is_blank
from autoresponse.messages import (
    BaseAction,
    PromptRequest,
    SystemMessage,
    ToolCall,
    action_model,
    canonical_action_type,
    parse_action,
)

_decoder = json.JSONDecoder()

#: The inside of a JSON string, after its opening quote: up to its closing quote, or up
#: to where it breaks off, at a raw newline (JSON has none in a string) or at the end.
_STRING_BODY = r'(?:[^"\\\n]++|\\[^\n])*+'
_STRING_REST = re.compile(_STRING_BODY)
#: A string as JSON has it: whole, and followed by what may follow a string in JSON.
_JSON_STRING = r'"' + _STRING_BODY + r'"(?=\s*+[:,\]}])'
#: A group with no group in it, read as one token: most groups are such, so most
#: cost one step.
_FLAT_BODY = r'(?:[^{}\[\]"]++|' + _JSON_STRING + r')*+'
_FLAT_GROUP = r'\{' + _FLAT_BODY + r'\}|\[' + _FLAT_BODY + r'\]'
#: One token of a reply's bracket structure, by kind. Possessive, so never backtracking.
#: In prose only brackets matter: a quote there starts no string.
_PROSE_TOKEN = re.compile(r'(?P<flat>' + _FLAT_GROUP + r')|(?P<open>[{\[]+)')
#: Inside a group a quote starts a string too, and brackets may close.
_GROUP_TOKEN = re.compile(
    r'(?P<flat>' + _FLAT_GROUP + r')'
    r'|(?P<open>[{\[]+)'
    r'|(?P<close>[}\]]+)'
    r'|(?P<string>' + _JSON_STRING + ')'  # its brackets are text
    r'|(?P<quote>")'  # any other quote: broken JSON, or prose in brackets
)
_CLOSER = {"{": "}", "[": "]"}

#: Levels of brackets searched for JSON inside a bracket group that is no JSON itself
#: (a brace in prose around the answer, a broken outer object): each level costs at
#: most one more decoding pass over the reply.
_SEARCH_LEVELS = 4

#: A ``system_message`` key as it stands in the reply, found even in JSON that does
#: not decode (whose inner actions would otherwise be read on their own). In a JSON
#: string its quotes are escaped, so a message may still mention the word.
_ECHO_KEY = re.compile(r'"system_message"\s*:')
_ECHO_ERROR = "your reply carries a system_message; that is runtime data and is never executed"
_TOO_DEEP = f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)"


@dataclass(frozen=True)
class Slot:
    """One action of a reply, by its place (1-based): valid, or rejected with why."""

    index: int
    type: str
    action: BaseAction | None
    error: str = ""
    tool_call_id: str | None = None


@dataclass(frozen=True)
class Extraction:
    """The valid actions of a reply, one line per problem found, and each action's place.

    ``prose`` is a reply that holds no JSON at all: plain words, an answer in itself
    (the dispatcher may deliver it as a message; it is never executed).
    """

    actions: tuple[BaseAction, ...]
    errors: tuple[str, ...]
    slots: tuple[Slot, ...] = ()
    prose: bool = False


# ------------------------------------------------------------- finding the JSON


class _Group(NamedTuple):
    """A closed bracket group of the reply, ``text[start:end]``, and the groups in it."""

    start: int
    end: int
    #: Holds brackets nested deeper than MAX_JSON_DEPTH: never handed to the decoder.
    too_deep: bool
    inner: Sequence[_Group]


class _OpenGroup:
    """A bracket group not closed yet, and the groups closed in it so far."""

    __slots__ = ("closer", "inner", "start", "too_deep")

    def __init__(self, start: int, closer: str) -> None:
        self.start = start
        self.closer = closer
        self.too_deep = False
        self.inner: list[_Group] = []


@dataclass(slots=True)
class _Layout:
    """The bracket structure of a reply, from one pass over it."""

    #: The outermost closed groups, left to right.
    groups: list[_Group]
    #: Where the first bracket that never closed (or held a broken string) opens.
    first_unclosed: int | None
    #: Somewhere brackets nest deeper than MAX_JSON_DEPTH.
    too_deep: bool


def _layout(text: str) -> _Layout:
    """Finds the balanced bracket groups of ``text``, reading each part of it twice at most.

    Quotes count only inside brackets, so a ``"`` in prose is harmless. A quote
    that starts no JSON string (the string breaks at a raw newline, or a word
    follows it, as when a bracket in prose comes before a quote) ends every open
    group: none of them is JSON. What looked like the string is then read again
    as prose, since it may hold the answer, but only once, so the work stays
    linear. A closing bracket of the wrong kind is skipped: its group can only
    fail to decode, and the groups in it are still searched. Brackets past
    MAX_JSON_DEPTH are counted, not recorded.
    """
    groups: list[_Group] = []
    open_groups: list[_OpenGroup] = []  # outermost first, at most MAX_JSON_DEPTH
    excess = 0  # open brackets past MAX_JSON_DEPTH
    first_unclosed: int | None = None
    too_deep = False
    read_again_until = 0  # the end of the text last read again as prose

    def abandon_open_groups() -> None:
        nonlocal excess, first_unclosed
        if open_groups and first_unclosed is None:
            first_unclosed = open_groups[0].start
        for group in open_groups:  # the groups closed in them still count, in text order
            groups.extend(group.inner)
        open_groups.clear()
        excess = 0

    resume_at: int | None = 0
    while resume_at is not None:
        in_prose = not open_groups
        pattern = _PROSE_TOKEN if in_prose else _GROUP_TOKEN
        tokens, resume_at = pattern.finditer(text, resume_at), None
        for token in tokens:
            kind, at, end = token.lastgroup, token.start(), token.end()
            if kind == "string":
                continue
            if kind == "quote":
                abandon_open_groups()
                string_end = _STRING_REST.match(text, at + 1).end()
                if at + 1 >= read_again_until:  # read what seemed a string again, as prose
                    read_again_until, resume_at = string_end, at + 1
                else:  # it was read twice already: skip it
                    resume_at = string_end + 1
                break
            if kind == "flat":
                if excess or len(open_groups) == MAX_JSON_DEPTH:
                    open_groups[-1].too_deep = too_deep = True
                else:
                    (open_groups[-1].inner if open_groups else groups).append(_Group(at, end, False, ()))
            elif kind == "open":
                room = MAX_JSON_DEPTH - len(open_groups)
                for offset in range(min(room, end - at)):
                    open_groups.append(_OpenGroup(at + offset, _CLOSER[text[at + offset]]))
                if end - at > room:
                    open_groups[-1].too_deep = too_deep = True
                    excess += end - at - room
                if in_prose:  # now in a group, where quotes count
                    resume_at = end
                    break
            else:
                # Past MAX_JSON_DEPTH the kinds of brackets do not matter: it is never decoded.
                skipped = min(excess, end - at)
                excess -= skipped
                for pos in range(at + skipped, end):
                    if text[pos] != open_groups[-1].closer:
                        continue
                    closed = open_groups.pop()
                    group = _Group(closed.start, pos + 1, closed.too_deep, closed.inner)
                    if not open_groups:
                        groups.append(group)
                        break  # the rest of the run is stray, in prose
                    open_groups[-1].inner.append(group)
                    open_groups[-1].too_deep |= group.too_deep
                if not open_groups:  # back in prose
                    resume_at = end
                    break
    abandon_open_groups()
    return _Layout(groups, first_unclosed, too_deep)


@dataclass(slots=True)
class _Decoded:
    """The JSON values of a reply, and the decoder's most telling complaint."""

    values: list[Any] = field(default_factory=list)
    too_deep: bool = False
    #: How far into its attempt the decoder got, where in the reply it stopped (if
    #: known), and what it said: of the attempt that got furthest.
    complaint: tuple[int, int | None, str] | None = None

    def note(self, start: int, exc: ValueError) -> None:
        """Keeps the complaint of the attempt that got furthest (the one most likely
        meant as JSON) about the text from ``start``. A plain ValueError is a number
        too long to convert."""
        if isinstance(exc, json.JSONDecodeError):
            complaint: tuple[int, int | None, str] = (exc.pos, start + exc.pos, exc.msg)
        else:
            complaint = (0, None, str(exc))
        if self.complaint is None or complaint[0] > self.complaint[0]:
            self.complaint = complaint

    def error(self, text: str) -> str | None:
        """The complaint kept, with its line and column in ``text``."""
        if self.complaint is None:
            return None
        _, pos, message = self.complaint
        if pos is None:
            return message
        line = text.count("\n", 0, pos) + 1
        column = pos - text.rfind("\n", 0, pos)
        return f"{message} at line {line} column {column}"


def _decode_group(text: str, group: _Group, levels: int, found: _Decoded) -> None:
    """Decodes ``group``; if it is no JSON, searches the groups in it, ``levels`` deep."""
    if group.too_deep:
        found.too_deep = True  # rejected whole: what is in it may belong to what is not read
        return
    try:
        # A copy of just the group: a complaint then costs its length, not the reply's.
        value, _ = _decoder.raw_decode(text[group.start:group.end])
    except ValueError as exc:
        found.note(group.start, exc)
        if levels > 1:
            for inner in group.inner:
                _decode_group(text, inner, levels - 1, found)
        return
    except RecursionError:  # cannot happen within MAX_JSON_DEPTH; a guarantee all the same
        found.too_deep = True
        return
    found.values.append(value)


def _within_depth(value: Any) -> bool:
    """True when ``value`` nests no deeper than MAX_JSON_DEPTH (walked with a stack)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return False
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def _json_values(text: str) -> _Decoded:
    """Every JSON object or list in ``text``, left to right, each in one piece."""
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        # The usual answer is one JSON value and nothing else: the C decoder reads it in one
        # go. Anything else (prose, fences, breakage, nesting too deep) takes the scan below.
        try:
            whole = _decoder.decode(stripped)
        except (ValueError, RecursionError):
            pass
        else:
            # no walk needed when there are fewer brackets than the limit could be passed with
            if stripped.count("{") + stripped.count("[") <= MAX_JSON_DEPTH or _within_depth(whole):
                return _Decoded(too_deep=False, values=[whole])
    layout = _layout(text)
    found = _Decoded(too_deep=layout.too_deep)
    for group in layout.groups:
        _decode_group(text, group, _SEARCH_LEVELS, found)
    if not found.values and not found.too_deep:
        _decode_scalar(text, found)
    if not found.values and not found.too_deep and layout.first_unclosed is not None:
        _decode_unclosed(text, layout.first_unclosed, found)
    return found


def _decode_scalar(text: str, found: _Decoded) -> None:
    """Decodes a reply that is one JSON scalar (``42``, ``"hi"``): not an action, but
    one the LLM is told about."""
    stripped = text.lstrip()
    if not stripped or stripped[0] in _CLOSER:
        return
    try:  # without a bracket first, the decoder reads one scalar at most: nothing nests
        found.values.append(_decoder.decode(stripped))
    except ValueError as exc:
        found.note(len(text) - len(stripped), exc)


def _decode_unclosed(text: str, start: int, found: _Decoded) -> None:
    """Notes what the decoder says about the group at ``start`` that never closed:
    usually truncated JSON. Nothing was too deep, and the decoder stops where the
    group broke off at the latest."""
    try:
        _decoder.raw_decode(text[start:])
    except ValueError as exc:
        found.note(start, exc)
    except RecursionError:  # as in _decode_group
        found.too_deep = True


# --------------------------------------------------------- from JSON to actions


def _may_carry_system_message(text: str) -> bool:
    """Whether JSON decoded from ``text`` can hold a ``system_message`` key: only when
    the text spells it, or has a ``\\u`` escape (the only escape that makes a letter).
    Most replies do not: they skip the walk of ``_carries_system_message``, on every turn."""
    return "system_message" in text or "\\u" in text


def _carries_system_message(value: Any) -> bool:
    """Whether an object anywhere in ``value`` has a ``system_message`` key.

    Walks with its own stack, not by recursion: a check must never be what fails.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if "system_message" in item:
                return True
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _raw_actions(values: list[Any]) -> list[Any]:
    """The action objects of a reply's JSON values, in order.

    Footnotes, what brackets in prose decode to ("see [1]", "{}": a list holding no
    object, an empty object), count only when nothing else does, so that a reply
    of just "[1]" is still explained.
    """
    raws: list[Any] = []
    footnotes: list[Any] = []
    meant = False  # some value is more than a footnote
    for value in values:
        if isinstance(value, list):
            if any(isinstance(item, dict) for item in value):
                raws.extend(value)
                meant = True
            else:
                footnotes.extend(value)
        elif isinstance(value, dict) and isinstance(value.get("actions"), list):
            raws.extend(value["actions"])
            meant = True
        elif value == {}:
            footnotes.append(value)
        else:
            raws.append(value)
            meant = True
    return raws if meant else footnotes


#: How a model writes out tool calls where a server's tool parser missed its format: in
#: ``<tool_call>`` tags (Hermes, Qwen; the last one's end tag may be missing), or after
#: Mistral's ``[TOOL_CALLS]``.
_TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_MISTRAL_CALLS = "[TOOL_CALLS]"


def _written_calls(text: str) -> list[Any] | None:
    """The actions of a reply that is nothing but tool calls written out in words: each
    ``<tool_call>`` block, Mistral's ``[TOOL_CALLS] [...]``, or the whole reply one
    ``{"name": ..., "arguments": {...}}`` (Llama's ``"parameters"``); None for any other
    reply. Only the whole reply is read so: a call quoted inside a message, or beside
    other words, is the message's text, never a command.

    >>> _written_calls('<tool_call>{"name": "terminal", "arguments": {"command": "df -h"}}</tool_call>')
    [{'type': 'terminal', 'payload': {'command': 'df -h'}}]
    >>> _written_calls('Like this: {"name": "terminal", "arguments": {"command": "df -h"}}') is None
    True
    """
    if '"name"' not in text:  # no call is written without it: every other reply pays one look
        return None
    stripped = text.strip()
    if stripped.startswith("<tool_call>"):
        blocks = list(_TOOL_CALL_TAG.finditer(stripped))
        if _TOOL_CALL_TAG.sub("", stripped).strip():  # words beside the calls
            return None
        written = [_json_or_none(block.group(1)) for block in blocks]
    elif stripped.startswith(_MISTRAL_CALLS):
        listed = _json_or_none(stripped[len(_MISTRAL_CALLS):])
        written = listed if isinstance(listed, list) else [None]
    else:
        whole = _json_or_none(stripped)
        written = whole if isinstance(whole, list) else [whole]
    calls = [_written_call(value) for value in written]
    return calls if calls and all(call is not None for call in calls) else None


def _json_or_none(text: str) -> Any:
    """``text`` as JSON nested within MAX_JSON_DEPTH, or None."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if _within_depth(value) else None


def _written_call(value: Any) -> dict[str, Any] | None:
    """``{"name": ..., "arguments": ...}`` (the arguments an object, or JSON text of one, as
    the tools protocol sends them; OpenAI's ``{"type": "function", "function": {...}}`` and
    Llama's ``"type": "function"`` beside them too) as the action it names; None for
    anything else."""
    if isinstance(value, dict) and value.get("type") == "function":
        inner = value.get("function")
        value = inner if isinstance(inner, dict) and len(value) == 2 else {
            key: item for key, item in value.items() if key != "type"}
    if not isinstance(value, dict) or len(value) != 2 or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        arguments = _json_or_none(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        return None
    return {"type": value["name"], "payload": arguments}


def _compact(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"][1:]) or "action"  # [0] is the union tag
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def extract_actions(text: str, allowed: Collection[str], *,
                    max_actions: int = MAX_ACTIONS_PER_REPLY,
                    max_chars: int = MAX_REPLY_CHARS,
                    may_stay_silent: bool = False) -> Extraction:
    """The valid actions in ``text`` that this turn allows, and the errors of the rest.

    A reply longer than ``max_chars`` is not read; one with more than
    ``max_actions`` actions has none carried out. ``{"actions": []}`` is an error,
    unless the turn ``may_stay_silent`` (then it is a valid answer: nothing to do).
    """
    if len(text) > max_chars:
        return Extraction((), (
            f"your reply is {len(text):,} characters long; at most {max_chars:,} are allowed",
        ))
    if _ECHO_KEY.search(text):
        return Extraction((), (_ECHO_ERROR,))
    written = _written_calls(text)
    if written is not None:  # tool calls the model wrote out, as the server did not take them
        if _may_carry_system_message(text) and _carries_system_message(written):
            return Extraction((), (_ECHO_ERROR,))
        return _checked([(raw, None, "") for raw in written], allowed, [], max_actions, may_stay_silent)
    found = _json_values(text)
    if not found.values:
        if found.too_deep:
            reason = _TOO_DEEP
        elif found.complaint and "{" in text:
            reason = f"invalid JSON ({found.error(text)})"
        else:
            reason = "no JSON found"
        prose = reason == "no JSON found" and not is_blank(text)  # only what would show is a reply
        return Extraction((), (f"your reply is not an action list: {reason}",), prose=prose)
    if _may_carry_system_message(text) and _carries_system_message(found.values):
        return Extraction((), (_ECHO_ERROR,))
    errors: list[str] = [f"part of your reply was not read: {_TOO_DEEP}"] if found.too_deep else []
    raws = _raw_actions(found.values)
    return _checked([(raw, None, "") for raw in raws], allowed, errors, max_actions, may_stay_silent)


def extract_tool_calls(calls: Sequence[ToolCall], allowed: Collection[str], *,
                       max_actions: int = MAX_ACTIONS_PER_REPLY,
                       max_chars: int = MAX_REPLY_CHARS,
                       may_stay_silent: bool = False) -> Extraction:
    """The valid actions among native tool calls (each names an action type, its
    arguments the payload), with the same rules and bounds as a reply in text."""
    size = sum(len(call.arguments) for call in calls)
    if size > max_chars:
        return Extraction((), (f"your tool calls are {size:,} characters long; at most {max_chars:,} are allowed",))
    raws: list[tuple[Any, str | None, str]] = []
    errors: list[str] = []
    for call in calls:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except (ValueError, RecursionError) as exc:
            refused = f"tool call {call.name!r}: its arguments are not JSON ({exc})"
        else:
            if _within_depth(arguments):
                if _may_carry_system_message(call.arguments) and _carries_system_message(arguments):
                    return Extraction((), (_ECHO_ERROR,))
                raws.append(({"type": call.name, "payload": arguments}, call.id, ""))
                continue
            refused = f"tool call {call.name!r}: {_TOO_DEEP}"
        errors.append(refused)
        raws.append((None, call.id, refused))
    return _checked(raws, allowed, errors, max_actions, may_stay_silent, named=[c.name for c in calls])


def _checked(raws: list[tuple[Any, str | None, str]], allowed: Collection[str], errors: list[str],
             max_actions: int, may_stay_silent: bool, named: list[str] | None = None) -> Extraction:
    """Each raw action (with its tool call's id) validated in its place; one with a reason
    is a place refused already, for that reason (counted in ``errors`` already)."""
    if not raws:
        if may_stay_silent and not errors:
            return Extraction((), ())
        return Extraction((), (*errors, "your reply holds no action"))
    if len(raws) > max_actions:
        return Extraction((), (*errors, (
            f"your reply has {len(raws)} actions; at most {max_actions} are allowed per reply"
        )))
    allowed_text = ", ".join(sorted(allowed))
    actions: list[BaseAction] = []
    slots: list[Slot] = []
    for n, (raw, call_id, refused) in enumerate(raws, 1):
        kind = raw.get("type") if isinstance(raw, dict) else None
        written = kind if isinstance(kind, str) else (named[n - 1] if named else "")
        problem = ""
        if refused:
            slots.append(Slot(n, written, None, refused, call_id))
            continue
        if not isinstance(raw, dict):
            problem = f"action {n}: expected an object, got {type(raw).__name__}"
        elif not isinstance(kind, str):
            problem = f"action {n}: missing \"type\""
        else:
            canonical = canonical_action_type(kind)
            if action_model(canonical) is None:
                problem = f"action {n}: unknown action type {kind!r}; allowed: {allowed_text}"
            elif canonical not in allowed:
                problem = f"action {n}: {kind!r} is not allowed in this turn; allowed: {allowed_text}"
            else:
                try:
                    action = parse_action(raw)
                except ValidationError as exc:
                    problem = f"action {n} ({kind}): invalid payload: {_compact(exc)}"
                else:
                    actions.append(action)
                    slots.append(Slot(n, action.type, action, "", call_id))
                    continue
        errors.append(problem)
        slots.append(Slot(n, written, None, problem, call_id))
    return Extraction(tuple(actions), tuple(errors), tuple(slots))


#: The end of a reply compared with what came before it, to find the loop it ended in.
_LOOP_PROBE = 40
#: A loop is the same text this many times in a row, at least.
_LOOP_REPEATS = 3
#: How many earlier occurrences of the end are tried as the loop's start, nearest first:
#: a looped paragraph may end several of its sentences alike.
_LOOP_CANDIDATES = 8
#: Where a word ends: the places a looped reply may be cut.
_WORD_END = re.compile(r"(?<=\S)(?=\s)")


def without_loop(text: str) -> str:
    """``text`` with the loop it ended in kept once: a small model cut off at its token
    limit often repeats one sentence to the end. The repeated phrase is kept whole, cut
    at its sentence, line or clause end if it has one, and never inside a word. Linear
    in the text; text that does not end in a loop comes back as it is.

    The loop's period is the distance back to an earlier occurrence of the text's end:
    the nearest that repeats often enough, of the few nearest tried (a paragraph whose
    sentences end alike has its end inside it, too).

    >>> without_loop("The sky is blue." + " It is the air." * 9 + " It is")
    'The sky is blue. It is the air.'
    >>> without_loop("Je suis désolé, " + "je suis désolé, " * 9 + "je suis dé")
    'Je suis désolé'
    >>> without_loop("Paris.")
    'Paris.'
    """
    if len(text) < _LOOP_PROBE * _LOOP_REPEATS:
        return text
    tail = text[-_LOOP_PROBE:]
    searched_to = len(text) - 1  # each search goes on back from where the last one stopped
    for _ in range(_LOOP_CANDIDATES):
        before = text.rfind(tail, 0, searched_to)
        if before < 0:
            return text
        searched_to = before + _LOOP_PROBE - 1
        period = len(text) - _LOOP_PROBE - before
        start = len(text) - period  # the last whole period; walk back while the one before matches
        while start >= period and text[start - period:start] == text[start:start + period]:
            start -= period
        # then char by char to where the loop begins, capitals aside: the phrase said first
        # often starts with one ("Je suis désolé, je suis désolé, ...")
        while start > 0 and text[start - 1].lower() == text[start - 1 + period].lower():
            start -= 1
        if (len(text) - start) >= period * _LOOP_REPEATS:
            kept = text[:_loop_cut(text, start, period)].rstrip()
            return kept.rstrip(",;:").rstrip() or kept  # a clause mark at the end promises more
    return text


def _loop_cut(text: str, start: int, period: int) -> int:
    """Where to cut ``text`` so that its loop (``period`` long, from ``start``) is said
    once: at a word end near where its first repetition ends, a sentence end if there
    is one, else a line end, else a clause end, else the nearest. Where the repetition
    ends is known only to a few characters (the text before the loop may end as the
    phrase does), so the cut is sought within half a period either side of it; a loop
    without a word end is cut right there."""
    once = start + period
    low, high = once - period // 2, once + (period - 1) // 2  # one period: every phase once
    cuts = [m.start() for m in _WORD_END.finditer(text, low, high + 1)]
    if not cuts:
        return once

    def preference(cut: int) -> tuple[int, int, int]:
        kind = (0 if text[cut - 1] in ".!?" else 1 if text[cut] == "\n"
                else 2 if text[cut - 1] in ",;:" else 3)
        return kind, abs(cut - once), cut

    return min(cuts, key=preference)


def rejection(prompt: PromptRequest, reply: str, errors: Collection[str]) -> SystemMessage:
    """The error system message that tells the LLM what was wrong with ``reply``: every
    error; the re-ask decides how many to show (``prompts.truncate_errors``)."""
    return SystemMessage(
        type="error",
        original_context=prompt.original_context,
        full_json_instructions=prompt.full_json_instructions,
        errors=tuple(errors),
        your_reply=reply[:MAX_YOUR_REPLY_CHARS],  # a re-ask quotes an excerpt of it
        error_retry_policy=error_retry_policy(prompt.allowed_actions),
    )
