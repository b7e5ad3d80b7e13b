"""The one place an asyncpraw ``Reddit`` is built from the settings.

The inbox poller and the sender share it, so they share one token and one rate-limit
budget: asyncprawcore reads ``X-Ratelimit-Remaining``/``-Used``/``-Reset`` from every
answer and waits before the next request when the budget runs out; here that wait is
capped (``RedditSettings.max_reset_wait``), so one odd ``X-Ratelimit-Reset`` cannot hold
every call for a day.

>>> reddit = await open_reddit(settings)                           # doctest: +SKIP
>>> await reddit.user.me()                                          # doctest: +SKIP
Redditor(name='synth_bot')
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import asyncpraw
from asyncprawcore.const import NANOSECONDS
from asyncprawcore.rate_limit import RateLimiter
from asyncprawcore.sessions import Session

from autoresponse.interfaces.reddit.settings import RedditSettings

log = logging.getLogger("autoresponse.reddit")


class CappedRateLimiter(RateLimiter):
    """asyncprawcore's ``RateLimiter``, whose wait before the next request is at most
    ``max_wait`` seconds, whatever ``X-Ratelimit-Reset`` says.

    >>> limiter = CappedRateLimiter(window_size=600, max_wait=600)
    >>> limiter.update(response_headers={"x-ratelimit-remaining": "0", "x-ratelimit-used": "600",
    ...                                  "x-ratelimit-reset": "86400"})
    >>> (limiter.next_request_timestamp_ns - time.monotonic_ns()) / NANOSECONDS <= 600
    True
    """

    def __init__(self, *, window_size: int, max_wait: float) -> None:
        super().__init__(window_size=window_size)
        self.max_wait = max_wait

    def update(self, *, response_headers: Mapping[str, str]) -> None:
        super().update(response_headers=response_headers)  # raises on headers it cannot read, as before
        latest = time.monotonic_ns() + int(self.max_wait * NANOSECONDS)
        if self.next_request_timestamp_ns is not None and self.next_request_timestamp_ns > latest:
            log.warning("Reddit says its rate limit resets in %ss (X-Ratelimit-Reset, %s calls left); "
                        "the next call waits %gs at most", response_headers.get("x-ratelimit-reset"),
                        response_headers.get("x-ratelimit-remaining"), self.max_wait)
            self.next_request_timestamp_ns = latest


def cap_rate_limits(reddit: asyncpraw.Reddit, max_wait: float) -> None:
    """Give each asyncprawcore session of ``reddit`` (the account's, the read-only one) a
    ``CappedRateLimiter`` in place of its own, before it has made a request."""
    cores = {id(core): core for core in (reddit._read_only_core, reddit._authorized_core, reddit._core)
             if core is not None}
    if not cores:
        raise RuntimeError("asyncpraw built no session: cannot cap its rate-limit waits")
    for core in cores.values():
        if not isinstance(core, Session):
            raise RuntimeError(f"asyncpraw's session is a {type(core).__name__}: "
                               "cannot cap its rate-limit waits")
        core._rate_limiter = CappedRateLimiter(window_size=core.rate_limiter.window_size, max_wait=max_wait)


async def open_reddit(settings: RedditSettings) -> asyncpraw.Reddit:
    """A ``Reddit`` for the configured app and account; call it on the loop that will use it."""
    if not settings.enabled:
        raise ValueError("Reddit needs AUTORESPONSE_REDDIT__CLIENT_ID, __CLIENT_SECRET and "
                         "__USERNAME with __PASSWORD (or __REFRESH_TOKEN)")
    account = ({"refresh_token": settings.refresh_token.get_secret_value()} if settings.refresh_token
               else {"username": settings.username,
                     "password": settings.password.get_secret_value()})  # type: ignore[union-attr]
    reddit = asyncpraw.Reddit(
        client_id=settings.client_id,
        client_secret=settings.client_secret.get_secret_value(),  # type: ignore[union-attr]
        user_agent=settings.user_agent,
        oauth_url=settings.oauth_url,
        reddit_url=settings.reddit_url,
        requestor_kwargs={"timeout": settings.timeout},  # asyncpraw's own "timeout" reaches no request
        # No call to PyPI on first use.
        check_for_updates=False,
        # RATELIMIT errors come to us at once: the sender parks only the reply that met
        # one, instead of asyncpraw sleeping inside post().
        ratelimit_seconds=0,
        **account,
    )
    cap_rate_limits(reddit, settings.max_reset_wait)
    return reddit
