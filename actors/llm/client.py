"""The LLM client actor: asks the LLM, concurrently, and forwards the answers."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from autoresponse.actors.actor import TypedActor, handles
from autoresponse.actors.limits import LLM_MAX_IN_FLIGHT
from autoresponse.actors.llm.engine import LLMEngine, LLMError
from autoresponse.actors.prompts import build_chat_request, render_openai_messages
from autoresponse.actors.receipts import receipt_failed
from autoresponse.actors.routes import DISPATCHER, autonomous_actions, chat_actions, sender
from autoresponse.messages import (
    Envelope,
    LLMFailure,
    LLMReply,
    LLMRequest,
    OutboundMessage,
    PromptRequest,
    UserRequest,
)

log = logging.getLogger("autoresponse.llm")

UNREACHABLE_NOTICE = "Sorry, I could not reach the language model, so I could not answer this."


class LLMClient(TypedActor):
    """Chat turns from user requests, delivery turns from the builder.

    Every call runs on the runtime's event loop, so many are in flight at once;
    the engine bounds how many.
    """

    def __init__(self, engine: LLMEngine, max_in_flight: int = LLM_MAX_IN_FLIGHT,
                 autonomous: Iterable[str] = ()) -> None:
        super().__init__()
        self.engine = engine
        self.io_limit = max_in_flight
        #: Command action types an autonomous turn (a public mention) may use besides replying.
        self.autonomous = tuple(autonomous)

    @handles
    def on_user_request(self, request: UserRequest, env: Envelope) -> None:
        ctx = request.context
        allowed = (autonomous_actions(self.runtime, ctx.interface_name, self.autonomous) if ctx.autonomous
                   else chat_actions(self.runtime, ctx.interface_name))
        if not allowed:
            self.runtime.dead_letters.post(env, "no sender", actor=self.name,
                                           detail=f"nothing can reply on {ctx.interface_name!r}")
            return
        self._ask(build_chat_request(request.text, ctx, allowed_actions=allowed, turns=request.turns), env)

    @handles
    def on_llm_request(self, request: LLMRequest, env: Envelope) -> None:
        self._ask(request.prompt, env)

    def _ask(self, prompt: PromptRequest, env: Envelope) -> None:
        self.run_io(self._complete(prompt, render_openai_messages(prompt)), cause=env)

    async def _complete(self, prompt: PromptRequest, messages: list[dict[str, str]]) -> LLMReply | LLMFailure:
        try:
            text = await self.engine.complete(messages)
        except LLMError as exc:
            return LLMFailure(prompt=prompt, error=str(exc), status=exc.status)
        except Exception as exc:
            # An engine bug or a surprise it let through: crashing would replay the call
            # and then drop the turn silently; as a failure the user still hears back.
            log.exception("the LLM engine %r failed unexpectedly", self.engine)
            return LLMFailure(prompt=prompt, error=f"unexpected {type(exc).__name__}: {exc}")
        return LLMReply(prompt=prompt, text=text)

    @handles
    def on_llm_reply(self, reply: LLMReply, env: Envelope) -> None:
        self.send(DISPATCHER, reply, cause=env)

    @handles
    def on_llm_failure(self, failure: LLMFailure, env: Envelope) -> None:
        self.runtime.dead_letters.post(env, "llm unavailable", actor=self.name, detail=failure.error)
        ctx = failure.prompt.original_context
        if receipt_failed(self, ctx, env, f"llm unavailable: {failure.error}"):
            return  # whoever asked for the receipt decides what the user hears
        self.send(sender(ctx.interface_name), OutboundMessage.reply(ctx, UNREACHABLE_NOTICE, notice=True),
                  cause=env)
