"""The one place tweepy's ``AsyncClient`` is built from the settings, and the few calls
the interface and the sender make with it.

tweepy's client fixes its host (``https://api.twitter.com``) but takes the aiohttp
session it sends through. Ours may carry a resolver that maps X's API hosts to
``api_address`` and trust an extra certificate authority (``ca_file``): then real,
unpatched tweepy talks to a proxy or to a fake X (``fake_server``) while its URLs,
TLS names and OAuth 1.0a signatures stay X's own. Nothing else resolves through it.

The mentions come as X's JSON, not as tweepy's objects: tweepy reads a page whole, so
one malformed post would fail the page, and every look after it, forever. The
interface reads them post by post (``parse_mention``).

>>> x = await open_x(settings)                                      # doctest: +SKIP
>>> found = await x.mentions_since(since_id=None, start_time=started)   # doctest: +SKIP
>>> [post["text"] for post, _ in found]                              # doctest: +SKIP
['@synth run df -h']
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import time
from collections.abc import Iterable
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver
from tweepy import TweepyException
from tweepy.asynchronous import AsyncClient

from autoresponse.interfaces.x.settings import (
    X_MAX_RATE_LIMIT_WAIT_SECONDS,
    X_MENTION_PAGES,
    X_MENTIONS_PER_PAGE,
    X_UNKNOWN_RESET_WAIT_SECONDS,
    XSettings,
)

#: The host names tweepy sends requests to.
X_API_HOSTS = ("api.twitter.com", "api.x.com")
_TWEET_FIELDS = ["author_id", "conversation_id", "created_at", "in_reply_to_user_id", "attachments"]
#: What a post's pictures and videos are described by (their URLs; nothing is downloaded).
_MEDIA_FIELDS = ["type", "url", "preview_image_url", "alt_text", "duration_ms"]


class UnknownReset(Exception):
    """X answered a 429 whose ``x-rate-limit-reset`` is no number (tweepy cannot read it)."""


class UnreadableAnswer(Exception):
    """X answered a post with what cannot be read: it may have been posted all the same."""


def seconds_until(reset: int | None, now: float | None = None) -> float:
    """How long a 429 asks us to wait: until ``x-rate-limit-reset`` (epoch seconds), from
    ``now`` (the runtime's clock's wall time; default the wall clock), at least a second,
    at most ``X_MAX_RATE_LIMIT_WAIT_SECONDS``; ``X_UNKNOWN_RESET_WAIT_SECONDS`` if X named
    no time."""
    if reset is None:
        return X_UNKNOWN_RESET_WAIT_SECONDS
    now = time.time() if now is None else now
    return min(X_MAX_RATE_LIMIT_WAIT_SECONDS, max(1.0, reset - now + 1.0))


class PinnedResolver(AbstractResolver):
    """Resolves X's API host names to one ``host:port``; refuses every other name.

    >>> import asyncio
    >>> [r["port"] for r in asyncio.run(PinnedResolver(["api.twitter.com"], "127.0.0.1:8443")
    ...                                 .resolve("api.twitter.com", 443))]
    [8443]
    """

    def __init__(self, names: Iterable[str], address: str) -> None:
        host, _, port = address.rpartition(":")
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            ip = None
        if ip is None or not port.isdigit():
            raise ValueError(f"api_address must be an IP address and a port, not {address!r}")
        self._names = set(names)
        self._host, self._port = str(ip), int(port)
        self._family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[dict[str, Any]]:
        if host not in self._names:
            raise OSError(f"{host} is not X's API; this session only reaches {self._host}:{self._port}")
        # aiohttp connects to the port named here, whatever the URL's: 443 becomes the proxy's.
        return [{"hostname": host, "host": self._host, "port": self._port, "family": self._family,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


def _secret(value: Any) -> str | None:
    return None if value is None else value.get_secret_value()


def post_id(post: Any) -> int | None:
    """The id of a post as X sends it (digits, in a string); None when it has none, or one
    no post has: X's ids are 64-bit, and a cursor moved past a bigger one would make
    every later look a 400.

    >>> post_id({"id": "1800000000000000000"}), post_id({"id": "junk"}), post_id(["1"])
    (1800000000000000000, None, None)
    >>> post_id({"id": "9" * 30}), post_id({"id": "9" * 5000}), post_id({"id": 0})
    (None, None, None)
    """
    found = post.get("id") if isinstance(post, dict) else None
    if isinstance(found, str) and found.isascii() and found.isdigit() and len(found) <= 19:
        found = int(found)  # 19 digits at most: never past int()'s limit on digits
    if isinstance(found, int) and not isinstance(found, bool) and 0 < found < 2**63:
        return found
    return None


class XApi:
    """tweepy's client with its session, used the same way by the interface and the sender."""

    def __init__(self, client: AsyncClient, session: aiohttp.ClientSession, *, user_auth: bool,
                 reader: AsyncClient) -> None:
        self.client = client
        self.session = session
        #: The same account's client, answering with X's JSON (``return_type=dict``): the
        #: mentions' and the replies'.
        self.reader = reader
        #: OAuth 1.0a (True), or an OAuth 2.0 user-context token as the bearer (False).
        self.user_auth = user_auth

    async def me(self) -> Any:
        """The account: ``.id`` and ``.username``."""
        return (await self.client.get_me(user_auth=self.user_auth)).data

    async def mentions_since(self, *, user_id: int, since_id: int | None,
                             start_time: dt.datetime | None) -> list[tuple[Any, dict[str, Any]]]:
        """Every mention newer than ``since_id`` (or, before any, since ``start_time``),
        oldest first, each as X sent it (JSON, unchecked) with its page's ``includes``
        (the authors, the media). A page that is no page of posts, or names a next page
        by no token (a non-empty string), is a TweepyException."""
        found: list[tuple[Any, dict[str, Any]]] = []
        token = None
        for _ in range(X_MENTION_PAGES):  # X keeps the newest 800 anyway
            try:
                page = await self.reader.get_users_mentions(
                    user_id, since_id=since_id, start_time=None if since_id else start_time,
                    max_results=X_MENTIONS_PER_PAGE, pagination_token=token,
                    expansions=["author_id", "attachments.media_keys"], tweet_fields=_TWEET_FIELDS,
                    user_fields=["username"], media_fields=_MEDIA_FIELDS, user_auth=self.user_auth)
            except (ValueError, RecursionError) as exc:  # a body that is no JSON, or nested past reading
                why = f"the mentions answered what cannot be read ({type(exc).__name__})"
                raise TweepyException(why) from None
            posts = (page.get("data") or []) if isinstance(page, dict) else None
            if not isinstance(posts, list):  # nothing in it to read: looked at again, backing off
                raise TweepyException(f"the mentions answered no list of posts: {str(page)[:200]}")
            includes = page.get("includes")
            found += [(post, includes if isinstance(includes, dict) else {}) for post in posts]
            meta = page.get("meta")
            token = meta.get("next_token") if isinstance(meta, dict) else None
            if token is None:
                break
            if not isinstance(token, str) or not token:  # no request could carry it: a failed look
                raise TweepyException(f"the mentions answered a next_token that is no token: {str(token)[:200]}")
        # A post without a readable id goes first: it is dead-lettered, and moves no cursor.
        return sorted(found, key=lambda pair: post_id(pair[0]) or 0)

    async def reply(self, text: str, in_reply_to: int) -> int:
        """Post ``text`` in reply to ``in_reply_to``; the new post's id. Raises tweepy's
        errors, aiohttp's, ``UnknownReset`` and ``UnreadableAnswer``."""
        try:  # read as JSON (the reader's): our own reading of the answer fails nowhere else
            answer = await self.reader.create_tweet(text=text, in_reply_to_tweet_id=in_reply_to,
                                                    user_auth=self.user_auth)
        except (UnicodeError, RecursionError, json.JSONDecodeError) as exc:  # a body that is no JSON
            raise UnreadableAnswer(f"{type(exc).__name__}: {exc}") from None
        except aiohttp.ContentTypeError as exc:
            if 200 <= exc.status < 300:  # posted, but no JSON came back: retrying would post twice
                raise UnreadableAnswer(f"{type(exc).__name__}: {exc}") from None
            raise
        except ValueError as exc:  # the one other ValueError: tweepy's int() of a 429's reset
            raise UnknownReset(f"429 with an x-rate-limit-reset that is no number ({exc})") from None
        found = post_id(answer.get("data")) if isinstance(answer, dict) else None
        if found is None:
            raise UnreadableAnswer(f"no post id in {str(answer)[:200]}")
        return found

    async def aclose(self) -> None:
        await self.session.close()


