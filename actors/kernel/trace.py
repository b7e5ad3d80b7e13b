"""Traces: every hop of a request, to see where it went, how long it waited, and how it ended.

The runtime records each message of a correlation: the actor it went to, its
type, when it was queued, when its handling started and ended, its attempt, and
its outcome (handled, a crash, a dead letter's reason, or cut short by a stop).
The newest ``keep`` finished correlations stay in memory, and every one in flight; with
a journal, each finished trace is also kept there (with the work's item, when it has one)::

    >>> runtime.tracer.trace("c-42")                                   # doctest: +SKIP
    [{'actor': 'conversations', 'type': 'UserRequest', 'queued': ..., ...}, ...]

Recording appends one event per hop, when it ends, with no lock; what is still queued or
being handled is read off the mailboxes and the actors when a trace is read.
``Runtime(trace=False)`` turns it off (the benchmark measures its cost). ``spans``, when
set (OpenTelemetry: see ``autoresponse.otel``), hears every event too; unset, it costs one
attribute check.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from autoresponse.actors.limits import TRACE_HOPS_KEPT, TRACES_IN_FLIGHT_KEPT, TRACES_KEPT
from autoresponse.messages.envelope import Envelope

_HOP_FIELDS = ("message_id", "causation_id", "actor", "type", "attempt", "queued", "started", "ended", "outcome")


class HopSpans(Protocol):
    """What hears every hop event besides the ring: spans for OpenTelemetry, set by the
    composition root (``autoresponse.otel``); the kernel knows only this shape. ``kind``
    is None for a message delivered, a type name for the result of its I/O."""

    def queued(self, env: Envelope, actor: str, kind: str | None) -> None: ...
    def started(self, env: Envelope, kind: str) -> None: ...
    def ended(self, env: Envelope, kind: str, outcome: str) -> None: ...
    def note(self, env: Envelope, kind: str, text: str) -> None: ...
    def finished(self, correlation: str) -> None: ...
    def published(self, env: Envelope, actor: str) -> str:
        """A span for ``env`` published as work for the cluster: its W3C traceparent."""
        ...


class TraceRecorder:
    """Thread-safe, and bounded: the newest ``keep`` finished correlations, every one still in
    flight up to ``in_flight`` more (past that the oldest goes, finished or not), and
    ``max_hops`` hops of each. A hop takes no lock; a correlation takes one as it starts
    and as it finishes. A trace in flight is never forgotten for newer ones.

    Recording is on every hop's path, so it writes once per hop: the runtime stamps an
    envelope when it queues it (``queued``), and the actor that handled it appends the whole
    hop when its handling ends (``handled``), one tuple of plain values (atomic under the
    GIL), to the trace its envelope carries (``Envelope.trace``: looked up once, as the
    correlation's first message is queued, and handed on to every message it causes).
    What is still queued or being handled is read from the mailboxes and the actors
    when a trace is read (``trace``'s ``in_flight``), not recorded on the way.
    """

    def __init__(self, keep: int = TRACES_KEPT, max_hops: int = TRACE_HOPS_KEPT, *,
                 in_flight: int = TRACES_IN_FLIGHT_KEPT, now: Callable[[], float] = time.time) -> None:
        #: The runtime's clock (wall time); Clock().time is time.time itself.
        self.now = now
        self._traces: OrderedDict[str, list[Sequence[Any]]] = OrderedDict()  # oldest first
        self._finished: deque[str] = deque()  # the newest ``keep`` finished, oldest first
        self._keep = keep
        self._most = keep + in_flight  # past it, the oldest goes, finished or not
        self._max_events = 2 * max_hops  # a hop, with room for notes
        self._lock = threading.Lock()  # once a correlation: as it starts, as it finishes
        #: Hears every event too (OpenTelemetry), when set.
        self.spans: HopSpans | None = None

    def _start(self, correlation: str, *, finished: bool = False) -> list[Sequence[Any]]:
        """The trace of ``correlation``: kept from now on, unless it is kept already."""
        lock = self._lock
        lock.acquire()  # not ``with``, which binds two methods of the lock: once a request
        try:
            events = self._traces.get(correlation)
            if events is None:
                events = self._traces[correlation] = []
                if finished:
                    self._kept(correlation)
                if len(self._traces) > self._most:
                    self._traces.popitem(last=False)
            return events
        finally:
            lock.release()

    def _kept(self, correlation: str) -> None:
        """Among the newest finished now; the oldest of them goes (under the lock)."""
        self._finished.append(correlation)
        while len(self._finished) > self._keep:
            self._traces.pop(self._finished.popleft(), None)

    def _record(self, env: Envelope, event: tuple[Any, ...]) -> None:
        events = env.trace
        if events is None:
            events = env.trace = self._traces.get(env.correlation_id)
        if events is not None and len(events) < self._max_events:
            events.append(event)

    def queued(self, env: Envelope, actor: str, kind: str | None = None) -> None:
        """``env`` (or the result of its I/O, of type ``kind``) enters ``actor``'s mailbox:
        stamped with the time, recorded with its hop when that ends."""
        env.queued_at = self.now()
        if env.trace is None:  # its first hop: its children carry its trace on
            env.trace = self._start(env.correlation_id)
        if self.spans is not None:
            self.spans.queued(env, actor, kind)

    def handled(self, started: float, env: Envelope, kind: str, outcome: str, actor: str) -> None:
        """The handling of ``env`` by ``actor``, begun at ``started``, has ended (``handled``,
        or a ``crash``): its whole hop, in one event. A message never queued through the
        runtime's delivery (a control signal) is not traced."""
        queued = env.queued_at
        if queued is not None:
            events = env.trace  # _record's, inline: on every hop
            if events is None:  # it made a dead letter of itself as it was handled
                events = self._traces.get(env.correlation_id)
            if events is not None and len(events) < self._max_events:
                events.append((_HOP, env.message_id, env.attempt, kind, queued, started, self.now(), outcome,
                               env.causation_id, actor))
        if self.spans is not None:
            self.spans.ended(env, kind, outcome)

    def ended(self, env: Envelope, kind: str, outcome: str, actor: str | None = None) -> None:
        """``env`` ends without being handled (a dead letter, cut short by a stop): its hop."""
        now = self.now()
        queued = env.queued_at
        if queued is None and env.trace is None and env.correlation_id not in self._traces:
            # Nothing of it in flight was traced (a message to no such actor, from outside):
            # a trace that is over already, kept among the finished, not the ones in flight.
            env.trace = self._start(env.correlation_id, finished=True)
        self._record(env, (_HOP, env.message_id, env.attempt, kind, now if queued is None else queued, None, now,
                           outcome, env.causation_id, actor or "dead letters"))
        if self.spans is not None:
            if queued is None:  # never queued: its span starts here
                self.spans.queued(env, actor or "dead letters", kind)
            self.spans.ended(env, kind, outcome)

    def note(self, env: Envelope, kind: str, text: str, *args: str | int | float) -> None:
        """Attach ``text`` to the hop of ``env`` (of type ``kind``): what an LLM call cost,
        an action a re-ask repeated and that was dropped. Shown as the hop's ``notes``. With
        ``args``, ``text`` is a ``str.format`` template filled in when the trace is read (a
        note on every request is not formatted on its path)."""
        self._record(env, (_NOTE, env.message_id, env.attempt, kind, text, *args))  # flat: nothing for the GC
        if self.spans is not None:
            self.spans.note(env, kind, text.format(*args) if args else text)

    def dead_letter(self, env: Envelope, reason: str, actor: str | None) -> None:
        """``env`` became a dead letter: its hop ends there (one handled already, such as a
        re-ask given up on, shows what it led to as its outcome)."""
        self.ended(env, type(env.body).__name__, f"{_DEAD}{reason}", actor)
        env.trace = None  # the dead-letter office keeps the envelope, for a replay: not its trace

    def finished(self, correlation: str, *, keep: bool = False) -> Any:
        """The correlation has nothing left in flight. With ``keep``, its trace to keep (in
        the journal), JSON-ready and as recorded: the hops are put together when it is
        read (``hops_of``), not on every request's path. None when nothing was recorded."""
        if self.spans is not None:
            self.spans.finished(correlation)
        events = self._traces.get(correlation)
        if events is None:
            return None
        lock = self._lock
        lock.acquire()  # as in ``_start``
        try:
            self._kept(correlation)
        finally:
            lock.release()
        return {"events": list(events)} if keep and events else None

    def trace(self, correlation: str, in_flight: Iterable[InFlightHop] = ()) -> list[dict[str, Any]]:
        """The hops of ``correlation`` in causal order: each after the one that caused it,
        siblings in the order they were queued. ``in_flight``: its messages still queued
        or being handled (the runtime reads them off its mailboxes and actors)."""
        events: list[Sequence[Any]] = list(self._traces.get(correlation, ()))
        for env, actor, kind, started in in_flight:
            if env.queued_at is not None:
                events.append((_HOP, env.message_id, env.attempt, kind, env.queued_at, started, None, None,
                               env.causation_id, actor))
        return _hops(events)

    def correlations(self) -> list[str]:
        """The correlations kept, newest last."""
        with self._lock:
            return list(self._traces)


#: A message of a trace still in flight: its envelope, the actor it is queued at or handled
#: by, its type, and when its handling started (None while it waits in the mailbox).
InFlightHop = tuple[Envelope, str, str, "float | None"]

#: A hop: message id, attempt, type, queued, started, ended, outcome, causation id, actor.
_HOP = "hop"
_NOTE = "note"
#: Events of traces recorded before hops were one event each (kept in journals).
_QUEUED, _ENDED, _HANDLED = "queued", "ended", "handled"
_DEAD = "dead letter: "


def hops_of(kept: Any) -> list[dict[str, Any]]:
    """The hops of a trace as ``on_finished`` handed it over, read back from a journal
    (JSON); a journal written before traces were kept as events holds the hops themselves."""
    try:
        if isinstance(kept, dict) and isinstance(kept.get("events"), list):
            return _hops(kept["events"])
        return [dict(hop) for hop in kept] if isinstance(kept, list) else []
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):  # damaged, or another version's
        return []


def _hops(events: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Events (tuples as recorded, or lists read back from JSON) as hops, in causal order."""
    hops: dict[tuple[Any, ...], dict[str, Any]] = {}
    notes: list[Sequence[Any]] = []
    for event in events:
        key = tuple(event[1:4])  # message id, attempt, type
        what = event[0]
        if what == _HOP:
            message_id, attempt, kind, queued, started, ended, outcome, causation_id, actor = event[1:]
            hop = hops.get(key)
            if hop is None:
                hops[key] = dict(zip(_HOP_FIELDS, (message_id, causation_id, actor, kind, attempt, queued, started,
                                                   ended, outcome), strict=True))
            elif hop["ended"] is None:  # read in flight, and recorded meanwhile
                hop.update(started=started, ended=ended, outcome=outcome)
            elif outcome is not None and outcome.startswith(_DEAD):  # handled, and what it led to went nowhere
                hop["outcome"] = outcome
        elif what == _NOTE:
            notes.append(event)
        elif what == _QUEUED:
            message_id, attempt, kind, at, causation_id, actor = event[1:]
            hops.setdefault(key, dict(zip(_HOP_FIELDS, (message_id, causation_id, actor, kind, attempt,
                                                        at, None, None, None), strict=True)))
        elif (hop := hops.get(key)) is not None:
            if what == _HANDLED:
                hop["started"] = event[4]
                if event[5] is not None and hop["ended"] is None:
                    hop["ended"], hop["outcome"] = event[5], event[6]
            elif hop["ended"] is None:
                hop["ended"], hop["outcome"] = event[4], event[5]
            elif event[5].startswith(_DEAD):
                hop["outcome"] = event[5]
    for note in notes:  # a note is written while its hop is handled, before the hop is
        if (hop := hops.get(tuple(note[1:4]))) is not None:
            hop.setdefault("notes", []).append(note[4].format(*note[5:]) if len(note) > 5 else note[4])
    return causal_order(list(hops.values()))


def causal_order(hops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Depth first from the messages nothing in the trace caused: each message, then the
    results of its own I/O (same message id), then the messages it caused, in queue order."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for hop in sorted(hops, key=lambda h: h["queued"]):
        by_id.setdefault(hop["message_id"], []).append(hop)
    children: dict[str | None, list[str]] = {}
    for message_id, same in by_id.items():  # in queue order of each message's first hop
        cause = same[0]["causation_id"]
        children.setdefault(cause if cause in by_id else None, []).append(message_id)
    ordered: list[dict[str, Any]] = []
    stack = list(reversed(children.get(None, [])))
    seen: set[str] = set()
    while stack:
        message_id = stack.pop()
        if message_id in seen:
            continue
        seen.add(message_id)
        ordered.extend(by_id[message_id])
        stack.extend(reversed(children.get(message_id, [])))
    return ordered
