"""Conversations: each chat's turns, one at a time, in the order its messages came.

Inbound interfaces send every ``UserRequest`` to the ``conversations`` pool,
which routes it by chat (interface, chat, thread), so one chat always lands on
the same actor while different chats run in parallel. A chat's next request
starts its turn only when the previous turn's correlation has finished (its
reply sent, or dead-lettered), so replies to a chat go out in the order the
requests came in, across the chat turn, the command and the delivery turn.

Per-chat state is data in a handful of actors, not an actor per chat.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.actor import TypedActor, handles
from autoresponse.actors.routes import LLM
from autoresponse.messages import Envelope, UserRequest


class TurnEnded(BaseModel):
    """The turn of one chat has finished (sent to the conversation that started it)."""

    model_config = ConfigDict(frozen=True)

    chat: str


def chat_of(message: Any, env: Envelope) -> str:
    """The routing key of the conversation pool: the chat a request belongs to."""
    if isinstance(message, UserRequest):
        return message.context.chat_key
    return env.correlation_id


class ConversationActor(TypedActor):
    """Starts each chat's turns in order; holds the ones that arrive while a turn runs."""

    def __init__(self) -> None:
        super().__init__()
        self._running: dict[str, str] = {}  # chat → the correlation of its turn under way
        self._waiting: dict[str, deque[Envelope]] = {}

    @handles
    def on_request(self, request: UserRequest, env: Envelope) -> None:
        chat = request.context.chat_key
        if chat in self._running:
            self.hold(env)
            self._waiting.setdefault(chat, deque()).append(env)
            return
        self._begin(chat, request, env)

    @handles
    def on_turn_ended(self, ended: TurnEnded, env: Envelope) -> None:
        self._running.pop(ended.chat, None)
        queue = self._waiting.get(ended.chat)
        if not queue:
            return
        following = queue.popleft()
        if not queue:
            del self._waiting[ended.chat]
        self._begin(ended.chat, following.body, following)
        self.release(following)

    def _begin(self, chat: str, request: UserRequest, env: Envelope) -> None:
        self._running[chat] = env.correlation_id
        self.runtime.when_finished(env.correlation_id, self.name, TurnEnded(chat=chat))
        self.send(LLM, request, cause=env)
