"""X's settings, and the limits of its API.

>>> XSettings(bearer_token="user-context-token").enabled
True
>>> XSettings().enabled   # a section nobody touched: off
False
>>> try:
...     XSettings(consumer_key="k", consumer_secret="s", access_token="t")   # one key missing
... except ValueError as exc:
...     print(exc.errors()[0]["msg"])
X needs more to log in: set AUTORESPONSE_X__ACCESS_TOKEN_SECRET ([x] access_token_secret), or ...
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from autoresponse.actors.inbound import StrangerPolicy, StrangerSettings
from autoresponse.interfaces.credentials import given, listed, refuse_in_part, setting

#: Longest post, in X's weighted characters (see ``counting``).
X_POST_WEIGHT = 280
#: What a URL weighs, however long it is (X shortens it to t.co).
X_URL_WEIGHT = 23
#: Seconds between two looks at the mentions timeline (its rate limit is per 15 minutes).
X_POLL_SECONDS = 60.0
#: Mentions per page, and pages read per look: X keeps the newest 800 mentions anyway.
X_MENTIONS_PER_PAGE = 100
X_MENTION_PAGES = 8
#: Attempts per chunk on network errors and 5xx.
X_SEND_ATTEMPTS = 3
#: 429s waited out per chunk, and the longest wait for ``x-rate-limit-reset``; beyond
#: either the reply is a dead letter (a poll simply waits the longest wait and looks again).
X_MAX_RATE_LIMITS = 3
X_MAX_RATE_LIMIT_WAIT_SECONDS = 900.0
#: The wait after a 429 that names no reset, or one that cannot be read.
X_UNKNOWN_RESET_WAIT_SECONDS = 60.0
#: Seconds to wait for X to answer one request.
X_TIMEOUT_SECONDS = 30.0

#: The account's OAuth 1.0a keys: all four, or a ``bearer_token`` instead.
_OAUTH1_KEYS = ("consumer_key", "consumer_secret", "access_token", "access_token_secret")
#: The settings that say the bot is meant to run: its credentials, its account and whom it
#: answers. Set without every credential, X would stay off without a word, so they are an
#: error. Tuning (``poll_interval``, ``strangers``, ...) does not count: it works on its
#: defaults, and may sit in a shared file for a daemon that runs no X bot.
_MEANT_TO_RUN = (*_OAUTH1_KEYS, "bearer_token", "user_id", "allowed_users")


class XSettings(StrangerSettings):
    """On with the account's OAuth 1.0a keys (all four), or an OAuth 2.0 user-context
    access token in ``bearer_token``; off when none of ``_MEANT_TO_RUN`` is, and an error
    when some are but neither set of credentials is whole. Only ``allowed_users`` cause actions."""

    consumer_key: SecretStr | None = None
    consumer_secret: SecretStr | None = None
    access_token: SecretStr | None = None
    access_token_secret: SecretStr | None = None
    #: An OAuth 2.0 access token of the account (user context), used when the four
    #: OAuth 1.0a keys are not all set.
    bearer_token: SecretStr | None = None
    #: The account's numeric id; asked of X (``/2/users/me``) when unset.
    user_id: int | None = None
    #: X user ids (numbers: names can change hands).
    allowed_users: list[int] = Field(default_factory=list)
    strangers: StrangerPolicy = "silent"  # public platforms: strangers get no answer
    poll_interval: float = Field(default=X_POLL_SECONDS, gt=0)
    timeout: float = Field(default=X_TIMEOUT_SECONDS, gt=0)
    #: Connect to this ``ip:port`` whenever api.twitter.com is asked for (a proxy in
    #: front of X, or a fake X); the URLs, TLS names and OAuth signatures stay X's own.
    api_address: str | None = None
    #: A certificate authority to trust besides the system's (that proxy's or fake's).
    ca_file: Path | None = None
    #: Where ``since_id`` is kept between runs; ``<data_dir>/x-since-id.json`` when unset.
    cursor_file: Path | None = None

    @model_validator(mode="after")
    def _a_bot_needs_every_credential(self) -> XSettings:
        """A bot meant to run (``_MEANT_TO_RUN``) without all it needs: ``refuse_in_part``."""
        if not self.enabled:
            needed = [setting("x", name) for name in _OAUTH1_KEYS if not given(getattr(self, name))]
            refuse_in_part(self, _MEANT_TO_RUN, "X needs more to log in: set {needed}, or {bearer} instead of the "
                           "four keys", needed=listed(needed), bearer=setting("x", "bearer_token"))
        return self

    @property
    def oauth1(self) -> bool:
        """Whether requests are signed with the account's OAuth 1.0a keys."""
        return all(given(getattr(self, name)) for name in _OAUTH1_KEYS)

    @property
    def enabled(self) -> bool:
        return self.oauth1 or given(self.bearer_token)



