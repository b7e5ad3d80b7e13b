"""The journal's checkpoints, on a thread of their own: no commit waits for one.

SQLite's automatic checkpoint runs inside the commit that fills the write-ahead log
past 1,000 pages: that commit copies 4 MiB back into the database (and syncs both
files) before it returns, and every accept queued behind it waits as long, several
milliseconds each time. Here the writer's connection checkpoints only as a backstop
(``WAL_BACKSTOP_FRAMES``); this thread copies the log back while the writer goes on,
and only the last few pages, written meanwhile, are copied with the writer held
(``WAL_RESET_FRAMES``), so that the log is used again from its start.

>>> checkpointer = WalCheckpointer(path, writer_lock)    # doctest: +SKIP
>>> checkpointer.written()  # after each commit: there is something to copy  # doctest: +SKIP
>>> checkpointer.close()                                                      # doctest: +SKIP
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("autoresponse.actors.journal")

#: How often, at most, the log is copied back while the journal is written to: a burst
#: that writes 30 MB/s grows it by 1.5 MB in between.
CHECKPOINT_SECONDS = 0.05
#: Once the log holds this many pages, a checkpoint completes it with the writer held, so
#: that the next commit writes the log from its start (SQLite's own automatic threshold).
WAL_RESET_FRAMES = 1000
#: The writer's own automatic checkpoint, for a burst faster than this thread copies (or
#: this thread failing): the log never grows past about 16 MiB.
WAL_BACKSTOP_FRAMES = 4 * WAL_RESET_FRAMES
#: How long a checkpoint waits for a lock it needs (another connection's read, the
#: compaction's RESTART) before it leaves the copy to its next turn.
_BUSY_TIMEOUT_MS = 50


class WalCheckpointer:
    """Copies the write-ahead log of the database at ``path`` back into it, on its own
    thread and connection, after commits; ``writer_lock`` is held by the one writer for
    each of its transactions."""

    def __init__(self, path: Path, writer_lock: threading.Lock, *, every: float = CHECKPOINT_SECONDS) -> None:
        self.every = every
        self._writer_lock = writer_lock
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        self._wrote = threading.Event()
        self._stopping = threading.Event()
        #: Checkpoints that left the log complete (it is written from its start next), for tests.
        self.resets = 0
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="journal-checkpointer", daemon=True)
        self._thread.start()

    def written(self) -> None:
        """A commit added pages to the log (called by the writer after each)."""
        self._wrote.set()

    def _run(self) -> None:
        while True:
            self._wrote.wait()  # an idle journal has nothing to copy: the thread sleeps
            if self._stopping.wait(self.every):  # the commits of the next moment share one copy
                return
            self._wrote.clear()
            try:
                self._checkpoint()
            except sqlite3.Error as exc:  # a full disk: the next turn tries again
                if not self._failing:  # said once, not every turn until it works again
                    log.warning("journal checkpoint failed (tried again after each commit): %s", exc)
                self._failing = True
                continue
            if self._failing:
                log.info("journal checkpoints work again")
                self._failing = False

    def _checkpoint(self) -> None:
        _, pages, _ = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if pages >= WAL_RESET_FRAMES:
            # The pages committed during the copy above, with no commit in between: the log
            # is then complete and the writer's next transaction starts it over.
            with self._writer_lock:
                busy, pages, copied = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if not busy and copied == pages:
                self.resets += 1

    def close(self) -> None:
        """Stop the thread (a copy under way ends first) and close its connection."""
        self._stopping.set()
        self._wrote.set()
        self._thread.join(10)
        self._db.close()
