"""The Reddit interface: the account's inbox (private messages, comment and post
replies, username mentions) becomes user requests.

A polling task this actor owns reads the unread inbox with asyncpraw, journals each
item (``runtime.accept``, one correlation per fullname), and only then marks the items
read: a kill between the two finds them unread again, and the journal recognises them.
Authorization happens here, in the actor, when the journaled item is handled.

Items are parsed one by one, so one malformed item (a field of the wrong type) is
logged, dead-lettered with its raw form and the field it got wrong, and marked read
with the rest, and the items behind it flow on.

>>> parse_item(comment)                                              # doctest: +SKIP
RedditItem(fullname='t1_3e9', kind='comment_reply', author='ada', body='run df -h', ...)
"""

from __future__ import annotations

import copy
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import asyncpraw
from asyncpraw.const import API_PATH
from asyncpraw.exceptions import AsyncPRAWException, ClientException
from asyncprawcore.exceptions import AsyncPrawcoreException, OAuthException, ResponseException
from pydantic import BaseModel, ConfigDict

from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.kernel.backoff import POLL_BACKOFF, Backoff
from autoresponse.actors.inbound import accept_input, dead_letter_malformed, take_request, turn_context
from autoresponse.actors.polling import PollHealth, polling
from autoresponse.interfaces.reddit.actions import INTERFACE_NAME
from autoresponse.interfaces.reddit.client import watching_rate_limits
from autoresponse.interfaces.reddit.media import images_in
from autoresponse.interfaces.reddit.settings import REDDIT_UNREAD_PER_POLL, RedditSettings
from autoresponse.messages import Attachment, Envelope, OriginalContext

log = logging.getLogger("autoresponse.reddit")


class RedditItem(BaseModel):
    """An inbox item: a private message (``t4_``) or a comment (``t1_``) that answers or
    mentions the account."""

    model_config = ConfigDict(frozen=True)

    fullname: str
    #: "message", "comment_reply", "post_reply" or "username_mention".
    kind: str
    author: str | None = None
    body: str
    subject: str | None = None
    subreddit: str | None = None
    #: For a comment: the submission it belongs to, and the thing it answers.
    link_id: str | None = None
    parent_id: str | None = None
    #: For a message: the first message of its conversation.
    first_message: str | None = None
    #: A link to the comment in its context.
    context: str | None = None
    #: The images it links or holds, by URL (the model is told them; nothing is downloaded).
    attachments: tuple[Attachment, ...] = ()

    @property
    def is_message(self) -> bool:
        return self.fullname.startswith("t4_")

    @property
    def conversation(self) -> str:
        """What the item belongs to: its submission, or its message thread."""
        return (self.first_message or self.fullname) if self.is_message else (self.link_id or self.fullname)


#: Items marked read by one call (asyncpraw's ``Inbox.mark_read`` sends as many).
READ_PER_CALL = 25


def _children(page: Any) -> list[Any]:
    """The items of a page of the inbox, as Reddit sent them; a page that is no listing
    is a failed read (the poll backs off and tries again)."""
    data = page.get("data") if isinstance(page, dict) else None
    children = data.get("children") if isinstance(data, dict) else None
    if not isinstance(children, list):
        raise ClientException(f"the inbox answered with no listing: {str(page)[:200]}")
    return children


def _data(child: Any) -> dict[str, Any] | None:
    """An inbox item's fields as Reddit sent them (``{"kind": ..., "data": {...}}``), or None."""
    data = child.get("data") if isinstance(child, dict) else None
    return data if isinstance(data, dict) else None


def _fullname(child: Any) -> str | None:
    """The fullname of an inbox item as Reddit sent it (its ``name``, or its kind and id),
    by which Reddit marks it read; None when it has neither."""
    data = _data(child)
    if data is None:
        return None
    name, kind, id_ = data.get("name"), child.get("kind"), data.get("id")
    if isinstance(name, str) and name:
        return name
    return f"{kind}_{id_}" if isinstance(kind, str) and kind and isinstance(id_, str) and id_ else None


