"""Telegram's settings, and the Bot API's limits."""

from __future__ import annotations

from pydantic import Field, SecretStr

from autoresponse.actors.inbound import StrangerSettings

#: Longest message, in UTF-16 code units as Telegram counts them.
TELEGRAM_MESSAGE_UTF16 = 4096
#: Telegram's flood limits: one message a second per chat, 30 a second overall,
#: 20 a minute per group.
TELEGRAM_CHAT_INTERVAL_SECONDS = 1.0
TELEGRAM_GLOBAL_PER_SECOND = 30
TELEGRAM_GROUP_PER_MINUTE = 20
#: Attempts per chunk on TimedOut/NetworkError, and waits on RetryAfter per chunk.
TELEGRAM_SEND_ATTEMPTS = 3
TELEGRAM_MAX_RETRY_AFTERS = 5
#: Seconds a getUpdates long poll waits for updates.
TELEGRAM_POLL_TIMEOUT_SECONDS = 10
#: Updates asked for per getUpdates call (Telegram's own maximum).
TELEGRAM_MAX_UPDATES = 100
#: The longest flood-control wait (RetryAfter) a reply waits out; a longer one parks it.
TELEGRAM_MAX_RETRY_AFTER_SECONDS = 60.0
#: Telegram sends in flight at once (Telegram takes 30 a second overall anyway);
#: more only grows the HTTP connection pool, which costs CPU per request.
TELEGRAM_MAX_CONCURRENT_SENDS = 32


class TelegramSettings(StrangerSettings):
    """On when a token is set. Only ``allowed_users`` can cause actions; strangers get a
    short refusal (``strangers = "silent"``: nothing)."""

    token: SecretStr | None = None
    #: python-telegram-bot's base_url: a local Bot API server or a fake ends in "/bot".
    base_url: str = "https://api.telegram.org/bot"
    allowed_users: list[int] = Field(default_factory=list)
    #: Parse mode of replies; a reply Telegram cannot parse is resent once as plain text.
    parse_mode: str | None = "Markdown"
    poll_timeout: int = Field(default=TELEGRAM_POLL_TIMEOUT_SECONDS, ge=0)
    #: Answer edited messages as new requests (off: an edit is not a new request).
    edited_messages: bool = False
    #: A reply Telegram asks to hold back longer than this (flood control) is not waited
    #: for: it becomes a dead letter (replayable), and the chat's other replies go on.
    max_retry_after: float = Field(default=TELEGRAM_MAX_RETRY_AFTER_SECONDS, gt=0)

    @property
    def enabled(self) -> bool:
        return self.token is not None and bool(self.token.get_secret_value())
