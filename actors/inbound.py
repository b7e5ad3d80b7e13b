"""What every inbound interface does with a message it has read: accept it durably
(``accept_input``), then hand it to its conversation, or answer a stranger as the
platform's settings say.

>>> await accept_input(self, update, f"telegram-{update_id}")     # doctest: +SKIP
>>> take_request(self, text, context, env, allowed=user in allowlist,
...              policy=self.settings)                              # doctest: +SKIP

A platform's settings inherit ``StrangerSettings`` for what a stranger gets, the words
of the refusal, and how much of it. ``converse`` gives a stranger an *autonomous* turn:
the bot may reply or stay silent, and may use only the actions configured for autonomous
turns (none but replying, by default).

A stranger is answered within bounds (``StrangerGate``), per platform, in a window
(``stranger_window``, an hour) that starts at their first message: one refusal at most
(it says the same every time), ``stranger_turns`` autonomous turns at most (10). Past
that their messages are journaled and closed unanswered, the first of them logged, the
rest at debug level: two bots set to answer strangers stop answering each other, and one
stranger's script gets no more out of the account. An allowed user is never counted.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from autoresponse.actors.approvals import within
from autoresponse.actors.kernel.actor import TypedActor
from autoresponse.actors.kernel.intake import Unstorable
from autoresponse.actors.kernel.runtime import Runtime
from autoresponse.actors.limits import MALFORMED_KEPT, STRANGER_TURNS, STRANGER_WINDOW_SECONDS, STRANGERS_REMEMBERED
from autoresponse.actors.routes import CONVERSATIONS, sender
from autoresponse.messages import Attachment, Envelope, MalformedInput, OriginalContext, OutboundMessage, UserRequest

log = logging.getLogger("autoresponse.inbound")

REFUSAL = "Sorry, I only take requests from people on my allowlist."

#: What a request from someone not on the allowlist gets: nothing, a short refusal, or an
#: autonomous turn (a reply the bot may also leave unsaid; no commands unless configured).
StrangerPolicy = Literal["silent", "refuse", "converse"]


class StrangerSettings(BaseModel):
    """The part of a platform's settings that says how strangers are answered."""

    strangers: StrangerPolicy = "refuse"
    refusal: str = REFUSAL
    #: Autonomous turns (``converse``) one stranger gets per ``stranger_window``; past it
    #: their messages go unanswered until the window is over. (A refusal: one per window.)
    stranger_turns: int = Field(default=STRANGER_TURNS, ge=0)
    #: Seconds of a stranger's window, from their first message in it.
    stranger_window: float = Field(default=STRANGER_WINDOW_SECONDS, gt=0)


#: What the gate says of one stranger's message: answer it; not, and log it (the first
#: past the bound in this window); not, quietly (logged once already).
Admission = Literal["answer", "first past", "past"]


@dataclass
class _Window:
    start: float
    answered: int = 0
    #: The message group (an album) last answered: its other items are the same turn.
    group: str | None = None
    logged: bool = False


class StrangerGate:
    """How many answers each stranger (a platform and a user) had in their current window:
    one gate per runtime (``stranger_gate``), so an interface's restart keeps the counts;
    a new process starts afresh. At most ``kept`` strangers are remembered, the least
    recently heard from forgotten first (and starting afresh, should they come back).

    >>> gate = StrangerGate(kept=2)
    >>> [gate.admit(("x", "mallory"), limit=1, window=60, now=t) for t in (0, 1, 2, 60)]
    ['answer', 'first past', 'past', 'answer']
    """

    def __init__(self, kept: int = STRANGERS_REMEMBERED) -> None:
        self._kept = kept
        self._windows: OrderedDict[tuple[str, str], _Window] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, who: tuple[str, str], *, limit: int, window: float, now: float,
              group: str | None = None) -> Admission:
        """Whether ``who`` gets an answer to one more message at ``now``: at most ``limit`` in
        a window of ``window`` seconds that begins at their first message. The items of one
        message group (``group``) after the first answered share its answer, uncounted."""
        with self._lock:
            current = self._windows.get(who)
            if current is None or not current.start <= now < current.start + window:
                current = self._windows[who] = _Window(start=now)
            self._windows.move_to_end(who)
            while len(self._windows) > self._kept:
                self._windows.popitem(last=False)
            if group is not None and group == current.group:
                return "answer"
            if current.answered < limit:
                current.answered += 1
                current.group = group
                return "answer"
            if current.logged:
                return "past"
            current.logged = True
            return "first past"

    def __len__(self) -> int:
        with self._lock:
            return len(self._windows)


