"""The X interface: posts that mention the account become user requests.

A polling task this actor owns reads the mentions timeline with tweepy, journals each
new mention (``runtime.accept``, one correlation per post id), and only then moves
``since_id`` past it (``cursor``): a kill between the two asks X for it again, and the
journal recognises it. A 429 waits for ``x-rate-limit-reset``, or longer while 429s go on
(shown as failing). Authorization happens here, in the actor, when the journaled mention
is handled.

Mentions are read post by post from X's JSON, so one malformed post (a field of the
wrong type) is logged, dead-lettered with its raw form and the field it got wrong, and
``since_id`` moves past it like past any other: the posts behind it flow on.

>>> parse_mention(post, includes, me=1000)                          # doctest: +SKIP
XMention(post_id=1800000000000000000, author_id=7, username='ada', text='@synth run df -h', ...)
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict
from tweepy import Forbidden, Media, TooManyRequests, TweepyException, Unauthorized

from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.kernel.backoff import POLL_BACKOFF, Backoff
from autoresponse.actors.inbound import accept_input, dead_letter_malformed, take_request, turn_context
from autoresponse.actors.polling import PollHealth, SharedPoller, polling
from autoresponse.interfaces.x.actions import INTERFACE_NAME
from autoresponse.interfaces.x.client import XApi, post_id, seconds_until
from autoresponse.interfaces.x.cursor import MentionCursor
from autoresponse.interfaces.x.media import attachments_of
from autoresponse.interfaces.x.settings import XSettings
from autoresponse.messages import Attachment, Envelope, OriginalContext

log = logging.getLogger("autoresponse.x")

class XMention(BaseModel):
    """A post that mentions the account."""

    model_config = ConfigDict(frozen=True)

    post_id: int
    conversation_id: int | None = None
    author_id: int | None = None
    username: str | None = None
    text: str
    created_at: str | None = None
    #: Its pictures (and videos), by URL: the model is told them; nothing is downloaded.
    attachments: tuple[Attachment, ...] = ()


def parse_mention(post: Any, includes: dict[str, Any], *, me: int) -> XMention | None:
    """An ``XMention`` from a post as X sends it (JSON) and its page's ``includes`` (its
    author, its media); None for the account's own posts (it never answers itself).
    Raises on a post X would not send (pydantic's ValidationError names the field)."""
    if not isinstance(post, dict):
        raise TypeError(f"the post is {type(post).__name__}, not an object")
    found = post_id(post)
    if found is None:
        raise ValueError(f"id: not a post id: {post.get('id')!r}")
    # One bad entry of a page's includes is passed over, not held against every post of it.
    users = {user["id"]: user for user in includes.get("users") or ()
             if isinstance(user, dict) and isinstance(user.get("id"), str)}
    author = users.get(post.get("author_id")) if isinstance(post.get("author_id"), str) else None
    media = {item["media_key"]: item for item in includes.get("media") or ()
             if isinstance(item, dict) and isinstance(item.get("media_key"), str)}
    keys = (post.get("attachments") or {}).get("media_keys") or ()
    mention = XMention(
        post_id=found,
        conversation_id=post.get("conversation_id"),
        author_id=post.get("author_id"),
        username=None if author is None else author.get("username"),
        text=post.get("text"),
        created_at=post.get("created_at"),
        attachments=attachments_of([Media(media[key]) for key in keys if key in media]),
    )
    return None if mention.author_id == me else mention


def mention_context(mention: XMention) -> OriginalContext:
    """Where ``mention`` came from, and where its answers go."""
    return OriginalContext(
        chat_id=mention.conversation_id or mention.post_id,
        message_id=mention.post_id,
        interface_name=INTERFACE_NAME,
        original_command=mention.text,
        user_id=mention.author_id,
        user_name=mention.username,
        chat_type="public",
        post_id=mention.post_id,
        conversation_id=mention.conversation_id,
    )


def origin(settings: XSettings) -> Callable[[Any], OriginalContext | None]:
    """Who sent an ``XMention`` (``Mount.origin``): its thread, when the author is allowed.
    A notice there is a public post, as the answer would have been; a stranger never gets
    one (refused, ignored, or an autonomous turn: a crafted mention must not make the
    account post). None too for a mention that cannot be read."""
    def of(mention: Any) -> OriginalContext | None:
        try:
            allowed = mention.author_id in settings.allowed_users
            return turn_context(mention_context(mention), allowed=allowed, policy=settings)
        except Exception:  # a malformed input: nobody to tell
            return None
    return of


class XInterface(TypedActor):
    """Reads the mentions timeline in a task this incarnation owns; a crash or stop cancels it."""

    def __init__(self, settings: XSettings, api: XApi, me: Any, cursor: MentionCursor) -> None:
        super().__init__()
        self.settings = settings
        self._api = api  # shared with the sender; the platform closes it
        self._me = me
        self._cursor = cursor
        self._mention = re.compile(rf"(?<!\w)@{re.escape(me.username)}\b", re.IGNORECASE)

    def setup(self) -> None:
        self.start_task(self._poll(), "mentions")
        log.info("reading the mentions of @%s every %gs", self._me.username, self.settings.poll_interval)

    async def _poll(self) -> None:
        failures = Backoff(POLL_BACKOFF, clock=self.runtime.clock.monotonic)
        # Several daemons: only the holder of the account's lease reads the mentions, from
        # the since_id they share.
        async with polling(self.runtime.journal, f"x-{self._me.id}", report=self.report_health) as shared:
            if shared is not None and shared.position:
                await asyncio.to_thread(self._cursor.advance, int(shared.position))
            await self._read_mentions(failures, shared)

    async def _read_mentions(self, failures: Backoff, shared: SharedPoller | None) -> None:
        clock = self.runtime.clock  # every wait here is a timer on the runtime's clock
        health = PollHealth(self.report_health)  # a refusal shows in the status and /healthz
        rate_limits = Backoff(POLL_BACKOFF, clock=clock.monotonic)  # back-to-back 429s
        while True:
            try:
                await self._take_new()
                if shared is not None and self._cursor.since_id is not None:
                    await shared.save(str(self._cursor.since_id))
            except TooManyRequests as exc:
                # X's reset, but never sooner than the backoff: a reset already past (a
                # clock apart from X's) or 429 after 429 would otherwise be a look a second.
                wait = max(seconds_until(exc.reset_time, now=clock.time()), rate_limits.next_delay())
                health.failed(f"X rate-limits the mentions timeline (429, x-rate-limit-reset "
                              f"{exc.reset_time})")
                log.warning("X rate-limited the mentions timeline; looking again in %.0fs", wait)
                await clock.sleep(wait)
                continue
            except (TimeoutError, TweepyException, aiohttp.ClientError) as exc:
                delay = failures.next_delay()
                said = " ".join(str(exc).split())  # tweepy's text runs over lines
                if isinstance(exc, (Unauthorized, Forbidden)):  # no retry fixes these by itself
                    health.refused(f"X refuses the account's credentials (reading the mentions: {said})")
                else:
                    health.failed(f"reading the mentions failed: {type(exc).__name__}: {said}")
                log.warning("reading the mentions failed (%s: %s); retrying in %.1fs",
                            type(exc).__name__, exc, delay)
                await clock.sleep(delay)
                continue
            failures.reset()
            rate_limits.reset()
            health.worked()
            await clock.sleep(self.settings.poll_interval)

    async def _take_new(self) -> None:
        """Journal every new mention, oldest first (or dead-letter it when it cannot be
        read), moving ``since_id`` past each."""
        cursor = self._cursor
        found = await self._api.mentions_since(user_id=self._me.id, since_id=cursor.since_id,
                                               start_time=cursor.start_time)
        for post, includes in found:
            try:
                mention = parse_mention(post, includes, me=self._me.id)
            # What reading a malformed post raises (a ValidationError is a ValueError).
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                self._malformed(post, f"{type(exc).__name__}: {exc}")
                mention = None  # moved past below: left behind, it would fail every look
            if mention is not None:
                await accept_input(self, mention, f"x-{mention.post_id}")
            taken = post_id(post)
            if taken is not None:  # without an id there is nothing to move past
                await asyncio.to_thread(cursor.advance, taken)

    def _malformed(self, post: Any, why: str) -> None:
        """Dead-letter a post that cannot be read, with why and the post as X sent it."""
        dead_letter_malformed(self, post, "malformed mention", why)

    @handles
    def on_mention(self, mention: XMention, env: Envelope) -> None:
        context = mention_context(mention)
        text = self._mention.sub("", mention.text).strip() or mention.text
        take_request(self, text, context, env, allowed=mention.author_id in self.settings.allowed_users,
                     policy=self.settings, attachments=mention.attachments)
