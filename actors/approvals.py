"""The approvals desk: a risky action runs only once someone who may approve it did.

With ``AUTORESPONSE_TERMINAL__APPROVAL=ask`` the dispatcher does not send a terminal
action to its executor: it hands it here (``ApprovalRequest``). The desk

* journals the approval (the action, its chat, when it expires: ``APPROVAL_TIMEOUT``
  on the runtime's clock) before anything else, so a restart keeps it waiting;
* offers it, with Approve and Deny buttons, in the request's chat (its owner, the
  requesting user, may decide) and in the private chat of each of ``APPROVERS``;
* takes the answers (``ApprovalAnswer``, from a Telegram callback query or a line typed
  at the console): an answer for an approval it does not know (a forged or tampered
  id) or from someone who may not decide is refused, logged, and changes nothing; the
  one who asked may decide only while their platform still allows them to cause actions
  (a restart may have taken them off its ``allowed_users``); an approval whose action
  the executor would now refuse (a restart took its program off the allowlist) is, when
  approved, settled as refused: it can no longer run;
* journals the decision, tells the one who answered (``ApprovalVerdict``), and hands it
  to the chat's conversation as a turn (``ApprovalOutcome``): the action runs, or the
  LLM is told, in an error system message, that it was denied, to tell the user;
* expires what nobody decided in time, with a notice to the user;
* declines at its start, with a notice to the user, what still waits for approval though
  its action no longer asks for one (approvals were turned off meanwhile: its platform's
  ``approval = "never"``, or the platform off): nobody may approve it now. The daemon
  starts the desk for that alone too (``Application.tree``);
* calls off a chat's pending approvals when its user cancels (``CancelApprovals``; a
  stranger's cancel, only the ones they asked for).

Answers come only from Telegram's buttons and the console, so the daemon refuses to
start with approvals on where nobody could answer them (``Application._check_approval``).

The wait is not work in flight: the request that asked finishes once the approval is
offered, and the answer comes in as work of its own (journaled by its interface), so
a stop does not wait for approvers, and nothing is lost across a restart.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.cancellation import is_cancelled
from autoresponse.actors.dispatcher import APPROVALS, describe
from autoresponse.actors.kernel import IoTask
from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.limits import APPROVAL_TIMEOUT_SECONDS
from autoresponse.actors.prompts import build_delivery_request, full_json_instructions
from autoresponse.actors.routes import CONVERSATIONS, delivery_actions, sender
from autoresponse.messages import (
    ActionRequest,
    BaseAction,
    Envelope,
    LLMRequest,
    OriginalContext,
    OutboundMessage,
    SystemMessage,
    Turn,
    canonical_interface,
    parse_action,
)
from autoresponse.messages.approval import (
    ApprovalAnswer,
    ApprovalOutcome,
    ApprovalRequest,
    ApprovalVerdict,
    CancelApprovals,
)
from autoresponse.messages.pipeline import Button

log = logging.getLogger("autoresponse.approvals")

#: Decided approvals remembered in memory (older ones are read from the journal).
_DECIDED_KEPT = 1_000

DENIED_INSTRUCTION = (
    "You are synth, a helpful assistant inside a chat bot. A command you proposed needed "
    "approval before it could run, and it was denied: it did not run. The system_message "
    "says which. Tell the user so in one short message, in that chat; do not propose to run "
    "it again unless they ask. Use only the message actions allowed below."
)
DENIED_POLICY = ("Nothing was carried out. Answer with one message action that tells the user the "
                 "command was denied and did not run.")

NOT_AN_APPROVER = ("Sorry, you may not decide this: only an approver, or the one who asked while they may "
                   "still use me, may.")
#: Said when an approval is approved but its action would now be refused (told the reason).
CANNOT_RUN = "{command} can no longer run: {reason}."
FORGED = "Sorry, this is no approval I know of."
NOTHING_PENDING = "Nothing is waiting for your approval here."
CANCELLED_PENDING = "Cancelled: {command} will not run."
#: Said in the request's chat when approvals were turned off while it waited (see ``setup``).
APPROVALS_OFF = "Not approved: approvals were turned off while {command} waited, so it did not run."
#: Said when a /cancel finds nothing of its chat under way: a request that finished, or
#: one in another conversation (on Reddit a new private message is a chat of its own).
NOTHING_TO_CANCEL = "Nothing to cancel in this conversation."


class ApprovalExpired(BaseModel):
    """An approval's time is up (a timer of the desk)."""

    model_config = ConfigDict(frozen=True)

    approval_id: str


