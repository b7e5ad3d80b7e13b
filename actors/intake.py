"""Durable intake: work from outside is journaled before it is acknowledged,
resumed after a crash or kill, and marked done when its correlation finishes.

>>> runtime.journal = SqliteJournal(path)                          # doctest: +SKIP
>>> runtime.accept("llm", request, correlation_id="telegram-7").result()  # then acknowledge
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import TYPE_CHECKING, Any

from autoresponse.messages.envelope import Envelope

if TYPE_CHECKING:
    from autoresponse.actors.journal import DeliveryJournal
    from autoresponse.actors.runtime import Runtime

log = logging.getLogger("autoresponse.intake")


class Intake:
    """The runtime's front door for work that must survive a kill."""

    def __init__(self, runtime: Runtime, journal: DeliveryJournal) -> None:
        self.runtime = runtime
        self.journal = journal
        self._open: set[str] = set()
        self._lock = threading.Lock()

    def accept(self, to: str, body: Any, correlation_id: str | None) -> concurrent.futures.Future[Envelope]:
        envelope = Envelope.new(body, correlation_id=correlation_id)
        accepted: concurrent.futures.Future[Envelope] = concurrent.futures.Future()

        def journaled(written: concurrent.futures.Future[bool]) -> None:
            error = written.exception()
            if error is not None:
                accepted.set_exception(error)
                return
            if written.result():  # new; a known correlation is already running or done
                with self._lock:
                    self._open.add(envelope.correlation_id)
                self.runtime.deliver(to, envelope)
            accepted.set_result(envelope)

        self.journal.accept(envelope, actor=to).add_done_callback(journaled)
        return accepted

    def resume(self) -> int:
        """Deliver again every journaled item that had not finished."""
        resumed = 0
        for item in self.journal.unfinished():
            cell = self.runtime.cell(item.actor) if self.runtime.has(item.actor) else None
            types = {t.__name__: t for t in (cell.actor_class._handlers if cell else ())
                     if isinstance(t, type)}
            if item.type not in types:
                log.error("cannot resume %s: %s does not handle %s", item.correlation, item.actor, item.type)
                self.journal.finish(item.correlation)
                continue
            body = types[item.type].model_validate_json(item.payload)  # type: ignore[attr-defined]
            with self._lock:
                self._open.add(item.correlation)
            self.runtime.deliver(item.actor, Envelope.new(body, correlation_id=item.correlation))
            resumed += 1
        return resumed

    def finished(self, correlation_id: str) -> None:
        """The correlation has nothing left in flight: its journal item is done."""
        with self._lock:
            if correlation_id not in self._open:
                return
            self._open.discard(correlation_id)
        self.journal.finish(correlation_id)
