"""The action dispatcher: from an LLM reply to the actors that carry out its actions."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Literal

from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.extractor import (
    Extraction,
    Slot,
    extract_actions,
    extract_tool_calls,
    rejection,
    without_loop,
)
from autoresponse.actors.limits import CHAT_CANDIDATES_SHOWN, MAX_ACTIONS_PER_REPLY, REASK_EXCERPT_CHARS
from autoresponse.actors.memory import ConversationStore
from autoresponse.actors.prompts import PLAIN_RETRY_NOTE, excerpt
from autoresponse.actors.receipts import settle_receipt
from autoresponse.actors.retry import RAN
from autoresponse.actors.routes import route_of, sender
from autoresponse.actors.streaming import withdrawal
from autoresponse.messages import (
    ActionRequest,
    BaseAction,
    Batch,
    ChatId,
    Envelope,
    LLMReply,
    MAX_MESSAGE_CHARS,
    OriginalContext,
    OutboundMessage,
    Position,
    PromptRequest,
    Rejection,
    action_key,
    action_model,
    message_action_for,
)
from autoresponse.messages.approval import ApprovalRequest

#: The approvals desk's name (``actors.approvals``, which imports this module).
APPROVALS = "approvals"

log = logging.getLogger("autoresponse.dispatcher")

#: What a reply in plain words (no action, no tool call) is: an answer delivered to the
#: original chat, or an error the LLM is re-asked about.
ProseRule = Literal["reply", "reask"]

#: Text of the runtime's own instructions: a reply that quotes them is no answer for a user
#: (a small model asked again plainly repeats the note on why, as if it were its answer).
_RUNTIME_WORDS = ("$defs", "system_message", "full_json_instructions", "error_retry_policy",
                  "Allowed action types in this turn", PLAIN_RETRY_NOTE)
#: Any of them, in one search in C (asked of every reply's text).
_RUNTIME_WORDS_FOUND = re.compile("|".join(map(re.escape, _RUNTIME_WORDS))).search


def turn_key(correlation_id: str, prompt: PromptRequest) -> str:
    """Names an LLM turn within its correlation by what it is about, not by what the
    LLM said: a resumed item asks again and gets the same key, so nothing is resent."""
    message = prompt.system_message
    if message is None:
        subject = prompt.current_text
    elif message.type == "output":
        subject = repr([(o.action_type, o.command) for o in message.outputs])
    elif message.type == "event" and message.event is not None:
        subject = message.event.description + message.event.due
    else:
        subject = repr(message.errors)
    digest = hashlib.sha256(subject.encode()).hexdigest()[:12]
    return f"{correlation_id}:{prompt.mode}:{prompt.reask}:{digest}"


def message_key(turn: str, index: int) -> str:
    """The key of the message sent by a turn's ``index``-th action (a streamed reply is
    previewed under its first action's key, then replaced by it)."""
    return f"{turn}:{index}"


#: A chat id as the LLM may give it: ASCII digits, maybe negative ("²" and "٣" are
#: digits to str.isdigit, and no chat's id).
_CHAT_ID = re.compile(r"-?[0-9]+")

def echoes_runtime(text: str) -> bool:
    """True when ``text`` quotes the runtime's schema or instructions (a small model
    copying its prompt): never sent to a user as a reply.

    >>> echoes_runtime("see #/$defs/Payload"), echoes_runtime("error_retry_policy: 3"), echoes_runtime("Paris.")
    (True, True, False)
    >>> echoes_runtime(f"({PLAIN_RETRY_NOTE}: 'x' is not on the allowlist.)")
    True
    """
    return _RUNTIME_WORDS_FOUND(text) is not None


#: Words a model puts in ``target`` when it means the chat it is answering.
_HERE = frozenset({"me", "user", "chat", "this chat", "current", "current chat", "here", "reply", "same",
                   "original", "original chat"})


def names_this_chat(target: str, ctx: OriginalContext) -> bool:
    """True when ``target`` names the chat being answered in words rather than by id: the
    interface's own name, the user's or the chat's name, or "me", "this chat", ..."""
    word = target.strip().lstrip("@").casefold()
    own = {ctx.interface_name.casefold(), *(n.casefold() for n in (ctx.user_name, ctx.chat_title) if n)}
    return word in _HERE or word in own


