"""Conversations: each chat's turns, one at a time, in order, with the chat's memory.

Inbound interfaces send every ``UserRequest`` to the ``conversations`` pool,
which routes it by chat (interface, chat, thread), so one chat always lands on
the same actor while different chats run in parallel. For each chat, the
conversation:

* starts a turn only when the previous one has finished (its reply sent, or
  dead-lettered), so replies go out in the order the requests came in;
* answers messages that arrive while a turn runs *together*: they join the next
  turn as one request, in order, and its reply threads to the last of them
  (people split one thought over several quick messages); but only the messages of
  one user, all allowed or all a stranger's: in a shared chat (an X thread, a group)
  someone else's message is a turn of its own, so nobody's words run with another's
  rights; and only up to ``MAX_MESSAGE_CHARS`` of text together (the longest message
  there is): the rest of a long burst is the next turn's, in order;
* gives each turn the chat's memory (``memory.ConversationStore``): its recent
  messages, replies and action records, and remembers the new message (once: a turn
  resumed from the journal after a crash or a stop was remembered at its first start),
  and each reply once its sender confirms it. Memory is an aid: when the store fails (a damaged
  file, a full disk, a text SQLite cannot encode) that is logged, and the turn goes on
  without it;
* gathers the messages of one group (a Telegram album: ten photos sent at once) for
  ``ALBUM_GATHER_SECONDS`` and answers them as one turn, with whatever else came meanwhile;
* takes a user's ``/forget`` as a turn of its own, in the chat's order: it clears
  the memory once the turns before it have finished (their replies remembered), so
  "forgotten" leaves nothing of what came before it. Messages that came before it
  are answered first, never merged with what came after it. A stranger's (an
  autonomous turn's) ``/forget`` is taken only in their private chat: a shared chat's
  memory is not theirs to wipe;
* takes a user's ``/cancel`` (or "stop" in a private chat) at once, ahead of the chat's
  queued turns: the turn under way is cancelled (its journal item closes as cancelled, its
  LLM call is aborted, its command killed; see ``cancellation``) and forgotten (its message
  leaves the memory, with what was remembered for it: the next turn is not about it), the
  queued turns are dropped (a queued ``/forget`` is not: it runs next, with its usual
  reply), pending approvals are called off, and the user gets a one-line confirmation, or
  "nothing to cancel". An allowed user cancels all of it; a stranger only their own
  (the turn under way if it is theirs, their queued messages and approvals);
* says nothing to a stranger's ``/cancel`` or ``/forget`` it does not take: like any
  notice to an autonomous turn (``failures``), it would be a public reply to whoever typed it;
* runs a decided approval (``ApprovalOutcome``: the action, or the LLM told it was
  denied) as a turn of its own, in the chat's order.

Per-chat state is data in a handful of actors, not an actor per chat; each keeps it in
its cell's ``_ChatBook``, so a crash of one, caused by any chat, costs no chat its place.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.approvals import APPROVALS, NOTHING_TO_CANCEL, denied_request
from autoresponse.actors.cancellation import abort, cancel_request, is_cancelled
from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.limits import ALBUM_GATHER_SECONDS
from autoresponse.actors.memory import ConversationStore, StoreUnreadable
from autoresponse.actors.routes import LLM, route_of, sender
from autoresponse.messages.approval import ApprovalOutcome, CancelApprovals, CancelWork
from autoresponse.messages import (
    MAX_MESSAGE_CHARS,
    Envelope,
    OriginalContext,
    OutboundMessage,
    ReplyDelivered,
    Turn,
    UserRequest,
    attachments_label,
)


log = logging.getLogger("autoresponse.conversation")

FORGOTTEN = "Done: I have forgotten our conversation."
NOT_FORGOTTEN = "Sorry, I could not clear my memory of our conversation; please try /forget again later."
#: ``/forget``, also as a Telegram group command addressed to a bot (``/forget@synth_bot``).
_FORGET = re.compile(r"^/forget(@\w+)?$", re.IGNORECASE)
CANCELLED = "Cancelled: I stopped working on your request."
CANCEL_UNAVAILABLE = ("Sorry, a request cannot be cancelled here: this bot shares its work with other "
                      "daemons, and a chat's messages are taken strictly one after the other.")
#: ``/cancel`` (``/cancel@synth_bot`` in a group); in a private chat "stop" too.
_CANCEL = re.compile(r"^/cancel(@\w+)?$", re.IGNORECASE)
_STOP = re.compile(r"^stop[.!]*$", re.IGNORECASE)


class TurnEnded(BaseModel):
    """The turn of one chat has finished (sent to the conversation that started it)."""

    model_config = ConfigDict(frozen=True)

    chat: str
    #: The turn that ended: a cancelled turn ends late, after the chat's next one started.
    correlation: str | None = None


class AlbumDue(BaseModel):
    """The time to gather a chat's message group is up (a timer of the conversation);
    ``first`` names the group's first message, so a late timer closes no newer group."""

    model_config = ConfigDict(frozen=True)

    chat: str
    first: str


