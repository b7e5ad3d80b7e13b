"""The one place an asyncpraw ``Reddit`` is built from the settings.

The inbox poller and the sender share it, so they share one token and one rate-limit
budget: asyncprawcore reads ``X-Ratelimit-Remaining``/``-Used``/``-Reset`` from every
answer and waits before the next request when the budget runs out.

>>> reddit = await open_reddit(settings)                           # doctest: +SKIP
>>> await reddit.user.me()                                          # doctest: +SKIP
Redditor(name='synth_bot')
"""

from __future__ import annotations

import asyncpraw

from autoresponse.interfaces.reddit.settings import RedditSettings


async def open_reddit(settings: RedditSettings) -> asyncpraw.Reddit:
    """A ``Reddit`` for the configured app and account; call it on the loop that will use it."""
    if not settings.enabled:
        raise ValueError("Reddit needs AUTORESPONSE_REDDIT__CLIENT_ID, __CLIENT_SECRET and "
                         "__USERNAME with __PASSWORD (or __REFRESH_TOKEN)")
    account = ({"refresh_token": settings.refresh_token.get_secret_value()} if settings.refresh_token
               else {"username": settings.username,
                     "password": settings.password.get_secret_value()})  # type: ignore[union-attr]
    return asyncpraw.Reddit(
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
