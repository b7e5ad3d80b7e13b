"""The action dispatcher: from an LLM reply to the actors that carry out its actions."""

from __future__ import annotations

import hashlib

from autoresponse.actors.actor import TypedActor, handles
from autoresponse.actors.extractor import extract_actions, rejection
from autoresponse.actors.limits import MAX_ACTIONS_PER_REPLY
from autoresponse.actors.routes import route_of
from autoresponse.messages import (
    ActionRequest,
    BaseAction,
    Envelope,
    LLMReply,
    OriginalContext,
    OutboundMessage,
    PromptRequest,
    Rejection,
    action_key,
)


def turn_key(correlation_id: str, prompt: PromptRequest) -> str:
    """Names an LLM turn within its correlation by what it is about, not by what the
    LLM said: a resumed item asks again and gets the same key, so nothing is resent."""
    message = prompt.system_message
    if message is None:
        subject = prompt.current_text
    elif message.type == "output":
        subject = repr([(o.action_type, o.command) for o in message.outputs])
    elif message.type == "event" and message.event is not None:
        subject = message.event.description + message.event.due
    else:
        subject = repr(message.errors)
    digest = hashlib.sha256(subject.encode()).hexdigest()[:12]
    return f"{correlation_id}:{prompt.mode}:{prompt.reask}:{digest}"


class ActionDispatcher(TypedActor):
    """Extracts the actions of each reply, sends the valid ones on, reports the rest.

    Message actions go to their interface's sender as a reply to the original
    message; other actions go to their executor. An action a re-ask repeats
    after it was carried out is skipped: nothing runs or is delivered twice.
    """

    def __init__(self, max_actions: int = MAX_ACTIONS_PER_REPLY) -> None:
        super().__init__()
        self.max_actions = max_actions

    @handles
    def on_reply(self, reply: LLMReply, env: Envelope) -> None:
        prompt = reply.prompt
        found = extract_actions(reply.text, prompt.allowed_actions, max_actions=self.max_actions)
        errors = list(found.errors)
        carried_out = list(prompt.carried_out)
        turn = turn_key(env.correlation_id, prompt)
        for index, action in enumerate(found.actions):
            key = action_key(action)
            if key in prompt.carried_out:
                continue
            problem = self._dispatch(action, prompt.original_context, prompt.mode, env, f"{turn}:{index}")
            if problem:
                errors.append(problem)
            else:
                carried_out.append(key)
        if errors:
            message = rejection(prompt, reply.text, errors)
            self.report_error(Rejection(prompt=prompt, message=message, carried_out=tuple(carried_out)),
                              cause=env, detail="; ".join(message.errors))

    def _dispatch(self, action: BaseAction, ctx: OriginalContext, mode: str, env: Envelope,
                  key: str) -> str:
        if action.kind == "message":
            target = action.payload.target
            if mode == "delivery" and target is not None and str(target) != str(ctx.chat_id):
                # Output of the user's action goes back to the user's chat, nowhere else.
                return f"{action.type}: a delivery answers the original chat; omit \"target\""
            body: object = OutboundMessage.reply(ctx, action.payload.text, chat_id=target, key=key)
        else:
            body = ActionRequest(action=action, context=ctx)
        self.send(route_of(action), body, cause=env)
        return ""
