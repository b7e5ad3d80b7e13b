"""The auto-response builder: action results go back to the LLM, never straight to the user.

It turns an action's output, or a reminder that fell due, into a delivery turn:
a system message for the LLM, after the chat's memory. The outputs of the
commands of one LLM reply are gathered into ONE delivery turn (one reply): it
waits for all of them up to ``batch_wait`` seconds, then delivers what is done
and says what is still running (whatever finishes later comes in a turn of its own).
A crash loses no output and repeats none: the outputs it held go back to its mailbox
and are gathered again, within the same wait (see ``_BatchBook``). What the outputs of each
request came to is remembered for the notice of a reply about them that dies on its way
(``delivered_outcome``): the reply does not show it.

From a thread, or awaited from a coroutine (the seed's interfaces do the latter)::

    >>> request_llm_delivery("Filesystem  Use%\\n/dev/sda1  42%", {"chat_id": 42,
    ...     "message_id": 7, "interface_name": "telegram_bot"},
    ...     action_type="terminal", command="df -h")                    # doctest: +SKIP
    >>> await request_llm_delivery(output, original_context=ctx,
    ...                            action_type="terminal", command="df -h")  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Generator, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.kernel import IoTask
from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.limits import BATCH_WAIT_SECONDS
from autoresponse.actors.memory import ConversationStore, action_record
from autoresponse.actors.prompts import build_delivery_request, full_json_instructions
from autoresponse.actors.routes import BUILDER, LLM, autonomous_actions, delivery_actions
from autoresponse.actors.kernel.runtime import Runtime
from autoresponse.messages import (
    ActionOutput,
    ActionResult,
    Envelope,
    EventDue,
    LLMRequest,
    OriginalContext,
    Outcome,
    SystemMessage,
)


#: Batches remembered (whose wait ran out, or that are gathering), the oldest forgotten first.
_BATCHES_KEPT = 1_000
#: Requests whose delivered outcome is remembered (``DeliveredOutcomes``), the oldest forgotten
#: first: it is asked for only while a reply about their outputs is on its way (the LLM's
#: answer, then its sender's attempts).
_OUTCOMES_KEPT = 10_000


class BatchDue(BaseModel):
    """The wait for the rest of a batch's outputs is over."""

    model_config = ConfigDict(frozen=True)

    key: str


class _BatchBook:
    """What a builder knows of its batches that a crash must not make it forget: when
    each batch's wait ends, and which batches are over (complete, or their wait ran out:
    their outputs were delivered as they were). A restarted builder gathers a batch again
    from the outputs put back in its mailbox; without this it would wait the full time
    again, and take a late output of a batch already delivered (a command still running
    then, or a dead letter's replay) for a new batch, calling the delivered ones still running.

    Only facts are written here, each once it is true, so the state of a crashed
    incarnation is never trusted; one book per cell (``Cell.book``), bounded.
    """

    __slots__ = ("deadlines", "over")

    def __init__(self) -> None:
        self.deadlines: OrderedDict[str, float] = OrderedDict()  # key → clock.monotonic() its wait ends
        #: key → the messages its outputs came in (one of them back after a crash is done with).
        self.over: OrderedDict[str, frozenset[str]] = OrderedDict()

    def deadline(self, key: str, wait: float, now: float) -> float:
        """When the wait for ``key`` ends: set by the first output seen (at ``now``), kept
        across crashes."""
        if key not in self.deadlines:
            self.deadlines[key] = now + wait
            _trim(self.deadlines)
        return self.deadlines[key]

    def ended(self, key: str, delivered: Iterable[str]) -> None:
        """The batch ``key`` was delivered, with the outputs of the messages ``delivered``."""
        self.deadlines.pop(key, None)
        self.over[key] = frozenset(delivered)
        _trim(self.over)


def _trim(kept: OrderedDict[str, Any], most: int = _BATCHES_KEPT) -> None:
    while len(kept) > most:
        kept.popitem(last=False)


