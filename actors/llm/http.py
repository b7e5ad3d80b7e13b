"""An OpenAI-compatible chat completions client over aiohttp.

>>> async with HttpEngine("http://127.0.0.1:11434/v1", model="llama3") as engine:  # doctest: +SKIP
...     completion = await engine.answer(prompt)      # tools, json_schema or text
...     await engine.complete([{"role": "user", "content": "hi"}])   # plain text

It speaks the model's own protocol (``protocol="auto"``): native ``tools`` first, then a
``json_schema`` response format, then JSON in text. A server that refuses a feature
(400 or 422 naming it) moves the engine one level down, once, for its lifetime: that
is a configuration fact, not a failure to retry. Where the server reports no tool
support (llama.cpp's ``/props``), ``auto`` starts at ``json_schema``; a ``tools`` the
operator chose is kept, with a warning and ``problem`` saying no action will come back.
A server that does not answer that question (down, a timeout, a 5xx) is asked again at
the next call, so a daemon started before its server still learns it. A re-ask in
``json_schema`` goes without the grammar, as the turn first asked plus one plain line
on why (``plain_retry``): at temperature 0 the grammar would give the rejected answer
again, and a small model shown the error as JSON writes JSON back. So does an answer
in ``json_schema`` cut off at its token limit (a small model looping inside the
grammar), asked once more, shorter; but a delivery's message that came whole before
the cut is its answer.

Reasoning (``<think>`` blocks, ``reasoning_content``) is cut off here; usage and the
finish reason come back with every answer.

Retries 408, 409, 429, 5xx, timeouts and connection errors a bounded number of
times, waiting as ``Retry-After`` says when the server says; never retries
other 4xx, nor a 429 that reports an exhausted quota. A kept-alive connection that
closes under a request before any answer (the server had just closed it) is passed
over at once, without counting as an attempt. Where a request carried a grammar (a
response format, tools), a 5xx or an error event in the stream saying it broke while
the model wrote is not retried as it was: that turn is asked once more as JSON in
text. All the calls of one turn share its deadline. A redirect is not followed: it is
an error that says where it leads.

Every way a call can go wrong ends in an ``LLMError``: each attempt has a total
timeout, the whole call a deadline, the body a size cap, and a body that is not
text or not JSON (however deeply nested) is a malformed response, and so is a field
the reply is made of (a tool call's index, id, name) that is of the wrong type; one
that only informs (the model's name, the finish reason, usage) is then unknown. The
model's name is cut to ``LLM_MODEL_NAME_CHARS``: the server decides it, not the operator.
Credentials in the base URL are sent as basic auth and never appear in a message or repr.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import functools
import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp
from pydantic import SecretStr
from yarl import URL

from autoresponse.actors.jsonbody import dump_json
from autoresponse.actors.kernel.backoff import BackoffPolicy
from autoresponse.actors.limits import (
    LLM_CONNECT_TIMEOUT_SECONDS,
    LLM_DEADLINE_SECONDS,
    LLM_MAX_ATTEMPTS,
    LLM_MAX_IN_FLIGHT,
    LLM_MAX_RESPONSE_BYTES,
    LLM_MAX_TOKENS,
    LLM_MAX_RETRY_AFTER_SECONDS,
    LLM_MAX_STREAM_LINE_BYTES,
    LLM_MODEL_NAME_CHARS,
    LLM_READ_TIMEOUT_SECONDS,
    LLM_REQUEST_TIMEOUT_SECONDS,
    LLM_SHORT_RETRY_TOKENS,
    LLM_STREAM_END_GRACE_SECONDS,
    STREAM_WATCH_SECONDS,
)
from autoresponse.actors.llm.budget import ContextBudget, NarrowedChats, request_tokens
from autoresponse.actors.llm.engine import Completion, LLMError
from autoresponse.actors.llm.reasoning import split_reasoning
from autoresponse.actors.prompts import (
    PROTOCOLS,
    Protocol,
    plain_retry,
    render_openai_messages,
    response_format,
    tool_definitions,
)
from autoresponse.messages import PromptRequest, ToolCall, Usage, registry_generation
from autoresponse.messages.actions import is_blank

log = logging.getLogger("autoresponse.llm")

RETRY_STATUSES = frozenset({408, 409, 429})
#: Wait between attempts when the server does not say (Retry-After): 0.5 s, doubling.
RETRY_BACKOFF = BackoffPolicy(min=0.5, max=8.0, jitter=0.5)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # whatever a bad date raises
        return None
    return max(0.0, when.timestamp() - time.time())


def split_credentials(base_url: str) -> tuple[str, str | None]:
    """``base_url`` without its userinfo, and that userinfo as a basic Authorization value.

    aiohttp would send URL credentials itself, but then the URL it carries (and
    puts in its errors) still has them; stripping them here keeps them out of
    every message. A URL without credentials is returned as given.
    """
    try:
        url = URL(base_url)
    except ValueError:
        # yarl's message may quote the URL, secret and all.
        raise ValueError("the LLM base URL is not a valid URL") from None
    if url.raw_user is None and url.raw_password is None:
        return base_url, None
    userinfo = f"{url.user or ''}:{url.password or ''}".encode()  # RFC 7617: UTF-8
    return str(url.with_user(None)), "Basic " + base64.b64encode(userinfo).decode("ascii")


class _Unanswered(LLMError):
    """A kept-alive connection closed under a request before any answer came: the server
    had just closed it (llama.cpp's server closes one after each stream, while saying
    keep-alive) and the pool handed it out before its close was seen. Sent again at once,
    without counting as an attempt: each such connection is dropped as it fails, so the
    pool runs out of them, and a new connection is not one of them."""


class _FailedMidway(LLMError):
    """The server took the request and failed while the model wrote: an error event in its
    stream. Never a refusal of a feature, so never learnt as one."""


async def _mark_reused(session: aiohttp.ClientSession, context: Any, params: Any) -> None:
    """A pooled connection carries the request whose ``trace_request_ctx`` this is."""
    marks = context.trace_request_ctx
    if isinstance(marks, dict):
        marks["reused"] = True


def _grammar_broke(exc: LLMError) -> bool:
    """The server's grammar for the format broke while the model wrote: a 5xx or an error
    event in the stream naming it (llama.cpp: 'Unexpected empty grammar stack after
    accepting piece'). Asked the same way, the model would break it the same way."""
    return "grammar" in str(exc).lower() and (isinstance(exc, _FailedMidway) or (exc.status or 0) >= 500)


def _retry_wait(error: LLMError, attempt: int) -> float:
    """Seconds to wait after ``attempt`` failed with ``error``: as the server said
    (Retry-After), else the backoff."""
    if error.retry_after is not None:
        return error.retry_after
    return RETRY_BACKOFF.delay(attempt)


@functools.lru_cache(maxsize=64)
def _format_member(name: str, allowed: tuple[str, ...], generation: int) -> bytes:
    """``"tools": [...]`` or ``"response_format": {...}`` of a turn allowing ``allowed``, as
    JSON: encoded once per set of action types and registry ``generation``, since
    encoding it was most of the cost of encoding a whole request."""
    value = tool_definitions(allowed) if name == "tools" else response_format(allowed)
    return json.dumps({name: value}, ensure_ascii=False)[1:-1].encode()


#: What a server's refusal names, per protocol feature (a 400/422 body).
_FEATURE_WORDS: dict[str, tuple[str, ...]] = {
    # Not "tool" alone: a 400 about a ``tool`` turn (one answering no call) refuses that
    # request, not the feature.
    "tools": ("tools", "tool_choice", "tool choice", "tool call", "tool use", "support tool", "function call"),
    "json_schema": ("response_format", "json_schema", "schema", "grammar"),
}
#: What a 400 says when the request did not fit the model's context window.
_CONTEXT_WORDS = ("context", "too long", "maximum context", "exceed")


def _complete_json(text: str) -> bool:
    """True when ``text`` is one whole JSON value (an enforced answer that was not cut off)."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


#: The start of an answer in the response format up to the end of its first action's
#: message text: the schema's order (type, then payload; text first in it), as a grammar
#: writes it. Possessive, so never backtracking.
_FIRST_MESSAGE_TEXT = re.compile(
    r'\s*+\{\s*+"actions"\s*+:\s*+\[\s*+\{\s*+"type"\s*+:\s*+"[^"\\\n]*+"\s*+,'
    r'\s*+"payload"\s*+:\s*+\{\s*+"text"\s*+:\s*+"(?:[^"\\\n]++|\\[^\n])*+"')


def _salvaged_message(text: str) -> str | None:
    """An answer in the response format cut off at its token limit, closed right after
    its first action's message text, when that came whole (what follows it, such as a
    target or a loop, is dropped): None when it holds no such text."""
    start = _FIRST_MESSAGE_TEXT.match(text)
    if start is None:
        return None
    closed = start.group() + "}}]}"
    try:
        said = json.loads(closed)["actions"][0]["payload"]["text"]
    except ValueError:  # an escape or a control character JSON does not allow
        return None
    return None if is_blank(said) else closed


def refused_feature(exc: LLMError, feature: str) -> bool:
    """True when ``exc`` is the server refusing ``feature`` (a 400/422 that names it)."""
    text = str(exc).lower()
    return exc.status in (400, 422) and any(word in text for word in _FEATURE_WORDS.get(feature, (feature,)))


def _names_refused(text: str, name: str) -> bool:
    """Whether an error's ``text`` (lower case) names parameter ``name`` as the one refused:
    OpenAI's ``"param": "max_tokens"``, or its message's "Unsupported parameter: 'max_tokens'"."""
    return re.search(rf""""param"\s*:\s*"{name}"|unsupported parameter:?\s*['"`]?{name}\b""", text) is not None


# Reading the server's JSON: every field is checked for its type where it is read, by
# these three, so that whatever a server sends ends as a malformed answer (an LLMError for
# that one call) or as a field left unknown, never as an exception further on (a pydantic
# model refusing it when the reply is built crashed the llm actor).


def _text(value: Any) -> str | None:
    """A field of the answer that is text (a tool call's id, name): None when absent; a
    TypeError, read as a malformed answer, when it is something else."""
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{type(value).__name__} where text belongs")


def _message_text(value: Any) -> str | None:
    """A message's content: its text, or the text of its parts (some servers send a list
    of ``{"type": "text", "text": ...}``, as a request may); a TypeError for anything else."""
    if not isinstance(value, list):
        return _text(value)
    texts = []
    for part in value:
        if not isinstance(part, dict):
            raise TypeError(f"{type(part).__name__} where a part of the content belongs")
        if part.get("type") == "text":
            texts.append(_text(part.get("text")) or "")
    return "".join(texts)


def _note(value: Any) -> str | None:
    """A field that only informs (the model's name, why it stopped): its text, else None,
    as if absent. The answer stands without it, so a user would rather have that answer
    than lose it to a server's odd label; the configured model's name stands in, as it
    does when a server names none."""
    return value if isinstance(value, str) else None


def _model_name(value: Any) -> str | None:
    """The model's name a reply gives (a ``_note``), cut to ``LLM_MODEL_NAME_CHARS``: the
    server decides it, and it goes on into metrics' labels, the status and spans."""
    name = _note(value)
    return name[:LLM_MODEL_NAME_CHARS] if name is not None else None


def _count(value: Any) -> int:
    """A count or an index: a whole number from 0, as a number or its text (some servers
    send one); a ValueError for anything else. JSON's ``1e999`` reads as an infinite float,
    which no count is (``int`` raises OverflowError on it)."""
    if isinstance(value, bool):
        raise ValueError("a truth value is not a count")
    try:
        number = int(value)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"{type(value).__name__} is not a count") from exc
    if number < 0:
        raise ValueError("a count is never negative")
    return number


