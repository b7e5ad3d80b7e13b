"""The Telegram userbot: a Telegram *user* account, driven with Telethon, whose new
messages from allowed users (or in allowed chats) are requests, answered in the chat
with ``reply_to``.

The adapter boundary is ``client.UserbotClient``: ``get_me``, ``send_message``,
``new_messages`` (Telethon's ``NewMessage`` events) and ``download_media``. ``client.TelethonUserbot``
implements it over MTProto; the tests, which cannot serve MTProto, hand the platform a
stand-in (``provided={USERBOT: ...}``) fed with Telethon's own TL types. Importing this
package loads nothing heavy: Telethon is imported only when the platform is mounted or
one of its parts is used.

A manual check with a real account (a spare one: the userbot acts as it)::

    # 1. an app at https://my.telegram.org (api_id, api_hash), then a session string:
    python -c "from telethon.sync import TelegramClient; from telethon.sessions import StringSession; \\
    c = TelegramClient(StringSession(), API_ID, 'API_HASH'); c.start(); print(c.session.save())"
    # 2. run it, allowing a second account of yours (its numeric user id):
    AUTORESPONSE_TELETHON__API_ID=... AUTORESPONSE_TELETHON__API_HASH=... \\
    AUTORESPONSE_TELETHON__SESSION=... AUTORESPONSE_TELETHON__ALLOWED_USERS='[111]' \\
    AUTORESPONSE_TERMINAL__ENABLED=true AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS='["uptime"]' \\
    autoresponse run
    # 3. from the second account write "run uptime" to the first: one reply, quoting it.
    #    From a third account: nothing. From the first account itself: nothing.

>>> PLATFORM.name, PLATFORM.interface
('telethon', 'telethon')
"""

from __future__ import annotations

import importlib
from typing import Any

from autoresponse.actors import routes
from autoresponse.actors.inbound import REFUSAL
from autoresponse.interfaces.telethon.actions import INTERFACE_NAME, MessageTelethonAction
from autoresponse.interfaces.telethon.settings import TelethonSettings
from autoresponse.supervisors import ChildSpec, Mount, MountError, Platform

#: The name under which an embedding program may hand the platform its own
#: ``UserbotClient`` (``Application(provided={USERBOT: ...})``): then no Telethon client is opened.
USERBOT = "telethon_userbot"


def _mount(m: Mount) -> None:
    from autoresponse.interfaces.telethon.client import open_userbot
    from autoresponse.interfaces.telethon.delivery import UserbotDelivery
    from autoresponse.interfaces.telethon.formatting import parse_mode_of
    from autoresponse.interfaces.telethon.interface import TelethonInterface, UserbotText, origin
    from autoresponse.interfaces.telethon.media import UserbotFiles
    from autoresponse.interfaces.telethon.sender import TelethonSender

    settings: TelethonSettings = m.settings
    provided = m.provided.get(USERBOT)

    async def connect() -> Any:
        if provided is not None:
            return provided, await provided.get_me()
        userbot = await open_userbot(settings)
        try:
            return userbot, await userbot.get_me()
        except BaseException:
            await userbot.aclose()
            raise

    try:
        userbot, me = m.run(connect())
    except Exception as exc:  # ConnectionError, PermissionError, a malformed session: say so, without it
        raise MountError(f"cannot sign in to Telegram as the userbot: {type(exc).__name__}: {exc}") from None
    if provided is None:
        m.on_loop_close(userbot.aclose)
    delivery = UserbotDelivery(userbot, m.journal, parse_mode=parse_mode_of(settings.parse_mode),
                               sleep=m.runtime.clock.sleep)
    m.expose(delivery)
    m.downloader(INTERFACE_NAME, UserbotFiles(userbot).download)  # photos, voice notes and files
    m.pipeline(ChildSpec(routes.sender(INTERFACE_NAME), TelethonSender, (delivery,)))
    m.inbound(ChildSpec(routes.interface(INTERFACE_NAME), TelethonInterface, (settings, userbot, me)))
    m.origin(UserbotText, origin(settings))  # a message its interface crashed on: its author is told


PLATFORM = Platform("telethon", TelethonSettings, _mount, actions=(MessageTelethonAction,),
                    interface=INTERFACE_NAME, interface_aliases=("telegram_userbot",))

_LAZY = {
    "UserbotDelivery": "delivery", "Undeliverable": "delivery", "TelethonInterface": "interface",
    "UserbotText": "interface", "TelethonSender": "sender", "UserbotClient": "client",
    "TelethonUserbot": "client", "open_userbot": "client",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["INTERFACE_NAME", "PLATFORM", "REFUSAL", "USERBOT", "MessageTelethonAction", "TelethonInterface",
           "TelethonSender", "TelethonSettings", "TelethonUserbot", "Undeliverable", "UserbotClient",
           "UserbotDelivery", "UserbotText", "open_userbot"]