class AlbumClose(BaseModel):
    """Close a chat's message group, after whatever was already queued (it is sent to the
    conversation's own mailbox, behind the group's last items)."""

    model_config = ConfigDict(frozen=True)

    chat: str
    first: str


def chat_of(message: Any, env: Envelope) -> str:
    """The routing key of the conversation pool: the chat a message belongs to."""
    if isinstance(message, (UserRequest, ReplyDelivered)):
        return message.context.chat_key
    if isinstance(message, ApprovalOutcome):
        return message.request.context.chat_key
    return env.correlation_id


def is_forget(request: UserRequest) -> bool:
    return bool(_FORGET.match(request.text.strip()))


def is_cancel(request: UserRequest) -> bool:
    """``/cancel``, or "stop" alone in a private chat."""
    text = request.text.strip()
    return bool(_CANCEL.match(text) or (request.context.chat_type == "private" and _STOP.match(text)))


def alone(body: Any) -> bool:
    """A turn of its own, never merged with the messages around it: a /forget, a decided approval."""
    return not isinstance(body, UserRequest) or is_forget(body)


def user_of(body: Any) -> str | None:
    """Whose a chat's item is: the user who sent the request, or who asked for the decided action."""
    context: OriginalContext = body.request.context if isinstance(body, ApprovalOutcome) else body.context
    return None if context.user_id is None else str(context.user_id)


def speaker(request: UserRequest) -> tuple[str | None, bool]:
    """Who a request speaks for, and with which rights (a stranger's turn is autonomous):
    only requests of the same speaker may share a turn."""
    return user_of(request), request.context.autonomous


def by_speaker(held: list[Envelope]) -> list[Envelope]:
    """Messages gathered together (albums two people sent at once, interleaved), each
    speaker's together, in the order each began: so each one's album is one turn."""
    groups: dict[tuple[str | None, bool], list[Envelope]] = {}
    for env in held:
        groups.setdefault(speaker(env.body), []).append(env)
    return [env for group in groups.values() for env in group]


#: How the chat's memory fails (a damaged file, a full disk, a lone surrogate SQLite cannot
#: encode): the turn goes on without it (a turn without memory beats no answer, and a
#: crash would restart the actor, losing every chat's queue).
_MEMORY_ERRORS = (sqlite3.Error, StoreUnreadable, UnicodeError)


def _memory_failed(chat: str, what: str, error: Exception) -> None:
    """Log a failure of the memory with its chat, never the text."""
    why = getattr(error, "reason", error)  # a UnicodeError's message would quote the text
    log.warning("conversation memory failed %s for chat %s (%s: %s); going on without it",
                what, chat, type(error).__name__, why)


def cancels(request: UserRequest, body: Any) -> bool:
    """Whether ``request`` (a /cancel) drops a queued item: one it may call off, but never a
    /forget (the user asked for it; it is no work to stop)."""
    return not (isinstance(body, UserRequest) and is_forget(body)) and may_cancel(request, user_of(body))


def may_cancel(request: UserRequest, owner: str | None) -> bool:
    """Whether ``request`` (a /cancel) may call off what ``owner`` sent: an allowed user
    anything of their chat, a stranger (an autonomous turn) only their own."""
    return not request.context.autonomous or (owner is not None and owner == user_of(request))


