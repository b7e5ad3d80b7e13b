"""One poller per platform account across daemons that share a journal.

On one daemon (the SQLite journal) a poller simply polls, and its position (an
offset, a ``since_id``) lives in the process. When daemons share the work through a
distributed journal (NATS JetStream), only the holder of the account's lease polls,
from the position they share: when it dies, another takes the lease within its TTL
and goes on from the last position saved. Inputs are journaled by their platform id,
so whatever the old holder had read but not saved is not taken twice.

>>> async with polling(self.runtime.journal, f"telegram-{bot.id}") as shared:  # doctest: +SKIP
...     offset = shared.position if shared else None   # the lease is held here
...     while True:
...         ...                                         # poll, journal
...         if shared: await shared.save("1043")       # raises LeaseLost if another polls now
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

log = logging.getLogger("autoresponse.polling")

#: A polling failure that is no refusal (a timeout, a 5xx) shows as failing once it has
#: happened this many times in a row.
POLL_FAILING_AFTER = 3


class PollHealth:
    """What an inbound actor's polling says of its health (``TypedActor.report_health``).

    A refusal (the platform answers 401 or 403: a revoked token, a suspended account)
    shows the actor as failing at once; any other failure once it has happened
    ``after`` times in a row (one timeout is weather); a poll that works clears it.

    >>> health = PollHealth(self.report_health)                      # doctest: +SKIP
    >>> health.refused("Telegram refuses the bot token (getUpdates: Unauthorized)")  # doctest: +SKIP
    >>> health.worked()                                               # doctest: +SKIP
    """

    def __init__(self, report: Callable[[bool, str], None], *, after: int = POLL_FAILING_AFTER) -> None:
        self._report = report
        self._after = after
        self._failures = 0

    def refused(self, reason: str) -> None:
        self._failures += 1
        self._report(False, reason)

    def failed(self, reason: str) -> None:
        self._failures += 1
        if self._failures >= self._after:
            self._report(False, reason)

    def worked(self) -> None:
        self._failures = 0
        self._report(True, "")


class LeaseLost(Exception):
    """Another daemon polls this account now: this poller must stop (its owner restarts it,
    and it waits for the lease again)."""


class SharedPoller:
    """The lease and the saved position of one account's poller (see the module)."""

    def __init__(self, journal: Any, account: str, report: Callable[..., None] | None = None) -> None:
        self._journal = journal
        self.account = account
        self._lease: Any = None
        #: The poller's ``report_health``: told while the lease cannot be taken or renewed.
        self._report = report
        #: The position the last holder saved (after ``start``), or None.
        self.position: str | None = None

    @classmethod
    def of(cls, journal: Any, account: str, report: Callable[..., None] | None = None) -> SharedPoller | None:
        """The shared poller when ``journal`` is shared by several daemons, else None."""
        return cls(journal, account, report) if getattr(journal, "distributed", False) else None

    async def start(self) -> str | None:
        """Wait for the account's lease; the position saved by the last holder."""
        self._lease = self._journal.lease(f"poller-{self.account}")
        if self._report is not None and hasattr(self._lease, "watch"):
            self._lease.watch(self._trouble)  # called at once, then from the journal's thread
        await self._lease.held()
        loop = asyncio.get_running_loop()
        saved = await loop.run_in_executor(None, self._journal.load, f"position-{self.account}")
        self.position = saved.decode() if saved else None
        log.info("polling %s from %s", self.account, self.position or "the start")
        return self.position

    async def save(self, position: str) -> None:
        """Save the position reached (its inputs are journaled); raises ``LeaseLost``."""
        await asyncio.wrap_future(self._journal.save(f"position-{self.account}", position.encode()))
        self.check()

    def check(self) -> None:
        """Raise ``LeaseLost`` when another daemon polls this account now."""
        if self._lease.lost.is_set():
            raise LeaseLost(f"another daemon polls {self.account} now")

    @property
    def holding(self) -> bool:
        """This daemon holds the account's lease (and has not lost it)."""
        return self._lease is not None and self._lease.holding

    def _trouble(self, trouble: str | None) -> None:
        """The lease cannot be taken or renewed (``trouble`` says why), or it can again."""
        assert self._report is not None
        self._report(trouble is None, f"the poller lease of {self.account}: {trouble}" if trouble else "",
                     concern="lease")

    def release(self) -> None:
        if self._lease is not None:
            self._lease.release()
        if self._report is not None:  # whoever polls next (here or elsewhere) says how it goes
            self._report(True, "", concern="lease")


@contextlib.asynccontextmanager
async def polling(journal: Any, account: str,
                  report: Callable[..., None] | None = None) -> AsyncIterator[SharedPoller | None]:
    """Poll ``account`` inside the block. On one daemon the block runs at once, with None;
    with several, once this daemon holds the account's lease, with the ``SharedPoller``
    (its ``position`` is where the last holder got to). The lease is released after.

    ``report`` (the poller's ``report_health``) shows the poller failing, with the reason,
    while the lease cannot be taken or renewed (the NATS server is out of reach)."""
    shared = SharedPoller.of(journal, account, report)
    if shared is None:
        yield None
        return
    try:
        await shared.start()
        yield shared
    finally:
        shared.release()
