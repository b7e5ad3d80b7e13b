"""The log of a server facing outside (the admin endpoint, Telegram's webhook): what aiohttp
logs of the calls it serves (``aiohttp.server``), where a call that is not HTTP at all
(bytes no request line has, a header too long: the caller's fault, answered 400) is one
WARNING at most every MALFORMED_LOG_SECONDS, with how many there were. aiohttp logs each
as an ERROR with a traceback, so anyone who can connect could flood the log. Everything
else, a handler's own error first, is logged as aiohttp logs it::

    >>> runner = web.AppRunner(app, logger=ServerLog("request(s)", clock.monotonic))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

#: Calls that are not HTTP are logged at most this often, so that no one can flood the log.
MALFORMED_LOG_SECONDS = 60.0


class ServerLog(logging.LoggerAdapter[logging.Logger]):
    """``aiohttp.server``'s log, calls that are not HTTP counted (``calls`` names them)."""

    def __init__(self, calls: str, monotonic: Callable[[], float]) -> None:
        super().__init__(logging.getLogger("aiohttp.server"))
        self._calls = calls
        self._monotonic = monotonic
        self._malformed = 0  # since the last line about them
        self._logged = float("-inf")

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        error = kwargs.get("exc_info")
        if not isinstance(error, HttpProcessingError):
            super().log(level, msg, *args, **kwargs)
            return
        self._malformed += 1
        now = self._monotonic()
        if now - self._logged >= MALFORMED_LOG_SECONDS:
            super().log(logging.WARNING, "answered %d %s that are not HTTP with a 400 (the last: %s)",
                        self._malformed, self._calls, type(error).__name__)
            self._malformed, self._logged = 0, now
