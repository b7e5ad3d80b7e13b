"""The Telegram userbot's settings, and its limits.

A message is at most 4096 UTF-16 units, as for the bot (``TELEGRAM_MESSAGE_UTF16``);
the userbot cuts its replies with the bot's own ``split_message``.

>>> TelethonSettings(api_id=12345, api_hash="0123abcd", session="1AbC...").enabled
True
>>> TelethonSettings().strangers
'silent'
"""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

from autoresponse.actors.inbound import StrangerPolicy, StrangerSettings
from autoresponse.interfaces.credentials import given, listed, refuse_in_part, setting

#: FloodWaitErrors waited out per chunk, and the longest such wait; beyond either the
#: reply is a dead letter. A flood wait holds back only its own chat.
TELETHON_MAX_FLOOD_WAITS = 3
TELETHON_MAX_FLOOD_WAIT_SECONDS = 300.0
#: Attempts per chunk on connection errors.
TELETHON_SEND_ATTEMPTS = 3
#: Times Telethon tries to connect (at the start, and after a disconnection) before giving up.
TELETHON_CONNECT_RETRIES = 3
#: New messages held between Telethon and the interface; Telethon waits when it is full.
TELETHON_EVENT_QUEUE = 1_000

#: What the userbot needs to log in.
_CREDENTIALS = ("api_id", "api_hash", "session")
#: The settings that say the userbot is meant to run: its credentials and whom it answers.
#: Set without the rest of the credentials, it would stay off without a word, so they are an
#: error. Tuning (``parse_mode``, ``strangers``, ...) does not count: it works on its
#: defaults, and may sit in a shared file for a daemon that runs no userbot.
_MEANT_TO_RUN = (*_CREDENTIALS, "allowed_users", "allowed_chats")


class TelethonSettings(StrangerSettings):
    """On when an app (``api_id``, ``api_hash`` from my.telegram.org) and a logged-in
    ``session`` string are set; off when none of ``_MEANT_TO_RUN`` is, and an error when
    some are but not all three. Only ``allowed_users``, or anyone in ``allowed_chats``,
    cause actions; the account's own messages never do."""

    api_id: int | None = None
    api_hash: SecretStr | None = None
    #: A Telethon ``StringSession`` of the logged-in account: it is the account's key.
    session: SecretStr | None = None
    #: Telegram user ids whose messages, in any chat, are requests.
    allowed_users: list[int] = Field(default_factory=list)
    #: Chat ids (Telethon's "marked" ids: groups are negative) in which every message is a request.
    allowed_chats: list[int] = Field(default_factory=list)
    strangers: StrangerPolicy = "silent"  # on a personal account, silence is the polite default
    #: How replies are formatted: "md" (bold, code and links; ``__`` and ``~~`` stay as
    #: written, so ``__init__.py`` stays whole: ``formatting.REPLY_MARKDOWN``), Telethon's
    #: own "markdown" or "html", or None for plain text.
    parse_mode: str | None = "md"
    connect_retries: int = Field(default=TELETHON_CONNECT_RETRIES, ge=0)

    @model_validator(mode="after")
    def _a_userbot_needs_every_credential(self) -> TelethonSettings:
        """A userbot meant to run (``_MEANT_TO_RUN``) without all it needs: ``refuse_in_part``."""
        if not self.enabled:
            needed = [setting("telethon", name) for name in _CREDENTIALS if not given(getattr(self, name))]
            refuse_in_part(self, _MEANT_TO_RUN, "Telethon needs more to log in: set {needed}", needed=listed(needed))
        return self

    @property
    def enabled(self) -> bool:
        return all(given(getattr(self, name)) for name in _CREDENTIALS)

    def allows(self, user_id: int | None, chat_id: int) -> bool:
        return (user_id is not None and user_id in self.allowed_users) or chat_id in self.allowed_chats