def merged(requests: list[UserRequest]) -> UserRequest:
    """Several messages of one chat and one speaker as one request: their texts in order,
    one per line, in the context of the last (the reply threads to it)."""
    if len(requests) == 1:
        return requests[0]
    text = "\n".join(r.text for r in requests if r.text)  # an album's photos mostly have no caption
    context = requests[-1].context.model_copy(update={"original_command": text})
    return UserRequest(text=text, context=context, attachments=tuple(a for r in requests for a in r.attachments))


def next_turn(waiting: deque[Envelope]) -> list[Envelope]:
    """What of a chat's queue its next turn takes, from its head (``waiting`` is left as it
    is): a /forget alone, or the messages up to the next /forget, or the next message of
    someone else, together."""
    turn = [waiting[0]]
    if alone(turn[0].body):
        return turn
    # One speaker a turn: merged, a stranger's words would run as an allowed user's.
    # Merged no longer than one message may be: a burst is never one huge request.
    who = speaker(turn[0].body)
    chars = len(turn[0].body.text)
    for env in islice(waiting, 1, None):
        if alone(env.body) or speaker(env.body) != who:
            break
        chars += 1 + len(env.body.text)  # and the line break that joins it
        if chars > MAX_MESSAGE_CHARS:
            break
        turn.append(env)
    return turn


class _Running(NamedTuple):
    """A chat's turn under way: its correlation, the user it runs for, and the id of its
    message in the chat's memory (forgotten if the turn is cancelled; None: none stored)."""

    correlation: str
    user: str | None
    remembered: int | None = None


class _Group(NamedTuple):
    """A message group being gathered: its first message (its timer's), what was held, and
    when the gathering ends (``clock.monotonic()``)."""

    first: str
    held: list[Envelope]
    due: float


class _ChatBook:
    """What a conversation knows of its chats that a crash must not make it forget: each
    chat's turn under way, the messages waiting for it, and the group being gathered.
    Without it a restarted conversation would take the messages put back in its mailbox
    for new ones and start them beside the turn under way, ignore that turn's end, and
    find nothing to cancel in it, for every chat it serves.

    A change is written once it is true (a turn once its request is sent and its end
    watched; a message once it is held; one out of the queue once its turn has started, or
    it is called off), so the message a crash cut short, retried, finds in the book what it
    did not do yet, and does it. What the crashed incarnation held comes back through the
    mailbox, where the book tells it from new messages. One book per cell (``Cell.book``).
    """

    __slots__ = ("gathering", "running", "waiting")

    def __init__(self) -> None:
        self.running: dict[str, _Running] = {}  # chat → its turn under way
        self.waiting: dict[str, deque[Envelope]] = {}  # chat → what waits for it, in order
        self.gathering: dict[str, _Group] = {}  # chat → a message group being gathered

    def held(self) -> Iterator[Envelope]:
        """The messages the book holds for its chats (every one held by the incarnation)."""
        for waiting in self.waiting.values():
            yield from waiting
        for group in self.gathering.values():
            yield from group.held


