"""The one place an asyncpraw ``Reddit`` is built from the settings.

The inbox poller and the sender share it, so they share one token and one rate-limit
budget: asyncprawcore reads ``X-Ratelimit-Remaining``/``-Used``/``-Reset`` from every
answer and waits before the next request when the budget runs out; here that wait is
capped (``RedditSettings.max_reset_wait``), so one odd ``X-Ratelimit-Reset`` cannot hold
every call for a day. A wait longer than ``REDDIT_HOLD_REPORTED_SECONDS`` is told to
whoever is ``watching_rate_limits`` (the interface: it shows itself failing until calls
flow again).

>>> reddit = await open_reddit(settings)                           # doctest: +SKIP
>>> await reddit.user.me()                                          # doctest: +SKIP
Redditor(name='synth_bot')
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping

import asyncpraw
from asyncprawcore.const import NANOSECONDS
from asyncprawcore.rate_limit import RateLimiter
from asyncprawcore.sessions import Session

from autoresponse.interfaces.reddit.settings import REDDIT_HOLD_REPORTED_SECONDS, RedditSettings

log = logging.getLogger("autoresponse.reddit")


#: Told why every call is held back (a reason), or that calls flow again (None).
HoldWatcher = Callable[[str | None], None]


class CappedRateLimiter(RateLimiter):
    """asyncprawcore's ``RateLimiter``, whose wait before the next request is at most
    ``max_wait`` seconds, whatever ``X-Ratelimit-Reset`` says; a wait longer than
    ``report_after`` is ``held`` (why), and told to its watcher, until the wait is over.

    >>> limiter = CappedRateLimiter(window_size=600, max_wait=600)
    >>> limiter.update(response_headers={"x-ratelimit-remaining": "0", "x-ratelimit-used": "600",
    ...                                  "x-ratelimit-reset": "86400"})
    >>> (limiter.next_request_timestamp_ns - time.monotonic_ns()) / NANOSECONDS <= 600
    True
    >>> limiter.held
    "Reddit's rate limit holds every call back for 600s (X-Ratelimit-Reset: 86400s, capped at 600s)..."
    """

    #: Seconds a wait must exceed to be ``held`` (see ``REDDIT_HOLD_REPORTED_SECONDS``).
    report_after = REDDIT_HOLD_REPORTED_SECONDS

    def __init__(self, *, window_size: int, max_wait: float) -> None:
        super().__init__(window_size=window_size)
        self.max_wait = max_wait
        #: Why every call waits now (a spent budget, longer than ``report_after``), or None.
        self.held: str | None = None
        #: Told ``held`` at every change (see ``watch``).
        self.watcher: HoldWatcher | None = None

    def watch(self, watcher: HoldWatcher | None) -> None:
        """Tell ``watcher`` ``held`` now and at every change, on the loop of the requests
        (it must not block); None stops telling."""
        self.watcher = watcher
        if watcher is not None:
            watcher(self.held)

    async def delay(self) -> None:
        await super().delay()
        self._hold(None)  # the wait is over: this call goes out (cancelled, it still holds)

    def update(self, *, response_headers: Mapping[str, str]) -> None:
        super().update(response_headers=response_headers)  # raises on headers it cannot read, as before
        now = time.monotonic_ns()
        latest = now + int(self.max_wait * NANOSECONDS)
        capped = self.next_request_timestamp_ns is not None and self.next_request_timestamp_ns > latest
        if capped:
            log.warning("Reddit says its rate limit resets in %ss (X-Ratelimit-Reset, %s calls left); "
                        "the next call waits %gs at most", response_headers.get("x-ratelimit-reset"),
                        response_headers.get("x-ratelimit-remaining"), self.max_wait)
            self.next_request_timestamp_ns = latest
        wait = ((self.next_request_timestamp_ns or now) - now) / NANOSECONDS
        if wait <= self.report_after:
            self._hold(None)
        elif "x-ratelimit-reset" in response_headers:  # (else the hold read before stands)
            cap = f", capped at {self.max_wait:g}s" if capped else ""
            self._hold(f"Reddit's rate limit holds every call back for {wait:.0f}s (X-Ratelimit-Reset: "
                       f"{response_headers['x-ratelimit-reset']}s{cap}): no inbox is read, no reply sent")

    def _hold(self, reason: str | None) -> None:
        if reason == self.held:
            return
        self.held = reason
        if self.watcher is not None:
            try:
                self.watcher(reason)
            except Exception:  # a watcher's fault never fails Reddit's calls
                log.exception("telling how long Reddit's rate limit holds calls back failed")


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


@contextlib.contextmanager
def watching_rate_limits(reddit: asyncpraw.Reddit, watcher: HoldWatcher) -> Iterator[None]:
    """Inside the block, tell ``watcher`` why every call of ``reddit`` is held back (its
    session's ``CappedRateLimiter.held``): at once, and at every change, None once calls
    flow. Enter it on the loop of the requests. The session is the one every call goes
    through (the account's; the read-only one makes none here)."""
    limiter = getattr(reddit._core, "_rate_limiter", None)
    if not isinstance(limiter, CappedRateLimiter):
        raise RuntimeError("asyncpraw's session has no capped rate limiter (see cap_rate_limits)")
    limiter.watch(watcher)
    try:
        yield
    finally:
        if limiter.watcher == watcher:  # not a watcher that came since (a next incarnation's)
            limiter.watch(None)


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
