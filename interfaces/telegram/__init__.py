"""Telegram: an interface on python-telegram-bot, a sender with Telegram's rules,
and a fake Bot API server for tests.

Importing this package registers nothing heavy: python-telegram-bot is loaded
only when the platform is mounted (a token is set) or one of its parts is used.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from autoresponse.actors import routes
from autoresponse.actors.inbound import REFUSAL
from autoresponse.interfaces.telegram.actions import MessageTelegramBotAction
from autoresponse.interfaces.telegram.chunking import split_message, utf16_len
from autoresponse.interfaces.telegram.settings import TelegramSettings
from autoresponse.supervisors import ChildSpec, Mount, MountError, Platform

INTERFACE_NAME = "telegram"


def _mount(m: Mount) -> None:
    from autoresponse.interfaces.telegram.bot import make_bot
    from telegram.error import TelegramError

    from autoresponse.interfaces.telegram.delivery import TelegramDelivery, refusal
    from autoresponse.interfaces.telegram.interface import TelegramInterface, TelegramText, origin
    from autoresponse.interfaces.telegram.media import TelegramFiles
    from autoresponse.interfaces.telegram.sender import TelegramSender

    settings: TelegramSettings = m.settings
    delivery = TelegramDelivery(make_bot(settings), parse_mode=settings.parse_mode, journal=m.journal,
                                max_retry_after=settings.max_retry_after,
                                clock=m.runtime.clock.monotonic, sleep=m.runtime.clock.sleep)
    try:
        m.run(delivery.start())
    except Exception as exc:  # InvalidToken, NetworkError: say so, without the token
        with contextlib.suppress(Exception):
            m.run(delivery.aclose())  # the sessions it opened before Telegram answered
        refused = refusal("getMe", exc) if isinstance(exc, TelegramError) else None
        raise MountError(refused or f"cannot reach the Telegram Bot API: {type(exc).__name__}: {exc}") from None
    m.on_loop_close(delivery.aclose)
    # The LLM hop's media_timeout bounds each download.
    files = TelegramFiles(delivery.bot, timeout=None, local_files=settings.local_files)
    m.on_loop_close(files.aclose)
    m.downloader(INTERFACE_NAME, files.download)  # photos, voice notes and files, read in the LLM hop
    m.expose(delivery)
    m.pipeline(ChildSpec(routes.sender(INTERFACE_NAME), TelegramSender, (delivery,)))
    m.inbound(ChildSpec(routes.interface(INTERFACE_NAME), TelegramInterface, (settings, delivery)))
    m.origin(TelegramText, origin(settings))  # a message its interface crashed on: its user is told


PLATFORM = Platform("telegram", TelegramSettings, _mount, actions=(MessageTelegramBotAction,),
                    interface=INTERFACE_NAME, interface_aliases=("telegram_bot",))

_LAZY = {
    "TelegramDelivery": "delivery", "Undeliverable": "delivery", "TelegramInterface": "interface",
    "TelegramText": "interface", "TelegramSender": "sender", "make_bot": "bot",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["INTERFACE_NAME", "PLATFORM", "REFUSAL", "MessageTelegramBotAction", "TelegramDelivery",
           "TelegramInterface", "TelegramSender", "TelegramSettings", "TelegramText", "Undeliverable",
           "make_bot", "split_message", "utf16_len"]