#: What tells one item from another when it has no id: not its score, which votes change.
_IDENTITY = ("author", "created_utc", "subject", "body", "link_id", "parent_id", "context")


def _identity(child: Any) -> str:
    """An item with no fullname, told from the others by what does not change between polls."""
    data = _data(child)
    if data is None:
        return repr(child)
    return repr((child.get("kind"), *(data.get(key) for key in _IDENTITY)))


def _name(value: Any) -> str | None:
    return None if value is None else str(value)


def parse_item(item: Any) -> RedditItem:
    """A journaled ``RedditItem`` from an asyncpraw ``Comment`` or ``Message``; raises on
    an item Reddit would not send (pydantic's ValidationError names the field)."""
    is_comment = bool(getattr(item, "was_comment", False)) or item.fullname.startswith("t1_")
    parsed = RedditItem(
        fullname=item.fullname,
        kind=(getattr(item, "type", None) or "comment_reply") if is_comment else "message",
        author=_name(getattr(item, "author", None)),
        body=item.body or "",
        subject=getattr(item, "subject", None),
        subreddit=_name(getattr(item, "subreddit", None)),
        link_id=getattr(item, "link_id", None) if is_comment else None,
        parent_id=getattr(item, "parent_id", None),
        first_message=None if is_comment else getattr(item, "first_message_name", None),
        context=getattr(item, "context", None) or None,
    )
    # From the checked body: a body of the wrong type fails above, naming the field.
    images = images_in(parsed.body, getattr(item, "media_metadata", None))
    return parsed.model_copy(update={"attachments": images})


def refused(exc: Exception) -> bool:
    """Reddit refuses the account: a wrong or revoked password or app (``invalid_grant``,
    401), or a suspended account (403). No retry fixes these by itself."""
    if isinstance(exc, OAuthException):
        return True
    response = getattr(exc, "response", None)
    return isinstance(exc, ResponseException) and getattr(response, "status", None) in (401, 403)


def item_context(item: RedditItem) -> OriginalContext:
    """Where ``item`` came from, and where its answers go."""
    return OriginalContext(
        chat_id=item.conversation,
        message_id=item.fullname,
        interface_name=INTERFACE_NAME,
        original_command=item.body,
        user_id=item.author,
        user_name=item.author,
        chat_type="private" if item.is_message else "public",
        fullname=item.fullname,
        item_kind=item.kind,
        subreddit=item.subreddit,
        subject=item.subject,
        permalink=item.context,
    )


def origin(settings: RedditSettings) -> Callable[[Any], OriginalContext | None]:
    """Who sent a ``RedditItem`` (``Mount.origin``): its conversation, when the author is
    allowed. A notice to a comment is a public comment, as the answer would have been; a
    stranger never gets one (refused, ignored, or an autonomous turn: a crafted item must
    not make the account post). None too for an item that cannot be read."""
    def of(item: Any) -> OriginalContext | None:
        try:
            return turn_context(item_context(item), allowed=settings.allows(item.author), policy=settings)
        except Exception:  # a malformed input: nobody to tell
            return None
    return of


