"""The retry actor: re-asks the LLM after an invalid reply, a bounded number of times.

The supervisor routes every rejection (an error system message plus the prompt
it answered) to one retry actor of its pool, chosen by correlation. The re-ask
carries ``error_retry_policy``, the errors, an excerpt of ``your_reply`` and the
``positions`` of the rejected reply (carried out or rejected); the valid actions
have already run, and the answer may only replace the rejected places, so nothing
runs or is delivered twice. In the tools protocol the rejected calls are answered
with ``tool`` turns, not a fresh user message.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.kernel.backoff import BackoffPolicy
from autoresponse.actors.limits import (
    MAX_ERRORS_SHOWN,
    RETRY_BACKOFF_MAX_SECONDS,
    RETRY_BACKOFF_MIN_SECONDS,
    RETRY_MAX_ATTEMPTS,
    RETRY_POOL_SIZE,
)
from autoresponse.actors.prompts import build_reask_request
from autoresponse.actors.receipts import receipt_failed, settle_receipt
from autoresponse.actors.routes import LLM, sender
from autoresponse.messages import Envelope, LLMRequest, Outcome, OutboundMessage, Rejection

#: What the user hears when a turn gives up having carried out nothing: asking again is safe.
GIVE_UP_NOTICE = "Sorry, I could not work out how to do that. Please try rephrasing your request."
#: ... when it gives up after part of the request was carried out (a command run, a message
#: sent): asking for the whole again would do that part twice.
PARTLY_DONE_NOTICE = "Sorry, I did part of what you asked, but could not work out the rest."
#: ... when a delivery turn gives up, by what became of what was asked (``PromptRequest.outcome``):
#: only the answer about it is missing, so none invites asking again blindly.
OUTCOME_NOTICES: dict[Outcome, str] = {
    "done": "I did what you asked, but could not put the answer together. It is done: no need to ask again.",
    "failed": "What you asked did not succeed, and I could not put the answer together. "
              "Please check before asking again.",
    "running": "What you asked is still running, and I could not put the answer together. "
               "Its result will follow when it ends.",
    "denied": "What you asked needed approval and was denied: it did not run.",
}
#: The outcomes of a delivery turn whose actions ran (its request was carried out, well or not).
RAN: frozenset[Outcome | None] = frozenset({"done", "failed", "running"})
#: The notice of a delivery turn whose actions all ran and succeeded.
DONE_NOTICE = OUTCOME_NOTICES["done"]


def give_up_notice(rejection: Rejection) -> str:
    """What the user is told when ``rejection``'s turn runs out of re-asks: it says what was
    done already, and invites a retry only when nothing was."""
    outcome = rejection.prompt.outcome
    if outcome is not None:
        return OUTCOME_NOTICES[outcome]
    return PARTLY_DONE_NOTICE if rejection.carried_out else GIVE_UP_NOTICE


#: The most retry actors a pool may hold: each is a thread, started before the daemon
#: serves (100000 never finished starting); re-asks are a few at a time.
RETRY_POOL_MAX = 64


class RetrySettings(BaseModel):
    max_attempts: int = Field(default=RETRY_MAX_ATTEMPTS, ge=0, description="re-asks per turn")
    max_errors: int = Field(default=MAX_ERRORS_SHOWN, ge=1, description="errors shown per re-ask")
    backoff_min: float = Field(default=RETRY_BACKOFF_MIN_SECONDS, ge=0)
    backoff_max: float = Field(default=RETRY_BACKOFF_MAX_SECONDS, ge=0)
    notify_user: bool = True
    pool_size: int = Field(default=RETRY_POOL_SIZE, ge=1, le=RETRY_POOL_MAX)

    def delay(self, reask: int) -> float:
        """Wait before re-ask number ``reask + 1``."""
        return BackoffPolicy(min=self.backoff_min, max=self.backoff_max, jitter=0).delay(reask + 1)


class RetryActor(TypedActor):
    def __init__(self, settings: RetrySettings) -> None:
        super().__init__()
        self.settings = settings

    @handles
    def on_rejection(self, rejection: Rejection, env: Envelope) -> None:
        prompt = rejection.prompt
        reask = build_reask_request(prompt, rejection.message, carried_out=rejection.carried_out,
                                    sent=rejection.sent, positions=rejection.positions,
                                    tool_calls=rejection.tool_calls, max_errors=self.settings.max_errors)
        # A reply cut off at its token limit gets one shorter try, not more: a model that
        # rambles would ramble again, and each try costs a whole reply's time.
        limit = min(self.settings.max_attempts, 1) if rejection.cut_off else self.settings.max_attempts
        if prompt.reask >= limit:
            self._give_up(rejection, reask.model_copy(update={"reask": 0}), env)
            return
        self.schedule(self.settings.delay(prompt.reask), LLMRequest(prompt=reask), cause=env)

    @handles
    def on_reask(self, request: LLMRequest, env: Envelope) -> None:
        self.send(LLM, request, cause=env)

    def _give_up(self, rejection: Rejection, fresh: object, env: Envelope) -> None:
        """Dead-letter the turn (replaying it re-asks with a fresh budget) and tell the user
        (``give_up_notice``: what was done already, if anything). A reminder's turn is its
        scheduler's to tell of and try again, unless its actions ran: then it was carried
        out, and its user hears what became of it, as anyone's would."""
        attempts = rejection.prompt.reask
        self.runtime.dead_letters.post(
            env.child(LLMRequest(prompt=fresh)), "retries exhausted", actor=LLM,
            detail=f"still invalid after {attempts} re-asks: " + "; ".join(rejection.message.errors),
        )
        ctx = rejection.prompt.original_context
        why = f"retries exhausted: {'; '.join(rejection.message.errors)}"
        if rejection.prompt.outcome in RAN:  # a reminder's command ran: trying it again would run it again
            settle_receipt(self, ctx, env, ok=True, detail=f"its actions ran; the answer about them: {why}")
        elif receipt_failed(self, ctx, env, why):
            return  # whoever asked for the receipt decides what the user hears
        to = sender(ctx.interface_name)
        # An autonomous turn (a stranger's, unasked) the bot may leave unanswered: on X or
        # Reddit a notice would be a public post a stranger's words could make it write.
        if self.settings.notify_user and not ctx.autonomous and self.runtime.has(to):
            self.send(to, OutboundMessage.reply(ctx, give_up_notice(rejection), notice=True), cause=env)
