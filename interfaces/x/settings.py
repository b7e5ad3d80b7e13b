"""X's settings, and the limits of its API.

>>> XSettings(bearer_token="user-context-token").enabled
True
>>> XSettings(consumer_key="k", consumer_secret="s", access_token="t").enabled   # one part missing
False
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from autoresponse.actors.inbound import StrangerPolicy, StrangerSettings

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

class XSettings(StrangerSettings):
    """On with the account's OAuth 1.0a keys (all four), or an OAuth 2.0 user-context
    access token in ``bearer_token``. Only ``allowed_users`` cause actions."""

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

    @property
    def oauth1(self) -> bool:
        """Whether requests are signed with the account's OAuth 1.0a keys."""
        return all(_set(s) for s in (self.consumer_key, self.consumer_secret, self.access_token,
                                     self.access_token_secret))

    @property
    def enabled(self) -> bool:
        return self.oauth1 or _set(self.bearer_token)


def _set(secret: SecretStr | None) -> bool:
    return secret is not None and bool(secret.get_secret_value())
