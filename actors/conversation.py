"""Conversations: each chat's turns, one at a time, in order, with the chat's memory.

Inbound interfaces send every ``UserRequest`` to the ``conversations`` pool,
which routes it by chat (interface, chat, thread), so one chat always lands on
the same actor while different chats run in parallel. For each chat, the
conversation:

* starts a turn only when the previous one has finished (its reply sent, or
  dead-lettered), so replies go out in the order the requests came in;
* answers messages that arrive while a turn runs *together*: they join the next
  turn as one request, in order, and its reply threads to the last of them
  (people split one thought over several quick messages);
* gives each turn the chat's memory (``memory.ConversationStore``): its recent
  messages, replies and action records, and remembers the new message, and each
  reply once its sender confirms it;
* gathers the messages of one group (a Telegram album: ten photos sent at once) for
  ``ALBUM_GATHER_SECONDS`` and answers them as one turn, with whatever else came meanwhile;
* takes a user's ``/forget`` as a turn of its own, in the chat's order: it clears
  the memory once the turns before it have finished (their replies remembered), so
  "forgotten" leaves nothing of what came before it. Messages that came before it
  are answered first, never merged with what came after it;
* takes a user's ``/cancel`` (or "stop" in a private chat) at once, ahead of the chat's
  queued turns: the turn under way is cancelled (its journal item closes as cancelled, its
  LLM call is aborted, its command killed; see ``cancellation``), the queued turns are
  dropped, pending approvals are called off, and the user gets a one-line confirmation,
  or "nothing to cancel";
* runs a decided approval (``ApprovalOutcome``: the action, or the LLM told it was
  denied) as a turn of its own, in the chat's order.

Per-chat state is data in a handful of actors, not an actor per chat.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.approvals import APPROVALS, NOTHING_TO_CANCEL, denied_request
from autoresponse.actors.cancellation import abort, cancel_request
from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.limits import ALBUM_GATHER_SECONDS
from autoresponse.actors.memory import ConversationStore
from autoresponse.actors.routes import LLM, route_of, sender
from autoresponse.messages.approval import ApprovalOutcome, CancelApprovals, CancelWork
from autoresponse.messages import Envelope, OutboundMessage, ReplyDelivered, UserRequest, attachments_label

FORGOTTEN = "Done: I have forgotten our conversation."
#: ``/forget``, also as a Telegram group command addressed to a bot (``/forget@synth_bot``).
_FORGET = re.compile(r"^/forget(@\w+)?$", re.IGNORECASE)
CANCELLED = "Cancelled: I stopped working on your request."
CANCEL_UNAVAILABLE = ("Sorry, a request cannot be cancelled here: this bot shares its work with other "
                      "daemons, and a chat's messages are taken strictly one after the other.")
#: ``/cancel`` (``/cancel@synth_bot`` in a group); in a private chat "stop" too.
_CANCEL = re.compile(r"^/cancel(@\w+)?$", re.IGNORECASE)
_STOP = re.compile(r"^stop[.!]*$", re.IGNORECASE)


class TurnEnded(BaseModel):
    """The turn of one chat has finished (sent to the conversation that started it)."""

    model_config = ConfigDict(frozen=True)

    chat: str
    #: The turn that ended: a cancelled turn ends late, after the chat's next one started.
    correlation: str | None = None


class AlbumDue(BaseModel):
    """The time to gather a chat's message group is up (a timer of the conversation);
    ``first`` names the group's first message, so a late timer closes no newer group."""

    model_config = ConfigDict(frozen=True)

    chat: str
    first: str


class AlbumClose(BaseModel):
    """Close a chat's message group, after whatever was already queued (it is sent to the
    conversation's own mailbox, behind the group's last items)."""

    model_config = ConfigDict(frozen=True)

    chat: str
    first: str


def chat_of(message: Any, env: Envelope) -> str:
    """The routing key of the conversation pool: the chat a message belongs to."""
    if isinstance(message, (UserRequest, ReplyDelivered)):
        return message.context.chat_key
    if isinstance(message, ApprovalOutcome):
        return message.request.context.chat_key
    return env.correlation_id


