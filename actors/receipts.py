"""Send receipts: a sender's word, to whoever asked in the context, that a reply went out."""

from __future__ import annotations

from autoresponse.actors.actor import TypedActor
from autoresponse.messages import Envelope, OutboundMessage, SendReceipt


def send_receipt(actor: TypedActor, message: OutboundMessage, env: Envelope, *, ok: bool,
                 detail: str = "") -> None:
    """Tell ``message.context.receipt_to`` how the send ended, if it asked."""
    ctx = message.context
    if ctx.receipt_to is not None and ctx.receipt_key is not None and not message.notice:
        actor.send(ctx.receipt_to, SendReceipt(key=ctx.receipt_key, ok=ok, detail=detail), cause=env)
