"""The auto-response builder: action results go back to the LLM, never straight to the user.

From any thread::

    >>> request_llm_delivery("Filesystem  Use%\\n/dev/sda1  42%", ctx,
    ...                      action_type="terminal", command="df -h")   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autoresponse.actors.actor import TypedActor, handles
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
    build_delivery_request,
    full_json_instructions,
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


def request_llm_delivery(
    output: str | None,
    original_context: OriginalContext,
    action_type: str,
    command: str | None = None,
    action_outputs: Iterable[ActionResult | Mapping[str, Any]] | None = None,
    *,
    runtime: Runtime | None = None,
    cause: Envelope | None = None,
) -> Envelope | None:
    """Deliver action output to the user through the LLM. Callable from any thread.

    ``output`` (with ``action_type`` and ``command``) is one result;
    ``action_outputs`` adds more, all delivered in ONE turn. Returns the envelope
    sent to the builder (its correlation id follows the delivery), or None if it
    was dead-lettered at once.
    """
    results: list[ActionResult] = []
    if output is not None:
        results.append(ActionResult(action_type=action_type, command=command, output=output))
    for item in action_outputs or ():
        results.append(item if isinstance(item, ActionResult) else ActionResult(**item))
    body = ActionOutput(original_context=original_context, results=tuple(results))
    return (runtime or Runtime.current()).send(BUILDER, body, cause=cause)