def _arguments(value: Any) -> str:
    """A tool call's arguments as JSON text: some servers send the object itself."""
    return value if isinstance(value, str) else json.dumps(value)


def _integer(digits: str) -> int | float:
    """A JSON integer; one of more digits than Python reads as an int (4,300) an infinite
    float, as JSON's ``1e999`` reads: no count is so big, so the field it is in is unknown
    or malformed as for any other, and the rest of the body is still read."""
    try:
        return int(digits)
    except ValueError:
        return float(digits)


#: A body or a stream's chunk as JSON (see ``_integer``).
_loads = functools.partial(json.loads, parse_int=_integer)


def _usage(data: Any) -> Usage | None:
    """What the call cost; None (unknown) where the server does not say it readably: usage
    only informs, and the answer stands without it."""
    if not isinstance(data, dict):
        return None
    try:
        return Usage(prompt_tokens=_count(data.get("prompt_tokens") or 0),
                     completion_tokens=_count(data.get("completion_tokens") or 0),
                     total_tokens=_count(data.get("total_tokens") or 0))
    except ValueError:
        return None


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    """The tool calls of a message, as text; anything that is not one is an error."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise TypeError("tool_calls is not a list")
    calls = []
    for n, call in enumerate(raw):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        calls.append(ToolCall(id=_text(call.get("id")) or f"call_{n}", name=_text(function.get("name")) or "",
                              arguments=_arguments(arguments if arguments is not None else {})))
    return tuple(calls)


def _adds_to_reply(chunk: dict[str, Any]) -> bool:
    """Whether a stream's chunk (read by ``_Stream.take`` already) carries any of the reply:
    its text, its reasoning, its tool calls."""
    choices = chunk.get("choices")
    delta = (choices[0].get("delta") or {}) if choices else {}
    return any(delta.get(key) for key in ("content", "reasoning_content", "reasoning", "tool_calls"))


class _Stream:
    """An OpenAI-style stream being read: content deltas, reasoning deltas, tool call
    deltas (by index: id and name once, arguments in pieces), usage in the last chunk."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.model = ""

    def take(self, chunk: dict[str, Any]) -> bool:
        """Read one chunk; True when it added answer text or tool arguments."""
        self.model = _model_name(chunk.get("model")) or self.model
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        choices = chunk.get("choices")
        if not choices:  # the usage chunk has none
            return False
        choice = choices[0]
        self.finish_reason = _note(choice.get("finish_reason")) or self.finish_reason
        delta = choice.get("delta") or {}
        thought = _note(delta.get("reasoning_content") or delta.get("reasoning"))
        if thought:
            self.reasoning.append(thought)
        grew = False
        text = _message_text(delta.get("content"))
        if text:
            self.content.append(text)
            grew = True
        for piece in delta.get("tool_calls") or ():
            index = piece.get("index")  # null as if absent: the next call
            slot = self.calls.setdefault(len(self.calls) if index is None else _count(index),
                                         {"id": "", "name": "", "arguments": []})
            slot["id"] = _text(piece.get("id")) or slot["id"]
            function = piece.get("function") or {}
            slot["name"] = _text(function.get("name")) or slot["name"]
            if function.get("arguments"):
                slot["arguments"].append(_arguments(function["arguments"]))
                grew = True
        return grew

    def partial(self) -> str:
        """The answer so far as the preview reads it: the text, or the first tool call
        written as the start of an actions JSON."""
        if self.calls:
            first = self.calls[min(self.calls)]
            return (f'{{"actions": [{{"type": "{first["name"]}", "payload": '
                    + "".join(first["arguments"]))
        return split_reasoning("".join(self.content))[0]

    def completion(self) -> Completion:
        text, thought = split_reasoning("".join(self.content))
        calls = tuple(ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments="".join(c["arguments"]))
                      for i, c in sorted(self.calls.items()))
        reasoning = "\n".join(x for x in ("".join(self.reasoning).strip(), thought) if x)
        return Completion(text=text, tool_calls=calls, reasoning=reasoning, usage=self.usage,
                          finish_reason=self.finish_reason, model=self.model)