class RedditInterface(TypedActor):
    """Reads the inbox in a task this incarnation owns; a crash or stop cancels it."""

    def __init__(self, settings: RedditSettings, reddit: asyncpraw.Reddit, username: str) -> None:
        super().__init__()
        self.settings = settings
        self._reddit = reddit  # shared with the sender; the platform closes it
        self._username = username
        self._mention = re.compile(rf"(?<![\w/])/?u/{re.escape(username)}\b", re.IGNORECASE)
        #: Malformed items with no fullname, which Reddit cannot mark read: each is listed again
        #: on every poll, and dead-lettered the first time only (the newest are remembered).
        self._nameless: OrderedDict[str, None] = OrderedDict()

    def setup(self) -> None:
        self.start_task(self._poll(), "inbox")
        log.info("reading the Reddit inbox every %gs", self.settings.poll_interval)

    async def _poll(self) -> None:
        # A spent rate-limit budget that holds every call back for long shows in the status
        # and /healthz too: no inbox is read and no reply sent then, though nothing fails.
        with watching_rate_limits(self._reddit, self._held_back):
            await self._read_inbox()

    def _held_back(self, reason: str | None) -> None:
        """Reddit's rate limit holds every call back (``reason``), or calls flow (None)."""
        self.report_health(reason is None, reason or "", concern="rate limit")

    async def _read_inbox(self) -> None:
        clock = self.runtime.clock  # every wait here is a timer on the runtime's clock
        failures = Backoff(POLL_BACKOFF, clock=clock.monotonic)
        health = PollHealth(self.report_health)  # a refusal shows in the status and /healthz
        # Several daemons: only the holder of the account's lease reads the inbox.
        async with polling(self.runtime.journal, f"reddit-{self._username}",
                           report=self.report_health) as shared:
            while True:
                if shared is not None:
                    shared.check()
                try:
                    await self._take_unread()
                except (AsyncPrawcoreException, AsyncPRAWException) as exc:
                    delay = failures.next_delay()
                    if refused(exc):  # no retry fixes these by itself
                        health.refused(f"Reddit refuses the account (reading the inbox: "
                                       f"{type(exc).__name__}: {exc})")
                    else:
                        health.failed(f"reading the inbox failed: {type(exc).__name__}: {exc}")
                    log.warning("reading the Reddit inbox failed (%s: %s); retrying in %.1fs",
                                type(exc).__name__, exc, delay)
                    await clock.sleep(delay)
                    continue
                failures.reset()
                health.worked()
                await clock.sleep(self.settings.poll_interval)

    async def _take_unread(self) -> None:
        """Journal every unread item, oldest first (or dead-letter it when it cannot be
        read), then mark them read.

        The page is read as JSON and each item made an object on its own: asyncpraw fails a
        whole listing on one item it cannot make (no id), which would stop the inbox there."""
        intake = self.runtime.intake
        await intake.room()  # backpressure: take nothing while the runtime is full
        limit = max(1, min(REDDIT_UNREAD_PER_POLL, intake.free()))
        page = await self._reddit.request(method="GET", path=API_PATH["unread"],
                                          params={"mark": False, "limit": limit})
        children = _children(page)
        read: list[str] = []  # the fullnames to mark read: every item but one that has none
        for child in reversed(children):  # the listing is newest first
            try:  # on a copy: asyncpraw's parsers change what they read, and a dead letter keeps it as sent
                item = self._reddit._objector.objectify(data=copy.deepcopy(child))
            # asyncpraw's own code on what Reddit sent: an error object raises its own exception.
            except Exception as exc:
                self._malformed(child, f"{type(exc).__name__}: {exc}", read)
                continue
            try:
                parsed = parse_item(item)
            # What reading a malformed item raises (a ValidationError is a ValueError).
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                self._malformed(child, f"{type(exc).__name__}: {exc}", read)
                continue  # marked read with the rest: kept unread, it would fail every poll
            await accept_input(self, parsed, f"reddit-{parsed.fullname}")
            read.append(parsed.fullname)  # the name it was journaled under
        for start in range(0, len(read), READ_PER_CALL):
            names = ",".join(read[start:start + READ_PER_CALL])
            await self._reddit.post(API_PATH["read_message"], data={"id": names})

    def _malformed(self, child: Any, why: str, read: list[str]) -> None:
        """Dead-letter an item that cannot be read, with why and its fields as Reddit sent
        them, and mark it read; one with no fullname cannot be, and is listed on every poll:
        dead-lettered the first time it is seen in this run."""
        name = _fullname(child)
        if name is not None:
            read.append(name)
        else:
            seen = _identity(child)
            if seen in self._nameless:
                return
            self._nameless[seen] = None
            if len(self._nameless) > REDDIT_UNREAD_PER_POLL:  # more than one listing shows
                self._nameless.popitem(last=False)
        dead_letter_malformed(self, _data(child) or child, "malformed item", why)

    @handles
    def on_item(self, item: RedditItem, env: Envelope) -> None:
        context = item_context(item)
        text = self._mention.sub("", item.body).strip() or item.body
        take_request(self, text, context, env, allowed=self.settings.allows(item.author), policy=self.settings,
                     attachments=item.attachments)
