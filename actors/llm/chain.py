"""A chain of engines: the main one, then fallbacks, each behind a circuit breaker.

When the main engine's retries are exhausted, or its circuit is open, the next engine
is asked, and so on; ``offline`` may close the chain with a short "I can't think right
now" notice. Each answer says which engine gave it, and ``EngineChain.outage`` why the
main engine cannot answer anyone now (the LLM client reports it as its health).

>>> chain = EngineChain([("main", HttpEngine(url, model="big")),             # doctest: +SKIP
...                      ("local", HttpEngine(local, model="small")),
...                      ("offline", NoticeEngine())])
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from autoresponse.actors.limits import LLM_BREAKER_COOLDOWN_SECONDS, LLM_BREAKER_FAILURES
from autoresponse.actors.llm.budget import WindowTooSmall
from autoresponse.actors.llm.engine import Completion, LLMEngine, LLMError
from autoresponse.actors.llm.offline import OfflineEngine
from autoresponse.messages import PromptRequest, message_action_for

log = logging.getLogger("autoresponse.llm")

THINKING_NOTICE = "Sorry, I can't think right now: the language model is unavailable. Please try again later."


class CircuitBreaker:
    """After ``failures`` failures in a row, skip the engine for ``cooldown`` seconds; then
    let one call through (half open) while the others go on to the fallbacks: a success
    closes it, a failure opens it again. Used from the event loop's thread only."""

    def __init__(self, failures: int = LLM_BREAKER_FAILURES, cooldown: float = LLM_BREAKER_COOLDOWN_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self._clock = clock
        self.consecutive = 0
        self.opened_at: float | None = None
        self._probing = False  # the one call let through while half open is under way

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "open" if self._clock() - self.opened_at < self.cooldown else "half-open"

    def allows(self) -> bool:
        """Whether a call may go to the engine now; while half open, only the first does
        (it is the probe), until it ends."""
        state = self.state
        if state == "closed":
            return True
        if state == "open" or self._probing:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        self.consecutive, self.opened_at, self._probing = 0, None, False

    def failure(self) -> None:
        self.consecutive += 1
        self._probing = False
        if self.consecutive >= self.failures or self.opened_at is not None:
            self.opened_at = self._clock()

    def abandoned(self) -> None:
        """A call ended saying nothing of the engine (it was cancelled): a probe may go again."""
        self._probing = False


def unavailable(exc: LLMError) -> bool:
    """Whether ``exc`` says the engine cannot answer anyone (unreachable, timed out, a 5xx,
    a 429, a key or model it refuses, an answer it garbled), not that it refused this one
    request (another 4xx: its content, its size), which says nothing of the next."""
    status = exc.status
    return status is None or not 400 <= status < 500 or status in _UNAVAILABLE_4XX


#: The 4xx statuses that refuse every request alike: a key (401, 403), a model or an
#: address (404), a timeout (408), a rate or a quota (429).
_UNAVAILABLE_4XX = frozenset({401, 403, 404, 408, 429})

#: What each of those statuses says of the server, for an operator.
_REFUSALS = {401: "the LLM server refuses the key", 403: "the LLM server refuses the key",
             404: "the LLM server knows no such model or address", 408: "the LLM server times requests out",
             429: "the LLM server turns requests away (a rate limit or a quota)"}


def outage_of(exc: LLMError) -> str | None:
    """Why ``exc`` says the LLM server fails every request, in one line for an operator
    (the status, never the body: it may quote the key), or None when it failed this one
    alone: too long, refused for its content, an answer garbled or timed out, a format
    the server broke while the model wrote."""
    if isinstance(exc, WindowTooSmall):  # no request fits this engine: a fallback may have room
        return str(exc)
    status = exc.status
    if exc.context_exceeded or exc.constraint_failed:
        return None
    if status is None:
        return _unreachable(exc.__cause__)
    if status in _REFUSALS:
        return f"{_REFUSALS[status]}: HTTP {status}"
    if status >= 500:  # the engine's retries are behind it
        return f"the LLM server fails: HTTP {status}"
    if status < 400:  # a redirect, or no completion at all
        return f"the LLM server answers HTTP {status}, not a completion"
    return None


def _unreachable(cause: BaseException | None) -> str | None:
    """Why the call never reached the server, when ``cause`` (what the engine's error was
    raised from) says so: refused, no such host, TLS, a connect timeout, the connection
    dropped; never a read that timed out (a slow answer is not a server away)."""
    if isinstance(cause, aiohttp.ClientConnectorError):  # refused, no such host, TLS
        os_error = cause.os_error
        why = "connection refused" if isinstance(os_error, ConnectionRefusedError) else os_error.strerror
        return f"cannot reach the LLM server at {cause.host}:{cause.port}: {why or cause}"
    reading = isinstance(cause, aiohttp.ServerTimeoutError) and not isinstance(cause, aiohttp.ConnectionTimeoutError)
    if isinstance(cause, aiohttp.ClientConnectionError) and not reading:
        return " ".join(f"cannot reach the LLM server: {cause}".split())
    return None


class NoticeEngine:
    """The last resort: a chat turn gets a short notice that the model is away; a delivery
    turn gets the offline engine's plain presentation of the output."""

    stream = False

    def __init__(self, notice: str = THINKING_NOTICE) -> None:
        self.notice = notice
        self._offline = OfflineEngine()

    async def answer(self, prompt: PromptRequest, on_text: Callable[[str], None] | None = None) -> Completion:
        if prompt.mode == "delivery" and prompt.system_message is not None and prompt.system_message.type != "error":
            return await self._offline.answer(prompt)
        model = message_action_for(prompt.original_context.interface_name)
        kind = model.action_type() if model is not None else "message_console"
        return Completion(text=json_actions(kind, self.notice), engine="offline")

    async def aclose(self) -> None:
        return None

    def __repr__(self) -> str:
        return "NoticeEngine()"


def json_actions(kind: str, text: str) -> str:
    """One message action, as an LLM would write it."""
    return json.dumps({"actions": [{"type": kind, "payload": {"text": text}}]}, ensure_ascii=False)


class EngineChain:
    """Engines asked in order until one answers; a failing one is skipped while its
    circuit is open. Only the first may stream (a fallback answers whole)."""

    def __init__(self, engines: list[tuple[str, LLMEngine]], *, failures: int = LLM_BREAKER_FAILURES,
                 cooldown: float = LLM_BREAKER_COOLDOWN_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not engines:
            raise ValueError("an engine chain needs at least one engine")
        self.engines = engines
        self.breakers = {name: CircuitBreaker(failures, cooldown, clock) for name, _ in engines}
        #: Why an engine fails everyone (``outage_of``), by name: set by such a failure,
        #: cleared by whatever closes its circuit.
        self._down: dict[str, str] = {}
        self.stream = bool(getattr(engines[0][1], "stream", False))

    async def answer(self, prompt: PromptRequest, on_text: Callable[[str], None] | None = None) -> Completion:
        failed: list[str] = []
        last: LLMError | None = None
        for n, (name, engine) in enumerate(self.engines):
            breaker = self.breakers[name]
            if not breaker.allows():
                failed.append(f"{name}: circuit open")
                continue
            try:
                answer = await (engine.answer(prompt, on_text) if n == 0 and on_text is not None
                                else engine.answer(prompt))
            except LLMError as exc:
                if exc.context_exceeded and not isinstance(exc, WindowTooSmall):
                    breaker.abandoned()
                    raise  # the request is too big for this model: the caller shrinks it
                if not unavailable(exc):  # it answered: this request, not the engine, was refused
                    breaker.success()
                    self._down.pop(name, None)
                else:
                    breaker.failure()
                    down = outage_of(exc)
                    if down is not None:
                        self._down[name] = down
                    if breaker.state == "open":
                        log.warning("LLM engine %s failed %d times in a row; skipping it for %gs",
                                    name, breaker.consecutive, breaker.cooldown)
                failed.append(f"{name}: {exc}")
                last = exc
                continue
            except BaseException:
                breaker.abandoned()
                raise
            breaker.success()
            self._down.pop(name, None)
            if failed:
                log.info("answered by the fallback engine %s (%s)", name, "; ".join(failed))
            return dataclasses.replace(answer, engine=name, failed=tuple(failed))
        raise LLMError("no LLM engine could answer: " + "; ".join(failed),
                       status=last.status if last is not None else None)

    def outage(self) -> str | None:
        """Why the main engine cannot answer anyone now, though a fallback may stand in:
        its circuit is open (or half open, a probe not yet back), or its last call found
        it away; None while it answers."""
        name = self.engines[0][0]
        breaker, down = self.breakers[name], self._down.get(name)
        if breaker.opened_at is not None:
            because = f" ({down})" if down else ""
            return f"{name}: circuit open after {breaker.failures} failures in a row{because}"
        return f"{name}: {down}" if down else None

    def status(self) -> list[dict[str, Any]]:
        return [{"name": name, "engine": repr(engine), "circuit": self.breakers[name].state,
                 "failures_in_a_row": self.breakers[name].consecutive,
                 "protocol": getattr(engine, "mode", "text"),
                 "context_tokens": getattr(engine, "context_tokens", None),
                 "problem": getattr(engine, "problem", None)}
                for name, engine in self.engines]

    async def aclose(self) -> None:
        for _, engine in self.engines:
            await engine.aclose()

    def __repr__(self) -> str:
        return "EngineChain(" + ", ".join(f"{name}={engine!r}" for name, engine in self.engines) + ")"