#: The data of the event that ends an OpenAI-style stream (and that data as ``_Events`` holds it).
_DONE = b"[DONE]"
_DONE_LINE = _DONE + b"\n"
_BOM = b"\xef\xbb\xbf"


class _Events:
    """The data of each event of a server-sent event stream, read as the WHATWG spec
    frames it: lines end with LF, CRLF or a lone CR; an event's ``data:`` lines are joined
    with LF, and it ends at a blank line; comments and the other fields are skipped.

    Lenient where servers are sloppy, as the reader was when it took a line per event: the
    end of the body, or a ``data: [DONE]``, ends the event under way; so does a data line
    opening an object after one that closed one (no JSON has ``}`` then ``{``: the server
    left out the blank line). At most ``limit`` bytes in all, LLM_MAX_STREAM_LINE_BYTES a
    line. Its state lives here, not in locals, so a read may be cancelled at any time.
    """

    def __init__(self, content: aiohttp.StreamReader, limit: int) -> None:
        self._content = content
        self._limit = limit
        self._size = 0
        self._lines: deque[bytes] = deque()  # read, not yet looked at
        self._partial = bytearray()  # the start of a line whose end has not come yet
        self._after_cr = False  # the last read ended with CR: an LF first in the next ends no line
        self._eof = False
        # The event under way: its data lines, each ended by LF (not a list of lines: a
        # stream of short ones would take several times its size in memory).
        self._data = bytearray()

    async def next(self) -> bytes | None:
        """The data of the next event; None at the end of the body."""
        while True:
            if self._data == _DONE_LINE:  # the end's blank line is not waited for
                return self._take()
            if not self._lines:
                if self._eof:
                    return self._take() if self._data else None
                await self._read()
                continue
            line = self._lines.popleft().strip()
            if not line:
                if self._data:
                    return self._take()
            elif line.startswith(b"data:"):
                value = line[5:].strip()
                opens = value[:1] == b"{" and self._data[-2:] == b"}\n"
                if self._data and (value == _DONE or opens):
                    event = self._take()
                    self._data += value + b"\n"
                    return event
                self._data += value + b"\n"

    def _take(self) -> bytes:
        del self._data[-1]  # the LF after the last line
        event = bytes(self._data)
        self._data.clear()
        return event

    async def _read(self) -> None:
        """Split what came next into lines, keeping back the start of one not ended yet."""
        chunk = await self._content.readany()
        if not chunk:
            self._eof = True
            if self._partial:  # a last line without its end
                self._lines.append(bytes(self._partial))
                self._partial.clear()
            return
        self._size += len(chunk)
        if self._size > self._limit:
            raise LLMError(f"LLM response is larger than {self._limit} bytes")
        if self._size == len(chunk) and chunk.startswith(_BOM):  # the first read (the spec drops it)
            chunk = chunk[len(_BOM):]
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]  # a CRLF split between two reads ends one line, not two
        self._after_cr = chunk[-1:] == b"\r"
        if not chunk:
            return
        lines = chunk.splitlines()  # on LF, CRLF and CR only, as SSE's lines end
        tail = b"" if chunk[-1:] in (b"\n", b"\r") else lines.pop()
        if lines and self._partial:
            lines[0] = bytes(self._partial) + lines[0]
            self._partial.clear()
        self._partial += tail
        if len(self._partial) > LLM_MAX_STREAM_LINE_BYTES or (
                lines and max(map(len, lines)) > LLM_MAX_STREAM_LINE_BYTES):
            raise LLMError("malformed LLM stream: a line too long to read")
        self._lines.extend(lines)