_GATES: weakref.WeakKeyDictionary[Runtime, StrangerGate] = weakref.WeakKeyDictionary()
_GATES_LOCK = threading.Lock()


def stranger_gate(runtime: Runtime) -> StrangerGate:
    """The runtime's one ``StrangerGate`` (made on first use; it goes with the runtime)."""
    with _GATES_LOCK:
        gate = _GATES.get(runtime)
        if gate is None:
            gate = _GATES[runtime] = StrangerGate()
        return gate


def take_request(actor: TypedActor, text: str, context: OriginalContext, env: Envelope, *,
                 allowed: bool, policy: StrangerSettings, attachments: tuple[Attachment, ...] = (),
                 media_group: str | None = None) -> None:
    """Start a turn for ``text`` (and what the message carried besides, by reference) in its
    chat's conversation, or answer a stranger by ``policy``, within its bounds: each
    stranger gets at most one refusal, or ``stranger_turns`` turns, a ``stranger_window``
    (see ``StrangerGate``). Past them nothing is sent; the input closes as any other."""
    text, context = _encodable(text), _encodable_context(context)
    turn = turn_context(context, allowed=allowed, policy=policy)
    admission: Admission = "answer" if allowed else _admit(actor, context, policy, media_group)
    if turn is not None and admission == "answer":
        actor.send(CONVERSATIONS, UserRequest(text=text, context=turn, attachments=attachments,
                                              media_group=media_group), cause=env)
        return
    _unanswered(context, policy, admission)
    if admission == "answer":  # a refusal: the window's one (``silent`` answers none)
        actor.send(sender(context.interface_name),
                   OutboundMessage.reply(context, policy.refusal, notice=True), cause=env)


#: A UTF-16 surrogate alone (JSON's "\ud800" decodes to one): no UTF-8 holds it, so every
#: hop that encodes the text (a key's digest, the LLM's request, the memory) would fail on it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _encodable(text: str) -> str:
    """``text`` with each lone surrogate read as U+FFFD, as an undecodable byte is.

    >>> _encodable("a" + chr(0xD800) + "b") == "a" + chr(0xFFFD) + "b"
    True
    """
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _encodable_context(context: OriginalContext) -> OriginalContext:
    """``context`` with its names and command text made encodable (a sender's name is the
    platform's too)."""
    fields = {"user_name": context.user_name, "chat_title": context.chat_title,
              "original_command": context.original_command}
    changed = {name: _encodable(value) for name, value in fields.items()
               if value is not None and _SURROGATE.search(value)}
    return context.model_copy(update=changed) if changed else context


def _admit(actor: TypedActor, context: OriginalContext, policy: StrangerSettings,
           media_group: str | None) -> Admission:
    """Whether the stranger who sent ``context`` gets an answer: a turn, or a refusal."""
    limit = {"silent": 0, "refuse": 1, "converse": policy.stranger_turns}[policy.strangers]
    user = context.user_id if context.user_id is not None else context.user_name or context.chat_key
    return stranger_gate(actor.runtime).admit((context.interface_name, str(user)), limit=limit,
                                              window=policy.stranger_window,
                                              now=actor.runtime.clock.monotonic(),
                                              # an album is one turn; refused, it is one message too many
                                              group=media_group if policy.strangers == "converse" else None)


