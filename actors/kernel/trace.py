"""Traces: every hop of a request, to see where it went, how long it waited, and how it ended.

The runtime records each message of a correlation: the actor it went to, its
type, when it was queued, when its handling started and ended, its attempt, and
its outcome (handled, a crash, a dead letter's reason, or cut short by a stop).
The newest ``keep`` correlations stay in memory; with a journal, each finished
trace is also kept there (with the work's item, when it has one)::

    >>> runtime.tracer.trace("c-42")                                   # doctest: +SKIP
    [{'actor': 'conversations', 'type': 'UserRequest', 'queued': ..., ...}, ...]

Recording appends one event per step, with no lock (a hop being handled is one list,
closed in place when it ends); ``Runtime(trace=False)``
turns it off (the benchmark measures its cost). ``spans``, when set (OpenTelemetry: see
``autoresponse.otel``), hears every event too; unset, it costs one attribute check.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from autoresponse.actors.limits import TRACE_HOPS_KEPT, TRACES_KEPT
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
    """Thread-safe without a lock, bounded in correlations and in events per correlation.

    Recording is on every hop's path, so it only appends: an event to the correlation's
    list (atomic under the GIL), and the hops are put together when a trace is read.
    """

    def __init__(self, keep: int = TRACES_KEPT, max_hops: int = TRACE_HOPS_KEPT, *,
                 now: Callable[[], float] = time.time) -> None:
        self._now = now  # the runtime's clock (wall time); Clock().time is time.time itself
        self._traces: dict[str, list[Sequence[Any]]] = {}
        self._order: deque[str] = deque()  # correlations, oldest first, to forget the oldest
        self._keep = keep
        self._max_events = 3 * max_hops  # a hop's queued and handled, with room for notes and ends
        #: Hears every event too (OpenTelemetry), when set.
        self.spans: HopSpans | None = None

    def _events(self, correlation: str) -> list[Sequence[Any]]:
        events = self._traces.get(correlation)
        if events is None:
            events = self._traces.setdefault(correlation, [])
            self._order.append(correlation)
            if len(self._order) > self._keep:
                try:
                    self._traces.pop(self._order.popleft(), None)
                except IndexError:  # another thread forgot it first
                    pass
        return events

    def queued(self, env: Envelope, actor: str, kind: str | None = None) -> None:
        """``env`` (or the result of its I/O, of type ``kind``) entered ``actor``'s mailbox."""
        events = self._traces.get(env.correlation_id)  # on every hop: a new one is the rare case
        if events is None:
            events = self._events(env.correlation_id)
        if len(events) < self._max_events:
            events.append((_QUEUED, env.message_id, env.attempt, kind or type(env.body).__name__, self._now(),
                           env.causation_id, actor))
        if self.spans is not None:
            self.spans.queued(env, actor, kind)

    def started(self, env: Envelope, kind: str) -> list[Any] | None:
        """``env`` (of type ``kind``) is being handled: its hop, for ``handled`` to close.
        One event for both ends, filled in when it ends: half the appends of two."""
        hop: list[Any] | None = None
        events = self._traces.get(env.correlation_id)
        if events is not None and len(events) < self._max_events:
            hop = [_HANDLED, env.message_id, env.attempt, kind, self._now(), None, None]
            events.append(hop)
        if self.spans is not None:
            self.spans.started(env, kind)
        return hop

    def handled(self, hop: list[Any] | None, env: Envelope, kind: str, outcome: str) -> None:
        """The handling ``started`` recorded has ended (``handled``, or a ``crash``)."""
        if hop is not None:
            hop[6] = outcome  # before the time: a reader takes a hop with a time as ended
            hop[5] = self._now()
        if self.spans is not None:
            self.spans.ended(env, kind, outcome)

    def ended(self, env: Envelope, kind: str, outcome: str) -> None:
        events = self._traces.get(env.correlation_id)
        if events is not None and len(events) < self._max_events:
            events.append((_ENDED, env.message_id, env.attempt, kind, self._now(), outcome))
        if self.spans is not None:
            self.spans.ended(env, kind, outcome)

    def note(self, env: Envelope, kind: str, text: str) -> None:
        """Attach ``text`` to the hop of ``env`` (of type ``kind``): what an LLM call cost,
        an action a re-ask repeated and that was dropped. Shown as the hop's ``notes``."""
        events = self._traces.get(env.correlation_id)
        if events is not None and len(events) < self._max_events:
            events.append((_NOTE, env.message_id, env.attempt, kind, text))
        if self.spans is not None:
            self.spans.note(env, kind, text)

    def dead_letter(self, env: Envelope, reason: str, actor: str | None) -> None:
        """``env`` became a dead letter: its hop ends there (one that was never queued,
        such as a re-ask given up on, gets a hop of its own)."""
        kind = type(env.body).__name__
        self.queued(env, actor or "dead letters", kind)  # ignored for a hop already queued
        self.ended(env, kind, f"{_DEAD}{reason}")

    def finished(self, correlation: str, *, keep: bool = False) -> Any:
        """The correlation has nothing left in flight. With ``keep``, its trace to keep (in
        the journal), JSON-ready and as recorded: the hops are put together when it is
        read (``hops_of``), not on every request's path. None when nothing was recorded."""
        if self.spans is not None:
            self.spans.finished(correlation)
        events = self._traces.get(correlation)
        if not events:
            return None
        # Its hops are closed: as tuples of plain values the garbage collector stops
        # walking them (thousands of kept traces, walked at every collection, were the
        # pipeline's p99). In place, index by index: an event appended meanwhile stays.
        for index, event in enumerate(events):
            if type(event) is list:
                events[index] = tuple(event)
        return {"events": list(events)} if keep else None

    def trace(self, correlation: str) -> list[dict[str, Any]]:
        """The hops of ``correlation`` in causal order: each after the one that caused it,
        siblings in the order they were queued."""
        return _hops(list(self._traces.get(correlation, ())))

    def correlations(self) -> list[str]:
        """The correlations kept, newest last."""
        return [c for c in list(self._order) if c in self._traces]


