"""The auto-response builder: action results go back to the LLM, never straight to the user.

From a thread, or awaited from a coroutine (the seed's interfaces do the latter)::

    >>> request_llm_delivery("Filesystem  Use%\\n/dev/sda1  42%", {"chat_id": 42,
    ...     "message_id": 7, "interface_name": "telegram_bot"},
    ...     action_type="terminal", command="df -h")                    # doctest: +SKIP
    >>> await request_llm_delivery(output, original_context=ctx,
    ...                            action_type="terminal", command="df -h")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from typing import Any

from autoresponse.actors.actor import TypedActor, handles
from autoresponse.actors.prompts import build_delivery_request, full_json_instructions
from autoresponse.actors.routes import BUILDER, LLM, delivery_actions
from autoresponse.actors.runtime import Runtime
from autoresponse.messages import (
    ActionOutput,
    ActionResult,
    Envelope,
    EventDue,
    LLMRequest,
    OriginalContext,
    SystemMessage,
)


class AutoResponseBuilder(TypedActor):
    """Turns action output and due events into a delivery turn for the LLM."""

    @handles
    def on_output(self, output: ActionOutput, env: Envelope) -> None:
        self._deliver(output.original_context, env, type="output", outputs=output.results)

    @handles
    def on_event(self, due: EventDue, env: Envelope) -> None:
        self._deliver(due.context, env, type="event", event=due.event)

    def _deliver(self, ctx: OriginalContext, env: Envelope, **content: Any) -> None:
        allowed = delivery_actions(self.runtime, ctx.interface_name)
        if not allowed:
            self.runtime.dead_letters.post(env, "no sender", actor=self.name,
                                           detail=f"nothing can reply on {ctx.interface_name!r}")
            return
        message = SystemMessage(original_context=ctx, full_json_instructions=full_json_instructions(allowed),
                                **content)
        prompt = build_delivery_request(message, allowed_actions=allowed)
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
