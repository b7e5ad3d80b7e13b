"""Send receipts: a word, to whoever asked in the context, on how a reply ended.

A context with ``receipt_to`` (a reminder's) asks to be told once its final
reply is confirmed sent, or has failed for good; the one who asked then decides
what the user hears (the event scheduler retries, and sends one notice when it
gives up), so the runtime's usual failure notice is not sent for it.
"""

from __future__ import annotations

from autoresponse.actors.actor import TypedActor
from autoresponse.messages import Envelope, OriginalContext, OutboundMessage, SendReceipt


def send_receipt(actor: TypedActor, message: OutboundMessage, env: Envelope, *, ok: bool,
                 detail: str = "") -> None:
    """Tell ``message.context.receipt_to`` how the send of a reply ended, if it asked."""
    if not message.notice:
        _tell(actor, message.context, env, ok=ok, detail=detail)


def receipt_failed(actor: TypedActor, context: OriginalContext, env: Envelope, detail: str) -> bool:
    """The turn failed before any reply (the LLM unreachable, re-asks exhausted): tell the
    receipt's asker, if there is one. True when one was told (then the user is not)."""
    return _tell(actor, context, env, ok=False, detail=detail)


def _tell(actor: TypedActor, ctx: OriginalContext, env: Envelope, *, ok: bool, detail: str) -> bool:
    if ctx.receipt_to is None or ctx.receipt_key is None:
        return False
    actor.send(ctx.receipt_to, SendReceipt(key=ctx.receipt_key, ok=ok, detail=detail), cause=env)
    return True