def _unanswered(context: OriginalContext, policy: StrangerSettings, admission: Admission) -> None:
    """Log a stranger's message that gets no turn: the refusal, and the first message past
    the window's bound; the rest only at debug level (a loop or a script logs no more)."""
    who, where = context.user_name or context.user_id, f"{context.interface_name} chat {context.chat_id}"
    if admission == "past":
        log.debug("left a message from %s in %s unanswered: a stranger past their bound", who, where)
        return
    if admission == "answer":  # the refusal
        log.info("refused a request from %s in %s: not on the allowlist", who, where)
        return
    bound = {"silent": "not on the allowlist", "refuse": "refused already",
             "converse": f"had their {policy.stranger_turns} turns"}[policy.strangers]
    log.info("left a request from %s in %s unanswered (%s); so are their next ones until their window of %s "
             "is over (logged at debug level only)", who, where, bound, within(policy.stranger_window))


def turn_context(context: OriginalContext, *, allowed: bool,
                 policy: StrangerSettings) -> OriginalContext | None:
    """The context a request from ``context``'s sender gets a turn in: ``context`` for an
    allowed user, made autonomous for a stranger under ``converse``; None for a stranger
    refused or ignored (no turn). ``take_request`` decides by it, and so does a platform's
    origin (``Mount.origin``): only whoever gets a turn hears that their input failed."""
    if allowed:
        return context
    if policy.strangers == "converse":
        return context.model_copy(update={"autonomous": True})
    return None


async def accept_input(actor: TypedActor, item: BaseModel, correlation_id: str) -> bool:
    """Accept one input of ``actor``'s platform durably, on the loop, waiting while the
    runtime is full; True once it is (acknowledge it upstream then). One correlation
    per input: seen again after a crash, it is recognised.

    An input that holds a lone surrogate (which no UTF-8 holds: JSON's "\ud800") is
    stored with it read as U+FFFD. One that still cannot be stored is malformed: a dead
    letter with the reason, and False; acknowledge it too, or it comes back forever.
    """
    try:
        await actor.runtime.intake.accept_async(actor.name, item, correlation_id)
    except Unstorable as exc:
        readable = _encodable_model(item)
        if readable is not None:  # only now, on the rare failure: no cost for every input
            return await accept_input(actor, readable, correlation_id)
        log.warning("a malformed input to %s was skipped (%s)", actor.name, exc)
        actor.runtime.dead_letters.post(Envelope.new(item), "malformed input", actor=actor.name, detail=str(exc))
        return False
    return True


def _encodable_model(item: BaseModel) -> BaseModel | None:
    """``item`` with every lone surrogate in its text read as U+FFFD; None when it holds
    none (or is not rebuilt from its fields)."""
    changed = False

    def clean(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, str) and _SURROGATE.search(value):
            changed = True
            return _encodable(value)
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(clean(item) for item in value)
        return value

    data = clean(item.model_dump())
    if not changed:
        return None
    try:
        return type(item).model_validate(data)
    except ValueError:
        return None


def dead_letter_malformed(actor: TypedActor, raw: Any, reason: str, why: str) -> None:
    """Dead-letter one input that cannot be read (``reason``: ``"malformed update"``, ...),
    with ``why`` and the input as the platform sent it (JSON), so that the inputs behind it
    flow on. The caller still acknowledges it (an offset, marked read, a cursor moved past
    it), or it comes back forever."""
    try:
        kept = json.dumps(raw, ensure_ascii=False, default=repr)[:MALFORMED_KEPT]
    except (ValueError, RecursionError):  # nested past what json writes, or circular
        kept = repr(raw)[:MALFORMED_KEPT]
    log.warning("%s at %s was skipped (%s)", reason, actor.name, why)
    actor.runtime.dead_letters.post(Envelope.new(MalformedInput(raw=kept)), reason, actor=actor.name,
                                    detail=why)
