"""The adapter boundary between the userbot and Telegram: ``UserbotClient``.

The interface and the sender use nothing of Telethon but what this protocol names:
``get_me``, ``send_message`` (Telethon's own signatures), ``new_messages`` (an
async iterator of Telethon's ``events.NewMessage.Event``) and ``download_media`` (a
message's photo or file, for the LLM hop). ``TelethonUserbot``
implements it on a real ``TelegramClient`` over MTProto. MTProto cannot be served on
127.0.0.1, so the tests implement it with a stand-in that builds the events from
Telethon's own TL types (``UpdateNewMessage``, ``Message``, ``User``) and finishes them
as Telethon's dispatch does; everything behind the boundary is ours and runs for real.

>>> userbot = await open_userbot(settings)                          # doctest: +SKIP
>>> async for event in userbot.new_messages():                      # doctest: +SKIP
...     await userbot.send_message(event.chat_id, "pong", reply_to=event.id)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from telethon import TelegramClient, events
from telethon.sessions import StringSession

from autoresponse.interfaces.telethon.settings import TELETHON_EVENT_QUEUE, TelethonSettings


class UserbotClient(Protocol):
    """What the userbot's interface and sender call: the adapter boundary."""

    async def get_me(self) -> Any:
        """The account (a ``telethon.tl.types.User``: ``.id``, ``.username``)."""

    async def send_message(self, entity: int, message: str, *, reply_to: int | None = None,
                           parse_mode: Any = ()) -> Any:
        """Send ``message`` to the chat ``entity``; the sent ``Message`` (``.id``). Raises
        Telethon's errors (``FloodWaitError``, ``UserIsBlockedError``, ...)."""

    def new_messages(self) -> AsyncIterator[Any]:
        """New incoming messages, as Telethon's ``events.NewMessage.Event``, until the
        connection is lost for good (then it raises ``ConnectionError``)."""

    async def download_media(self, chat_id: int, message_id: int, *, thumb: str | None = None) -> bytes:
        """The bytes of a message's photo (its size of type ``thumb``, e.g. ``"x"``) or file."""


class TelethonUserbot:
    """``UserbotClient`` on a real, connected ``TelegramClient``."""

    def __init__(self, client: TelegramClient) -> None:
        self.client = client
        self._queue: asyncio.Queue[Any] = asyncio.Queue(TELETHON_EVENT_QUEUE)
        self._held: Any = None  # a message taken off the queue by an incarnation cancelled meanwhile
        # Telethon awaits the put: when the interface falls behind, Telethon waits.
        client.add_event_handler(self._queue.put, events.NewMessage(incoming=True))

    async def get_me(self) -> Any:
        return await self.client.get_me()

    async def send_message(self, entity: int, message: str, *, reply_to: int | None = None,
                           parse_mode: Any = ()) -> Any:
        return await self.client.send_message(entity, message, reply_to=reply_to, parse_mode=parse_mode)

    async def new_messages(self) -> AsyncIterator[Any]:
        if not self.client.is_connected():
            await self.client.connect()  # a new incarnation of the interface, after a disconnection
        while True:
            if self._held is not None:  # taken as the last incarnation was cancelled: first now
                held, self._held = self._held, None
                yield held
                continue
            taken = asyncio.ensure_future(self._queue.get())
            lost = self.client.disconnected
            try:
                await asyncio.wait({taken, lost}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # cancelled: a get left behind would take the next message unread
                if taken.done() and not taken.cancelled():
                    self._held = taken.result()
                taken.cancel()
                raise
            if not taken.done():
                taken.cancel()
                # Chain why (a revoked session is an auth error): the interface reports it.
                raise ConnectionError("Telegram disconnected the userbot") from getattr(
                    self.client, "_updates_error", None)
            yield taken.result()

    async def download_media(self, chat_id: int, message_id: int, *, thumb: str | None = None) -> bytes:
        message = await self.client.get_messages(chat_id, ids=message_id)
        if message is None or message.media is None:
            raise LookupError("the message or its media is gone")
        data = await self.client.download_media(message, file=bytes, thumb=thumb)
        if not isinstance(data, bytes):
            raise LookupError("the message's media has no file")
        return data

    async def aclose(self) -> None:
        await self.client.disconnect()


async def open_userbot(settings: TelethonSettings) -> TelethonUserbot:
    """The logged-in account of ``settings.session``, connected; call it on the loop that
    will use it. Raises ``PermissionError`` when the session is not logged in."""
    if not settings.enabled:
        raise ValueError("the userbot needs AUTORESPONSE_TELETHON__API_ID, __API_HASH and __SESSION")
    client = TelegramClient(StringSession(settings.session.get_secret_value()),  # type: ignore[union-attr]
                            settings.api_id, settings.api_hash.get_secret_value(),  # type: ignore[union-attr]
                            connection_retries=settings.connect_retries, retry_delay=1)
    userbot = TelethonUserbot(client)
    await client.connect()
    if not await client.is_user_authorized():
        await client.disconnect()
        raise PermissionError("the session is not logged in; make a new session string")
    return userbot
