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
* takes a user's ``/forget`` as a turn of its own, in the chat's order: it clears
  the memory once the turns before it have finished (their replies remembered), so
  "forgotten" leaves nothing of what came before it. Messages that came before it
  are answered first, never merged with what came after it.

Per-chat state is data in a handful of actors, not an actor per chat.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.memory import ConversationStore
from autoresponse.actors.routes import LLM, sender
from autoresponse.messages import Envelope, OutboundMessage, ReplyDelivered, UserRequest

FORGOTTEN = "Done: I have forgotten our conversation."
#: ``/forget``, also as a Telegram group command addressed to a bot (``/forget@synth_bot``).
_FORGET = re.compile(r"^/forget(@\w+)?$", re.IGNORECASE)


class TurnEnded(BaseModel):
    """The turn of one chat has finished (sent to the conversation that started it)."""

    model_config = ConfigDict(frozen=True)

    chat: str


def chat_of(message: Any, env: Envelope) -> str:
    """The routing key of the conversation pool: the chat a message belongs to."""
    if isinstance(message, (UserRequest, ReplyDelivered)):
        return message.context.chat_key
    return env.correlation_id


def is_forget(request: UserRequest) -> bool:
    return bool(_FORGET.match(request.text.strip()))


def merged(requests: list[UserRequest]) -> UserRequest:
    """Several messages of one chat as one request: their texts in order, one per line,
    in the context of the last (the reply threads to it)."""
    if len(requests) == 1:
        return requests[0]
    text = "\n".join(r.text for r in requests)
    context = requests[-1].context.model_copy(update={"original_command": text})
    return UserRequest(text=text, context=context)


class ConversationActor(TypedActor):
    """Starts each chat's turns in order; holds what arrives while a turn runs."""

    def __init__(self, store: ConversationStore | None = None) -> None:
        super().__init__()
        self.store = store
        self._running: dict[str, str] = {}  # chat → the correlation of its turn under way
        self._waiting: dict[str, deque[Envelope]] = {}

    @handles
    def on_request(self, request: UserRequest, env: Envelope) -> None:
        chat = request.context.chat_key
        if chat in self._running:
            # A /forget waits too: run now, it would clear the memory before the turns
            # ahead of it wrote their messages and replies.
            self.hold(env)
            self._waiting.setdefault(chat, deque()).append(env)
            return
        self._start(chat, [env])

    @handles
    def on_turn_ended(self, ended: TurnEnded, env: Envelope) -> None:
        self._running.pop(ended.chat, None)
        waiting = self._waiting.get(ended.chat)
        if not waiting:
            self._waiting.pop(ended.chat, None)
            return
        # The next turn: a /forget alone, or the messages up to the next /forget together.
        turn = [waiting.popleft()]
        if not is_forget(turn[0].body):
            while waiting and not is_forget(waiting[0].body):
                turn.append(waiting.popleft())
        if not waiting:
            del self._waiting[ended.chat]
        self._start(ended.chat, turn)
        for held in turn:
            self.release(held)

    @handles
    def on_reply_delivered(self, delivered: ReplyDelivered, env: Envelope) -> None:
        if self.store is not None:
            self.store.append(delivered.context.chat_key, "assistant", delivered.text, kind="reply")

    def _start(self, chat: str, envelopes: list[Envelope]) -> None:
        """Start the chat's next turn: a /forget, or the requests in ``envelopes``."""
        if is_forget(envelopes[0].body):
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
            self.store.append(chat, "user", request.text)
            request = request.model_copy(update={"turns": tuple(turns)})
        self._running[chat] = cause.correlation_id
        self.runtime.when_finished(cause.correlation_id, self.name, TurnEnded(chat=chat))
        self.send(LLM, request, cause=cause)

    def _forget(self, chat: str, env: Envelope) -> None:
        """Clear the chat's memory; its answer is a turn, so what comes after waits for it."""
        request: UserRequest = env.body
        if self.store is not None:
            self.store.forget(chat)
        self._running[chat] = env.correlation_id
        self.runtime.when_finished(env.correlation_id, self.name, TurnEnded(chat=chat))
        self.send(sender(request.context.interface_name),
                  OutboundMessage.reply(request.context, FORGOTTEN, notice=True), cause=env)
