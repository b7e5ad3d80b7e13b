"""The LLM client actor: asks the LLM, concurrently, and forwards the answers.

It reports its health as an interface does: failing, with why, while the LLM fails every
request (away, refusing the key, failing with 5xx, its circuit open, a context window its
instructions alone fill), so ``/healthz``, the status and the metrics say so; healthy again
once it answers.

A request the LLM fails gets a notice that says what became of it: what its commands
came to, when any ran or any of its reply went out (``failures.notice_of``), else why it
failed (too long, the model away, the window too small for the bot), so that nobody asks
again for a command that ran.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from autoresponse.actors.cancellation import abort_io, is_cancelled
from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.dispatcher import message_key, turn_key
from autoresponse.actors.failures import notice_of
from autoresponse.actors.limits import LLM_MAX_IN_FLIGHT, PREVIEW_MIN_CHARS, PREVIEW_SECONDS
from autoresponse.actors.llm.budget import WINDOW_TOO_SMALL, WindowTooSmall
from autoresponse.actors.llm.chain import EngineChain, outage_of
from autoresponse.actors.llm.engine import LLMEngine, LLMError
from autoresponse.actors.llm.media import MediaReader, unsupported, unsupported_notice
from autoresponse.actors.llm.usage import UsageMeter, turn_kind
from autoresponse.actors.retry import GIVE_UP_NOTICE
from autoresponse.actors.prompts import build_chat_request
from autoresponse.actors.receipts import receipt_failed
from autoresponse.actors.routes import DISPATCHER, autonomous_actions, chat_actions, sender
from autoresponse.actors.streaming import preview_text, withdrawal
from autoresponse.messages.approval import CancelWork
from autoresponse.messages import (
    Envelope,
    LLMFailure,
    LLMReply,
    LLMRequest,
    OutboundMessage,
    PromptRequest,
    OriginalContext,
    UserRequest,
    message_action_for,
)


def chat_key(context: OriginalContext) -> str:
    """A chat across interfaces, for usage and budgets."""
    return f"{context.interface_name}:{context.chat_id}"

log = logging.getLogger("autoresponse.llm")

UNREACHABLE_NOTICE = "Sorry, I could not reach the language model, so I could not answer this."
BUDGET_NOTICE = ("Sorry, this chat has used today's share of the language model. Your message is kept, "
                 "and I can answer it later.")
TOO_LONG_NOTICE = "Sorry, this is too long for the language model to read; please send it shorter."
#: The bot's own instructions fill the model's window: nothing the user sends would fit.
WINDOW_NOTICE = ("Sorry, the language model's context window is too small for the bot's instructions, "
                 "so I could not answer this; the operator was told.")


class LLMClient(TypedActor):
    """Chat turns from user requests, delivery turns from the builder.

    Every call runs on the runtime's event loop, so many are in flight at once;
    the engine bounds how many.
    """

    def __init__(self, engine: LLMEngine, max_in_flight: int = LLM_MAX_IN_FLIGHT,
                 autonomous: Iterable[str] = (), meter: UsageMeter | None = None,
                 media: MediaReader | None = None) -> None:
        super().__init__()
        self.engine = engine
        self.io_limit = max_in_flight
        #: Command action types an autonomous turn (a public mention) may use besides replying.
        self.autonomous = tuple(autonomous)
        #: Tokens counted per model, turn kind and chat; the chats' daily budget.
        self.meter = meter or UsageMeter()
        #: Reads what a message carried besides words (photos, files, voice) before a chat turn.
        self.media = media or MediaReader()
        #: Whether the LLM may be marked failing: a success by the main engine then clears
        #: it, and costs nothing while it is not (true at first: a mark outlives a restart).
        self._maybe_failing = True

    @handles
    def on_user_request(self, request: UserRequest, env: Envelope) -> None:
        if is_cancelled(self.runtime, env.correlation_id):
            return  # its user cancelled it: late work of it is dropped
        ctx = request.context
        allowed = (autonomous_actions(self.runtime, ctx.interface_name, self.autonomous) if ctx.autonomous
                   else chat_actions(self.runtime, ctx.interface_name))
        if not allowed:
            self.runtime.dead_letters.post(env, "no sender", actor=self.name,
                                           detail=f"nothing can reply on {ctx.interface_name!r}")
            return
        chat = chat_key(ctx)
        if self.meter.over_budget(chat):
            # Nothing is lost: the request waits as a dead letter, to replay another day.
            self.runtime.dead_letters.post(env, "token budget", actor=self.name,
                                           detail=f"{chat} used its {self.meter.daily_tokens_per_chat} tokens today")
            if self.meter.first_refusal_today(chat):
                self.send(sender(ctx.interface_name), OutboundMessage.reply(ctx, BUDGET_NOTICE, notice=True),
                          cause=env)
            return
        if not request.text.strip() and unsupported(request.attachments):  # a video alone: say so, ask nothing
            self.send(sender(ctx.interface_name),
                      OutboundMessage.reply(ctx, unsupported_notice(request.attachments), notice=True), cause=env)
            return
        prompt = build_chat_request(request.text, ctx, allowed_actions=allowed, turns=request.turns,
                                    now=self.runtime.clock.time())
        if request.attachments:
            prompt = prompt.model_copy(update={"attachments": request.attachments})
        self._ask(prompt, env)

    @handles
    def on_llm_request(self, request: LLMRequest, env: Envelope) -> None:
        if is_cancelled(self.runtime, env.correlation_id):
            return  # its user cancelled it: late work of it is dropped
        self._ask(request.prompt, env)

    def _ask(self, prompt: PromptRequest, env: Envelope) -> None:
        watch = self._previewer(prompt, env) if getattr(self.engine, "stream", False) else None
        call = self._complete(prompt, watch, env)
        spans = self.runtime.tracer.spans if self.runtime.tracer is not None else None
        if spans is not None:  # OpenTelemetry: the call is a span of its own (autoresponse.otel)
            call = getattr(spans, "llm_call")(env, call, self.engine)
        self.run_io(call, cause=env)

    def _previewer(self, prompt: PromptRequest, env: Envelope) -> Callable[[str], bool] | None:
        """While a first answer is streamed and reads as a reply to its chat, its text so
        far goes to the chat's sender as a preview, at most one every PREVIEW_SECONDS,
        keyed as the dispatcher will key the final reply (its first action)."""
        ctx = prompt.original_context
        model = message_action_for(ctx.interface_name)
        if model is None or prompt.reask or prompt.carried_out:
            return None  # a re-ask's first action may not be the reply the user saw growing
        wanted, to = model.action_type(), sender(ctx.interface_name)
        key = message_key(turn_key(env.correlation_id, prompt), 0)
        # The first preview waits PREVIEW_SECONDS too: a reply that comes quickly is
        # simply sent, and only a slow one is shown as it grows.
        clock = self.runtime.clock
        last_at, last_text = clock.monotonic(), ""

        def on_text(partial: str) -> bool:
            nonlocal last_at, last_text
            found = preview_text(partial)
            now = clock.monotonic()
            if (found is None or found[0] != wanted or len(found[1].strip()) < PREVIEW_MIN_CHARS
                    or now - last_at < PREVIEW_SECONDS or found[1] == last_text):
                return bool(last_text)
            last_at, last_text = now, found[1]
            self.send(to, OutboundMessage.reply(ctx, last_text, key=key, preview=True), cause=env)
            return True
        return on_text

    async def _read_media(self, prompt: PromptRequest, env: Envelope) -> PromptRequest | None:
        """The chat turn's attachments read for the model (downloads, transcription), on the
        loop; a file too large gets its notice now. None: nothing is left to ask."""
        asked, notices, left = await self.media.read(prompt)
        ctx = prompt.original_context
        for notice in notices:
            self.send(sender(ctx.interface_name), OutboundMessage.reply(ctx, notice, notice=True), cause=env)
        return asked if left else None

    async def _complete(self, prompt: PromptRequest, watch: Callable[[str], bool] | None = None,
                        env: Envelope | None = None) -> LLMReply | LLMFailure | None:
        started = self.runtime.clock.monotonic()
        previewed = False
        asked = prompt  # what the engine is sent: the attachments read (never kept in the reply)
        if prompt.attachments and prompt.system_message is None and env is not None:
            read = await self._read_media(prompt, env)
            if read is None:
                return None
            asked = read

        def on_text(partial: str) -> None:
            nonlocal previewed
            previewed = watch(partial) if watch is not None else False

        try:
            answer = await (self.engine.answer(asked) if watch is None
                            else self.engine.answer(asked, on_text))
        except asyncio.CancelledError:  # its user cancelled it (or the daemon stops)
            if previewed and env is not None:
                self._withdraw(prompt, env)
            raise
        except LLMError as exc:
            self._report_health(exc)
            return LLMFailure(prompt=prompt, error=str(exc), status=exc.status, previewed=previewed,
                              too_long=exc.context_exceeded or exc.status == 413)
        except Exception as exc:
            # An engine bug or a surprise it let through: crashing would replay the call
            # and then drop the turn silently; as a failure the user still hears back.
            log.exception("the LLM engine %r failed unexpectedly", self.engine)
            return LLMFailure(prompt=prompt, error=f"unexpected {type(exc).__name__}: {exc}", previewed=previewed)
        if answer.failed or self._maybe_failing:  # a fallback answered, or a mark to clear
            self._report_health()
        if log.isEnabledFor(logging.DEBUG):  # its arguments cost more than the check, every call
            # Logged on the loop, with the request's correlation id (the task inherits it).
            log.debug("the LLM answered in %.3fs (%d characters, %d tool calls, %s)",
                      self.runtime.clock.monotonic() - started, len(answer.text), len(answer.tool_calls),
                      answer.protocol)
            if answer.reasoning:
                log.debug("the LLM reasoned (%d characters; kept off the actions)", len(answer.reasoning))
        return LLMReply(prompt=prompt, text=answer.text, tool_calls=answer.tool_calls, previewed=previewed,
                        usage=answer.usage, engine=answer.engine, model=answer.model,
                        finish_reason=answer.finish_reason, protocol=answer.protocol)

    def _report_health(self, error: LLMError | None = None) -> None:
        """What this call says of the LLM: failing while it fails every request, healthy
        once it answers; a failure of this request's own (too long, refused for its
        content, a garbled answer) says neither. A chain's main engine counts, though a
        fallback stands in for it. A window too small for the bot's instructions fails
        every request too, whoever sends it. The mark outlives a restart of this actor: the
        LLM down is this actor degraded, never crashing."""
        if isinstance(error, WindowTooSmall):
            down: str | None = str(error)
        elif isinstance(self.engine, EngineChain):
            down = self.engine.outage()
        elif error is None:
            down = None
        elif (down := outage_of(error)) is None:
            return
        self.report_health(down is None, down or "")
        self._maybe_failing = down is not None

    def _withdraw(self, prompt: PromptRequest, env: Envelope) -> None:
        """Take back the preview the chat saw of a reply that will not be finished (its
        call failed, or its user cancelled it): left, a half reply reads as the answer."""
        ctx = prompt.original_context
        key = message_key(turn_key(env.correlation_id, prompt), 0)
        self.send(sender(ctx.interface_name), withdrawal(ctx, key), cause=env)

    @handles
    def on_llm_reply(self, reply: LLMReply, env: Envelope) -> None:
        if is_cancelled(self.runtime, env.correlation_id):
            if reply.previewed:
                self._withdraw(reply.prompt, env)
            return  # its user cancelled it: late work of it is dropped
        kind = turn_kind(reply.prompt)
        self.meter.add(chat_key(reply.prompt.original_context), kind=kind, model=reply.model or "?",
                       engine=reply.engine or "main", usage=reply.usage)
        tracer = self.runtime.tracer
        if tracer is not None:  # what the call cost and who answered, on the request's trace
            usage, engine, model = reply.usage, reply.engine or "main", reply.model or "?"
            finish = reply.finish_reason or "?"
            if usage:
                tracer.note(env, "LLMReply", "{} turn by {} ({}, {}): {}+{} tokens, finish {}", kind, engine, model,
                            reply.protocol, usage.prompt_tokens, usage.completion_tokens, finish)
            else:
                tracer.note(env, "LLMReply", "{} turn by {} ({}, {}): usage unknown, finish {}", kind, engine, model,
                            reply.protocol, finish)
        self.send(DISPATCHER, reply, cause=env)

    @handles
    def on_llm_failure(self, failure: LLMFailure, env: Envelope) -> None:
        if failure.previewed:  # the chat saw a reply start that will not be finished
            self._withdraw(failure.prompt, env)
        if is_cancelled(self.runtime, env.correlation_id):
            return  # its user cancelled it: late work of it is dropped
        self.runtime.dead_letters.post(env, "llm unavailable", actor=self.name, detail=failure.error)
        ctx = failure.prompt.original_context
        if receipt_failed(self, ctx, env, f"llm unavailable: {failure.error}"):
            return  # whoever asked for the receipt decides what the user hears
        self.send(sender(ctx.interface_name), OutboundMessage.reply(ctx, failure_notice(failure), notice=True),
                  cause=env)

    @handles
    def on_cancel(self, cancel: CancelWork, env: Envelope) -> None:
        """A user cancelled: their calls under way are aborted (the HTTP request is closed),
        and nothing of them comes back."""
        aborted = abort_io(self, cancel.correlations)
        if aborted:
            log.info("aborted %d LLM call(s) of a cancelled request in %s", aborted, cancel.chat)


def failure_notice(failure: LLMFailure) -> str:
    """What the user hears of ``failure``: what became of their request where its commands
    ran or part of its reply went out (asking again would run them twice), else why."""
    if failure.error.startswith(WINDOW_TOO_SMALL):
        why = WINDOW_NOTICE
    elif failure.too_long and failure.prompt.system_message is not None:
        why = GIVE_UP_NOTICE  # a re-ask or delivery the runtime wrote: not the user's to shorten
    else:
        why = TOO_LONG_NOTICE if failure.too_long else UNREACHABLE_NOTICE  # reached, and refused
    return notice_of(failure, nothing_done=why)
