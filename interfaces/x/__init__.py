"""X: posts that mention the account as requests, replies threaded under them, and a
fake X API v2 for tests.

Real tweepy (``tweepy.asynchronous.AsyncClient``) is used unpatched. Its host is fixed
(api.twitter.com), so tests run it against ``fake_server.FakeXServer`` through the
session we hand it: a resolver that maps api.twitter.com to the fake, and a test
certificate authority (see ``client``). Importing this package loads nothing heavy:
tweepy is imported only when the platform is mounted or one of its parts is used.

>>> PLATFORM.name, PLATFORM.interface
('x', 'x')
"""

from __future__ import annotations

import importlib
from typing import Any

from autoresponse.actors import routes
from autoresponse.actors.inbound import REFUSAL
from autoresponse.interfaces.x.actions import INTERFACE_NAME, MessageXAction
from autoresponse.interfaces.x.settings import XSettings
from autoresponse.supervisors import ChildSpec, Mount, MountError, Platform

#: Where ``since_id`` is kept, under the data directory, unless ``cursor_file`` says otherwise.
CURSOR_FILE = "x-since-id.json"


def _mount(m: Mount) -> None:
    from autoresponse.interfaces.x.client import open_x
    from autoresponse.interfaces.x.cursor import MentionCursor
    from autoresponse.interfaces.x.delivery import XDelivery
    from autoresponse.interfaces.x.interface import XInterface, XMention, origin
    from autoresponse.interfaces.x.sender import XSender

    settings: XSettings = m.settings

    async def connect() -> Any:
        api = await open_x(settings)
        try:
            return api, await api.me()  # checks the credentials once, up front
        except BaseException:
            await api.aclose()
            raise

    try:
        api, me = m.run(connect())
    except Exception as exc:  # Unauthorized, ClientError, ValueError: say so, without secrets
        raise MountError(f"cannot sign in to X: {type(exc).__name__}: {exc}") from None
    m.on_loop_close(api.aclose)
    where = settings.cursor_file or m.data_dir / CURSOR_FILE
    try:
        cursor = MentionCursor.open(where, user_id=me.id)
    except (OSError, ValueError) as exc:
        raise MountError(f"cannot keep X's since_id in {where}: {exc}") from None
    delivery = XDelivery(api, m.journal, clock=m.runtime.clock)
    m.expose(delivery)
    m.pipeline(ChildSpec(routes.sender(INTERFACE_NAME), XSender, (delivery,)))
    m.inbound(ChildSpec(routes.interface(INTERFACE_NAME), XInterface, (settings, api, me, cursor)))
    m.origin(XMention, origin(settings))  # a mention its interface crashed on: its author is told


PLATFORM = Platform("x", XSettings, _mount, actions=(MessageXAction,), interface=INTERFACE_NAME,
                    interface_aliases=("twitter",), action_aliases={"message_twitter": "message_x"})

_LAZY = {
    "XDelivery": "delivery", "Undeliverable": "delivery", "XInterface": "interface",
    "XMention": "interface", "XSender": "sender", "open_x": "client", "XApi": "client",
    "MentionCursor": "cursor", "split_post": "counting", "weighted_length": "counting",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CURSOR_FILE", "INTERFACE_NAME", "PLATFORM", "REFUSAL", "MentionCursor", "MessageXAction",
           "Undeliverable", "XApi", "XDelivery", "XInterface", "XMention", "XSender", "XSettings",
           "open_x", "split_post", "weighted_length"]
