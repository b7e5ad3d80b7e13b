"""The action dispatcher: from an LLM reply to the actors that carry out its actions."""

from __future__ import annotations

from autoresponse.actors.actor import TypedActor, handles
from autoresponse.actors.extractor import extract_actions, rejection
from autoresponse.actors.routes import route_of
from autoresponse.messages import (
    ActionRequest,
    BaseAction,
    Envelope,
    LLMReply,
    OriginalContext,
    OutboundMessage,
    Rejection,
    action_key,
)


class ActionDispatcher(TypedActor):
    """Extracts the actions of each reply, sends the valid ones on, reports the rest.

    Message actions go to their interface's sender as a reply to the original
    message; other actions go to their executor. An action a re-ask repeats
    after it was carried out is skipped: nothing runs or is delivered twice.
    """

    @handles
    def on_reply(self, reply: LLMReply, env: Envelope) -> None:
        prompt = reply.prompt
        found = extract_actions(reply.text, prompt.allowed_actions)
        errors = list(found.errors)
        carried_out = list(prompt.carried_out)
        for action in found.actions:
            key = action_key(action)
            if key in prompt.carried_out:
                continue
            problem = self._dispatch(action, prompt.original_context, prompt.mode, env)
            if problem:
                errors.append(problem)
            else:
                carried_out.append(key)
        if errors:
            message = rejection(prompt, reply.text, errors)
            self.report_error(Rejection(prompt=prompt, message=message,
                                        carried_out=tuple(carried_out)), cause=env)

    def _dispatch(self, action: BaseAction, ctx: OriginalContext, mode: str, env: Envelope) -> str:
        if action.kind == "message":
            target = action.payload.target
            if mode == "delivery" and target is not None and str(target) != str(ctx.chat_id):
                # Output of the user's action goes back to the user's chat, nowhere else.
                return f"{action.type}: a delivery answers the original chat; omit \"target\""
            body: object = OutboundMessage.reply(ctx, action.payload.text, chat_id=target)
        else:
            body = ActionRequest(action=action, context=ctx)
        self.send(route_of(action), body, cause=env)
        return ""
