"""Cancelled requests: what a user's ``/cancel`` called off, and telling the actors
that hold its work.

The conversation cancels a chat's request in three steps:

* ``cancel_request`` closes its journal item as ``cancelled`` at once, so a restart
  never brings it back, and remembers it (for a while, bounded) so that any late
  work of it is dropped wherever it arrives (``is_cancelled``): a reply that was
  already on its way to the LLM client, an action already on its way to an executor;
* ``abort`` hands a ``CancelWork`` to every actor that handles one, ahead of its
  queued work (an actor at its I/O limit takes no work, but always control
  messages): the LLM client aborts the call, an executor kills the command's
  process group;
* the approvals desk, if there is one, calls off the chat's pending approvals.

>>> cancel_request(runtime, "telegram-1000-17")                     # doctest: +SKIP
>>> abort(runtime, CancelWork(chat="telegram:42:", correlations=("telegram-1000-17",)))  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from autoresponse.messages.approval import CancelWork
from autoresponse.messages.envelope import Envelope

if TYPE_CHECKING:
    from autoresponse.actors.kernel.actor import TypedActor
    from autoresponse.actors.kernel.runtime import Runtime

#: Cancelled correlations remembered per runtime (late work of older ones is long gone).
CANCELLED_KEPT = 10_000


class _Cancelled:
    __slots__ = ("ids", "lock")

    def __init__(self) -> None:
        self.ids: OrderedDict[str, None] = OrderedDict()
        self.lock = threading.Lock()


_registry: WeakKeyDictionary[Runtime, _Cancelled] = WeakKeyDictionary()
_registry_lock = threading.Lock()


def _of(runtime: Runtime) -> _Cancelled:
    global _last
    last = _last  # asked on every hop: the last runtime asked about first (a daemon has one)
    if last is not None and last[0]() is runtime:
        return last[1]
    with _registry_lock:
        found = _registry.get(runtime)
        if found is None:
            found = _registry[runtime] = _Cancelled()
        _last = (weakref.ref(runtime), found)
        return found


#: The runtime ``_of`` answered last, weakly, with its ids: no WeakKeyDictionary lookup
#: (Python code, and a new weak reference) on every hop.
_last: tuple[weakref.ref[Runtime], _Cancelled] | None = None


def cancel_request(runtime: Runtime, correlation: str) -> None:
    """Call off ``correlation``: its journal item closes as ``cancelled`` now (the journal
    commits in order, so before anything written after), and its late work is dropped."""
    cancelled = _of(runtime)
    with cancelled.lock:
        cancelled.ids[correlation] = None
        cancelled.ids.move_to_end(correlation)
        while len(cancelled.ids) > CANCELLED_KEPT:
            cancelled.ids.popitem(last=False)
    if runtime.journal is not None:
        runtime.journal.finish(correlation, "cancelled")


def is_cancelled(runtime: Runtime, correlation: str) -> bool:
    """True when ``correlation`` was cancelled by its user: its work is dropped."""
    # One membership test of a C-implemented dict is atomic: no lock on this, the hot path.
    return correlation in _of(runtime).ids


def abort(runtime: Runtime, work: CancelWork) -> list[str]:
    """Hand ``work`` to every actor that handles ``CancelWork``, ahead of its queue; the
    names of those told."""
    told = []
    for cell in runtime.cells:
        if CancelWork in cell.actor_class._handlers:
            runtime.signal(cell.name, work)
            told.append(cell.name)
    return told


def abort_io(actor: TypedActor, correlations: Iterable[str]) -> int:
    """Cancel the I/O ``actor`` runs for ``correlations`` (an LLM call, a command, a timer
    with a cause): its coroutine gets ``CancelledError`` on the loop (and cleans up, e.g.
    kills a process group), and the work stops waiting for it. How many were cancelled.
    Call it from the actor's own thread (a handler)."""
    wanted = set(correlations)
    with actor._owned_lock:
        tasks = [task for task, owner in actor._owned.items()
                 if isinstance(owner, Envelope) and owner.correlation_id in wanted]
    for task in tasks:
        actor.cancel(task)
    return len(tasks)
