"""Recorded conversations (cassettes): a live session as JSON lines, replayed offline.

::

    autoresponse record session.jsonl    # serve as `run` does, and record
    autoresponse replay session.jsonl    # offline: the recorded LLM replies, the sends compared

One event a line: a ``header`` (what the session allowed), then in the order they
happened ``inbound`` (what started a request: a user's message, an event's turn),
``llm`` (what the LLM was asked within a request, and what it answered) and ``send``
(a message handed to a sender). A replay starts the same requests again, one at a
time, with the same correlation ids; each request's LLM calls are answered, in
order, by what it was answered then; and what the senders are handed must match,
chat by chat, or the replay prints the difference::

    >>> result = replay(Cassette.load(path))               # doctest: +SKIP
    >>> result.matches, result.diff                        # doctest: +SKIP
    (True, [])

A bug report's session, recorded, becomes a regression test: ``tests/cassettes/``.
"""

from __future__ import annotations

import difflib
import io
import json
import tempfile
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ValidationError

from autoresponse import messages
from autoresponse.actors.kernel import Runtime
from autoresponse.actors.kernel.actor import current_correlation
from autoresponse.actors.llm import Completion, LLMEngine, LLMError
from autoresponse.actors.prompts import render_openai_messages
from autoresponse.actors.routes import CONVERSATIONS, LLM, SENDER_PREFIX, sender
from autoresponse.actors.sender import DeliverySender
from autoresponse.config import Settings
from autoresponse.messages import Envelope, OutboundMessage, PromptRequest, ToolCall
from autoresponse.supervisors import platforms

CASSETTE_VERSION = 1

#: What a request is started by: the actors whose first message of a correlation is one.
_STARTS = (CONVERSATIONS, LLM)

#: The settings a cassette keeps: what decides which actions a replayed turn may take.
_KEPT_SECTIONS = ("terminal", "runtime")


#: The text fields each kind of line must have.
_REQUIRED = {"inbound": ("to", "correlation", "type"), "send": ("to", "chat_id", "text"), "llm": ()}


class CassetteError(ValueError):
    """A cassette that cannot be read: says which line, and why."""


def _send_line(to: str, message: OutboundMessage) -> dict[str, Any]:
    return {"to": to, "chat_id": str(message.chat_id), "text": message.text, "notice": message.notice}


class CassetteRecorder:
    """Writes what a running application takes in, asks, answers and sends.

    Each line is flushed as it is written: a session killed half way keeps what it
    did up to then. ``attach`` before the application starts; ``close`` after it stops.
    """

    def __init__(self, path: str | Path, settings: Settings) -> None:
        self.path = Path(path)
        self._file: TextIO = self.path.open("w", encoding="utf-8")
        self._lock = threading.Lock()
        self._started: set[str] = set()
        self._untaps: list[Callable[[], None]] = []
        kept = {name: settings.section(name).model_dump(mode="json") for name in _KEPT_SECTIONS}
        self._write({"kind": "header", "version": CASSETTE_VERSION, "recorded": time.time(), "settings": kept})

    def _write(self, line: dict[str, Any]) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.write(json.dumps(line, ensure_ascii=False) + "\n")
                self._file.flush()

    def engine(self, engine: LLMEngine) -> LLMEngine:
        """``engine``, with each of its answers recorded."""
        return _RecordingEngine(engine, self)

    def attach(self, runtime: Runtime) -> None:
        """Watch what starts requests and what every platform's sender is handed."""
        for name in _STARTS:
            self._untaps.append(runtime.watch(name, lambda env, to=name: self._inbound(to, env)))
        for platform in platforms():
            to = sender(platform.name)
            self._untaps.append(runtime.watch(to, lambda env, to=to: self._sent(to, env)))

    def _inbound(self, to: str, env: Envelope) -> None:
        with self._lock:
            if env.correlation_id in self._started:
                return
            self._started.add(env.correlation_id)
        body = env.body
        self._write({"kind": "inbound", "to": to, "correlation": env.correlation_id,
                     "type": type(body).__name__, "body": body.model_dump(mode="json")})

    def _sent(self, to: str, env: Envelope) -> None:
        message = env.body
        if isinstance(message, OutboundMessage) and not message.preview:
            self._write({"kind": "send", "correlation": env.correlation_id, **_send_line(to, message)})

    def llm(self, messages: list[dict[str, Any]], answer: Completion | None, error: str | None) -> None:
        line: dict[str, Any] = {"kind": "llm", "correlation": current_correlation.get(), "messages": messages}
        if answer is None:
            line["error"] = error
        else:
            line["reply"] = answer.text
            if answer.tool_calls:
                line["tool_calls"] = [call.model_dump() for call in answer.tool_calls]
        self._write(line)

    def close(self) -> None:
        for untap in self._untaps:
            untap()
        with self._lock:
            self._file.close()