class ApprovalJournal(Protocol):
    """What the desk needs of the journal (``SqliteJournal`` has it)."""

    def record_approval(self, *, approval_id: str, key: str, correlation: str, chat: str, request: str,
                        expires: float) -> Any: ...
    def settle_approval(self, approval_id: str, state: str, *, by: str, decision: str) -> Any: ...
    def approvals(self, state: str | None = "pending") -> list[dict[str, Any]]: ...
    def approval(self, *, approval_id: str | None = None, key: str | None = None) -> dict[str, Any] | None: ...


@dataclass
class Approval:
    id: str
    key: str
    correlation: str
    request: ActionRequest
    expires: float  # the runtime clock's time()
    state: str = "pending"  # pending | approved | denied | expired | cancelled | refused | declined
    decided_by: str | None = None
    #: The correlation of the answer (or the timer, or the cancel) that decided it.
    decision: str | None = None

    @property
    def command(self) -> str:
        return describe(self.request.action)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Approval:
        data = json.loads(row["request"])
        request = ActionRequest(action=parse_action(data["action"]),
                                context=OriginalContext.model_validate(data["context"]))
        return cls(id=row["id"], key=row["key"], correlation=row["correlation"], request=request,
                   expires=row["expires"], state=row["state"], decided_by=row.get("decided_by"),
                   decision=row.get("decision"))


def stored_request(request: ActionRequest) -> str:
    """The action and its context as the journal keeps them (a batch is not kept: an
    approved action's output is delivered on its own)."""
    return json.dumps({"action": request.action.model_dump(mode="json"),
                       "context": request.context.model_dump(mode="json")})


def callback_data(approve: bool, approval_id: str) -> str:
    """What a button carries back (at most 64 bytes on Telegram)."""
    return f"{'approve' if approve else 'deny'}:{approval_id}"


def parse_answer(data: str) -> tuple[bool, str] | None:
    """(approve, approval id) from a button's data; None when it is not one of ours."""
    verb, _, approval_id = data.partition(":")
    if verb not in ("approve", "deny") or not approval_id or not approval_id.replace("-", "").replace("_", "").isalnum():
        return None
    return verb == "approve", approval_id


