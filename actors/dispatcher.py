"""The action dispatcher: from an LLM reply to the actors that carry out its actions."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from difflib import SequenceMatcher

from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.extractor import extract_actions, rejection
from autoresponse.actors.limits import CHAT_CANDIDATES_SHOWN, MAX_ACTIONS_PER_REPLY
from autoresponse.actors.memory import ConversationStore
from autoresponse.actors.receipts import settle_receipt
from autoresponse.actors.routes import route_of, sender
from autoresponse.actors.streaming import withdrawal
from autoresponse.messages import (
    ActionRequest,
    BaseAction,
    Batch,
    ChatId,
    Envelope,
    LLMReply,
    OriginalContext,
    OutboundMessage,
    PromptRequest,
    Rejection,
    action_key,
)


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

#: Two messages to one chat whose texts are at least this similar (difflib's ratio, after
#: folding case and spaces) say the same thing: a re-ask does not send the second.
SAME_MESSAGE_RATIO = 0.8


def _folded(text: str) -> str:
    return " ".join(text.casefold().split())


def says_again(target: str, text: str, sent: Iterable[tuple[str, str]]) -> bool:
    """True when ``text`` to ``target`` repeats, even reworded, a message already sent there."""
    mine = _folded(text)
    return any(where == target and SequenceMatcher(None, mine, _folded(said)).ratio() >= SAME_MESSAGE_RATIO
               for where, said in sent)


def describe(action: BaseAction) -> str:
    """A short description of a command, to say it is still running."""
    command = getattr(action.payload, "command", None)
    return f"`{command}`" if command else f"{action.type} {action.payload.model_dump_json()[:80]}"


class ActionDispatcher(TypedActor):
    """Extracts the actions of each reply, sends the valid ones on, reports the rest.

    Message actions go to their interface's sender as a reply to the original
    message; other actions go to their executor, several of one reply as a batch
    whose outputs come back in one delivery turn. An action a re-ask repeats after
    it was carried out is skipped, and so is a message that says again what this
    turn already sent to that chat (see ``says_again``): nothing runs or is
    delivered twice. A message may name its chat by title or @username in a chat
    turn; an unknown or ambiguous name is an error that lists the candidates.
    """

    def __init__(self, max_actions: int = MAX_ACTIONS_PER_REPLY, store: ConversationStore | None = None) -> None:
        super().__init__()
        self.max_actions = max_actions
        self.store = store

    @handles
    def on_reply(self, reply: LLMReply, env: Envelope) -> None:
        prompt = reply.prompt
        found = extract_actions(reply.text, prompt.allowed_actions, max_actions=self.max_actions,
                                may_stay_silent=prompt.may_stay_silent)
        if not found.actions and not found.errors:  # a turn that may stay silent did
            if reply.previewed:
                self._withdraw(prompt.original_context, turn_key(env.correlation_id, prompt), env)
            settle_receipt(self, prompt.original_context, env, ok=True, detail="nothing to say")
            return
        errors = list(found.errors)
        carried_out = list(prompt.carried_out)
        sent = list(prompt.sent)
        turn = turn_key(env.correlation_id, prompt)
        keyed = [(a, action_key(a)) for a in found.actions]
        fresh = [(a, key) for a, key in keyed if key not in prompt.carried_out]
        commands = tuple(describe(a) for a, _ in fresh if a.kind != "message")
        run = 0  # commands sent so far: each one's place in the batch
        ctx = prompt.original_context
        replaced_preview = False
        for index, (action, key) in enumerate(fresh):
            problem = action.check(prompt.original_context)
            if problem:
                errors.append(problem)
                continue
            if action.kind == "message":
                problem = self._message(action, prompt, env, message_key(turn, index), sent)
                replaced_preview |= index == 0 and not problem and str(action.payload.target or ctx.chat_id) == str(ctx.chat_id)
            else:
                batch = Batch(key=turn, index=run, commands=commands) if len(commands) > 1 else None
                self.send(route_of(action), ActionRequest(action=action, context=prompt.original_context,
                                                          batch=batch), cause=env)
                run += 1
                problem = ""
            if problem:
                errors.append(problem)
            else:
                carried_out.append(key)
        if reply.previewed and not replaced_preview:
            self._withdraw(ctx, turn, env)
        if errors:
            message = rejection(prompt, reply.text, errors)
            self.report_error(Rejection(prompt=prompt, message=message, carried_out=tuple(carried_out),
                                        sent=tuple(sent)),
                              cause=env, detail="; ".join(message.errors))

    def _withdraw(self, ctx: OriginalContext, turn: str, env: Envelope) -> None:
        """The chat saw this turn's reply grow, but its first action is not that reply."""
        self.send(sender(ctx.interface_name), withdrawal(ctx, message_key(turn, 0)), cause=env)

    def _message(self, action: BaseAction, prompt: PromptRequest, env: Envelope, key: str,
                 sent: list[tuple[str, str]]) -> str:
        """Send one message action, or say what is wrong with it."""
        ctx = prompt.original_context
        target = action.payload.target
        if prompt.mode == "delivery" and target is not None and str(target) != str(ctx.chat_id):
            # Output of the user's action goes back to the user's chat, nowhere else.
            return f"{action.type}: a delivery answers the original chat; omit \"target\""
        if target is not None and str(target) != str(ctx.chat_id):
            target, problem = self._resolve(action, ctx, target)
            if problem:
                return problem
        where = str(ctx.chat_id if target is None else target)
        text = action.payload.text
        if prompt.reask and says_again(where, text, sent):
            return ""  # delivered already in this turn, in other words: not twice
        thread = getattr(action.payload, "message_thread_id", None)
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