def fitted_to_turn(action: BaseAction, prompt: PromptRequest) -> BaseAction:
    """``action`` as it applies in ``prompt``'s chat (``BaseAction.fitted``) and turn: a
    delivery answers the original chat and no other, so there a message's ``target``
    means nothing (a small model copies the output into it) and is dropped first (the
    chat's own fitting then sees a message to the original chat); its text goes there.

    >>> from autoresponse.messages import OriginalContext, PromptRequest, message_action_for
    >>> ctx = OriginalContext(chat_id="console", interface_name="console")
    >>> delivery = PromptRequest(mode="delivery", system_instruction="", allowed_actions=(),
    ...                          full_json_instructions="", current_text="", original_context=ctx)
    >>> model = message_action_for("console")
    >>> said = model(type="message_console", payload={"text": "19:12:23", "target": "19:12:23"})
    >>> fitted_to_turn(said, delivery).payload.target is None
    True
    >>> fitted_to_turn(said, delivery.model_copy(update={"mode": "chat"})) is said
    True
    """
    ctx = prompt.original_context
    target = action.payload.target if prompt.mode == "delivery" and action.kind == "message" else None
    if target is not None and str(target) != str(ctx.chat_id):
        action = action.model_copy(update={"payload": action.payload.model_copy(update={"target": None})})
    return action.fitted(ctx)


def replacing(positions: tuple[Position, ...], kinds: list[str]) -> list[bool]:
    """Which actions of a re-ask's answer (by kind, in order) may go out: each must take a
    rejected place of the reply it corrects; one that would answer a place already
    carried out is dropped, whatever its wording.

    An answer that restates the whole reply (as many actions as it had places) is read
    place by place; a shorter one fills the rejected places in order, a place of the
    same kind first, then one whose kind is unknown. An action may take a rejected place
    of the other kind (words instead of a refused command) only when nothing of its own
    kind was carried out: a message after a delivered one is a reworded repeat. Nothing
    carried out: all go.

    >>> from autoresponse.messages import Position
    >>> refused = Position(index=1, type="terminal", done=False, kind="command")
    >>> replacing((refused,), ["message"])                     # words for a refused command
    [True]
    >>> said = Position(index=1, type="message_console", done=True, kind="message")
    >>> replacing((said, refused.model_copy(update={"index": 2})), ["message"])   # a repeat
    [False]
    """
    if not any(p.done for p in positions):
        return [True] * len(kinds)
    done_kinds = {p.kind for p in positions if p.done}
    if len(kinds) == len(positions):
        return [not p.done and (p.kind in (kind, "any") or kind not in done_kinds)
                for p, kind in zip(positions, kinds, strict=True)]
    free = [p for p in positions if not p.done]
    keep = []
    for kind in kinds:
        place = (next((p for p in free if p.kind == kind), None) or next((p for p in free if p.kind == "any"), None)
                 or (next(iter(free), None) if kind not in done_kinds else None))
        if place is not None:
            free.remove(place)
        keep.append(place is not None)
    return keep


def describe(action: BaseAction) -> str:
    """A short description of a command, to say it is still running."""
    command = getattr(action.payload, "command", None)
    return f"`{command}`" if command else f"{action.type} {action.payload.model_dump_json()[:80]}"


