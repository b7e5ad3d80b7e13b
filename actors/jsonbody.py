"""JSON in bodies. Read from outside (the admin endpoint, Telegram's webhook calls): UTF-8,
JSON, and nested no deeper than a limit, or ``MalformedJson`` saying which; the bytes
themselves a few at a time, each whole within a time limit (``BodyReads``). Written
(an LLM request, a Bot API call, a journaled trace): compact UTF-8, by ``dump_json``.

Depth is bounded because everything after the parse walks the value (validation, the
journal, a log line), and a walk that recurses would overflow on ``[[[[...``.

>>> read_json_body(b'{"update_id": 7}')
{'update_id': 7}
>>> read_json_body(b"[[[1]]]", max_depth=2)
Traceback (most recent call last):
autoresponse.actors.jsonbody.MalformedJson: the body nests deeper than 2 levels
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

from autoresponse.actors.limits import JSON_BODY_MAX_DEPTH


class MalformedJson(ValueError):
    """A body that is no acceptable JSON value; ``text`` is what it held (for a dead letter)."""

    def __init__(self, why: str, text: str) -> None:
        super().__init__(why)
        self.text = text


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and dicts nest in ``value`` more than ``limit`` deep (walked without
    recursion, so that the walk itself cannot overflow).

    >>> nests_deeper_than({"a": [[1]]}, 2), nests_deeper_than({"a": [[1]]}, 3)
    (True, False)
    """
    pending = [(value, 0)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, (list, dict)):
            if level + 1 > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, level + 1) for child in children)
    return False


def read_json_body(body: bytes, max_depth: int = JSON_BODY_MAX_DEPTH) -> Any:
    """The JSON value ``body`` carries; MalformedJson when it is not UTF-8, not JSON, or
    nested deeper than ``max_depth``."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedJson(f"the body is not UTF-8: {exc}", body.decode("utf-8", "backslashreplace")) from None
    too_deep = f"the body nests deeper than {max_depth} levels"
    try:
        value = json.loads(text)
    except RecursionError:  # "[[[[..." past the interpreter's limit
        raise MalformedJson(too_deep, text) from None
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        raise MalformedJson(f"the body is not JSON: {exc}", text) from None
    if nests_deeper_than(value, max_depth):
        raise MalformedJson(too_deep, text)
    return value


class BodyReads:
    """The request bodies a server is reading now: at most ``limit`` at once, each whole
    within ``seconds``. A client that sends a byte at a time is never idle, so no idle
    timeout cuts it; this does, and a few such clients cannot hold every connection.

    >>> reads = BodyReads(limit=1, seconds=30.0)
    >>> async def body() -> bytes:
    ...     assert reads.full  # while it is read, another request would be refused
    ...     return b"{}"
    >>> asyncio.run(reads.read(body)), reads.full
    (b'{}', False)
    """

    def __init__(self, limit: int, seconds: float) -> None:
        self.limit = limit
        self.seconds = seconds
        self.reading = 0

    @property
    def full(self) -> bool:
        """``limit`` bodies are being read: answer another request 503 at once, unread."""
        return self.reading >= self.limit

    async def read(self, body: Callable[[], Awaitable[bytes]]) -> bytes:
        """What ``body()`` reads (``request.read``); TimeoutError when it is not whole
        within ``seconds``."""
        self.reading += 1
        try:
            async with asyncio.timeout(self.seconds):
                return await body()
        finally:
            self.reading -= 1


def dump_json(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, by pydantic-core's encoder: on every delivery's path
    (a trace, a request body), where it costs a fifth to a half of ``json.dumps``'s time.
    What it refuses and ``json.dumps`` takes (a lone surrogate, which UTF-8 cannot carry,
    or nesting past its depth) is encoded by ``json.dumps``, surrogates escaped.

    >>> dump_json({"text": "héllo", "n": [1, 2.5]})
    b'{"text":"h\\xc3\\xa9llo","n":[1,2.5]}'
    >>> dump_json("\\ud800")
    b'"\\\\ud800"'
    """
    try:
        return to_json(value)
    except PydanticSerializationError:
        return json.dumps(value, separators=(",", ":")).encode()
