"""Log lines on stderr: readable text by default, JSON lines for a log collector.

>>> configure("INFO", format="json", secrets=["s3cr3t-token"])        # doctest: +SKIP

``AUTORESPONSE_LOG__FORMAT=json`` gives one JSON object a line::

    {"time": "2025-01-31T10:00:00.123+00:00", "level": "DEBUG", "logger": "autoresponse.llm",
     "message": "LLM call took 0.412s", "thread": "asyncio-loop", "correlation_id": "5f0c..."}

Both formats carry the correlation id of the message being handled when the line
was logged (``current_correlation``: set while an actor handles a message, and
inherited by the I/O it hands to the event loop); the text format appends it as
`` [corr=...]``. Every configured secret is redacted in both, in the message and
in a traceback alike, whoever logged it: libraries log what they like (httpx logs
each request URL, and a Telegram URL holds the bot token).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import threading
from collections.abc import Iterable
from typing import Any

from autoresponse.actors.kernel.actor import current_correlation
from autoresponse.redaction import Redactor

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class RedactSecrets(logging.Filter):
    """Replaces every configured secret (bot token, API key, admin token, URL credentials)
    in log lines: the message, and the traceback of an exception logged with it."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.redact = Redactor(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.redact.secrets:
            text = record.getMessage()
            redacted = self.redact(text)
            if redacted != text:
                record.msg, record.args = redacted, None
            if record.exc_info and not record.exc_text:
                # Formatters use exc_text as it is when it is set: format it here, redacted.
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = self.redact(record.exc_text)
            if record.stack_info:
                record.stack_info = self.redact(record.stack_info)
        return True


class Correlation(logging.Filter):
    """Puts ``correlation_id`` on each record: the correlation being handled in the thread
    (or the loop task) that logs it, else None. Filters run in the logging thread."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.correlation_id = current_correlation.get()
        return True


class TextFormatter(logging.Formatter):
    """The readable format, with `` [corr=...]`` after the message when there is one."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        correlation = getattr(record, "correlation_id", None)
        return f"{text} [corr={correlation}]" if correlation else text


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (ISO 8601, UTC), level, logger, message, thread, and
    correlation_id, exception, stack when there are."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        correlation = getattr(record, "correlation_id", None)
        if correlation:
            line["correlation_id"] = correlation
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(level: str, *, format: str = "text", secrets: Iterable[str] = ()) -> logging.Handler:
    """Log to stderr at ``level`` in ``format`` ("text" or "json"), secrets redacted.

    Warnings and uncaught exceptions become log lines too: redacted like the rest, and
    in the JSON format every line on stderr is one JSON object.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    handler.addFilter(Correlation())
    handler.addFilter(RedactSecrets(secrets))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.captureWarnings(True)
    _log_uncaught_exceptions()
    return handler


def _log_uncaught_exceptions() -> None:
    """Uncaught exceptions (the main thread's, any other thread's) as log lines, not raw
    tracebacks on stderr."""
    log = logging.getLogger("autoresponse")

    def main_thread(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, error, tb)
            return
        log.critical("uncaught exception", exc_info=(kind, error, tb))

    def other_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        where = args.thread.name if args.thread is not None else "a thread"
        log.error("uncaught exception in %s", where,
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = main_thread
    threading.excepthook = other_thread