class DeliveredOutcomes:
    """What the commands of each request came to, as the builder delivered their outputs
    (its delivery turns' ``PromptRequest.outcome``), by correlation. A reply that dies on its
    way shows nothing of it, and its failure notice must not invite asking again when a
    command ran (``actors.failures``). A cell book: a fact once the outputs are in hand, kept
    across the builder's crashes; bounded; written by the builder, read from any thread."""

    __slots__ = ("_lock", "_outcomes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes: OrderedDict[str, Outcome] = OrderedDict()

    def record(self, correlation: str, outcome: Outcome) -> None:
        with self._lock:
            # A failure stays: a later turn of the request (a batch's late output) is not all of it.
            if self._outcomes.get(correlation) != "failed":
                self._outcomes[correlation] = outcome
            self._outcomes.move_to_end(correlation)
            _trim(self._outcomes, _OUTCOMES_KEPT)

    def get(self, correlation: str) -> Outcome | None:
        with self._lock:
            return self._outcomes.get(correlation)


def delivered_outcome(runtime: Runtime, correlation: str) -> Outcome | None:
    """What the commands of the request ``correlation`` came to, as the builder delivered
    their outputs; None when it delivered none (nothing ran, as far as it knows)."""
    if not runtime.has(BUILDER):
        return None
    return runtime.cell(BUILDER).book(DeliveredOutcomes).get(correlation)


class _Gathering:
    """The outputs of one batch so far, and the envelopes they came in (held)."""

    __slots__ = ("commands", "held", "results", "timer")

    def __init__(self, commands: tuple[str, ...]) -> None:
        self.commands = commands
        self.results: dict[int, tuple[ActionResult, ...]] = {}
        self.held: list[Envelope] = []
        self.timer: IoTask | None = None


class AutoResponseBuilder(TypedActor):
    """Turns action output and due events into a delivery turn for the LLM."""

    def __init__(self, store: ConversationStore | None = None, *, batch_wait: float = BATCH_WAIT_SECONDS,
                 autonomous: Iterable[str] = ()) -> None:
        super().__init__()
        self.store = store
        self.batch_wait = batch_wait
        #: Command action types a reminder's turn may use besides replying.
        self.autonomous = tuple(autonomous)
        self._gathering: dict[str, _Gathering] = {}
        self._book = self.cell.book(_BatchBook)
        self._outcomes = self.cell.book(DeliveredOutcomes)

    @handles
    def on_output(self, output: ActionOutput, env: Envelope) -> None:
        batch = output.batch
        over = self._book.over.get(batch.key) if batch is not None else None
        if batch is None or over is not None:
            if over is None or env.message_id not in over:  # else delivered with its batch, back after a crash
                self._deliver_output(output.original_context, output.results, env)
            return
        gathering = self._gathering.get(batch.key)
        if gathering is None:
            gathering = self._gathering[batch.key] = _Gathering(batch.commands)
            # The timer has no cause: the held outputs are the batch's work in flight, and a
            # crash puts them back. An output as its cause too would come back twice, be
            # held twice, and keep its correlation in flight for ever.
            now = self.runtime.clock.monotonic()
            left = self._book.deadline(batch.key, self.batch_wait, now) - now
            gathering.timer = self.schedule(max(left, 0.0), BatchDue(key=batch.key))
        gathering.results[batch.index] = output.results
        if all(held.message_id != env.message_id for held in gathering.held):
            # The same output again (a crash in its own handler puts it back both as held
            # and as the message it was handling): it is held once, released once.
            self.hold(env)
            gathering.held.append(env)
        if len(gathering.results) >= len(gathering.commands):
            self._complete(batch.key, output.original_context)

    @handles
    def on_batch_due(self, due: BatchDue, env: Envelope) -> None:
        gathering = self._gathering.get(due.key)
        if gathering is not None:
            self._complete(due.key, gathering.held[0].body.original_context, timed_out=True)

    def _complete(self, key: str, ctx: OriginalContext, *, timed_out: bool = False) -> None:
        gathering = self._gathering.pop(key)
        results = [r for index in sorted(gathering.results) for r in gathering.results[index]]
        if timed_out:
            running = [c for n, c in enumerate(gathering.commands) if n not in gathering.results]
            results.append(ActionResult(action_type="note", output=(
                f"still running after {self.batch_wait:g}s: {', '.join(running)}; "
                "its output will come in a message of its own")))
        else:
            self.cancel(gathering.timer)
        self._deliver_output(ctx, results, gathering.held[-1])
        # Over once delivered: a crash before, and its outputs, back, are gathered again into
        # one turn (each once, the last one's wait kept), not delivered one by one.
        self._book.ended(key, (held.message_id for held in gathering.held))
        for held in gathering.held:
            self.release(held)

    @handles
    def on_event(self, due: EventDue, env: Envelope) -> None:
        ctx = due.context
        allowed = autonomous_actions(self.runtime, ctx.interface_name, self.autonomous)
        self._deliver(ctx, env, allowed, self._turns(ctx), may_stay_silent=True, type="event", event=due.event)

    def _deliver_output(self, ctx: OriginalContext, results: Iterable[ActionResult], env: Envelope) -> None:
        results = tuple(results)
        turns = self._turns(ctx)  # what came before; this output travels in the system message
        if self.store is not None:
            for result in results:
                if result.action_type != "note":
                    self.store.append(ctx.chat_key, "user", action_record(result), kind="action")
        allowed = delivery_actions(self.runtime, ctx.interface_name)
        self._deliver(ctx, env, allowed, turns, type="output", outputs=results)

    def _turns(self, ctx: OriginalContext) -> list[Any]:
        return self.store.recent(ctx.chat_key) if self.store is not None else []

    def _deliver(self, ctx: OriginalContext, env: Envelope, allowed: tuple[str, ...], turns: list[Any],
                 *, may_stay_silent: bool = False, **content: Any) -> None:
        if not allowed:
            self.runtime.dead_letters.post(env, "no sender", actor=self.name,
                                           detail=f"nothing can reply on {ctx.interface_name!r}")
            return
        message = SystemMessage(original_context=ctx, full_json_instructions=full_json_instructions(allowed),
                                **content)
        prompt = build_delivery_request(message, allowed_actions=allowed, turns=turns, now=self.runtime.clock.time(),
                                        may_stay_silent=may_stay_silent)
        if prompt.outcome is not None:  # outputs, not a reminder: its commands ran, or were refused
            self._outcomes.record(env.correlation_id, prompt.outcome)
        self.send(LLM, LLMRequest(prompt=prompt), cause=env)


class DeliveryRequested:
    """What ``request_llm_delivery`` returns: already sent; awaiting it gives the envelope."""

    __slots__ = ("envelope",)

    def __init__(self, envelope: Envelope | None) -> None:
        #: The envelope sent to the builder (its correlation follows the delivery), or
        #: None if it was dead-lettered at once.
        self.envelope = envelope

    def __await__(self) -> Generator[Any, None, Envelope | None]:
        return _ready(self.envelope).__await__()

    def __repr__(self) -> str:
        return f"DeliveryRequested({self.envelope!r})"


async def _ready(envelope: Envelope | None) -> Envelope | None:
    return envelope


def request_llm_delivery(
    output: str | None,
    original_context: OriginalContext | Mapping[str, Any],
    action_type: str,
    command: str | None = None,
    action_outputs: Iterable[ActionResult | Mapping[str, Any]] | None = None,
    *,
    runtime: Runtime | None = None,
    cause: Envelope | None = None,
) -> DeliveryRequested:
    """Deliver action output to the user through the LLM. Call it from any thread, or
    ``await`` it from a coroutine; either way it is sent before it returns.

    ``original_context`` is an ``OriginalContext`` or the seed's dict (extra keys,
    such as ``action_specific_data``, travel to the delivery prompt). ``output``
    (with ``action_type`` and ``command``) is one result; ``action_outputs`` adds
    more, all delivered in ONE turn.
    """
    ctx = (original_context if isinstance(original_context, OriginalContext)
           else OriginalContext.model_validate(dict(original_context)))
    results: list[ActionResult] = []
    if output is not None:
        results.append(ActionResult(action_type=action_type, command=command, output=output))
    for item in action_outputs or ():
        results.append(item if isinstance(item, ActionResult) else ActionResult(**item))
    body = ActionOutput(original_context=ctx, results=tuple(results))
    return DeliveryRequested((runtime or Runtime.current()).send(BUILDER, body, cause=cause))
