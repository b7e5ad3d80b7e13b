"""Sending replies through the Telegram Bot API, by its rules.

One ``TelegramDelivery`` per bot, used on the runtime's event loop:

* chunks of at most 4096 UTF-16 units (see ``chunking``), in order;
* one message a second per chat, 20 a minute per group, 30 a second overall;
* ``RetryAfter`` holds back only its own chat; other chats keep flowing; a wait
  over ``max_retry_after`` is not waited out: that reply is given up (a dead
  letter the operator can replay) and the chat's next replies go on;
* ``TimedOut``/``NetworkError`` are retried a bounded number of times;
* ``BadRequest`` is never retried as it is: an unparsable reply is resent once
  as plain text, a too long one is split smaller (down to a floor); a reply whose
  preview message is gone is sent anew; anything else is final;
* a preview taken back is deleted with the same waits and retries; one that cannot be
  is edited to say it was withdrawn;
* ``Forbidden`` marks the chat unreachable until its user writes again
  (``reachable``); ``ChatMigrated`` re-targets (a few times at most);
* any other refusal (a revoked token, a conflict) or an unreadable answer makes
  that reply undeliverable, with its reason: never a crash of the sender.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import warnings
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiolimiter import AsyncLimiter
from telegram import Bot
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    EndPointNotFound,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.warnings import PTBDeprecationWarning

from autoresponse.actors.kernel.backoff import BackoffPolicy
from autoresponse.actors.journal import DeliveryJournal, SendLedger
from autoresponse.actors.sender import Undeliverable
from autoresponse.interfaces.telegram.approval import markup_of
from autoresponse.interfaces.telegram.chunking import split_message, utf16_len
from autoresponse.interfaces.telegram.settings import (
    TELEGRAM_CHAT_INTERVAL_SECONDS,
    TELEGRAM_GLOBAL_PER_SECOND,
    TELEGRAM_GROUP_PER_MINUTE,
    TELEGRAM_MAX_CONCURRENT_SENDS,
    TELEGRAM_MAX_MIGRATIONS,
    TELEGRAM_MAX_RETRY_AFTER_SECONDS,
    TELEGRAM_MAX_RETRY_AFTERS,
    TELEGRAM_MIN_CHUNK_UTF16,
    TELEGRAM_PREVIEW_WITHDRAWN_TEXT,
    TELEGRAM_SEND_ATTEMPTS,
)
from autoresponse.messages import ChatId, OutboundMessage

log = logging.getLogger("autoresponse.telegram")

#: Wait after a failed send before the next attempt: 0.5 s, doubling.
SEND_BACKOFF = BackoffPolicy(min=0.5, max=8.0, jitter=0.1)
#: Replies being previewed at once, at most (one whose final reply never came is forgotten).
_PREVIEWS_KEPT = 1_000
#: Per-chat pacing state is dropped for chats idle this long.
_IDLE_SECONDS = 120.0
#: Telegram's words for a change to a sent message that there is nothing left to make.
_NOTHING_TO_CHANGE = ("to delete not found", "to edit not found", "not modified")


class _Shown:
    """A reply shown while it was being written: its message, and the text it shows."""

    __slots__ = ("message_id", "text")

    def __init__(self, message_id: int, text: str) -> None:
        self.message_id = message_id
        self.text = text


class _ChatLane:
    """Order and pace for one chat: a FIFO lock and the times of recent sends."""

    __slots__ = ("last", "lock", "recent", "used")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.last = float("-inf")
        self.recent: deque[float] = deque(maxlen=TELEGRAM_GROUP_PER_MINUTE)
        self.used = 0.0


class TelegramDelivery:
    def __init__(self, bot: Bot, *, parse_mode: str | None = "Markdown",
                 journal: DeliveryJournal | None = None,
                 overall_per_second: float = TELEGRAM_GLOBAL_PER_SECOND,
                 max_retry_after: float = TELEGRAM_MAX_RETRY_AFTER_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.bot = bot
        self.ledger = SendLedger(journal)
        self.overall_per_second = overall_per_second
        self.max_retry_after = max_retry_after
        self.parse_mode = parse_mode
        self._clock = clock
        self._sleep = sleep
        self._lanes: OrderedDict[ChatId, _ChatLane] = OrderedDict()
        self._previews: OrderedDict[str, _Shown] = OrderedDict()  # reply key → what it shows
        self._overall: AsyncLimiter | None = None
        self._in_flight: asyncio.Semaphore | None = None
        #: Chats that blocked the bot or no longer exist.
        self.unreachable: set[str] = set()
        #: Group chats that became supergroups: old id → new id.
        self.migrated: dict[str, ChatId] = {}

    def reachable(self, chat_id: ChatId) -> None:
        """The chat's user wrote to us: if they had blocked the bot, they no longer do."""
        self.unreachable.discard(str(chat_id))

    async def start(self) -> None:
        await self.bot.initialize()

    async def aclose(self) -> None:
        await self.bot.shutdown()

    def _lane(self, chat_id: ChatId) -> _ChatLane:
        """The chat's lane, in O(1): lanes are kept least recently used first, so the idle
        ones are dropped from the front, a few on each call, never by a scan."""
        now = self._clock()
        lanes = self._lanes
        lane = lanes.get(chat_id)
        if lane is None:
            lane = lanes[chat_id] = _ChatLane()
        else:
            lanes.move_to_end(chat_id)
        lane.used = now
        for _ in range(2):  # prune: at most two per call keeps every call O(1)
            oldest_id, oldest = next(iter(lanes.items()))
            if now - oldest.used <= _IDLE_SECONDS or oldest.lock.locked():
                break
            del lanes[oldest_id]
        return lane

    async def deliver(self, message: OutboundMessage) -> list[int]:
        """Send every chunk of ``message``; the ids Telegram gave them. Raises Undeliverable.

        A reply that was previewed while the LLM wrote it (``preview``) ends in that
        message: its first chunk is edited in, once, and the rest are sent after it.
        """
        chat_id: ChatId = self.migrated.get(str(message.chat_id), message.chat_id)
        if str(chat_id) in self.unreachable:
            raise Undeliverable("chat unreachable", f"chat {chat_id} blocked the bot earlier")
        lane = self._lane(chat_id)
        async with lane.lock:  # FIFO: replies to one chat keep their order
            shown = self._previews.pop(message.key, None) if message.key else None
            ids: list[int] = []
            for n, chunk in enumerate(split_message(message.text)):
                if self.ledger.already_sent(message, n):
                    continue  # confirmed before a restart: never twice
                if n == 0 and shown is not None:  # (sent anew if its user deleted the preview)
                    ids += ([shown.message_id] if chunk == shown.text else
                            await self._send(lane, message, chunk, None, edit_of=shown.message_id))
                else:
                    reply_to = message.reply_to_message_id if n == 0 else None
                    ids += await self._send(lane, message, chunk, reply_to)
                await _settled(self.ledger.confirm(message, n))
            return ids

    async def preview(self, message: OutboundMessage) -> None:
        """Show a reply while the LLM is still writing it: the first preview sends a
        message, later ones edit it (paced as any send: one a second per chat), and one
        with no text takes it back (``_withdraw``). Only the first chunk is shown, never
        split: one Telegram calls too long is not shown; the final ``deliver`` sends the
        rest. Best effort: a preview that cannot be shown is dropped (the final reply
        still goes out), and nothing that goes wrong with one crashes the sender."""
        if not message.key or str(message.chat_id) in self.unreachable or self.ledger.already_sent(message, 0):
            return  # a replayed turn whose reply went out before a restart shows nothing new
        text = (split_message(message.text) or [""])[0]
        chat_id: ChatId = self.migrated.get(str(message.chat_id), message.chat_id)
        lane = self._lane(chat_id)
        async with lane.lock:
            shown = self._previews.get(message.key)
            try:
                if not text.strip():  # taken back
                    if shown is not None:
                        await self._withdraw(lane, message, message.key, shown)
                elif shown is None:
                    [sent] = await self._send(lane, message, text, message.reply_to_message_id, split=False)
                    self._previews[message.key] = _Shown(sent, text)
                    while len(self._previews) > _PREVIEWS_KEPT:
                        self._previews.popitem(last=False)
                elif shown.text != text:
                    [shown.message_id] = await self._send(lane, message, text, None, edit_of=shown.message_id,
                                                          split=False)
                    shown.text = text
            except (Undeliverable, TelegramError) as exc:
                log.info("a preview was not shown (%s)", exc)
            except Exception:  # unforeseen: a preview is best effort; the sender and its replies go on
                log.exception("a preview to chat %s failed", chat_id)

    async def _withdraw(self, lane: _ChatLane, message: OutboundMessage, key: str, shown: _Shown) -> None:
        """Take a preview back: delete it; if Telegram will not (a flood wait past what this
        bot waits, the network down, a message too old), edit it to say it was withdrawn,
        so that no half reply stays as if it were the answer. It is forgotten once either
        is done; kept while neither is (a final reply of its key still replaces it)."""
        message_id = shown.message_id
        try:
            await self._change_sent(lane, message, "deleteMessage",
                                    lambda chat_id: self.bot.delete_message(chat_id, message_id))
        except Undeliverable as exc:
            try:
                await self._change_sent(lane, message, "editMessageText", lambda chat_id: self._send_message(
                    chat_id, TELEGRAM_PREVIEW_WITHDRAWN_TEXT, None, None, None, edit_of=message_id))
            except Undeliverable as last:
                log.warning("a withdrawn preview in chat %s could not be deleted (%s) nor marked "
                            "withdrawn (%s)", message.chat_id, exc, last)
                return
            log.warning("a withdrawn preview in chat %s could not be deleted (%s): it says %r instead",
                        message.chat_id, exc, TELEGRAM_PREVIEW_WITHDRAWN_TEXT)
        if self._previews.get(key) is shown:
            del self._previews[key]

    async def _send_message(self, chat_id: ChatId, text: str, parse_mode: str | None, reply_to: Any,
                            thread_id: Any, edit_of: int | None = None,
                            markup: dict[str, Any] | None = None) -> int:
        """sendMessage, reading only the new message's id.

        The fast path: PTB's ``send_message`` builds a whole ``Message`` from the answer
        (a fifth of the client's CPU per reply), and only its id is used. Through
        ``do_api_request`` the call, its retries of nothing and its errors (RetryAfter,
        BadRequest, Forbidden, ChatMigrated) are PTB's own; only the answer stays JSON.
        """
        params: dict[str, Any] = {"chat_id": chat_id, "text": text}
        if parse_mode is not None:
            params["parse_mode"] = parse_mode
        if edit_of is not None:  # the same call, on a message already sent: editMessageText
            params["message_id"] = edit_of
            await self.bot.do_api_request("editMessageText", api_kwargs=params)
            return edit_of
        if reply_to is not None:
            params["reply_parameters"] = {"message_id": reply_to, "allow_sending_without_reply": True}
        if thread_id is not None:
            params["message_thread_id"] = thread_id
        if markup is not None:  # buttons under the message (an approval's Approve and Deny)
            params["reply_markup"] = markup
        result = await self.bot.do_api_request("sendMessage", api_kwargs=params)
        try:
            return int(result["message_id"])
        except (KeyError, TypeError, ValueError):  # it may have been sent: the operator decides
            raise Undeliverable("bad answer", f"Telegram answered sendMessage without a message id: "
                                f"{str(result)[:200]}") from None

    async def _pace(self, lane: _ChatLane, group: bool) -> None:
        """Wait until this chat, this group and the bot may send again."""
        wait = lane.last + TELEGRAM_CHAT_INTERVAL_SECONDS - self._clock()
        if group and len(lane.recent) == lane.recent.maxlen:
            wait = max(wait, lane.recent[0] + 60.0 - self._clock())
        if wait > 0:
            await self._sleep(wait)
        if self._overall is None:
            self._overall = AsyncLimiter(self.overall_per_second, 1)
        await self._overall.acquire()

    def _connections(self) -> asyncio.Semaphore:
        """Held for each Bot API call: a bounded number of connections, as Telegram allows."""
        if self._in_flight is None:
            self._in_flight = asyncio.Semaphore(TELEGRAM_MAX_CONCURRENT_SENDS)
        return self._in_flight

    async def _flood_wait(self, exc: RetryAfter, waits: int) -> None:
        """Wait out Telegram's flood control, the ``waits``-th time for one call; raises
        Undeliverable for a wait too long, or one too many."""
        wait = _seconds(exc)
        if wait > self.max_retry_after:
            raise Undeliverable("flood control", f"Telegram asked to wait {wait:g}s, more than "
                                f"the {self.max_retry_after:g}s this bot waits") from None
        if waits > TELEGRAM_MAX_RETRY_AFTERS:
            raise Undeliverable("flood control", str(exc)) from None
        await self._sleep(wait)

    async def _network_wait(self, exc: NetworkError, failures: int) -> None:
        """Back off after the ``failures``-th network error of one call; raises Undeliverable
        after the last attempt."""
        if failures >= TELEGRAM_SEND_ATTEMPTS:
            raise Undeliverable("network", str(exc)) from None
        await self._sleep(SEND_BACKOFF.delay(failures))

    async def _change_sent(self, lane: _ChatLane, message: OutboundMessage, method: str,
                           change: Callable[[ChatId], Awaitable[object]]) -> None:
        """Make ``change`` (``method``) to a message already sent to ``message``'s chat,
        paced, with the flood waits and network retries of a send. A message already gone
        (its user deleted it), or already saying this, needs no change. Raises Undeliverable."""
        failures = retry_afters = 0
        while True:
            chat_id = self.migrated.get(str(message.chat_id), message.chat_id)
            await self._pace(lane, message.context.is_group)
            try:
                async with self._connections():
                    await change(chat_id)
                return
            except RetryAfter as exc:
                retry_afters += 1
                await self._flood_wait(exc, retry_afters)
            except Forbidden as exc:
                self.unreachable.add(str(chat_id))
                raise Undeliverable("chat unreachable", str(exc)) from None
            except BadRequest as exc:
                problem = str(exc).lower()
                if any(done in problem for done in _NOTHING_TO_CHANGE):
                    return  # gone already, or saying this already
                raise Undeliverable("bad request", str(exc)) from None
            except NetworkError as exc:  # TimedOut included; BadRequest is caught above
                failures += 1
                await self._network_wait(exc, failures)
            except TelegramError as exc:  # a revoked token, a migrated group: no retry helps
                raise Undeliverable("refused", refusal(method, exc) or f"Telegram refuses {method}: "
                                    f"{exc.message}") from None
            finally:
                lane.last = self._clock()
                lane.recent.append(lane.last)

    async def _send(self, lane: _ChatLane, message: OutboundMessage, text: str,
                    reply_to: Any, *, edit_of: int | None = None, split: bool = True) -> list[int]:
        """Send ``text`` (or edit it into ``edit_of``); the ids of the messages it became:
        one, or (``split``) several if Telegram calls it too long. Raises Undeliverable."""
        parse_mode = self.parse_mode
        failures = retry_afters = 0
        targets = {str(self.migrated.get(str(message.chat_id), message.chat_id))}  # chats tried
        while True:
            chat_id = self.migrated.get(str(message.chat_id), message.chat_id)
            await self._pace(lane, message.context.is_group)
            try:
                async with self._connections():
                    return [await self._send_message(chat_id, text, parse_mode, reply_to, message.thread_id,
                                                     edit_of, markup_of(message))]
            except RetryAfter as exc:
                retry_afters += 1
                await self._flood_wait(exc, retry_afters)
            except ChatMigrated as exc:
                if str(exc.new_chat_id) in targets or len(targets) > TELEGRAM_MAX_MIGRATIONS:
                    raise Undeliverable("chat migrated", f"chat {message.chat_id} migrates again, to "
                                        f"{exc.new_chat_id}: a group migrates once; not followed") from None
                targets.add(str(exc.new_chat_id))
                self.migrated[str(message.chat_id)] = exc.new_chat_id
            except Forbidden as exc:
                self.unreachable.add(str(chat_id))
                raise Undeliverable("chat unreachable", str(exc)) from None
            except BadRequest as exc:
                problem = str(exc).lower()
                if "parse entities" in problem and parse_mode is not None:
                    parse_mode = None  # fix the payload: plain text, once
                elif edit_of is not None and "not modified" in problem:
                    return [edit_of]  # it already says this
                elif edit_of is not None and ("to edit not found" in problem or "can't be edited" in problem):
                    # Its user deleted the message (a preview): what it was to say goes out anew.
                    edit_of, reply_to = None, message.reply_to_message_id
                elif "too long" in problem and edit_of is None and split:
                    half = utf16_len(text) // 2
                    if half < TELEGRAM_MIN_CHUNK_UTF16:  # that short is no message too long
                        raise Undeliverable("bad request", f"Telegram calls a message of {utf16_len(text)} "
                                            f"characters too long: {exc}") from None
                    ids: list[int] = []
                    for part in split_message(text, half):
                        ids += await self._send(lane, message, part, reply_to if not ids else None)
                    return ids
                else:
                    raise Undeliverable("bad request", str(exc)) from None
            except NetworkError as exc:  # TimedOut included; BadRequest is caught above
                failures += 1
                await self._network_wait(exc, failures)
            except TelegramError as exc:  # a revoked token, a conflict: no retry helps
                method = "sendMessage" if edit_of is None else "editMessageText"
                raise Undeliverable("refused", refusal(method, exc) or f"Telegram refuses {method}: "
                                    f"{exc.message}") from None
            finally:
                lane.last = self._clock()
                lane.recent.append(lane.last)