class HttpEngine:
    """One long-lived aiohttp session per engine, created on the runtime's loop.

    ``read_timeout`` bounds each wait for data, ``request_timeout`` one whole
    attempt (connect, send, read the body), ``deadline`` the whole call: every
    attempt and every wait between them.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: SecretStr | str | None = None,
        connect_timeout: float = LLM_CONNECT_TIMEOUT_SECONDS,
        read_timeout: float = LLM_READ_TIMEOUT_SECONDS,
        request_timeout: float = LLM_REQUEST_TIMEOUT_SECONDS,
        deadline: float = LLM_DEADLINE_SECONDS,
        max_response_bytes: int = LLM_MAX_RESPONSE_BYTES,
        max_attempts: int = LLM_MAX_ATTEMPTS,
        max_in_flight: int = LLM_MAX_IN_FLIGHT,
        temperature: float | None = None,
        stream: bool = False,
        protocol: str = "auto",
        max_tokens: int | None = LLM_MAX_TOKENS,
        seed: int | None = None,
        context_tokens: int | None = None,
    ) -> None:
        if protocol != "auto" and protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be auto, {', '.join(PROTOCOLS)}; not {protocol!r}")
        base, basic_auth = split_credentials(base_url)
        self.url = base.rstrip("/") + "/chat/completions"
        self.model = model
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if key and basic_auth is not None:
            # One Authorization header: refuse now rather than fail every request.
            raise ValueError("give the LLM either an api_key or credentials in the base URL, "
                             "not both")
        # A SecretStr, so that no repr or dump of the engine shows it.
        self._authorization = SecretStr(f"Bearer {key}" if key else basic_auth or "")
        self._timeout = aiohttp.ClientTimeout(
            total=request_timeout, connect=connect_timeout,
            sock_connect=connect_timeout, sock_read=read_timeout,
        )
        self._timeouts_text = (f"connect {connect_timeout:g}s, read {read_timeout:g}s, "
                               f"whole request {request_timeout:g}s")
        self.deadline = deadline
        self.max_response_bytes = max_response_bytes
        self.max_attempts = max_attempts
        self.max_in_flight = max_in_flight
        self.temperature = temperature
        #: Ask for the reply as a stream (server-sent events) when a caller watches it grow.
        self.stream = stream
        #: As configured ("auto" or one protocol), and the one in use now: ``auto``
        #: moves down a level when the server refuses a feature, and stays there.
        self.protocol = protocol
        self.mode: Protocol = "tools" if protocol == "auto" else protocol  # type: ignore[assignment]
        self.max_tokens = max_tokens
        self.seed = seed
        #: What the server refused, once each: learnt, never retried.
        self.refused: set[str] = set()
        self._base = base.rstrip("/")
        #: The model's context window: configured, else what the server says (once).
        self.context_tokens = context_tokens
        #: What the server said of itself at the first call it answered (llama.cpp /props, ...).
        self.server_facts: dict[str, Any] = {}
        #: What the server said that keeps this engine from working as configured, for
        #: the status (None: nothing).
        self.problem: str | None = None
        self._discovered = False
        self._discovering: asyncio.Lock | None = None  # made on the loop, at the first call
        self._discovery_tries = 0  # tries that have ended, answered or not
        #: Calls the server answered though it did not answer what it is (see _discovery_missed).
        self._discovery_misses = 0
        #: The last request sent, as fitted, and its protocol: for ``last_request_tokens``.
        self._last_request: tuple[PromptRequest, Protocol] | None = None
        self._budget: ContextBudget | None = None
        #: Chats the server found too big at the whole budget: theirs, smaller, that fitted.
        self._narrowed = NarrowedChats()
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None

    def __repr__(self) -> str:  # never shows the key: the URL has no credentials left
        return f"HttpEngine({self.url!r}, model={self.model!r})"

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Content-Type": "application/json"}
            if self._authorization.get_secret_value():
                headers["Authorization"] = self._authorization.get_secret_value()
            connector = aiohttp.TCPConnector(limit=self.max_in_flight)
            reuse = aiohttp.TraceConfig()  # which requests a pooled connection carries (_Unanswered)
            reuse.on_connection_reuseconn.append(_mark_reused)
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=self._timeout, connector=connector, trace_configs=[reuse]
            )
            self._slots = asyncio.Semaphore(self.max_in_flight)
        return self._session

    async def answer(self, prompt: PromptRequest,
                     on_text: Callable[[str], None] | None = None) -> Completion:
        """The model's answer to ``prompt`` in the protocol this engine speaks now, the
        request fitted to the model's context window (one smaller try if the server
        still finds it too big; where that fits, the chat's next requests start at its
        size). Every call the turn makes shares one deadline."""
        until = asyncio.get_running_loop().time() + self.deadline
        try:
            async with asyncio.timeout_at(until):
                missed = await self._discover()
        except TimeoutError as exc:
            raise self._deadline_error(0, None, still="finding out what the server is") from exc
        shrunk = loosened = False
        asked_again: list[str] = []  # why, each time: for the error, if the turn fails after all
        while True:
            # Where the server's grammar broke, this call is asked once more as JSON in text.
            mode: Protocol = "text" if loosened else self.mode
            budget = self.budget
            if budget is not None and self._narrowed:  # only once some chat was refused as too big
                budget = self._narrowed.budget(prompt, budget)
            if budget is not None and shrunk:  # the server found this one too big: once more, smaller
                budget = budget.smaller()
            # A re-ask where a grammar holds the format goes without it, asked plainly.
            plain = mode == "json_schema" and prompt.reask > 0
            asked = plain_retry(prompt) if plain else prompt
            fitted = budget.fit(asked, mode) if budget is not None else asked
            body: dict[str, Any] = {"messages": render_openai_messages(fitted, mode)}
            # The tools or the response format: the same for every turn that allows these
            # actions, so encoded once (see _format_member).
            fixed = b""
            if mode == "tools":
                fixed = _format_member("tools", prompt.allowed_actions, registry_generation())
                if "tool_choice" not in self.refused:
                    # A delivery turn answers the user: a message tool, never prose.
                    must = prompt.mode == "delivery" and not prompt.may_stay_silent
                    body["tool_choice"] = "required" if must else "auto"
            elif mode == "json_schema" and not plain:
                fixed = _format_member("response_format", prompt.allowed_actions, registry_generation())
            self._last_request = (fitted, mode)
            if plain:
                mode = "text"
            try:
                completion = await self.chat(body, on_text, encoded=fixed, until=until)
                if mode == "json_schema" and completion.finish_reason == "length" and not _complete_json(
                        completion.text):
                    # A small model can loop inside the enforced JSON until its limit. A
                    # delivery's message text that came whole before the loop is its answer
                    # (a target means nothing there: it goes to the original chat); elsewhere
                    # the target cut off may have named another chat.
                    salvaged = _salvaged_message(completion.text) if prompt.mode == "delivery" else None
                    if salvaged is not None:
                        log.info("the model's answer ran to its token limit after a whole message; "
                                 "answering with that message")
                        completion = Completion(**{**completion.__dict__, "text": salvaged})
                    else:
                        # Ask once more, shorter and unconstrained (without the response
                        # format); a plain answer is a reply too.
                        completion = await self.chat(body, on_text, limit=LLM_SHORT_RETRY_TOKENS, until=until)
                        mode = "text"
            except LLMError as exc:
                if exc.context_exceeded and not shrunk:
                    shrunk = True
                    self._too_big(str(exc), budget)
                elif exc.constraint_failed and mode != "text" and not loosened:
                    # Not learnt: the grammar holds for most answers, and broke on this one.
                    loosened = True
                    log.warning("the LLM server's %s grammar broke while the model wrote (%s); "
                                "asking this turn once more as JSON in text", mode, str(exc)[:160])
                elif not self._learn(exc, mode):
                    if asked_again:
                        exc.args = (f"{exc} (asked again after: {'; '.join(asked_again)})",)
                    raise
                asked_again.append(str(exc)[:160])
                continue
            if shrunk and budget is not None:  # this chat's next requests start at the size that fitted
                self._narrowed.fitted(prompt, budget)
            if missed:  # the server answered this call, though not what it is
                self._discovery_missed()
            return Completion(**{**completion.__dict__, "protocol": mode, "model": completion.model or self.model})

    @property
    def last_request_tokens(self) -> int | None:
        """Estimated tokens of the last request sent (the budget in use, for the status).

        Estimated when asked, not on every call: that renders the whole request again.
        """
        if self._last_request is None:
            return None
        budget = self.budget  # counts a response format as this server does
        return budget.tokens(*self._last_request) if budget is not None else request_tokens(*self._last_request)

    @property
    def budget(self) -> ContextBudget | None:
        """The context budget, once the window is known. A response format counts as
        prompt tokens but where llama.cpp makes it a grammar beside the prompt (kept up
        with discovery, which may answer after the budget was made)."""
        if self._budget is None and self.context_tokens:
            self._budget = ContextBudget(self.context_tokens, self.max_tokens or 0)
        if self._budget is not None:
            self._budget.format_in_prompt = self.server_facts.get("server") != "llama.cpp"
        return self._budget

    def _too_big(self, error: str, budget: ContextBudget | None) -> None:
        """The server found the request, fitted to ``budget`` (None: the window unknown),
        too big: learn its window if it says (else take what was sent as too big), for
        every request from now on. The one smaller try at this request is ``answer``'s."""
        said = re.search(r'"n_ctx"\s*:\s*(\d+)', error)
        if said and not self.context_tokens:
            self.context_tokens = int(said.group(1))
        learnt = self.budget
        if learnt is None:  # the window is still unknown
            self._budget = learnt = ContextBudget((self.last_request_tokens or 0) + (self.max_tokens or 0),
                                                  self.max_tokens or 0)
        log.warning("the LLM server found a request too big for its context; asking once more "
                    "within %d tokens", (learnt if budget is None else budget).smaller().room)

    async def _discover(self) -> bool:
        """Ask the server, until it answers once, what it is: its context window and
        whether its chat template supports tools (llama.cpp ``/props``, vLLM
        ``/v1/models``, Ollama ``/api/show``). Anything it does not say stays unknown;
        nothing here fails a call. True when this call asked and got no answer (the
        server down, a timeout, a 5xx): the next call asks again."""
        if self._discovered:
            return False
        if self._discovering is None:
            self._discovering = asyncio.Lock()
        tries = self._discovery_tries
        async with self._discovering:  # the first calls all wait for it: none goes out unfitted
            if self._discovered or self._discovery_tries != tries:
                return False  # answered, or asked in vain while this call waited: not again now
            try:
                facts = await discover_server(self._open(), self._base, self.model)
            finally:
                self._discovery_tries += 1  # once it is over: the calls that waited for it see it
            if facts is None:
                return True
            self._discovered = True
        facts = self.server_facts = facts
        if not self.context_tokens and facts.get("context_tokens"):
            self.context_tokens = int(facts["context_tokens"])
            self._budget = None  # a guess made from a refusal while the window was unknown
        if self.protocol == "auto" and facts.get("supports_tools") is False and self.mode == "tools":
            self.mode = "json_schema"
            log.info("the LLM server's chat template does not support tools; speaking json_schema")
        elif self.protocol == "tools" and facts.get("supports_tools") is False:
            # The operator chose tools: kept, but no action can come back until this changes.
            self.problem = _NO_TOOLS
            log.warning("%s", _NO_TOOLS)

    def _discovery_missed(self) -> None:
        """The server answered a call but not what it is (a /props that fails or hangs
        while chats work): after ``_DISCOVERY_MISSES`` such calls it is no longer asked,
        so that asking does not slow every call; what it did not say stays unknown."""
        self._discovery_misses += 1
        if self._discovery_misses >= _DISCOVERY_MISSES and not self._discovered:
            self._discovered = True
            log.warning("the LLM server at %s answers calls but not what it is: no longer asking; "
                        "its context window stays unknown", self._base)

    def _learn(self, exc: LLMError, mode: Protocol) -> bool:
        """A refusal of a feature this call used: note it, and say whether to ask again."""
        if exc.status not in (400, 422) or isinstance(exc, _FailedMidway):
            return False  # a refusal comes before the answer, not in the middle of it
        text = str(exc).lower()
        if mode == "tools" and "tool_choice" in text and "tool_choice" not in self.refused:
            self.refused.add("tool_choice")
            log.warning("the LLM server refuses tool_choice; asking without it from now on")
            return True
        if self.protocol == "auto" and mode != "text" and refused_feature(exc, mode):
            self.refused.add(mode)
            self.mode = PROTOCOLS[PROTOCOLS.index(mode) + 1]
            log.warning("the LLM server refuses %s (%s); speaking %s from now on",
                        mode, str(exc)[:120], self.mode)
            return True
        return False

    async def complete(self, messages: list[dict[str, Any]],
                       on_text: Callable[[str], None] | None = None) -> str:
        """The text of the answer to plain ``messages`` (reasoning cut off)."""
        return (await self.chat({"messages": messages}, on_text)).text

    async def chat(self, body: dict[str, Any], on_text: Callable[[str], None] | None = None, *,
                   limit: int | None = None, encoded: bytes = b"", until: float | None = None) -> Completion:
        """POST ``body`` (messages and protocol fields; the model, limits and stream are
        added here) with retries under the deadline (or until the loop's time ``until``,
        when a turn of several calls shares one). With ``on_text`` (and ``stream`` on)
        the answer is streamed and ``on_text`` sees it grow. ``encoded`` holds members of
        the body already encoded as JSON (``"tools": [...]``), sent as they are."""
        watch = on_text if self.stream else None
        while True:
            sent = {"model": self.model, **body}
            if self.temperature is not None:
                sent["temperature"] = self.temperature
            if self.seed is not None:
                sent["seed"] = self.seed
            if self.max_tokens is not None:
                name = "max_completion_tokens" if "max_tokens" in self.refused else "max_tokens"
                budget = self.budget
                reserve = budget.reserve if budget is not None else self.max_tokens
                sent[name] = min(reserve, limit) if limit is not None else reserve
            if watch is not None:
                sent["stream"] = True
                if "stream_options" not in self.refused:
                    sent["stream_options"] = {"include_usage": True}
            payload = dump_json(sent)
            if encoded:  # spliced in before the closing brace: ``sent`` is never empty
                payload = b"%s,%s}" % (payload[:-1], encoded)
            try:
                return await self._send(payload, watch, constrained=bool(encoded) or "tools" in body
                                        or "response_format" in body, until=until)
            except LLMError as exc:
                if isinstance(exc, _FailedMidway) or not (exc.status == 400 and self._refused_parameter(exc)):
                    raise

    async def _send(self, payload: bytes, watch: Callable[[str], None] | None, *,
                    constrained: bool = False, until: float | None = None) -> Completion:
        """POST ``payload``, retrying what ``LLMError.retryable`` allows, at most
        ``max_attempts`` times in all, every attempt and wait under the deadline (or
        ``until``). Where the request carries a grammar (``constrained``: a response
        format, tools) and it broke, the error says so and is not retried as it was.

        A plain loop rather than tenacity's ``AsyncRetrying``, which was built and stepped
        through on every call: about 12 µs of the event loop's CPU per answer.
        """
        session = self._open()
        assert self._slots is not None
        attempts = 0  # these two for the deadline's message
        last: LLMError | None = None
        try:
            # The deadline cancels whatever is under way: the wait for a slot, an attempt,
            # or a wait between attempts.
            async with asyncio.timeout_at(until if until is not None
                                          else asyncio.get_running_loop().time() + self.deadline):
                async with self._slots:
                    while True:
                        attempts += 1
                        try:
                            return await self._post(session, payload, watch)
                        except _Unanswered as exc:  # a stale pooled connection, now dropped
                            last, attempts = exc, attempts - 1
                            continue
                        except LLMError as exc:
                            if constrained and _grammar_broke(exc):
                                exc.constraint_failed, exc.retryable = True, False
                                raise
                            if not exc.retryable or attempts >= self.max_attempts:
                                raise
                            last = exc
                        await asyncio.sleep(_retry_wait(last, attempts))
        except TimeoutError as exc:  # _post turns its own timeouts into LLMError
            raise self._deadline_error(attempts, last, still=None if attempts else
                                       f"waiting for one of the {self.max_in_flight} calls in flight to end") from exc

    def _refused_parameter(self, exc: LLMError) -> bool:
        """A 400 refusing ``max_tokens`` or ``stream_options``: ask the other way, once each
        (a refusal of ``max_completion_tokens`` after that is the call's error, never a loop).

        It refuses one it names as the parameter refused (OpenAI's current models: "Unsupported
        parameter: 'max_tokens' ... Use 'max_completion_tokens' instead"), or the one it names
        alone; never one it names because the request did not fit (vLLM's "'max_tokens' or
        'max_completion_tokens' is too large")."""
        if exc.context_exceeded:
            return False
        text = str(exc).lower()
        for name in ("max_tokens", "stream_options"):
            if name in self.refused:
                continue
            if _names_refused(text, name) or (name in text and "max_completion_tokens" not in text):
                self.refused.add(name)
                log.warning("the LLM server refuses %s; asking %s from now on", name,
                            "with max_completion_tokens" if name == "max_tokens" else "without it")
                return True
        return False

    def _deadline_error(self, attempts: int, last: LLMError | None, *, still: str | None = None) -> LLMError:
        """The deadline passed: say what was ``still`` under way before any attempt, or how
        many attempts were made and how the last one ended."""
        because = f"; last error: {last}" if last is not None else ""
        where = f"still {still}" if still else f"{attempts} attempt(s)"
        return LLMError(f"LLM request timed out: no answer within the {self.deadline:g}s deadline ({where}){because}")

    async def _post(self, session: aiohttp.ClientSession, payload: bytes,
                    on_text: Callable[[str], None] | None = None) -> Completion:
        answered, connection = False, {"reused": False}
        try:
            # Never redirected: an answer at another address is a configuration to fix, and
            # following it would mix the hops' connections (see _Unanswered).
            async with session.post(self.url, data=payload, trace_request_ctx=connection,
                                    allow_redirects=False) as resp:
                answered = True
                if resp.status == 200 and resp.content_type == "text/event-stream":
                    return await self._streamed(resp, on_text)
                raw = await self._read(resp)
                if resp.status != 200:
                    # Only the start of an error body is shown; bad bytes are fine there.
                    text = raw.decode("utf-8", errors="replace")
                    if 300 <= resp.status < 400:
                        text = (f"it redirects to {resp.headers.get('Location', '?')[:200]!r}; point the "
                                f"base URL there. {text}")
                    raise self._http_error(resp.status, resp.headers.get("Retry-After"), text)
                encoding = resp.charset or "utf-8"  # JSON is UTF-8 unless the server says
        except asyncio.TimeoutError as exc:
            raise LLMError(f"LLM request timed out ({self._timeouts_text})",
                           retryable=True) from exc
        except aiohttp.ClientError as exc:
            # Only a reused connection can be stale; a new one that fails is the server's doing.
            stale = (connection["reused"] and not answered
                     and isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))
                     and not isinstance(exc, aiohttp.ClientConnectorError))
            raise (_Unanswered if stale else LLMError)(f"cannot reach the LLM at {self.url}: {exc}",
                                                       retryable=True) from exc
        return self._content(raw, encoding)

    async def _streamed(self, resp: aiohttp.ClientResponse,
                        on_text: Callable[[str], None] | None) -> Completion:
        """The answer of an OpenAI-style stream: events of deltas, then ``[DONE]``.

        Bounded like a whole body; an event that is not a delta is an error, and so is a
        stream cut before its end (retried). ``on_text`` sees the answer so far, reasoning
        cut off, at most every STREAM_WATCH_SECONDS, so a long reply is not joined once
        per delta.
        """
        stream = _Stream()
        events = _Events(resp.content, self.max_response_bytes)
        seen, finished = -STREAM_WATCH_SECONDS, False
        replied = False  # some of the reply came: till then, a finish reason ends nothing
        whole = False  # a finish reason came, and nothing of the reply after it
        clock = asyncio.get_running_loop().time
        while True:
            if not whole:
                data = await events.next()
            else:  # what may follow (the usage, [DONE]) is not waited for long
                try:
                    data = await asyncio.wait_for(events.next(), LLM_STREAM_END_GRACE_SECONDS)
                except TimeoutError:
                    log.debug("the LLM's stream stayed open after its reply ended; read no further")
                    break
            if data is None:  # the end of the body
                break
            if data == _DONE:
                finished = True
                break
            try:
                chunk = _loads(data)
                if not isinstance(chunk, dict):
                    raise TypeError("a chunk is not an object")
                error = chunk.get("error")
                grew = False if error is not None else stream.take(chunk)
            except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
                raise LLMError(f"malformed LLM stream: {data[:200]!r}") from exc
            if error is not None:  # the server failed part way (llama.cpp ends the stream here)
                code = error.get("code") if isinstance(error, dict) else None
                status = code if isinstance(code, int) and 400 <= code <= 599 else 500
                raise self._http_error(status, None, data.decode("utf-8", errors="replace"), streamed=True)
            finished = finished or stream.finish_reason is not None
            # Some proxies put a finish reason on every chunk, the first (its role, no text)
            # too, long before the model's first token: the reply is whole only once some of
            # it came and then a chunk with a finish reason and nothing more of it.
            adds = _adds_to_reply(chunk)
            replied = replied or adds
            whole = replied and stream.finish_reason is not None and not adds
            if grew and on_text is not None and clock() - seen >= STREAM_WATCH_SECONDS:
                seen = clock()
                on_text(stream.partial())
        if not finished:
            raise LLMError("the LLM's stream ended before the reply did", retryable=True)
        return stream.completion()

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        """The body, at most ``max_response_bytes`` of it.

        An answer (200) that is bigger is an error; an error body that is bigger is
        cut, since only its start is ever shown.
        """
        limit = self.max_response_bytes
        too_big = LLMError(f"LLM response is larger than {limit} bytes")
        if resp.status == 200 and resp.content_length is not None and resp.content_length > limit:
            raise too_big  # said so up front: no need to read it
        body = bytearray()
        async for chunk in resp.content.iter_any():
            body += chunk
            if len(body) > limit:
                if resp.status == 200:
                    raise too_big
                return bytes(body[:limit])
        return bytes(body)

    @staticmethod
    def _content(raw: bytes, encoding: str) -> Completion:
        """The answer in a completion body; LLMError for anything else."""
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:  # bad bytes, or a charset Python lacks
            raise LLMError(f"LLM response is not valid {encoding.upper()} text: "
                           f"{raw[:100]!r}") from exc
        try:
            data = _loads(text)
            choice = data["choices"][0]
            message = choice["message"]
            content = _message_text(message.get("content"))
            calls = _tool_calls(message.get("tool_calls"))
            thought = _note(message.get("reasoning_content") or message.get("reasoning")) or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
            # RecursionError: json nests as deep as the server likes.
            raise LLMError(f"malformed LLM response: {text[:200]!r}") from exc
        if content is None:  # null content: tool calls only, or an empty answer
            content = ""
        if not isinstance(content, str):
            raise LLMError(f"LLM response has no text content: {text[:200]!r}")
        answer, inline = split_reasoning(content)
        reasoning = "\n".join(x for x in (thought, inline) if x)
        return Completion(text=answer, tool_calls=calls, reasoning=reasoning, usage=_usage(data.get("usage")),
                          finish_reason=_note(choice.get("finish_reason")),
                          model=_model_name(data.get("model")) or "")

    @staticmethod
    def _http_error(status: int, retry_after_header: str | None, text: str, *, streamed: bool = False) -> LLMError:
        """What an error status (or, ``streamed``, an error event in a stream) says: whether
        to retry, and whether the request did not fit."""
        retry_after = parse_retry_after(retry_after_header)
        quota = status == 429 and "insufficient_quota" in text
        retryable = (status in RETRY_STATUSES or status >= 500) and not quota
        if retry_after is not None and retry_after > LLM_MAX_RETRY_AFTER_SECONDS:
            retryable = False
        what = "quota exhausted" if quota else f"HTTP {status}"
        lower = text.lower()
        exceeded = status == 400 and "context" in lower and any(w in lower for w in _CONTEXT_WORDS[1:])
        return (_FailedMidway if streamed else LLMError)(
            f"LLM answered {what}{' in its stream' if streamed else ''}: {text[:200]}", status=status,
            retry_after=retry_after, retryable=retryable, context_exceeded=exceeded)

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> HttpEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