class ConversationActor(TypedActor):
    """Starts each chat's turns in order; holds what arrives while a turn runs."""

    def __init__(self, store: ConversationStore | None = None) -> None:
        super().__init__()
        self.store = store
        book = self.cell.book(_ChatBook)
        self._running = book.running
        self._waiting = book.waiting
        self._gathering = book.gathering
        #: What an incarnation before this one held (and each group's first message, its
        #: timer's): all of it comes back through the mailbox (see ``_came_back``).
        self._returning = ({env.message_id for env in book.held()}
                           | {group.first for group in book.gathering.values()})

    def _came_back(self, chat: str, env: Envelope) -> bool:
        """Whether ``env`` is one the chat's book has already taken, back in the mailbox after
        a crash: held again while it still waits, its group's timer set again; done with if
        the chat dealt with it meanwhile (a turn started it, a /cancel dropped it)."""
        if env.message_id not in self._returning:
            return False
        group = self._gathering.get(chat)
        if any(held.message_id == env.message_id for held in self._held_for(chat)):
            self.hold(env)
        if group is not None and group.first == env.message_id:  # its timer ended with the crash
            self._close_at(chat, group, env)
        return True

    def _catch_up(self, chat: str) -> None:
        """End the chat's turn under way if all its work has finished though its end was never
        heard (its ``TurnEnded`` lost to crashes, dead-lettered): a turn the book holds for
        ever would hold the chat for good. A ``TurnEnded`` that comes after is then a stale one."""
        running = self._running.get(chat)
        if running is not None and not self.runtime.inflight.count(running.correlation):
            del self._running[chat]
            self._next_turn(chat)

    def _held_for(self, chat: str) -> Iterator[Envelope]:
        """What waits in ``chat``: its queue, then its group being gathered."""
        yield from self._waiting.get(chat, ())
        group = self._gathering.get(chat)
        if group is not None:
            yield from group.held

    @handles
    def on_request(self, request: UserRequest, env: Envelope) -> None:
        chat = request.context.chat_key
        if self._came_back(chat, env):
            return
        self._catch_up(chat)
        if is_cancel(request):  # at once: it cannot wait for the turn it cancels
            self._cancel(chat, env)
            return
        if is_forget(request) and request.context.autonomous and request.context.chat_type != "private":
            # A shared chat's memory (an X thread, a group) is not a stranger's to wipe.
            self._ignore(request, "/forget")
            return
        if chat in self._gathering or request.media_group is not None:
            self._gather(chat, env)
            return
        if chat in self._running:
            # A /forget waits too: run now, it would clear the memory before the turns
            # ahead of it wrote their messages and replies.
            self.hold(env)
            self._waiting.setdefault(chat, deque()).append(env)
            return
        self._start(chat, [env])

    def _gather(self, chat: str, env: Envelope) -> None:
        """Hold a message of a group (an album), and what comes after it, for one turn."""
        self.hold(env)
        gathering = self._gathering.get(chat)
        if gathering is None:
            due = self.runtime.clock.monotonic() + ALBUM_GATHER_SECONDS
            gathering = self._gathering[chat] = _Group(first=env.message_id, held=[env], due=due)
            self._close_at(chat, gathering, env)
        else:
            gathering.held.append(env)

    def _close_at(self, chat: str, group: _Group, env: Envelope) -> None:
        """Set the timer that closes ``group`` when its gathering ends (``env``: its first message)."""
        left = max(group.due - self.runtime.clock.monotonic(), 0.0)
        self.schedule(left, AlbumDue(chat=chat, first=group.first), cause=env)

    @handles
    def on_album_due(self, due: AlbumDue, env: Envelope) -> None:
        # A timer comes ahead of queued work: items of the group already queued go first.
        self.send(self.name, AlbumClose(chat=due.chat, first=due.first), cause=env)

    @handles
    def on_album_close(self, close: AlbumClose, env: Envelope) -> None:
        gathered = self._gathering.get(close.chat)
        # Else the group was cancelled (a newer one may be gathering), or this message's
        # attempt that crashed queued it already.
        if gathered is not None and gathered.first == close.first:
            del self._gathering[close.chat]
            self._waiting.setdefault(close.chat, deque()).extend(by_speaker(gathered.held))
        if close.chat not in self._running:
            self._next_turn(close.chat)

    @handles
    def on_turn_ended(self, ended: TurnEnded, env: Envelope) -> None:
        running = self._running.get(ended.chat)
        if running is not None:
            if ended.correlation is not None and running.correlation != ended.correlation:
                return  # a cancelled turn's work ended: the chat went on without it
            del self._running[ended.chat]
        # (With no turn under way, a crash came between this turn's end and the next one's
        # start, which this message, retried, makes; or nothing waits.)
        self._next_turn(ended.chat)

    def _next_turn(self, chat: str) -> None:
        """Start the chat's next turn from what waits (``next_turn``)."""
        waiting = self._waiting.get(chat)
        if not waiting:
            self._waiting.pop(chat, None)
            return
        turn = next_turn(waiting)
        self._start(chat, turn)
        # Out of the queue once started: a crash before leaves them waiting for the retry.
        for _ in turn:
            waiting.popleft()
        if not waiting:
            del self._waiting[chat]
        for held in turn:
            self.release(held)

    @handles
    def on_reply_delivered(self, delivered: ReplyDelivered, env: Envelope) -> None:
        chat = delivered.context.chat_key
        if is_cancelled(self.runtime, env.correlation_id):
            return  # confirmed after its turn's /cancel: the turn is forgotten, its reply too
        if self.store is not None:
            try:
                self.store.append(chat, "assistant", delivered.text, kind="reply")
            except _MEMORY_ERRORS as error:
                _memory_failed(chat, "remembering a reply", error)

    def _start(self, chat: str, envelopes: list[Envelope]) -> None:
        """Start the chat's next turn: a /forget, a decided approval, or the requests in ``envelopes``."""
        if isinstance(envelopes[0].body, ApprovalOutcome):
            self._decided(chat, envelopes[0])
        elif is_forget(envelopes[0].body):
            self._forget(chat, envelopes[0])
        else:
            self._begin(chat, envelopes)

    def _begin(self, chat: str, envelopes: list[Envelope]) -> None:
        """Start one turn for the requests in ``envelopes`` (their last one carries it)."""
        request = merged([e.body for e in envelopes])
        cause = envelopes[-1]
        remembered = None
        if self.store is not None:
            try:
                self.store.seen(request.context)
            except _MEMORY_ERRORS as error:
                _memory_failed(chat, "noting the chat", error)
            said = " ".join(filter(None, (request.text, attachments_label(request.attachments))))
            remembered, turns = self._remember(chat, cause.correlation_id, said)
            request = request.model_copy(update={"turns": tuple(turns)})
        self.send(LLM, request, cause=cause)
        self._turn(chat, cause, remembered)

    def _remember(self, chat: str, correlation: str, said: str) -> tuple[int | None, list[Turn]]:
        """Remember the message ``said`` that starts the turn ``correlation``: its id in the
        memory, and the chat's turns before it. A turn resumed from the journal (after a
        crash, or a stop whose drain ran out) was remembered at its first start: its message
        is neither stored again nor sent twice (the request carries it)."""
        assert self.store is not None
        try:
            stored = self.store.stored_for(chat, correlation)
            before = self.store.history(chat)
        except _MEMORY_ERRORS as error:
            _memory_failed(chat, "reading the memory", error)
            stored, before = None, []
        if stored is not None:
            return stored, [Turn(role=e.role, content=e.content) for e in before if e.id < stored]
        remembered = None
        try:
            remembered = self.store.append(chat, "user", said, correlation=correlation)
        except _MEMORY_ERRORS as error:
            _memory_failed(chat, "remembering a message", error)
        return remembered, [Turn(role=e.role, content=e.content) for e in before]

    def _recent(self, chat: str) -> list[Any]:
        """The chat's recent turns; none when the memory cannot be read."""
        if self.store is not None:
            try:
                return self.store.recent(chat)
            except _MEMORY_ERRORS as error:
                _memory_failed(chat, "reading the memory", error)
        return []

    def _turn(self, chat: str, env: Envelope, remembered: int | None = None) -> None:
        """``env``'s correlation is the chat's turn under way until it has finished (called
        once the turn's work is sent: in the book, it is a turn started); ``remembered``: the
        id of its message in the memory."""
        self.runtime.when_finished(env.correlation_id, self.name,
                                   TurnEnded(chat=chat, correlation=env.correlation_id))
        self._running[chat] = _Running(env.correlation_id, user_of(env.body), remembered)

    def _forget(self, chat: str, env: Envelope) -> None:
        """Clear the chat's memory (if the store fails, the user hears it was not cleared); its
        answer is a turn, so what comes after waits for it."""
        request: UserRequest = env.body
        answer = FORGOTTEN if self.store is None else NOT_FORGOTTEN
        if self.store is not None:
            try:
                self.store.forget(chat)
                answer = FORGOTTEN
            except _MEMORY_ERRORS as error:
                _memory_failed(chat, "forgetting", error)
        self.send(sender(request.context.interface_name),
                  OutboundMessage.reply(request.context, answer, notice=True), cause=env)
        self._turn(chat, env)

    @handles
    def on_outcome(self, outcome: ApprovalOutcome, env: Envelope) -> None:
        chat = outcome.request.context.chat_key
        if self._came_back(chat, env):
            return
        self._catch_up(chat)
        if chat in self._running or self._waiting.get(chat):
            self.hold(env)
            self._waiting.setdefault(chat, deque()).append(env)
            return
        self._start(chat, [env])

    def _decided(self, chat: str, env: Envelope) -> None:
        """A decided approval's turn: the action runs, or the LLM hears it was denied."""
        outcome: ApprovalOutcome = env.body
        if outcome.approved:
            self.send(route_of(outcome.request.action), outcome.request, cause=env)
        else:
            request = denied_request(self.runtime, outcome, self._recent(chat))
            if request is not None:
                self.send(LLM, request, cause=env)
        self._turn(chat, env)

    def _cancel(self, chat: str, env: Envelope) -> None:
        """Cancel the chat's turn under way and drop its queued turns (a stranger's /cancel:
        only theirs), then confirm."""
        request: UserRequest = env.body
        ctx = request.context
        if self.runtime.intake.distributed:
            # On a shared journal a chat's items run one after the other, so this one
            # runs only once the request it would cancel has finished: say so plainly
            # (to a stranger nothing: on X it would be a public reply).
            if ctx.autonomous:
                self._ignore(request, "/cancel")
            else:
                self._say(ctx, CANCEL_UNAVAILABLE, env)
            return
        dropped = [e for e in self._held_for(chat) if cancels(request, e.body)]  # the rest stays
        running = self._running.get(chat)
        if running is not None and not may_cancel(request, running.user):
            running = None  # someone else's turn: it goes on
        cancelled = ([running.correlation] if running is not None else []) + [e.correlation_id for e in dropped]
        for correlation in dict.fromkeys(cancelled):
            cancel_request(self.runtime, correlation)
        if cancelled:
            abort(self.runtime, CancelWork(chat=chat, correlations=tuple(dict.fromkeys(cancelled))))
        # Out of the book once called off: a crash before, and the /cancel, retried, does it all.
        self._drop(chat, {e.message_id for e in dropped})
        if running is not None:
            self._forget_turn(chat, running)
            del self._running[chat]
        for held in dropped:
            self.release(held)
        self._confirm(request, bool(cancelled), env)
        if running is not None:
            # What others queued (not this user's to cancel), and a /forget, go on: after
            # the confirmation, which answers what came first.
            self._next_turn(chat)

    def _forget_turn(self, chat: str, running: _Running) -> None:
        """Take a cancelled turn out of the chat's memory: what came next would otherwise be
        answered about it (queued messages were never remembered)."""
        if self.store is not None and running.remembered is not None:
            try:
                self.store.forget_turn(chat, running.remembered)
            except _MEMORY_ERRORS as error:
                _memory_failed(chat, "forgetting a cancelled turn", error)

    def _confirm(self, request: UserRequest, cancelled: bool, env: Envelope) -> None:
        """Call off the chat's pending approvals too (a stranger's: theirs), and tell the user."""
        ctx = request.context
        if self.runtime.has(APPROVALS):
            self.send(APPROVALS, CancelApprovals(context=ctx, confirm=not cancelled), cause=env)
            if not cancelled:
                return  # the desk answers: it knows whether an approval was pending
        if cancelled:
            self._say(ctx, CANCELLED, env)
        elif ctx.autonomous:
            self._ignore(request, "/cancel")
        else:
            self._say(ctx, NOTHING_TO_CANCEL, env)

    def _drop(self, chat: str, dropped: set[str]) -> None:
        """Take the messages ``dropped`` names out of the chat's queue and its group being
        gathered; the rest stays, in order (a group's, until its timer)."""
        kept = deque(e for e in self._waiting.pop(chat, ()) if e.message_id not in dropped)
        if kept:
            self._waiting[chat] = kept
        group = self._gathering.pop(chat, None)
        if group is not None and (held := [e for e in group.held if e.message_id not in dropped]):
            self._gathering[chat] = group._replace(held=held)

    def _ignore(self, request: UserRequest, what: str) -> None:
        """A stranger's command that is not theirs to give: logged, not answered (an autonomous
        turn gets no notices, see ``failures``; on X each would be a public reply)."""
        ctx = request.context
        log.info("ignored %s from %s in %s chat %s: a stranger's may touch only their own",
                 what, ctx.user_name or ctx.user_id, ctx.interface_name, ctx.chat_id)

    def _say(self, ctx: Any, text: str, env: Envelope) -> None:
        self.send(sender(ctx.interface_name), OutboundMessage.reply(ctx, text, notice=True), cause=env)
