"""Posting replies on X, by its rules.

* A reply answers the post that mentioned the account (``in_reply_to_tweet_id``); no
  other target is written to.
* A reply heavier than 280 weighted characters (see ``counting``) is cut between words
  into posts, each answering the one before it: a thread, in order.
* A 429 waits for ``x-rate-limit-reset`` (that reply only; others go on; a fixed wait
  when the reset cannot be read), a bounded number of times; network errors and 5xx are
  retried a bounded number of times; anything else X refuses (a duplicate, a deleted
  post, no permission) is final: a dead letter with X's words. So is an answer that
  cannot be read: the post may be up, and is never made twice.
* A retry that X refuses as a duplicate, after a try whose answer never came (a timeout,
  a dropped connection, a 5xx), is that try's post: it went out. The chunk counts as
  posted (its id unread) and the rest of the reply follows.

>>> delivery = XDelivery(api, journal)                               # doctest: +SKIP
>>> await delivery.deliver(OutboundMessage.reply(ctx, "Your disks are fine."))   # doctest: +SKIP
[1800000000000000002]
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from tweepy import Forbidden, HTTPException, TooManyRequests, TwitterServerError

from autoresponse.actors.kernel.backoff import SEND_BACKOFF
from autoresponse.actors.kernel.clock import Clock
from autoresponse.actors.journal import DeliveryJournal, SendLedger
from autoresponse.actors.sender import Undeliverable
from autoresponse.interfaces.x.client import UnknownReset, UnreadableAnswer, XApi, seconds_until
from autoresponse.interfaces.x.counting import split_post
from autoresponse.interfaces.x.settings import (
    X_MAX_RATE_LIMIT_WAIT_SECONDS,
    X_MAX_RATE_LIMITS,
    X_SEND_ATTEMPTS,
)
from autoresponse.messages import OutboundMessage

log = logging.getLogger("autoresponse.x")

#: How X words its refusal of a post with the text of one of the account's recent posts.
_DUPLICATE_CONTENT = "duplicate content"


def _is_duplicate(exc: HTTPException) -> bool:
    """Whether X refused a post as one it already has (a 403 saying so)."""
    return isinstance(exc, Forbidden) and _DUPLICATE_CONTENT in str(exc).lower()  # tweepy's text holds X's


def _post_id(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class XDelivery:
    """``clock`` (the runtime's) reads the time for X's rate-limit resets and waits them
    out; ``sleep`` replaces its sleep alone."""

    def __init__(self, api: XApi, journal: DeliveryJournal | None = None, *,
                 sleep: Callable[[float], Any] | None = None, clock: Clock | None = None) -> None:
        self.api = api
        self.ledger = SendLedger(journal)
        self._clock = clock if clock is not None else Clock()
        self._sleep = sleep if sleep is not None else self._clock.sleep

    async def deliver(self, message: OutboundMessage) -> list[int]:
        """Post every chunk of ``message``; the ids X gave them (but for a chunk whose
        answer was lost, see ``_post``). Raises Undeliverable."""
        parent = _post_id(message.reply_to_message_id)
        if parent is None:
            raise Undeliverable("no thread", f"a reply on X answers a post; {message.chat_id!r} is not one")
        posted: list[int] = []
        for n, chunk in enumerate(split_post(message.text)):
            if self.ledger.already_sent(message, n):
                continue  # confirmed before a restart: never twice (the next answers the mention)
            made = await self._post(chunk, parent)
            # A chunk posted without its id read: the next answers the last post known (the
            # one before it, or the mention), as after a restart. The reply then reads in
            # order under the mention, nothing missing; only that link of the chain is lost.
            if made is not None:
                posted.append(made)
                parent = made
            await asyncio.wrap_future(self.ledger.confirm(message, n))
        return posted

    async def _post(self, text: str, in_reply_to: int) -> int | None:
        """The new post's id; None when X refuses a retry as a duplicate of what a try
        before it, whose answer never came, posted (nothing can tell us its id)."""
        rate_limits = failures = 0
        while True:
            try:
                return await self.api.reply(text, in_reply_to)
            except (TooManyRequests, UnknownReset) as exc:
                rate_limits += 1
                reset = exc.reset_time if isinstance(exc, TooManyRequests) else None
                wait = seconds_until(reset, now=self._clock.time())
                if rate_limits > X_MAX_RATE_LIMITS or wait >= X_MAX_RATE_LIMIT_WAIT_SECONDS:
                    raise Undeliverable("rate limited", str(exc)) from None
                log.info("X rate-limited the reply to %s; it waits %.0fs", in_reply_to, wait)
                await self._sleep(wait)
            except (TimeoutError, TwitterServerError, aiohttp.ClientError) as exc:
                failures += 1
                if failures >= X_SEND_ATTEMPTS:
                    raise Undeliverable("network", f"{type(exc).__name__}: {exc}") from None
                await self._sleep(SEND_BACKOFF.delay(failures))
            except UnreadableAnswer as exc:
                raise Undeliverable("unreadable answer", str(exc)) from None
            except HTTPException as exc:  # 400, 401, 403 (a duplicate, no permission), 404
                if failures and _is_duplicate(exc):
                    # The try that failed went out. (Or the same words answered another
                    # post lately, and that try never reached X: nothing tells them apart.)
                    log.info("X has the reply to %s already (a try before went out unanswered)", in_reply_to)
                    return None
                raise Undeliverable("rejected by X", f"{type(exc).__name__}: {exc}") from None