def within(seconds: float) -> str:
    """A wait as people say it: "5 minutes", "30 seconds", "2 hours"."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    if seconds >= 120:
        return f"{round(seconds / 60)} minutes"
    n = max(1, round(seconds))
    return f"{n} second{'s' if n != 1 else ''}"


def denied_request(runtime: Any, outcome: ApprovalOutcome, turns: Iterable[Turn]) -> LLMRequest | None:
    """The delivery turn that tells the LLM, in an error system message, that the action
    was denied (so that it tells the user); None when nothing can reply in that chat."""
    ctx = outcome.request.context
    allowed = delivery_actions(runtime, ctx.interface_name)
    if not allowed:
        return None
    by = f" by {outcome.by}" if outcome.by else ""
    message = SystemMessage(
        type="error", original_context=ctx, full_json_instructions=full_json_instructions(allowed),
        errors=(f"{describe(outcome.request.action)} needed approval and was denied{by}: it did not run.",),
        error_retry_policy=DENIED_POLICY)
    prompt = build_delivery_request(message, allowed_actions=allowed, turns=turns, instruction=DENIED_INSTRUCTION,
                                    now=runtime.clock.time(), outcome="denied")
    return LLMRequest(prompt=prompt)


class ApprovalDesk(TypedActor):
    """Journals, offers, decides and expires the approvals of risky actions."""

    def __init__(self, journal: ApprovalJournal, *, approvers: Iterable[str | int] = (),
                 timeout: float = APPROVAL_TIMEOUT_SECONDS,
                 requesters: Mapping[str, Collection[str]] | None = None,
                 preflight: Mapping[str, Callable[[BaseAction], str]] | None = None,
                 gated: Collection[str] | None = None) -> None:
        super().__init__()
        self.journal = journal
        #: User ids who may decide any approval ("123", or "telegram:123" for one platform).
        self.approvers = tuple(str(a).strip() for a in approvers if str(a).strip())
        self.timeout = timeout
        #: By interface, who may cause actions there now (its ``allowed_users``, as text): the
        #: one who asked decides only while among them. None: not checked.
        self.requesters = None if requesters is None else {
            name: frozenset(user.lower() for user in users) for name, users in requesters.items()}
        #: By action type, what its executor would refuse in an action now ("" when nothing).
        self.preflight = dict(preflight or {})
        #: The action types that ask for approval now (the dispatcher's); None: every one.
        self.gated = None if gated is None else frozenset(gated)
        self._pending: dict[str, Approval] = {}
        self._decided: OrderedDict[str, Approval] = OrderedDict()
        self._timers: dict[str, IoTask | None] = {}

    def setup(self) -> None:
        # After a restart (of the daemon or of this actor) what waited still waits, until
        # the time it was given then; unless approvals were turned off for it meanwhile.
        for row in self.journal.approvals("pending"):
            try:
                approval = Approval.from_row(row)
            except ValueError as exc:  # an action type no longer registered: it cannot run
                log.error("approval %s cannot be read (%s); it stays pending in the journal", row.get("id"), exc)
                continue
            if self.gated is None or approval.request.action.type in self.gated:
                self._track(approval)
            else:
                self._decline(approval)

    def _decline(self, approval: Approval) -> None:
        """Its action no longer asks for approval, so nobody may approve it: settled as
        declined, and its chat told, as an expiry is. Settled here, before the desk takes
        any answer, so that no answer resumed from the journal can still approve it."""
        self._settle(approval, "declined", by="", decision="")
        log.info("%s waited for approval, but approvals are off for it now: declined", approval.command)
        self._notify(approval, APPROVALS_OFF.format(command=approval.command), None)

    # ---------------------------------------------------------------- asking

    @handles
    def on_request(self, asked: ApprovalRequest, env: Envelope) -> None:
        if is_cancelled(self.runtime, env.correlation_id):
            return
        key = f"{env.correlation_id}|{asked.key}"
        known = next((a for a in self._pending.values() if a.key == key), None)
        if known is None:
            row = self.journal.approval(key=key)
            known = Approval.from_row(row) if row is not None else None
        if known is not None:
            if known.state == "pending":  # the same turn again (a resumed request): offered again
                self._offer(known, env)
            return
        approval = Approval(id=secrets.token_urlsafe(12), key=key, correlation=env.correlation_id,
                            request=asked.request.model_copy(update={"batch": None}),
                            expires=self.runtime.clock.time() + self.timeout)
        self.journal.record_approval(approval_id=approval.id, key=key, correlation=approval.correlation,
                                     chat=approval.request.context.chat_key,
                                     request=stored_request(approval.request), expires=approval.expires)
        log.info("%s waits for approval %s", approval.command, approval.id)
        self._track(approval)
        self._offer(approval, env)

    def _track(self, approval: Approval) -> None:
        self._pending[approval.id] = approval
        left = max(0.0, approval.expires - self.runtime.clock.time())
        self._timers[approval.id] = self.schedule(left, ApprovalExpired(approval_id=approval.id))

    def _offer(self, approval: Approval, env: Envelope) -> None:
        """The approval, with its buttons, in the request's chat and the approvers' own chats."""
        ctx = approval.request.context
        buttons = (Button(label="Approve", data=callback_data(True, approval.id)),
                   Button(label="Deny", data=callback_data(False, approval.id)))
        left = within(max(1.0, approval.expires - self.runtime.clock.time()))
        to = sender(ctx.interface_name)
        text = f"Approval needed: may I run {approval.command}? Approve or deny within {left}."
        self.send(to, OutboundMessage.reply(ctx, text, notice=True).model_copy(update={"buttons": buttons}),
                  cause=env)
        asker = ctx.user_name or (f"user {ctx.user_id}" if ctx.user_id is not None else "someone")
        where = f" in {ctx.chat_title}" if ctx.chat_title else ""
        for chat in self._approver_chats(ctx):
            text = (f"Approval needed: {asker} asked me to run {approval.command}{where}. "
                    f"Approve or deny within {left}.")
            message = OutboundMessage.reply(ctx, text, notice=True, chat_id=chat)
            self.send(to, message.model_copy(update={"buttons": buttons}), cause=env)

    def _approver_chats(self, ctx: OriginalContext) -> list[int | str]:
        """The private chats of the approvers on the request's platform, but the request's own."""
        if ctx.user_id is None:  # a platform without user ids (the console): its own chat only
            return []
        chats: list[int | str] = []
        for entry in self.approvers:
            platform, _, user = entry.rpartition(":")
            if platform and canonical_interface(platform) != ctx.interface_name:
                continue
            if user in (str(ctx.chat_id), *(str(c) for c in chats)):
                continue
            chats.append(int(user) if user.lstrip("-").isdigit() else user)
        return chats

    # ---------------------------------------------------------------- answers

    @handles
    def on_answer(self, answer: ApprovalAnswer, env: Envelope) -> None:
        who = answer.context
        name = who.user_name or (str(who.user_id) if who.user_id is not None else who.interface_name)
        if answer.malformed is not None:
            log.warning("refused a forged approval answer from %s (user %s) on %s: %s", name, who.user_id,
                        who.interface_name, answer.malformed)
            self._verdict(answer, FORGED, env, accepted=False)
            return
        approval = self._find(answer)
        if approval is None:
            if answer.approval_id is None:
                self._verdict(answer, NOTHING_PENDING, env, accepted=False)
                return
            log.warning("refused an answer for unknown approval %r from %s (user %s) on %s: forged or tampered",
                        answer.approval_id, name, who.user_id, who.interface_name)
            self._verdict(answer, FORGED, env, accepted=False)
            return
        if not self._may_decide(approval, who):
            log.warning("refused an answer for approval %s of %s from %s (user %s) on %s: not an approver",
                        approval.id, approval.command, name, who.user_id, who.interface_name)
            self._verdict(answer, NOT_AN_APPROVER, env, accepted=False)
            return
        if approval.state != "pending":
            if approval.decision == env.correlation_id and approval.state in ("approved", "denied"):
                self._hand_over(approval, env)  # this very answer, again (resumed after a restart)
                return
            self._verdict(answer, f"Too late: {approval.command} was already {approval.state}.", env,
                          accepted=False, settled=True)
            return
        if answer.approve and (problem := self._refusal(approval)):
            self._refuse(approval, problem, answer, env)
            return
        state = "approved" if answer.approve else "denied"
        self._settle(approval, state, by=name, decision=env.correlation_id)
        log.info("%s was %s by %s (user %s)", approval.command, state, name, who.user_id)
        said = (f"Approved: running {approval.command}." if answer.approve
                else f"Denied: {approval.command} will not run.")
        self._verdict(answer, said, env, accepted=True, settled=True)
        self._hand_over(approval, env)

    def _find(self, answer: ApprovalAnswer) -> Approval | None:
        """The approval an answer names, or the latest pending one of its chat."""
        if answer.approval_id is None:
            where = answer.context
            mine = [a for a in self._pending.values()
                    if a.request.context.interface_name == where.interface_name
                    and str(a.request.context.chat_id) == str(where.chat_id)]
            return max(mine, key=lambda a: a.expires, default=None)
        found = self._pending.get(answer.approval_id) or self._decided.get(answer.approval_id)
        if found is None:
            row = self.journal.approval(approval_id=answer.approval_id)
            found = Approval.from_row(row) if row is not None else None
        return found

    def _may_decide(self, approval: Approval, who: OriginalContext) -> bool:
        """The one who asked, while their platform still allows them (on a platform without
        user ids: whoever answers in its chat), or an approver, on the request's platform."""
        ctx = approval.request.context
        if who.interface_name != ctx.interface_name:
            return False
        if ctx.user_id is None:
            return who.user_id is None and str(who.chat_id) == str(ctx.chat_id)
        if who.user_id is None:
            return False
        if str(who.user_id) == str(ctx.user_id) and self._still_allowed(ctx):
            return True
        for entry in self.approvers:
            platform, _, user = entry.rpartition(":")
            if user == str(who.user_id) and (not platform or canonical_interface(platform) == who.interface_name):
                return True
        return False

    def _still_allowed(self, ctx: OriginalContext) -> bool:
        """Whether the one who asked may still cause actions on their platform: among its
        ``allowed_users`` as the daemon runs now (a restart may have taken them off)."""
        if self.requesters is None:
            return True
        return str(ctx.user_id).lower() in self.requesters.get(ctx.interface_name, frozenset())  # Reddit's names

    def _refusal(self, approval: Approval) -> str:
        """What the executor would now refuse in the action (its program taken off the
        allowlist by a restart), as the dispatcher's preflight says; "" when nothing."""
        preflight = self.preflight.get(approval.request.action.type)
        return preflight(approval.request.action) if preflight is not None else ""

    def _refuse(self, approval: Approval, problem: str, answer: ApprovalAnswer, env: Envelope) -> None:
        """Approved, but it can no longer run: settled as refused, and nothing runs. The one
        who answered hears why, and the request's chat too when they answered elsewhere."""
        self._settle(approval, "refused", by="", decision=env.correlation_id)
        log.warning("%s was approved but can no longer run: %s", approval.command, problem)
        said = CANNOT_RUN.format(command=approval.command, reason=problem)
        self._verdict(answer, said, env, accepted=False, settled=True)
        if str(answer.context.chat_id) != str(approval.request.context.chat_id):
            self._notify(approval, said, env)

    def _notify(self, approval: Approval, text: str, env: Envelope | None) -> None:
        """Tell the request's chat how its approval ended (``env``: what ended it; None at the
        start, where the notice is a correlation of its own, as a timer's message is)."""
        ctx = approval.request.context
        notice = OutboundMessage.reply(ctx, text, notice=True)
        if env is None:
            self.runtime.send(sender(ctx.interface_name), notice)
        else:
            self.send(sender(ctx.interface_name), notice, cause=env)

    def _verdict(self, answer: ApprovalAnswer, text: str, env: Envelope, *, accepted: bool,
                 settled: bool = False) -> None:
        """Tell the one who answered: through the callback they pressed, else in their chat."""
        if answer.callback_id is not None and answer.reply_to is not None and self.runtime.has(answer.reply_to):
            self.send(answer.reply_to, ApprovalVerdict(
                callback_id=answer.callback_id, text=text, accepted=accepted, chat_id=answer.context.chat_id,
                prompt_message_id=answer.prompt_message_id, settled=settled), cause=env)
            return
        self.send(sender(answer.context.interface_name),
                  OutboundMessage.reply(answer.context, text, notice=True), cause=env)

    def _hand_over(self, approval: Approval, env: Envelope) -> None:
        """The decision, as a turn of the request's chat."""
        self.send(CONVERSATIONS, ApprovalOutcome(approval_id=approval.id, request=approval.request,
                                                 approved=approval.state == "approved",
                                                 by=approval.decided_by or ""), cause=env)

    def _settle(self, approval: Approval, state: str, *, by: str, decision: str) -> None:
        """Decide it: in the journal first (committed in order, before anything it causes)."""
        self.journal.settle_approval(approval.id, state, by=by, decision=decision)
        approval.state, approval.decided_by, approval.decision = state, by, decision
        self._pending.pop(approval.id, None)
        self.cancel(self._timers.pop(approval.id, None))
        self._decided[approval.id] = approval
        while len(self._decided) > _DECIDED_KEPT:
            self._decided.popitem(last=False)

    # ---------------------------------------------------------------- expiry, cancel

    @handles
    def on_expired(self, expired: ApprovalExpired, env: Envelope) -> None:
        approval = self._pending.get(expired.approval_id)
        if approval is None:
            return
        self._timers.pop(approval.id, None)  # it fired
        self._settle(approval, "expired", by="", decision=env.correlation_id)
        log.info("%s was not approved within %s: it expired", approval.command, within(self.timeout))
        self._notify(approval, f"Nobody approved {approval.command} in time, so it did not run.", env)

    @handles
    def on_cancel(self, cancel: CancelApprovals, env: Envelope) -> None:
        who = cancel.context
        chat = who.chat_key
        # A stranger (an autonomous turn) calls off only what they asked for; in a shared
        # chat (an X thread) someone else's approvals are not theirs.
        called_off = [a for a in self._pending.values() if a.request.context.chat_key == chat
                      and (not who.autonomous or (who.user_id is not None
                                                  and str(a.request.context.user_id) == str(who.user_id)))]
        for approval in called_off:
            self._settle(approval, "cancelled", by=cancel.context.user_name or "", decision=env.correlation_id)
            log.info("%s was cancelled while it waited for approval", approval.command)
        if cancel.confirm and (called_off or not who.autonomous):  # a stranger's empty /cancel: no answer
            text = (CANCELLED_PENDING.format(command=", ".join(a.command for a in called_off)) if called_off
                    else NOTHING_TO_CANCEL)
            self.send(sender(cancel.context.interface_name),
                      OutboundMessage.reply(cancel.context, text, notice=True), cause=env)
