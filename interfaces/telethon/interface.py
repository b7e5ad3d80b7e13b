"""The userbot's interface: new messages to the Telegram user account become requests.

A task this actor owns takes Telethon's ``NewMessage`` events through the adapter
boundary (``client.UserbotClient.new_messages``) and journals each text message
(``runtime.accept``, one correlation per chat and message id) before handling it.
Telethon acknowledges updates to Telegram itself, so a message that arrives while the
daemon is down is not replayed (a string session keeps no update state); one that was
journaled survives a crash or a kill. The account's own messages are never requests,
and authorization happens here, in the actor.

>>> parse_event(event, me=500)                                       # doctest: +SKIP
UserbotText(chat_id=7, message_id=11, sender_id=7, user_name='ada', chat_type='private', ...)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict
from telethon import errors

from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.inbound import accept_input, dead_letter_malformed, take_request, turn_context
from autoresponse.interfaces.telethon.actions import INTERFACE_NAME
from autoresponse.interfaces.telethon.client import UserbotClient
from autoresponse.interfaces.telethon.media import attachments_of
from autoresponse.interfaces.telethon.settings import TelethonSettings
from autoresponse.messages import Attachment, Envelope, OriginalContext

log = logging.getLogger("autoresponse.telethon")


class UserbotText(BaseModel):
    """A text message someone else sent in a chat the account is in."""

    model_config = ConfigDict(frozen=True)

    chat_id: int
    message_id: int
    sender_id: int | None = None
    user_name: str | None = None
    #: "private", "group" (basic groups and supergroups) or "channel".
    chat_type: str
    chat_title: str | None = None
    #: The forum topic the message is in, if any.
    thread_id: int | None = None
    text: str
    #: A photo, voice note, file, sticker, place, contact or poll, by reference (``text`` is its caption).
    attachments: tuple[Attachment, ...] = ()
    #: The album the message is part of (Telethon's ``grouped_id``): one turn for all of it.
    media_group: str | None = None


def _name(entity: Any) -> str | None:
    if entity is None:
        return None
    for attribute in ("username", "first_name", "title"):  # a user's handle or name, a chat's title
        if getattr(entity, attribute, None):
            return str(getattr(entity, attribute))
    return None


def parse_event(event: Any, *, me: int) -> UserbotText | None:
    """A ``UserbotText`` from Telethon's ``NewMessage.Event``; None when it is the account's
    own (outgoing, or sent by the account from elsewhere) or carries neither text nor media."""
    message = event.message
    if message.out or event.sender_id == me:
        return None
    attachments = attachments_of(message, event.chat_id)
    if not message.message and not attachments:
        return None
    reply = message.reply_to
    topic = getattr(reply, "reply_to_top_id", None) or getattr(reply, "reply_to_msg_id", None)
    return UserbotText(
        chat_id=event.chat_id,
        message_id=message.id,
        sender_id=event.sender_id,
        user_name=_name(message.sender),  # the entities came with the update: no request
        chat_type="private" if event.is_private else "group" if event.is_group else "channel",
        chat_title=None if event.is_private else _name(message.chat),
        thread_id=topic if getattr(reply, "forum_topic", False) else None,
        text=message.message or "",
        attachments=attachments,
        media_group=None if message.grouped_id is None else str(message.grouped_id),
    )


def text_context(text: UserbotText) -> OriginalContext:
    """Where ``text`` came from, and where its answers go."""
    return OriginalContext(
        chat_id=text.chat_id,
        message_id=text.message_id,
        interface_name=INTERFACE_NAME,
        original_command=text.text,
        thread_id=text.thread_id,
        user_id=text.sender_id,
        user_name=text.user_name,
        chat_type=text.chat_type,
        chat_title=text.chat_title,
    )


def origin(settings: TelethonSettings) -> Callable[[Any], OriginalContext | None]:
    """Who sent a ``UserbotText`` (``Mount.origin``): its chat, when the sender or the chat
    is allowed (a stranger hears nothing: refused, ignored, or an autonomous turn); None too
    for one that cannot be read."""
    def of(text: Any) -> OriginalContext | None:
        try:
            allowed = settings.allows(text.sender_id, text.chat_id)
            return turn_context(text_context(text), allowed=allowed, policy=settings)
        except Exception:  # a malformed input: nobody to tell
            return None
    return of


def refusal(exc: BaseException) -> str | None:
    """Why Telegram refuses the userbot's session (logged out, revoked, the account deleted:
    an RPC error with code 401, or an authorization key error), from ``exc`` or what caused
    it; None for anything else (a lost connection is retried by the restarts)."""
    for error in (exc, exc.__cause__):
        if isinstance(error, (errors.UnauthorizedError, errors.AuthKeyError)):
            return (f"Telegram refuses the userbot's session ({type(error).__name__}): "
                    "make a new session string")
    return None


class TelethonInterface(TypedActor):
    """Takes new messages in a task this incarnation owns; a crash or stop cancels it."""

    def __init__(self, settings: TelethonSettings, userbot: UserbotClient, me: Any) -> None:
        super().__init__()
        self.settings = settings
        self._userbot = userbot  # shared with the sender; the platform disconnects it
        self._me = me

    def setup(self) -> None:
        self.start_task(self._receive(), "new messages")
        log.info("listening as the Telegram user %s", self._me.username or self._me.id)

    async def _receive(self) -> None:
        try:
            async for event in self._userbot.new_messages():
                self.report_health(True)  # Telegram talks to the account
                try:
                    text = parse_event(event, me=self._me.id)
                except Exception as exc:  # a shape we do not read: Telethon has acknowledged it
                    dead_letter_malformed(self, repr(getattr(event, "message", event)), "malformed message",
                                          f"{type(exc).__name__}: {exc}")
                    continue
                if text is not None:
                    await accept_input(self, text, f"telethon-{self._me.id}-{text.chat_id}-{text.message_id}")
        except Exception as exc:
            why = refusal(exc)
            if why is not None:  # shown as failing: the restarts that follow cannot fix it
                self.report_health(False, why)
            raise

    @handles
    def on_text(self, text: UserbotText, env: Envelope) -> None:
        context = text_context(text)
        take_request(self, text.text, context, env, allowed=self.settings.allows(text.sender_id, text.chat_id),
                     policy=self.settings, attachments=text.attachments, media_group=text.media_group)
