"""The journal's checkpoints, copied on a thread of their own: no commit waits for a copy.

SQLite checkpoints a write-ahead log inside the commit that fills it past 1,000 pages
(``WAL_RESET_FRAMES``): that commit copies the whole 4 MiB back into the database, and
syncs both files, before it returns, and every accept queued behind it waits as long,
several milliseconds each time. This thread copies the log back as it grows, beside
the writer and holding nothing of it; the writer's own checkpoint, when it comes, finds
only the last few pages still to copy, and then starts the log over from its start, as
before. Should this thread fall behind or fail, the writer's checkpoint does it all.

>>> checkpointer = WalCheckpointer(path)                                      # doctest: +SKIP
>>> checkpointer.written()  # after each commit: there is something to copy  # doctest: +SKIP
>>> checkpointer.close()                                                      # doctest: +SKIP
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("autoresponse.actors.journal")

#: How long commits gather between two copies while the journal is written to. Short:
#: on the one core a daemon runs on, a copy runs instead of the deliveries, so many
#: short copies, not a few long ones (docs/benchmarks.md has the figures: at 50 ms a
#: copy of about 900 pages was the p99 at a steady load).
CHECKPOINT_SECONDS = 0.01
#: The log's pages at which the writer's own checkpoint completes it and the next commit
#: writes it from its start again (SQLite's default, set explicitly).
WAL_RESET_FRAMES = 1000
#: From this many pages in the log, a tenth of ``CHECKPOINT_SECONDS`` between copies.
_NEAR_RESET = WAL_RESET_FRAMES * 3 // 4


class WalCheckpointer:
    """Copies the write-ahead log of the database at ``path`` back into it, on its own
    thread and connection, after commits."""

    def __init__(self, path: Path, *, every: float = CHECKPOINT_SECONDS) -> None:
        self.every = every
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._wrote = threading.Event()
        self._stopping = threading.Event()
        #: Pages of the log this thread copied back (for tests).
        self.copied = 0
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="journal-checkpointer", daemon=True)
        self._thread.start()

    def written(self) -> None:
        """A commit added pages to the log (called by the writer after each)."""
        self._wrote.set()

    def _run(self) -> None:
        done = 0  # of the log as it stands: copied before this turn
        pause = self.every
        # Asked each turn, not only after the pause: a close that lands between the pause and
        # the clear below has its wake-up cleared, and the thread would sleep on for good.
        while not self._stopping.is_set():
            self._wrote.wait()  # an idle journal has nothing to copy: the thread sleeps
            if self._stopping.wait(pause):  # the commits of the next moment share one copy
                return
            self._wrote.clear()
            try:
                pages, copied = self._checkpoint()
            except sqlite3.Error as exc:  # a full disk: the next turn tries again
                if not self._failing:  # said once, not every turn until it works again
                    log.warning("journal checkpoint failed (tried again after each commit): %s", exc)
                self._failing = True
                continue
            if self._failing:
                log.info("journal checkpoints work again")
                self._failing = False
            copied = max(copied, 0)  # -1: not a write-ahead log (a file system without one)
            self.copied += copied - done if copied >= done else copied  # fewer: the log started over
            done = copied
            # Close to the writer's own checkpoint, copy more often: it finds less left to copy.
            pause = self.every if pages < _NEAR_RESET else self.every / 10

    def _checkpoint(self) -> tuple[int, int]:
        """One copy, PASSIVE: what no reader still needs, never waiting for a lock. The pages
        in the log, and how many of them are back in the database."""
        _, pages, copied = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return pages, copied

    def close(self) -> None:
        """Stop the thread (a copy under way ends first) and close its connection."""
        self._stopping.set()
        self._wrote.set()
        self._thread.join(10)
        self._db.close()