class ActionDispatcher(TypedActor):
    """Extracts the actions of each reply, sends the valid ones on, reports the rest.

    Message actions go to their interface's sender as a reply to the original
    message; other actions go to their executor, several of one reply as a batch
    whose outputs come back in one delivery turn. A reply in plain words is an answer
    to the chat (``prose="reply"``), never executed. A re-ask's answer replaces only
    the places of the rejected reply that were rejected: an action it repeats is
    skipped, a message beyond the rejected message places is dropped (and traced),
    whatever its wording, and an empty answer means nothing more. An empty answer
    ends a turn only where it may (``may_end_quietly``); elsewhere the user still waits,
    and it is re-asked like any invalid one. A message may name
    its chat by title or @username in a chat turn; an unknown or ambiguous name is an
    error that lists the candidates. An action its executor would refuse (a program
    off the allowlist: ``preflight``) is an error the LLM hears at once, in the turn
    that chose it, rather than a refusal it has to explain later. A delivery's message
    goes to the original chat only: a ``target`` it names is dropped, and traced.
    """

    def __init__(self, max_actions: int = MAX_ACTIONS_PER_REPLY, store: ConversationStore | None = None,
                 prose: ProseRule = "reply", approval: Iterable[str] = (),
                 preflight: Mapping[str, Callable[[BaseAction], str]] | None = None) -> None:
        super().__init__()
        self.max_actions = max_actions
        self.store = store
        self.prose = prose
        #: Command action types that run only once approved (the approvals desk asks).
        self.approval = frozenset(approval)
        #: action type → what its executor would refuse in an action ("" when nothing).
        self.preflight = dict(preflight or {})

    def _extract(self, reply: LLMReply) -> Extraction:
        prompt = reply.prompt
        if reply.tool_calls:
            return extract_tool_calls(reply.tool_calls, prompt.allowed_actions, max_actions=self.max_actions,
                                      may_stay_silent=may_end_quietly(prompt))
        if not reply.text.strip():  # nothing, or only reasoning (the engine cut it off)
            return _nothing(prompt, "your reply was empty", chosen=False)
        # An empty action list is weighed here, by what the turn owes its user.
        found = extract_actions(reply.text, prompt.allowed_actions, max_actions=self.max_actions,
                                may_stay_silent=True)
        if not found.slots and not found.errors:
            return _nothing(prompt, "your reply holds no action", chosen=reply.finish_reason != "length")
        if found.prose and self.prose == "reply":
            text = reply.text.strip()
            if reply.finish_reason == "length":  # cut off: a loop it ended in is said once
                text = without_loop(text)
            return self._prose(text, prompt) or found
        return found

    def _prose(self, text: str, prompt: PromptRequest) -> Extraction | None:
        """Plain words as the message action of the original chat (never executed)."""
        model = message_action_for(prompt.original_context.interface_name)
        if model is None or model.action_type() not in prompt.allowed_actions:
            return None
        if echoes_runtime(text):
            return Extraction((), ("your reply quotes the runtime's instructions; answer the user instead",))
        action = model(type=model.action_type(), payload={"text": text[:MAX_MESSAGE_CHARS]})
        return Extraction((action,), (), (Slot(1, action.type, action),))

    @handles
    def on_reply(self, reply: LLMReply, env: Envelope) -> None:
        prompt = reply.prompt
        found = self._extract(reply)
        if not found.actions and not found.errors:  # nothing to say, or nothing more
            if reply.previewed:
                self._withdraw(prompt.original_context, turn_key(env.correlation_id, prompt), env)
            settle_receipt(self, prompt.original_context, env, ok=True, detail="nothing to say")
            return
        errors = [e for e in found.errors if not any(e == slot.error for slot in found.slots)] if found.errors else []
        carried_out = list(prompt.carried_out)
        sent = list(prompt.sent)
        turn = turn_key(env.correlation_id, prompt)
        ctx = prompt.original_context
        # What became of each place: made into ``Position``s only for a re-ask (they are its).
        positions: list[tuple[Slot, bool, str]] = []
        kept: list[tuple[int, Slot, str]] = []  # (place in the reply, slot, its key) of what goes out
        may_go: dict[int, bool] = {}  # id(slot) → whether it may go out (a re-ask's answer only)
        if prompt.reask:
            valid = [slot for slot in found.slots if slot.action is not None]
            may_go = dict(zip((id(v) for v in valid), replacing(prompt.positions, [
                "message" if v.action.kind == "message" else "command" for v in valid]), strict=True))
        seen: dict[str, str] = {}  # key → why it was refused ("" when it went on)
        for index, slot in enumerate(found.slots):
            action = slot.action
            if action is None:
                positions.append((slot, False, slot.error))
                errors.append(slot.error)
                continue
            key = action_key(action)
            if key in carried_out or key in seen:  # a repeat, in this reply or of an earlier one
                # It shares the fate of its first: a repeat of a refused action was not carried out.
                refused = seen.get(key, "")
                positions.append((slot, not refused, refused))
                continue
            seen[key] = ""
            if not may_go.get(id(slot), True):
                self._dropped(env, slot, "answers a place already carried out")
                continue
            fitted, fitted_key = fitted_to_turn(action, prompt), key
            if fitted is not action:
                log.info("action %d (%s): dropped what cannot apply in this chat", slot.index, slot.type)
                self._noted(env, f"action {slot.index} ({slot.type}): dropped what cannot apply in this chat")
                action, slot = fitted, replace(slot, action=fitted)
                fitted_key = action_key(action)
            preflight = self.preflight.get(action.type)
            problem = action.check(ctx) or (preflight(action) if preflight is not None else "")
            if problem:
                positions.append((slot, False, problem))
                errors.append(problem)
                seen[key] = problem
                continue
            kept.append((index, slot, fitted_key))
        commands: tuple[str, ...] | None = None  # the batch of the reply's commands, once one goes
        run = 0  # commands sent so far: each one's place in the batch
        replaced_preview = False
        for index, slot, key in kept:
            action = slot.action
            assert action is not None
            problem = ""
            if action.kind == "message":
                problem = self._message(action, prompt, env, message_key(turn, index), sent)
                replaced_preview |= (reply.previewed and index == 0 and not problem
                                     and str(action.payload.target or ctx.chat_id) == str(ctx.chat_id))
            elif self._gated(action):
                self._ask_approval(action, ctx, message_key(turn, index), env)
            else:
                if commands is None:
                    commands = tuple(describe(s.action) for _, s, _ in kept  # type: ignore[union-attr]
                                     if s.action.kind != "message" and not self._gated(s.action))  # type: ignore[union-attr]
                batch = Batch(key=turn, index=run, commands=commands) if len(commands) > 1 else None
                self.send(route_of(action), ActionRequest(action=action, context=ctx, batch=batch), cause=env)
                run += 1
            positions.append((slot, not problem, problem))
            if problem:
                errors.append(problem)
            else:
                carried_out.append(key)
        if reply.previewed and not replaced_preview:
            self._withdraw(ctx, turn, env)
        if errors:
            cut_off = reply.finish_reason == "length"
            if cut_off:
                errors.insert(0, "your reply was cut off at its token limit before it was complete; "
                                 "answer again, much shorter")
            message = rejection(prompt, reply.text or _calls_text(reply), errors)
            self.report_error(Rejection(prompt=prompt, message=message, carried_out=tuple(carried_out),
                                        sent=tuple(sent), positions=tuple(sorted(
                                            (self._position(*p) for p in positions), key=lambda p: p.index)),
                                        tool_calls=reply.tool_calls, cut_off=cut_off),
                              cause=env, detail="; ".join(message.errors))

    def _gated(self, action: BaseAction) -> bool:
        """Whether ``action`` waits for approval before it runs (the desk is there to ask)."""
        return action.type in self.approval and self.runtime.has(APPROVALS)

    def _ask_approval(self, action: BaseAction, ctx: OriginalContext, key: str, env: Envelope) -> None:
        """The approval gate: the action goes to the approvals desk, not to its executor; it
        runs alone (in no batch) once approved, as a turn of its own."""
        self.send(APPROVALS, ApprovalRequest(request=ActionRequest(action=action, context=ctx), key=key),
                  cause=env)

    @staticmethod
    def _position(slot: Slot, done: bool, error: str = "") -> Position:
        said = ""
        if slot.action is not None:
            payload = slot.action.payload
            said = getattr(payload, "text", None) or getattr(payload, "command", None) or payload.model_dump_json()
        model = action_model(slot.type) if slot.type else None
        kind = "any" if model is None else model.kind
        return Position(index=slot.index, type=slot.type, done=done, error=error, kind=kind,
                        excerpt=excerpt(str(said), REASK_EXCERPT_CHARS // 4), tool_call_id=slot.tool_call_id)

    def _dropped(self, env: Envelope, slot: Slot, why: str) -> None:
        """A re-ask answered a place already carried out: nothing goes out, the trace says so."""
        log.info("dropped action %d (%s) of a re-ask: it %s", slot.index, slot.type, why)
        self._noted(env, f"dropped action {slot.index} ({slot.type}): it {why}")

    def _noted(self, env: Envelope, note: str) -> None:
        """What the dispatcher changed in a reply, in the reply's trace."""
        tracer = self.runtime.tracer
        if tracer is not None:
            tracer.note(env, "LLMReply", note)

    def _withdraw(self, ctx: OriginalContext, turn: str, env: Envelope) -> None:
        """The chat saw this turn's reply grow, but its first action is not that reply."""
        self.send(sender(ctx.interface_name), withdrawal(ctx, message_key(turn, 0)), cause=env)

    def _message(self, action: BaseAction, prompt: PromptRequest, env: Envelope, key: str,
                 sent: list[tuple[str, str]]) -> str:
        """Send one message action, or say what is wrong with it."""
        ctx = prompt.original_context
        target = action.payload.target
        if target is not None and names_this_chat(str(target), ctx):
            target = None  # a small model's way of saying "here": the interface, the user, "me"
        # (A delivery's message has no other target by now: ``fitted_to_turn``.)
        if target is not None and str(target) != str(ctx.chat_id):
            target, problem = self._resolve(action, ctx, target)
            if problem:
                return problem
        where = str(ctx.chat_id if target is None else target)
        text = action.payload.text
        if echoes_runtime(text):
            return f"{action.type}: the text quotes the runtime's instructions; write the answer for the user"
        # A topic's thread, on the platforms whose payloads have one (asked for an attribute
        # it lacks, a pydantic model raises, slowly; and its ``model_fields`` is Python
        # code: on every reply). ``__pydantic_fields__`` is the same dict, a class attribute.
        payload = action.payload
        thread = payload.message_thread_id if "message_thread_id" in type(payload).__pydantic_fields__ else None
        message = OutboundMessage.reply(ctx, text, chat_id=target, key=key)
        if thread is not None:
            message = message.model_copy(update={"thread_id": thread})
        self.send(route_of(action), message, cause=env)
        sent.append((where, text))
        return ""

    def _resolve(self, action: BaseAction, ctx: OriginalContext, target: ChatId) -> tuple[ChatId, str]:
        """A chat named by id stays as it is; one named by title or @username is looked up
        among the chats this daemon has seen on the same interface."""
        if isinstance(target, int) or _CHAT_ID.fullmatch(str(target)) or self.store is None:
            return target, ""
        if not str(target).strip().lstrip("@").strip():
            return target, f"{action.type}: \"target\" names no chat; give a chat's id, title or @username"
        found = self.store.find_chats(ctx.interface_name, str(target))
        if len(found) == 1:
            chat_id = found[0].chat_id
            return (int(chat_id) if _CHAT_ID.fullmatch(chat_id) else chat_id), ""
        if not found:
            return target, (f"{action.type}: no chat named {target!r} is known on {ctx.interface_name}; "
                            "give the chat's id, or a title or @username this bot has seen")
        candidates = "; ".join(c.describe() for c in found[:CHAT_CANDIDATES_SHOWN])
        if len(found) > CHAT_CANDIDATES_SHOWN:
            candidates += f"; and {len(found) - CHAT_CANDIDATES_SHOWN} more (name it more exactly)"
        return target, (f"{action.type}: the chat name {target!r} is ambiguous: it could be {candidates}. "
                        "Send the message again with the chosen chat's id as \"target\"")


def may_end_quietly(prompt: PromptRequest) -> bool:
    """Whether an answer with no action ends ``prompt``'s turn with nothing (more) said.

    Only a turn the bot may leave unanswered (a reminder's, an autonomous one: the bot was
    not asked), or one that has delivered or carried out something already (its re-ask's
    empty answer means "nothing more"). Anywhere else its user is still waiting, a delivery
    turn's with a command already run: "nothing" is no answer, and it is re-asked.

    >>> from autoresponse.messages import OriginalContext, PromptRequest
    >>> ctx = OriginalContext(chat_id=1, interface_name="console")
    >>> asked = PromptRequest(mode="chat", system_instruction="", allowed_actions=(),
    ...                       full_json_instructions="", current_text="hi", original_context=ctx)
    >>> may_end_quietly(asked), may_end_quietly(asked.model_copy(update={"reask": 1}))
    (False, False)
    >>> may_end_quietly(asked.model_copy(update={"reask": 1, "carried_out": ("message_console:1",)}))
    True
    """
    return (prompt.may_stay_silent or prompt.original_context.autonomous
            or bool(prompt.carried_out) or bool(prompt.sent))


def _nothing(prompt: PromptRequest, what: str, *, chosen: bool) -> Extraction:
    """An answer with no action: the end of a turn that may end quietly, else an error
    that tells the LLM its user still waits (``what`` says what the answer was).

    Silence has to be ``chosen``: a whole ``{"actions": []}``. An empty answer, or one cut
    off at the token limit, is no choice (a reasoning model that spent its tokens thinking
    says nothing): it ends a turn only after part of it went out ("nothing more"), and a
    reminder's or an autonomous turn asks again, or the reminder would be marked delivered
    with nothing sent."""
    if may_end_quietly(prompt) and (chosen or prompt.carried_out or prompt.sent):
        return Extraction((), ())
    if may_end_quietly(prompt):  # the bot may stay silent, but has to say so
        return Extraction((), (f'{what}: answer with the actions to take, or with {{"actions": []}} '
                               "if there is nothing to say",))
    if prompt.outcome in RAN:  # a delivery turn of what actions output
        waiting = "the result: present it to them in a message"
    elif prompt.mode == "delivery":
        waiting = "an answer: tell them in a message"
    else:
        waiting = "an answer: answer them, or carry out what they asked"
    return Extraction((), (f"{what}, and the user is still waiting for {waiting}",))


def _calls_text(reply: LLMReply) -> str:
    """The tool calls of a reply as the text of an actions list (to quote in a re-ask)."""
    return "; ".join(f"{call.name}({call.arguments})" for call in reply.tool_calls)