class _RecordingEngine:
    def __init__(self, engine: LLMEngine, recorder: CassetteRecorder) -> None:
        self._engine = engine
        self._recorder = recorder
        self.stream = getattr(engine, "stream", False)

    async def answer(self, prompt: PromptRequest, *more: Any) -> Completion:
        messages = render_openai_messages(prompt)  # as a reader of the cassette reads them
        try:
            answer = await self._engine.answer(prompt, *more)
        except LLMError as exc:
            self._recorder.llm(messages, None, str(exc))
            raise
        self._recorder.llm(messages, answer, None)
        return answer

    async def aclose(self) -> None:
        await self._engine.aclose()

    def __repr__(self) -> str:
        return f"recorded {self._engine!r}"


@dataclass
class Cassette:
    """A recording, read back."""

    settings: dict[str, Any]
    inbound: list[dict[str, Any]]
    llm: list[dict[str, Any]]
    sends: list[dict[str, Any]]

    @classmethod
    def load(cls, path: str | Path) -> Cassette:
        lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
        with Path(path).open(encoding="utf-8", errors="strict") as file:
            for number, raw in enumerate(file, 1):
                if not raw.strip():
                    continue
                try:
                    line = json.loads(raw)
                    kind = line["kind"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise CassetteError(f"{path}:{number}: not a cassette line ({exc})") from None
                except RecursionError:  # lists or objects nested past what Python's parser takes
                    raise CassetteError(f"{path}:{number}: not a cassette line (it nests lists or "
                                        "objects too deeply to be read as JSON)") from None
                missing = [key for key in _REQUIRED.get(kind, ()) if not isinstance(line.get(key), str)]
                if missing or kind == "llm" and not isinstance(line.get("reply", line.get("error")), str):
                    raise CassetteError(f"{path}:{number}: a {kind!r} line without "
                                        f"{', '.join(missing) or 'a reply or an error'}")
                lines[kind].append(line)
        headers = lines["header"]
        if len(headers) != 1 or headers[0].get("version") != CASSETTE_VERSION:
            raise CassetteError(f"{path}: not a version {CASSETTE_VERSION} cassette (one header line expected)")
        for line in lines["inbound"]:
            _message(line)  # every request reads, before any is replayed
        return cls(settings=headers[0].get("settings") or {}, inbound=lines["inbound"],
                   llm=lines["llm"], sends=lines["send"])

    @property
    def replayable_sends(self) -> list[dict[str, Any]]:
        """The sends of the recorded requests. An interface's own answer that started no
        request (a stranger's refusal) is left out: a replay starts at the requests."""
        started = {line["correlation"] for line in self.inbound}
        return [line for line in self.sends if line.get("correlation") in started]

    @property
    def interfaces(self) -> set[str]:
        """Every interface the session answered on, or could have."""
        found = {line["to"].removeprefix(SENDER_PREFIX) for line in self.sends}
        for line in self.inbound:
            body = line["body"]
            context = body.get("context") or (body.get("prompt") or {}).get("original_context") or {}
            if context.get("interface_name"):
                found.add(context["interface_name"])
        return found


class _ReplayEngine:
    """Answers each request's LLM calls with what that request was answered, in order."""

    def __init__(self, recorded: list[dict[str, Any]]) -> None:
        self._answers: dict[str | None, deque[dict[str, Any]]] = defaultdict(deque)
        for line in recorded:
            self._answers[line.get("correlation")].append(line)
        self._lock = threading.Lock()

    async def answer(self, prompt: PromptRequest, *more: Any) -> Completion:
        correlation = current_correlation.get()
        with self._lock:
            answers = self._answers.get(correlation)
            line = answers.popleft() if answers else None
        if line is None:
            raise LLMError(f"the cassette holds no more LLM replies for request {correlation}")
        if "error" in line:
            raise LLMError(line["error"])
        calls = tuple(ToolCall.model_validate(call) for call in line.get("tool_calls") or ())
        return Completion(text=str(line["reply"]), tool_calls=calls, engine="cassette")

    async def aclose(self) -> None:
        pass

    def __repr__(self) -> str:
        return "a cassette's recorded replies"


class _CapturedDelivery:
    """What a stand-in sender is handed, in order; everything counts as delivered."""

    def __init__(self, to: str, sends: list[dict[str, Any]], lock: threading.Lock) -> None:
        self.to, self._sends, self._lock = to, sends, lock

    async def deliver(self, message: OutboundMessage) -> list[Any]:
        with self._lock:
            self._sends.append(_send_line(self.to, message))
            return [len(self._sends)]


@dataclass
class ReplayResult:
    expected: list[dict[str, Any]]
    got: list[dict[str, Any]]
    unfinished: list[str] = field(default_factory=list)

    @property
    def diff(self) -> list[str]:
        """A unified diff of the sends, chat by chat (empty when they match)."""
        return list(difflib.unified_diff(_by_chat(self.expected), _by_chat(self.got),
                                         "recorded", "replayed", lineterm=""))

    @property
    def matches(self) -> bool:
        return not self.diff and not self.unfinished


def _by_chat(sends: list[dict[str, Any]]) -> list[str]:
    """One line a send, grouped by chat (the order across chats depends on timing; the
    order within one does not)."""
    chats: dict[tuple[str, str], list[str]] = defaultdict(list)
    for line in sends:
        note = " (notice)" if line.get("notice") else ""
        chats[(line["to"], line["chat_id"])].append(f"  {json.dumps(line['text'], ensure_ascii=False)}{note}")
    return [row for (to, chat), texts in sorted(chats.items()) for row in [f"{to} chat {chat}:", *texts]]


def replay(cassette: Cassette, *, timeout: float = 60.0) -> ReplayResult:
    """Run the cassette's requests again, offline, one at a time; what was sent, compared.

    Nothing outside is touched: no platform is mounted but the terminal (with the
    recorded allowlist), every sender is a stand-in, memory lives in a temporary
    directory, and the LLM is the recording.
    """
    from autoresponse.app import Application  # the composition root; cassettes sit beside it

    kept = {name: cassette.settings[name] for name in _KEPT_SECTIONS if name in cassette.settings}
    sends: list[dict[str, Any]] = []
    lock = threading.Lock()
    unfinished: list[str] = []
    with tempfile.TemporaryDirectory(prefix="autoresponse-replay-") as data_dir:
        settings = Settings.load(data_dir=data_dir, journal={"enabled": False}, admin={"enabled": False},
                                 console={"read_stdin": False}, **kept)
        app = Application(settings, engine=_ReplayEngine(cassette.llm), console=_quiet_console(),
                          mount=("terminal",))
        for name in sorted(cassette.interfaces):
            to = sender(name)
            app.extra_actors[to] = (DeliverySender, (_CapturedDelivery(to, sends, lock),))
        with app:
            for line in cassette.inbound:
                app.runtime.send(line["to"], _message(line), correlation_id=line["correlation"])
                if not app.runtime.wait_idle(line["correlation"], timeout):
                    unfinished.append(line["correlation"])
    return ReplayResult(expected=cassette.replayable_sends, got=sends, unfinished=unfinished)


def _message(line: dict[str, Any]) -> Any:
    """The protocol message an ``inbound`` line holds."""
    model = getattr(messages, str(line.get("type")), None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise CassetteError(f"an inbound line holds an unknown message type {line.get('type')!r}")
    try:
        return model.model_validate(line["body"])
    except (ValidationError, KeyError) as exc:
        raise CassetteError(f"an inbound {model.__name__} does not read: {exc}") from None


def _quiet_console() -> Any:
    from autoresponse.interfaces.console import Console

    return Console(io.StringIO())