_QUEUED, _ENDED, _NOTE = "queued", "ended", "note"
#: Started, and ended once its last two fields are set (``started`` / ``handled``).
_HANDLED = "handled"
_DEAD = "dead letter: "


def hops_of(kept: Any) -> list[dict[str, Any]]:
    """The hops of a trace as ``on_finished`` handed it over, read back from a journal
    (JSON); a journal written before traces were kept as events holds the hops themselves."""
    if isinstance(kept, dict) and isinstance(kept.get("events"), list):
        return _hops(kept["events"])
    return kept if isinstance(kept, list) else []


def _hops(events: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Events (tuples as recorded, or lists read back from JSON) as hops, in causal order."""
    hops: dict[tuple[Any, ...], dict[str, Any]] = {}
    for event in events:
        key = tuple(event[1:4])  # message id, attempt, type
        what = event[0]
        if what == _QUEUED:
            message_id, attempt, kind, at, causation_id, actor = event[1:]
            hops.setdefault(key, dict(zip(_HOP_FIELDS, (message_id, causation_id, actor, kind, attempt,
                                                        at, None, None, None), strict=True)))
        elif (hop := hops.get(key)) is not None:
            if what == _HANDLED:
                hop["started"] = event[4]
                if event[5] is not None and hop["ended"] is None:
                    hop["ended"], hop["outcome"] = event[5], event[6]
            elif what == _NOTE:
                hop.setdefault("notes", []).append(event[4])
            elif hop["ended"] is None:
                hop["ended"], hop["outcome"] = event[4], event[5]
            elif event[5].startswith(_DEAD):  # handled, and what it led to went nowhere
                hop["outcome"] = event[5]
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
