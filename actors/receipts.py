"""Send receipts: a word, to whoever asked in the context, on how a reply ended; and,
for a reply confirmed sent, to its conversation, which remembers it.

A context with ``receipt_to`` (a reminder's) asks to be told once its final
reply is confirmed sent, or has failed for good; the one who asked then decides
what the user hears (the event scheduler retries, and sends one notice when it
gives up), so the runtime's usual failure notice is not sent for it.
"""

from __future__ import annotations

from autoresponse.actors.kernel.actor import TypedActor
from autoresponse.actors.routes import CONVERSATIONS
from autoresponse.messages import (
    Envelope,
    OriginalContext,
    OutboundMessage,
    ReplyDelivered,
    SendReceipt,
)


def send_receipt(actor: TypedActor, message: OutboundMessage, env: Envelope, *, ok: bool,
                 detail: str = "") -> None:
    """Every sender calls this once a reply's send has ended: it tells
    ``message.context.receipt_to`` how, if it asked, and a reply confirmed sent joins its
    chat's memory (only then: what the user never saw is not remembered as said)."""
    if message.notice:
        return
    settle_receipt(actor, message.context, env, ok=ok, detail=detail)
    if ok and actor.runtime.has(CONVERSATIONS):
        where = message.context
        if str(message.chat_id) != str(where.chat_id):  # sent to another chat: its memory
            where = where.model_copy(update={"chat_id": message.chat_id, "thread_id": message.thread_id})
        actor.send(CONVERSATIONS, ReplyDelivered(context=where, text=message.text), cause=env)


def receipt_failed(actor: TypedActor, context: OriginalContext, env: Envelope, detail: str) -> bool:
    """The turn failed before any reply (the LLM unreachable, re-asks exhausted): tell the
    receipt's asker, if there is one. True when one was told (then the user is not)."""
    return settle_receipt(actor, context, env, ok=False, detail=detail)


def settle_receipt(actor: TypedActor, ctx: OriginalContext, env: Envelope, *, ok: bool, detail: str) -> bool:
    """Tell ``ctx.receipt_to`` how its turn ended (a silent turn ends well with no send);
    True when someone had asked."""
    if ctx.receipt_to is None or ctx.receipt_key is None:
        return False
    actor.send(ctx.receipt_to, SendReceipt(key=ctx.receipt_key, ok=ok, detail=detail), cause=env)
    return True
