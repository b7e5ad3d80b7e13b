"""Sending the userbot's replies, by Telegram's rules for user accounts.

* Chunks of at most 4096 UTF-16 units, cut by the bot's own ``split_message`` (at
  paragraphs, lines, spaces; never inside a code block or an emoji); the first answers
  the message that asked (``reply_to``), each next one the chunk before it, so the
  reply stays in its thread and forum topic, in order.
* Replies to one chat go out one at a time, in order. A ``FloodWaitError`` holds back
  only its own chat for the seconds Telegram names (a bounded number of times, up to a
  bounded wait); other chats keep flowing.
* Connection errors are retried a bounded number of times; a chat that blocked the
  account, where it may not write, or that Telethon cannot find (not in its session's
  cache), is a dead letter at once.

>>> delivery = UserbotDelivery(userbot, journal)                     # doctest: +SKIP
>>> await delivery.deliver(OutboundMessage.reply(ctx, "Your disks are fine."))   # doctest: +SKIP
[12]
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from telethon import errors

from autoresponse.actors.kernel.backoff import SEND_BACKOFF
from autoresponse.actors.journal import DeliveryJournal, SendLedger
from autoresponse.actors.sender import Undeliverable
from autoresponse.interfaces.telegram.chunking import split_message
from autoresponse.interfaces.telethon.client import UserbotClient
from autoresponse.interfaces.telethon.formatting import REPLY_MARKDOWN
from autoresponse.interfaces.telethon.settings import (
    TELETHON_MAX_FLOOD_WAIT_SECONDS,
    TELETHON_MAX_FLOOD_WAITS,
    TELETHON_SEND_ATTEMPTS,
)
from autoresponse.messages import OutboundMessage

log = logging.getLogger("autoresponse.telethon")

#: Errors that mean the account cannot write to the chat: no retry helps.
_UNREACHABLE = (errors.UserIsBlockedError, errors.ChatWriteForbiddenError, errors.PeerIdInvalidError,
                errors.ChannelPrivateError, errors.InputUserDeactivatedError,
                errors.UserBannedInChannelError, errors.ChatAdminRequiredError)


#: How Telethon's ValueError begins when it has no access hash for the chat (not met since
#: its session began): it cannot address the chat, as if it were gone.
_UNKNOWN_PEER = "Could not find the input entity"


class UserbotDelivery:
    def __init__(self, userbot: UserbotClient, journal: DeliveryJournal | None = None, *,
                 parse_mode: Any = REPLY_MARKDOWN, sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.userbot = userbot
        self.ledger = SendLedger(journal)
        self.parse_mode = parse_mode
        self._sleep = sleep
        #: Per chat: its FIFO lock and how many replies use it (dropped at zero).
        self._lanes: dict[int, tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def _lane(self, chat: int) -> AsyncIterator[None]:
        lock, users = self._lanes.setdefault(chat, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._lanes[chat]

    async def deliver(self, message: OutboundMessage) -> list[int]:
        """Send every chunk of ``message``; the ids Telegram gave them. Raises Undeliverable."""
        try:
            chat = int(message.chat_id)
        except (TypeError, ValueError):
            raise Undeliverable("unknown chat", f"{message.chat_id!r} is not a Telegram chat id") from None
        sent: list[int] = []
        reply_to = None if message.reply_to_message_id is None else int(message.reply_to_message_id)
        async with self._lane(chat):  # replies to one chat keep their order
            for n, chunk in enumerate(split_message(message.text)):
                if self.ledger.already_sent(message, n):
                    continue  # confirmed before a restart: never twice (the next answers the message)
                reply_to = await self._send(chat, chunk, reply_to)
                sent.append(reply_to)
                await asyncio.wrap_future(self.ledger.confirm(message, n))
        return sent

    async def _send(self, chat: int, text: str, reply_to: int | None) -> int:
        flood_waits = failures = 0
        while True:
            try:
                sent = await self.userbot.send_message(chat, text, reply_to=reply_to, parse_mode=self.parse_mode)
                return int(sent.id)
            except errors.FloodWaitError as exc:
                flood_waits += 1
                if flood_waits > TELETHON_MAX_FLOOD_WAITS or exc.seconds > TELETHON_MAX_FLOOD_WAIT_SECONDS:
                    raise Undeliverable("flood control", str(exc)) from None
                log.info("Telegram asks the userbot to wait %ss before writing to chat %s", exc.seconds, chat)
                await self._sleep(exc.seconds)
            except _UNREACHABLE as exc:
                raise Undeliverable("chat unreachable", f"{type(exc).__name__}: {exc}") from None
            except ValueError as exc:
                if not str(exc).startswith(_UNKNOWN_PEER):
                    raise  # the sender dead-letters it, naming it
                raise Undeliverable("chat unreachable", f"{type(exc).__name__}: {exc}") from None
            except errors.RPCError as exc:
                raise Undeliverable("rejected by Telegram", f"{type(exc).__name__}: {exc}") from None
            except (TimeoutError, ConnectionError, OSError) as exc:
                failures += 1
                if failures >= TELETHON_SEND_ATTEMPTS:
                    raise Undeliverable("network", f"{type(exc).__name__}: {exc}") from None
                await self._sleep(SEND_BACKOFF.delay(failures))