async def open_x(settings: XSettings) -> XApi:
    """tweepy's client on our session; call it on the loop that will use it."""
    if not settings.enabled:
        raise ValueError("X needs AUTORESPONSE_X__CONSUMER_KEY, __CONSUMER_SECRET, __ACCESS_TOKEN and "
                         "__ACCESS_TOKEN_SECRET, or an OAuth 2.0 user token in __BEARER_TOKEN")
    context = ssl.create_default_context()
    if settings.ca_file is not None:
        context.load_verify_locations(cafile=str(settings.ca_file))
    resolver = PinnedResolver(X_API_HOSTS, settings.api_address) if settings.api_address else None
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, resolver=resolver),
                                    timeout=aiohttp.ClientTimeout(total=settings.timeout))
    if settings.oauth1:
        credentials = {"consumer_key": _secret(settings.consumer_key),
                       "consumer_secret": _secret(settings.consumer_secret),
                       "access_token": _secret(settings.access_token),
                       "access_token_secret": _secret(settings.access_token_secret)}
    else:
        credentials = {"bearer_token": _secret(settings.bearer_token)}
    client = AsyncClient(**credentials)
    # Its own client, not the sender's switched to JSON for a while: they share the loop.
    reader = AsyncClient(**credentials, return_type=dict)
    # tweepy's documented attribute: every request goes through it.
    client.session = reader.session = session
    return XApi(client, session, user_auth=settings.oauth1, reader=reader)