#: How long each try at finding out what the server is may take, at most.
_DISCOVERY_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
#: Protocol ``tools`` with a server whose chat template has none: the model never calls one.
_NO_TOOLS = ("the LLM server's chat template does not support tools, but the protocol is set to tools: "
             "no action will run; set AUTORESPONSE_LLM__PROTOCOL=auto or json_schema, or start "
             "llama-server with --jinja and a chat template that has tools")
#: Calls a server answers without answering what it is, before it is no longer asked.
_DISCOVERY_MISSES = 3


class _NoAnswer(Exception):
    """A discovery request got no answer: no connection, a timeout, a 5xx."""


async def discover_server(session: aiohttp.ClientSession, base: str, model: str) -> dict[str, Any] | None:
    """What an OpenAI-compatible server says of the model it serves: ``context_tokens``
    and ``supports_tools`` where it says; ``server`` names which kind answered. {} when
    it answers without saying (a 404 is an answer); None when it does not answer."""
    try:
        return await _server_facts(session, base, model)
    except _NoAnswer:
        return None


async def _server_facts(session: aiohttp.ClientSession, base: str, model: str) -> dict[str, Any]:
    root = base.removesuffix("/v1")
    facts: dict[str, Any] = {}
    props = await _get_json(session, "GET", f"{root}/props")
    if isinstance(props, dict) and ("default_generation_settings" in props or "n_ctx" in props):
        settings = _object(props.get("default_generation_settings"))
        caps = _object(props.get("chat_template_caps"))
        facts.update(server="llama.cpp",
                     context_tokens=_window(settings.get("n_ctx")) or _window(props.get("n_ctx")))
        if isinstance(caps.get("supports_tools"), bool):
            facts["supports_tools"] = caps["supports_tools"]
        return facts
    models = await _get_json(session, "GET", f"{base}/models")
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        for entry in models["data"]:
            if isinstance(entry, dict) and _window(entry.get("max_model_len")) and (
                    entry.get("id") == model or len(models["data"]) == 1):
                return {"server": "vllm", "context_tokens": _window(entry["max_model_len"])}
    shown = await _get_json(session, "POST", f"{root}/api/show", {"model": model})
    if isinstance(shown, dict) and isinstance(shown.get("model_info"), dict):
        # Ollama serves num_ctx (its parameters, else its default), not the model's maximum.
        found = re.search(r"num_ctx\s+(\d+)", str(shown.get("parameters") or ""))
        most = next((w for k, v in shown["model_info"].items()
                     if k.endswith(".context_length") and (w := _window(v))), None)
        window = (_window(found.group(1)) if found else None) or min(most or OLLAMA_DEFAULT_CONTEXT,
                                                                     OLLAMA_DEFAULT_CONTEXT)
        return {"server": "ollama", "context_tokens": window}
    return facts


#: Ollama's context when a model sets no num_ctx.
OLLAMA_DEFAULT_CONTEXT = 4096


def _object(value: Any) -> dict[str, Any]:
    """A member of what a server says of itself that should be an object; {} (nothing
    said) when it is not: discovery never fails a call."""
    return value if isinstance(value, dict) else {}


def _window(value: Any) -> int | None:
    """A context window a server reports, in tokens; None (unknown) unless it is one."""
    try:
        return _count(value) or None
    except ValueError:
        return None


async def _get_json(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    """The JSON the server answers at ``url``; None where it answers anything else (a
    404, not JSON). Raises ``_NoAnswer`` where it does not answer."""
    try:
        async with session.request(method, url, json=body, timeout=_DISCOVERY_TIMEOUT) as resp:
            if resp.status >= 500:  # down for now (llama.cpp's 503 while it loads the model)
                raise _NoAnswer(f"HTTP {resp.status}")
            if resp.status != 200:
                return None
            raw = await resp.content.read(256 * 1024)
            return json.loads(raw)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise _NoAnswer(str(exc)) from exc
    except (ValueError, RecursionError):  # not JSON
        return None
