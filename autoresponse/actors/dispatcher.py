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
)


class ActionDispatcher(TypedActor):
    """Extracts the actions of each reply, sends the valid ones on, reports the rest.

    Message actions go to their interface's sender as a reply to the original
    message; other actions go to their executor.
    """

    @handles
    def on_reply(self, reply: LLMReply, env: Envelope) -> None:
        prompt = reply.prompt
        found = extract_actions(reply.text, prompt.allowed_actions)
        errors = list(found.errors)
        for action in found.actions:
            problem = self._dispatch(action, prompt.original_context, prompt.mode, env)
            if problem:
                errors.append(problem)
        if errors:
            self.report_error(rejection(prompt, reply.text, errors), cause=env)

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
