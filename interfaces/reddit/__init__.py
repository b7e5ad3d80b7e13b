"""Reddit: the account's inbox (private messages, comment and post replies, username
mentions) as requests, replies threaded under what asked, and a fake Reddit API for tests.

Importing this package loads nothing heavy: asyncpraw is imported only when the
platform is mounted (an app and an account are configured) or one of its parts is used.

>>> PLATFORM.name, PLATFORM.interface
('reddit', 'reddit')
"""

from __future__ import annotations

import importlib
from typing import Any

from autoresponse.actors import routes
from autoresponse.actors.inbound import REFUSAL
from autoresponse.interfaces.reddit.actions import INTERFACE_NAME, MessageRedditAction
from autoresponse.interfaces.reddit.settings import RedditSettings
from autoresponse.supervisors import ChildSpec, Mount, MountError, Platform


def _mount(m: Mount) -> None:
    from autoresponse.interfaces.reddit.client import open_reddit
    from autoresponse.interfaces.reddit.delivery import RedditDelivery
    from autoresponse.interfaces.reddit.interface import RedditInterface, RedditItem, origin
    from autoresponse.interfaces.reddit.sender import RedditSender

    settings: RedditSettings = m.settings

    async def connect() -> Any:
        reddit = await open_reddit(settings)
        try:
            return reddit, (await reddit.user.me()).name  # checks the credentials once, up front
        except BaseException:
            await reddit.close()
            raise

    try:
        reddit, username = m.run(connect())
    except Exception as exc:  # OAuthException, ResponseException, RequestException: say so, without secrets
        raise MountError(f"cannot sign in to Reddit: {type(exc).__name__}: {exc}") from None
    m.on_loop_close(reddit.close)
    delivery = RedditDelivery(reddit, m.journal, sleep=m.runtime.clock.sleep)
    m.expose(delivery)
    m.pipeline(ChildSpec(routes.sender(INTERFACE_NAME), RedditSender, (delivery,)))
    m.inbound(ChildSpec(routes.interface(INTERFACE_NAME), RedditInterface, (settings, reddit, username)))
    m.origin(RedditItem, origin(settings))  # an item its interface crashed on: its author is told


PLATFORM = Platform("reddit", RedditSettings, _mount, actions=(MessageRedditAction,),
                    interface=INTERFACE_NAME)

_LAZY = {
    "RedditDelivery": "delivery", "Undeliverable": "delivery", "RedditInterface": "interface",
    "RedditItem": "interface", "RedditSender": "sender", "open_reddit": "client",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["INTERFACE_NAME", "PLATFORM", "REFUSAL", "MessageRedditAction", "RedditDelivery",
           "RedditInterface", "RedditItem", "RedditSender", "RedditSettings", "Undeliverable",
           "open_reddit"]
