"""What a user hears when their request dies on its way: a short notice.

A request ends as a dead letter, with its reason, when a message of it crashed its actor on
every attempt, looped past the hop limit, outlived its deadline, or found its actor stopped
for good. The dead letter is for the operator; the user, who asked and is waiting, gets a
notice in their chat, once however many of the request's messages die::

    >>> notices = FailureNotices(runtime)                                # doctest: +SKIP
    >>> runtime.dead_letters.observers.append(notices)                  # doctest: +SKIP
    >>> notices.origin(PagerInput, pager_origin)                         # doctest: +SKIP

Only a message of a request's turn is told of (``context_of``): the request, its prompt and
reply, an action, its output, a reply to send. So is a platform's input that its interface
never turned into a request (it crashed on it every time), when the platform says who sent
it: the kernel knows no platform's inputs, so each registers an *origin* for its own
(``Mount.origin``, handed to ``FailureNotices.origin``), which names the chat the request
would have been answered in, or None when nobody would have been answered (a stranger
refused or ignored, group chatter not meant for the bot, an approval's answer) or the input
cannot be read. An origin never raises; one that does names nobody. A stranger who would
have had an autonomous turn hears nothing, as an autonomous turn never does (below).

An action that dies (its executor crashed on it every time, say) is not the request's
failure but its own: its failed result goes to the builder (``failed_action``), with its
batch's other outputs, and the LLM tells the user what ran and what did not.

The notice says what became of the request, when the message that died shows it
(``notice_of``: a command's output, a delivery turn, a re-ask after part of the reply went
out), in the words of a turn that gives up (``actors.retry``), and invites no retry: asking
again would run a command twice. A reply to send shows nothing of its request: what its
commands came to is the builder's word (``delivered_outcome``), kept by correlation as it
delivers their outputs. Only a request where nothing ran, as far as that message (or the
builder, for a reply) shows, hears ``FAILURE_NOTICE``, which invites asking again.

Nothing is said for the other reasons: they have a word of their own (re-asks exhausted, the
LLM unreachable), or no word can reach the user (an unreachable chat), or the input could
not be read at all (a malformed update: no chat can be trusted in it). Nor for an autonomous
turn, which the bot may leave unanswered anyway; a reminder's turn, whose scheduler tries it
again when its reply is not confirmed, and speaks when it gives up; a notice or a preview
that failed.

The notice is work of its own (its correlation is the request's and ``NOTICE_SUFFIX``):
the request's journal item closes as dead whatever becomes of it, so a stop or a kill before
it is sent never resumes the request that failed.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from autoresponse.actors.builder import delivered_outcome
from autoresponse.actors.kernel.runtime import Runtime
from autoresponse.actors.limits import FAILURES_REMEMBERED
from autoresponse.actors.prompts import outcome_of
from autoresponse.actors.retry import OUTCOME_NOTICES, PARTLY_DONE_NOTICE
from autoresponse.actors.routes import BUILDER, sender
from autoresponse.messages import (
    ActionOutput,
    ActionRequest,
    ActionResult,
    Envelope,
    LLMFailure,
    LLMReply,
    LLMRequest,
    OriginalContext,
    Outcome,
    OutboundMessage,
    Rejection,
    SystemMessage,
    UserRequest,
)

log = logging.getLogger("autoresponse.failures")

#: Who a platform's input came from: the chat its request would have been answered in, or
#: None (nobody to tell, or an input it cannot read). Registered per input type.
Origin = Callable[[Any], OriginalContext | None]

#: The notice of a request that carried out nothing (as far as the message that died shows):
#: asking again is safe.
FAILURE_NOTICE = "Sorry, something went wrong with your request, and it was not finished. Please try again."
#: The reasons of a dead letter that the user is told of.
TOLD = frozenset({"crash", "hop limit", "deadline", "actor stopped"})
#: The notice's correlation: its request's, and this.
NOTICE_SUFFIX = "/failed"


def context_of(body: Any) -> OriginalContext | None:
    """The chat whose request ``body`` is a message of, or None: for a request, its prompt,
    the LLM's reply, an action, its output and a reply to send (not a notice, nor a preview:
    the reply it previews still comes)."""
    if isinstance(body, OutboundMessage):
        return None if body.notice or body.preview else body.context
    if isinstance(body, (UserRequest, ActionRequest)):
        return body.context
    if isinstance(body, (LLMRequest, LLMReply, LLMFailure, Rejection)):
        return body.prompt.original_context
    if isinstance(body, (ActionOutput, SystemMessage)):
        return body.original_context
    return None


def notice_of(body: Any, delivered: Outcome | None = None, *, nothing_done: str = FAILURE_NOTICE) -> str:
    """What the user hears when ``body``, a message of their request, dies: what became of
    the request, when ``body`` shows it (a command's output, a delivery turn, a turn that
    carried out part of its reply), in the words of a turn that gives up (``actors.retry``);
    else ``nothing_done`` (an LLM failure says why: too long, the model away). A reply to
    send shows nothing of the rest of its request: for one, ``delivered`` says what its
    request's commands came to (``delivered_outcome``), None when no output of them was
    delivered."""
    if isinstance(body, OutboundMessage):
        return nothing_done if delivered is None else OUTCOME_NOTICES[delivered]
    if isinstance(body, ActionOutput):
        outcome = outcome_of(body.results)
        # One command of several: the rest may not have run, or not well.
        if body.batch is not None and outcome == "done":
            return PARTLY_DONE_NOTICE
        return OUTCOME_NOTICES[outcome]
    if isinstance(body, SystemMessage) and body.type == "output":
        return OUTCOME_NOTICES[outcome_of(body.outputs)]
    if isinstance(body, (LLMRequest, LLMReply, LLMFailure, Rejection)):
        prompt = body.prompt
        if prompt.outcome is not None:  # a delivery turn: its commands ran, or were denied
            return OUTCOME_NOTICES[prompt.outcome]
        # A rejection's list adds what its own reply carried out to what its prompt's says.
        carried_out = body.carried_out if isinstance(body, Rejection) else prompt.carried_out
        if carried_out:
            return PARTLY_DONE_NOTICE
    return nothing_done


def failed_action(request: ActionRequest, reason: str, actor: str | None) -> ActionResult:
    """The result of an action that died on its way (its executor crashed on it every time,
    it outlived its deadline, its executor stopped): failed, and it may not have run."""
    command = getattr(request.action.payload, "command", None)
    return ActionResult(action_type=request.action.type, command=command if isinstance(command, str) else None,
                        output=f"not carried out: {actor or 'its executor'} failed on it ({reason}); it may not "
                               "have run, or only in part", ok=False)


class FailureNotices:
    """A dead-letter observer (``DeadLetterOffice.observers``): sends the notice, from the
    thread that posted the letter, through the chat's sender. Thread-safe; ``origin`` is
    called before the runtime starts."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        #: A platform's input type → who an input of it came from (``origin``).
        self.origins: dict[type, Origin] = {}
        self._lock = threading.Lock()
        self._told: OrderedDict[str, None] = OrderedDict()  # correlations told, newest last

    def origin(self, input_type: type, origin: Origin) -> None:
        """Tell the user who sent an input of ``input_type`` (what a platform's inbound actor
        journals and handles) when it dies unread: ``origin(input)`` names their chat."""
        self.origins[input_type] = origin

    def context(self, body: Any) -> OriginalContext | None:
        """The chat to tell that ``body`` died: a message of a request's turn, or a
        platform's input whose origin names one. Never raises."""
        context = context_of(body)
        if context is not None:
            return context
        origin = next((self.origins[kind] for kind in type(body).__mro__ if kind in self.origins), None)
        if origin is None:
            return None
        try:
            found = origin(body)
        except Exception:  # an origin must not raise; one that does names nobody
            log.exception("the origin of a %s failed", type(body).__name__)
            return None
        return found if isinstance(found, OriginalContext) else None

    def __call__(self, envelope: Envelope, reason: str, actor: str | None) -> None:
        if reason not in TOLD:
            return
        if isinstance(envelope.body, ActionRequest) and self.runtime.has(BUILDER):
            # One action's failure, not the request's: its result says so, with the outputs of
            # its batch (which waited for it to the end of the batch's wait, calling it still
            # running), through the LLM; a notice to ask again would run the others twice.
            self.runtime.send(BUILDER, envelope.body.output(failed_action(envelope.body, reason, actor)),
                              correlation_id=envelope.correlation_id)
            return
        context = self.context(envelope.body)
        if context is None or context.autonomous or context.receipt_to is not None:
            return
        to = sender(context.interface_name)
        if self.runtime.has(to) and self._first(envelope.correlation_id):
            # A reply shows nothing of what its request ran; its correlation ties it to what the
            # builder delivered of it (a reply beside a command still running finds nothing yet).
            delivered = (delivered_outcome(self.runtime, envelope.correlation_id)
                         if isinstance(envelope.body, OutboundMessage) else None)
            # A notice is no message of a request's turn (``context_of``): one that dies too is a
            # dead letter with its reason, and nothing more is sent.
            text = notice_of(envelope.body, delivered)
            self.runtime.send(to, OutboundMessage.reply(context, text, notice=True),
                              correlation_id=envelope.correlation_id + NOTICE_SUFFIX)

    def _first(self, correlation: str) -> bool:
        """The first failure of ``correlation`` told (the newest ``FAILURES_REMEMBERED``)."""
        with self._lock:
            if correlation in self._told:
                return False
            self._told[correlation] = None
            if len(self._told) > FAILURES_REMEMBERED:
                self._told.popitem(last=False)
            return True