def refusal(method: str, exc: TelegramError) -> str | None:
    """Why Telegram refuses the bot, for the status (never the token), when ``exc`` is a
    refusal that no retry fixes by itself: a token that is wrong or revoked (401, 404), a
    bot that is blocked or deleted (403), another poller or a webhook in the way (409)."""
    if isinstance(exc, (EndPointNotFound, InvalidToken)) and isinstance(exc.__cause__, InvalidToken):
        # do_api_request's name for a 401 or 404 on a method that exists; or Bot.initialize's
        # words, which quote the token
        exc = exc.__cause__
    if isinstance(exc, InvalidToken):
        return f"Telegram refuses the bot token ({method}: {exc.message}): is it revoked? Ask @BotFather"
    if isinstance(exc, Forbidden):
        return f"Telegram forbids the bot ({method}: {exc.message})"
    if isinstance(exc, Conflict):
        return f"Telegram refuses {method}: {exc.message}"
    return None


async def _settled(confirmed: concurrent.futures.Future[bool]) -> None:
    """Wait for the ledger's confirmation; one already settled (no journal, no key) is read
    at once: ``wrap_future`` would wake the loop through its self-pipe for it (a write and
    a read of a socket per reply)."""
    if confirmed.done():
        confirmed.result()  # raises what the ledger raised
        return
    await asyncio.wrap_future(confirmed)


def _seconds(error: RetryAfter) -> float:
    """RetryAfter's wait in seconds (PTB moves it from int to timedelta; accept both)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = error.retry_after
    return value.total_seconds() if hasattr(value, "total_seconds") else float(value)