def is_forget(request: UserRequest) -> bool:
    return bool(_FORGET.match(request.text.strip()))


def is_cancel(request: UserRequest) -> bool:
    """``/cancel``, or "stop" alone in a private chat."""
    text = request.text.strip()
    return bool(_CANCEL.match(text) or (request.context.chat_type == "private" and _STOP.match(text)))


def alone(body: Any) -> bool:
    """A turn of its own, never merged with the messages around it: a /forget, a decided approval."""
    return not isinstance(body, UserRequest) or is_forget(body)


def merged(requests: list[UserRequest]) -> UserRequest:
    """Several messages of one chat as one request: their texts in order, one per line,
    in the context of the last (the reply threads to it)."""
    if len(requests) == 1:
        return requests[0]
    text = "\n".join(r.text for r in requests if r.text)  # an album's photos mostly have no caption
    context = requests[-1].context.model_copy(update={"original_command": text})
    return UserRequest(text=text, context=context, attachments=tuple(a for r in requests for a in r.attachments))


class ConversationActor(TypedActor):
    """Starts each chat's turns in order; holds what arrives while a turn runs."""

    def __init__(self, store: ConversationStore | None = None) -> None:
        super().__init__()
        self.store = store
        self._running: dict[str, str] = {}  # chat → the correlation of its turn under way
        self._waiting: dict[str, deque[Envelope]] = {}
        self._gathering: dict[str, list[Envelope]] = {}  # chat → a message group being gathered

    @handles
    def on_request(self, request: UserRequest, env: Envelope) -> None:
        chat = request.context.chat_key
        if is_cancel(request):  # at once: it cannot wait for the turn it cancels
            self._cancel(chat, env)
            return
        if chat in self._gathering or request.media_group is not None:
            self._gather(chat, env)
            return
        if chat in self._running:
            # A /forget waits too: run now, it would clear the memory before the turns
            # ahead of it wrote their messages and replies.
            self.hold(env)
            self._waiting.setdefault(chat, deque()).append(env)
            return
        self._start(chat, [env])

    def _gather(self, chat: str, env: Envelope) -> None:
        """Hold a message of a group (an album), and what comes after it, for one turn."""
        self.hold(env)
        gathering = self._gathering.get(chat)
        if gathering is None:
            self._gathering[chat] = [env]
            self.schedule(ALBUM_GATHER_SECONDS, AlbumDue(chat=chat, first=env.message_id), cause=env)
        else:
            gathering.append(env)

    @handles
    def on_album_due(self, due: AlbumDue, env: Envelope) -> None:
        # A timer comes ahead of queued work: items of the group already queued go first.
        self.send(self.name, AlbumClose(chat=due.chat, first=due.first), cause=env)

    @handles
    def on_album_close(self, close: AlbumClose, env: Envelope) -> None:
        gathered = self._gathering.get(close.chat)
        if not gathered or gathered[0].message_id != close.first:
            return  # the group was cancelled (a newer one may be gathering)
        del self._gathering[close.chat]
        self._waiting.setdefault(close.chat, deque()).extend(gathered)
        if close.chat not in self._running:
            self._next_turn(close.chat)

    @handles
    def on_turn_ended(self, ended: TurnEnded, env: Envelope) -> None:
        if ended.correlation is not None and self._running.get(ended.chat) != ended.correlation:
            return  # a cancelled turn's work ended: the chat went on without it
        self._running.pop(ended.chat, None)
        self._next_turn(ended.chat)

    def _next_turn(self, chat: str) -> None:
        """Start the chat's next turn from what waits: a /forget alone, or the messages up
        to the next /forget together."""
        waiting = self._waiting.get(chat)
        if not waiting:
            self._waiting.pop(chat, None)
            return
        turn = [waiting.popleft()]
        if not alone(turn[0].body):
            while waiting and not alone(waiting[0].body):
                turn.append(waiting.popleft())
        if not waiting:
            del self._waiting[chat]
        self._start(chat, turn)
        for held in turn:
            self.release(held)

    @handles
    def on_reply_delivered(self, delivered: ReplyDelivered, env: Envelope) -> None:
        if self.store is not None:
            self.store.append(delivered.context.chat_key, "assistant", delivered.text, kind="reply")

    def _start(self, chat: str, envelopes: list[Envelope]) -> None:
        """Start the chat's next turn: a /forget, a decided approval, or the requests in ``envelopes``."""
        if isinstance(envelopes[0].body, ApprovalOutcome):
            self._decided(chat, envelopes[0])
        elif is_forget(envelopes[0].body):
            self._forget(chat, envelopes[0])
        else:
            self._begin(chat, envelopes)

    def _begin(self, chat: str, envelopes: list[Envelope]) -> None:
        """Start one turn for the requests in ``envelopes`` (their last one carries it)."""
        request = merged([e.body for e in envelopes])
        cause = envelopes[-1]
        if self.store is not None:
            self.store.seen(request.context)
            turns = self.store.recent(chat)
            said = " ".join(filter(None, (request.text, attachments_label(request.attachments))))
            self.store.append(chat, "user", said)
            request = request.model_copy(update={"turns": tuple(turns)})
        self._turn(chat, cause)
        self.send(LLM, request, cause=cause)

    def _turn(self, chat: str, env: Envelope) -> None:
        """``env``'s correlation is the chat's turn under way until it has finished."""
        self._running[chat] = env.correlation_id
        self.runtime.when_finished(env.correlation_id, self.name,
                                   TurnEnded(chat=chat, correlation=env.correlation_id))

    def _forget(self, chat: str, env: Envelope) -> None:
        """Clear the chat's memory; its answer is a turn, so what comes after waits for it."""
        request: UserRequest = env.body
        if self.store is not None:
            self.store.forget(chat)
        self._turn(chat, env)
        self.send(sender(request.context.interface_name),
                  OutboundMessage.reply(request.context, FORGOTTEN, notice=True), cause=env)

    @handles
    def on_outcome(self, outcome: ApprovalOutcome, env: Envelope) -> None:
        chat = outcome.request.context.chat_key
        if chat in self._running or self._waiting.get(chat):
            self.hold(env)
            self._waiting.setdefault(chat, deque()).append(env)
            return
        self._start(chat, [env])

    def _decided(self, chat: str, env: Envelope) -> None:
        """A decided approval's turn: the action runs, or the LLM hears it was denied."""
        outcome: ApprovalOutcome = env.body
        self._turn(chat, env)
        if outcome.approved:
            self.send(route_of(outcome.request.action), outcome.request, cause=env)
            return
        turns = self.store.recent(chat) if self.store is not None else []
        request = denied_request(self.runtime, outcome, turns)
        if request is not None:
            self.send(LLM, request, cause=env)

    def _cancel(self, chat: str, env: Envelope) -> None:
        """Cancel the chat's turn under way and drop its queued turns, then confirm."""
        ctx = env.body.context
        if self.runtime.intake.distributed:
            # On a shared journal a chat's items run one after the other, so this one
            # runs only once the request it would cancel has finished: say so plainly.
            self._say(ctx, CANCEL_UNAVAILABLE, env)
            return
        dropped = list(self._waiting.pop(chat, ())) + self._gathering.pop(chat, [])
        running = self._running.pop(chat, None)
        cancelled = ([running] if running is not None else []) + [e.correlation_id for e in dropped]
        for correlation in dict.fromkeys(cancelled):
            cancel_request(self.runtime, correlation)
        if cancelled:
            abort(self.runtime, CancelWork(chat=chat, correlations=tuple(dict.fromkeys(cancelled))))
        for held in dropped:
            self.release(held)
        if self.runtime.has(APPROVALS):  # a pending approval of the chat is called off too
            self.send(APPROVALS, CancelApprovals(context=ctx, confirm=not cancelled), cause=env)
            if not cancelled:
                return  # the desk answers: it knows whether an approval was pending
        self._say(ctx, CANCELLED if cancelled else NOTHING_TO_CANCEL, env)

    def _say(self, ctx: Any, text: str, env: Envelope) -> None:
        self.send(sender(ctx.interface_name), OutboundMessage.reply(ctx, text, notice=True), cause=env)
