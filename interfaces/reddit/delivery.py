"""Posting replies on Reddit, by its rules.

* A reply answers the inbox item it came from: ``comment.reply`` or ``message.reply``
  (both are ``/api/comment`` with the item's fullname); no other target is written to.
* Markdown is kept. A reply longer than 10,000 characters is cut at paragraphs (else
  lines, else spaces; never inside a code block), and each further chunk answers the
  one before it, so the chunks read in order as one thread.
* A ``RATELIMIT`` API error parks only that reply: it waits the time Reddit names and
  tries again, while other replies go on. Rate-limit headers pace every request
  (asyncprawcore reads them).
* Network errors and 5xx are retried a bounded number of times; anything else Reddit
  refuses (a deleted comment, a locked thread, a ban) is final: a dead letter with
  Reddit's words.

>>> delivery = RedditDelivery(reddit, journal)                      # doctest: +SKIP
>>> await delivery.deliver(OutboundMessage.reply(ctx, "Your disks are fine."))   # doctest: +SKIP
['t1_3ed']
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

import asyncpraw
from asyncpraw.exceptions import RedditAPIException
from asyncpraw.models import Message
from asyncprawcore.exceptions import (
    RequestException,
    ResponseException,
    ServerError,
    TooManyRequests,
)

from autoresponse.actors.kernel.backoff import SEND_BACKOFF
from autoresponse.actors.journal import DeliveryJournal, SendLedger
from autoresponse.actors.sender import Undeliverable
from autoresponse.interfaces.reddit.settings import (
    REDDIT_MAX_RATELIMIT_WAIT_SECONDS,
    REDDIT_MAX_RATELIMITS,
    REDDIT_REPLY_UTF16,
    REDDIT_SEND_ATTEMPTS,
)
from autoresponse.interfaces.telegram.chunking import split_message
from autoresponse.messages import OutboundMessage

log = logging.getLogger("autoresponse.reddit")

#: Things a reply can answer: a comment, a submission, a private message.
_REPLYABLE = re.compile(r"^t[134]_[0-9a-z]+$")
#: How Reddit says how long to wait: "... Take a break for 3 minutes before trying again."
_WAIT = re.compile(r"(\d+) (milliseconds?|seconds?|minutes?)")


def ratelimit_wait(error: RedditAPIException) -> float | None:
    """Seconds a RATELIMIT error asks us to wait (None: it is another error).

    >>> from asyncpraw.exceptions import RedditAPIException
    >>> ratelimit_wait(RedditAPIException([["RATELIMIT", "Take a break for 2 minutes.", "ratelimit"]]))
    121.0
    """
    for item in error.items:
        if item.error_type == "RATELIMIT":
            found = _WAIT.search(item.message or "")
            if found is None:
                return 60.0 + 1.0  # no time named: a minute, the usual
            amount, unit = int(found.group(1)), found.group(2)
            seconds = amount * 60 if unit.startswith("minute") else 0 if unit.startswith("milli") else amount
            return float(seconds) + 1.0  # Reddit rounds down
    return None


class RedditDelivery:
    def __init__(self, reddit: asyncpraw.Reddit, journal: DeliveryJournal | None = None, *,
                 sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.reddit = reddit
        self.ledger = SendLedger(journal)
        self._sleep = sleep

    async def deliver(self, message: OutboundMessage) -> list[str]:
        """Post every chunk of ``message``; the fullnames Reddit gave them. Raises Undeliverable."""
        thing = None if message.reply_to_message_id is None else str(message.reply_to_message_id)
        if thing is None or not _REPLYABLE.match(thing):
            raise Undeliverable("no thread", f"a Reddit reply answers an inbox item; {message.chat_id!r} "
                                             "is not one")
        posted: list[str] = []
        parent = thing
        for n, chunk in enumerate(split_message(message.text, REDDIT_REPLY_UTF16)):
            if self.ledger.already_sent(message, n):
                continue  # confirmed before a restart: never twice (the next answers the item)
            parent = await self._post(parent, chunk)
            posted.append(parent)
            await asyncio.wrap_future(self.ledger.confirm(message, n))
        return posted

    async def _target(self, fullname: str) -> Any:
        kind, id_ = fullname.split("_", 1)
        if kind == "t4":
            return Message(self.reddit, {"id": id_})
        if kind == "t3":
            return await self.reddit.submission(id_, fetch=False)
        return await self.reddit.comment(id_, fetch=False)

    async def _post(self, fullname: str, text: str) -> str:
        """Reply to ``fullname`` with ``text``; the new reply's fullname."""
        ratelimits = failures = 0
        while True:
            try:
                reply = await (await self._target(fullname)).reply(text)
                # None: Reddit posted it but did not say as what (a quarantined subreddit).
                return fullname if reply is None else reply.fullname
            except RedditAPIException as exc:
                wait = ratelimit_wait(exc)
                if wait is None:
                    raise Undeliverable("rejected by Reddit", str(exc)) from None
                ratelimits += 1
                if ratelimits > REDDIT_MAX_RATELIMITS or wait > REDDIT_MAX_RATELIMIT_WAIT_SECONDS:
                    raise Undeliverable("rate limited", str(exc)) from None
                log.info("Reddit rate-limited the reply to %s; it waits %.0fs", fullname, wait)
                await self._sleep(wait)
            except (RequestException, ServerError, TooManyRequests) as exc:
                failures += 1
                if failures >= REDDIT_SEND_ATTEMPTS:
                    raise Undeliverable("network", f"{type(exc).__name__}: {exc}") from None
                await self._sleep(SEND_BACKOFF.delay(failures))
            except ResponseException as exc:  # 403 locked or banned, 404 gone, ...
                raise Undeliverable("rejected by Reddit", f"{type(exc).__name__}: {exc}") from None
