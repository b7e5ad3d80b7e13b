"""The journal: a small interface, and SQLite behind it (WAL, group commit).

* ``accept``: a work item (the message that starts a correlation) is written
  before the caller acknowledges it upstream;
* ``finish``: the correlation ended: delivered (``done``), or closed by a real
  failure (``dead``). An item interrupted by a stop is never finished: it stays
  open and is resumed on the next start;
* ``was_sent`` / ``mark_sent``: idempotency keys of outbound chunks, so a
  resumed item does not resend what was already confirmed (a correlation this
  journal accepted as new is answered from memory: nothing of it was sent before);
* ``record_dead_letter`` and friends: dead letters, durable and replayable;
* ``unfinished``: what to resume on start; ``compact``: forget old finished work;
* ``record_approval`` and friends: actions waiting for approval, and their decisions
  (``actors.approvals``); an item is ``cancelled`` by its user with ``finish``.

Writes are group-committed by one writer thread: every write waiting when a
commit starts shares it, so the journal costs one fsync-free WAL commit per
batch, not per message. WAL with synchronous=NORMAL survives the process being
killed at any moment (not a power cut). A commit starts once its first write is
due: an accept at once, or ``GROUP_COMMIT_SECONDS`` after it was queued when accepts
come closer together than that (the next ones share its commit); a write nothing
waits on to go on (``finish``, ``mark_sent``) ``LAZY_WRITE_SECONDS`` after (the
next accept's commit takes it along), and again, later, when the database failed it
(a full disk), until it commits or the journal closes.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

try:
    import fcntl
except ImportError:  # Windows: no flock; one process per journal is then the operator's to keep
    fcntl = None  # type: ignore[assignment]

from pydantic import BaseModel

from autoresponse.actors.journal._checkpointer import WAL_RESET_FRAMES, WalCheckpointer
from autoresponse.actors.jsonbody import dump_json
from autoresponse.actors.limits import (
    DEAD_LETTER_RETENTION_SECONDS,
    DEAD_LETTERS_KEPT,
    INTAKE_RETRY_AFTER_SECONDS,
    JOURNAL_COMPACT_SECONDS,
)
from autoresponse.messages import Envelope, OutboundMessage
from autoresponse.messages.envelope import current_correlation

log = logging.getLogger("autoresponse.actors.journal")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    correlation TEXT PRIMARY KEY,
    actor TEXT NOT NULL,
    type TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'open',   -- open | done | dead | cancelled (by its user)
    created REAL NOT NULL,
    finished REAL,
    trace TEXT                            -- its trace as JSON, kept with its finish
);
CREATE INDEX IF NOT EXISTS items_state ON items (state, finished);
CREATE TABLE IF NOT EXISTS sent (
    key TEXT PRIMARY KEY,
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS traces (       -- traces of work that had no item
    correlation TEXT PRIMARY KEY,
    time REAL NOT NULL,
    hops TEXT NOT NULL                    -- the trace as JSON (kernel.trace: its events, or its hops)
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY,
    time REAL NOT NULL,
    reason TEXT NOT NULL,
    summary TEXT NOT NULL                 -- DeadLetter.summary() as JSON
);
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY,                  -- what its buttons carry (random)
    key TEXT NOT NULL UNIQUE,             -- the asking correlation and the action's place in it
    correlation TEXT NOT NULL,
    chat TEXT NOT NULL,
    request TEXT NOT NULL,                -- the action and its context as JSON
    state TEXT NOT NULL DEFAULT 'pending',  -- pending | approved | denied | expired | cancelled | refused | declined
    created REAL NOT NULL,
    expires REAL NOT NULL,                -- on the runtime's clock
    decided REAL,
    decided_by TEXT,
    decision TEXT                         -- the correlation of the answer that decided it
);
CREATE INDEX IF NOT EXISTS approvals_state ON approvals (state, decided);
"""


class JournalCorrupt(Exception):
    """The journal file exists but is not a readable journal. It is never replaced silently."""


class JournalStorageFailed(ValueError):
    """The disk or the file system failed the journal (full, an I/O error, a file that cannot
    be opened): the journal itself is intact, and was left as it is. A ValueError, as the
    CLI shows a start's ValueError as one line (``cannot start: ...``)."""


#: SQLite's primary result codes that mean the file is not a readable journal (SQLITE_CORRUPT,
#: SQLITE_NOTADB); every other error (SQLITE_FULL, SQLITE_IOERR, SQLITE_CANTOPEN...) is the
#: storage's, and moving the journal aside for it would abandon every accepted request.
_CORRUPT_CODES = frozenset({11, 26})


def damaged(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says an SQLite file is damaged (no database, a malformed page);
    any other error is the disk's or the file system's (the memory's store asks too)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _CORRUPT_CODES


def _failure(exc: sqlite3.Error, path: Path, doing: str) -> JournalCorrupt | JournalStorageFailed:
    """What ``exc``, met while ``doing``, means to whoever starts on the journal at ``path``."""
    if damaged(exc):
        return JournalCorrupt(f"the journal {path} cannot be read ({exc}); it was left as it is")
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    return JournalStorageFailed(f"the journal {path} cannot be used ({doing}): {name}: {exc}; the disk or the "
                                "file system failed it (full, an I/O error, a file that cannot be opened), it is "
                                "not corrupt, and the journal was left intact: fix the cause and start again")


class JournalFailing(Exception):
    """The journal cannot store new work now: its database fails its writes (the disk full,
    an I/O error, its file locked by another process). Nothing was taken; ask again after
    ``retry_after``, as when the intake is full. The journal says why (``failing``) until
    its writes commit again."""

    def __init__(self, reason: str, retry_after: float = INTAKE_RETRY_AFTER_SECONDS) -> None:
        super().__init__(f"the journal cannot store new work now ({reason}); try again in {retry_after:g}s")
        self.retry_after = retry_after


class LedgerUnavailable(Exception):
    """The journal could not say whether a reply was sent already (the NATS server away,
    say): the reply waits for its sender to try again, rather than go out twice or not at all."""


class JournalInUse(Exception):
    """Another process has this journal open. Two would each resume the other's unfinished
    work as their own on starting, and answer it twice."""


def _hold(lock_path: Path) -> IO[str] | None:
    """An exclusive lock on ``lock_path`` for as long as the file stays open, which holds the
    process's id; JournalInUse naming the holder's when another process has it. The kernel
    drops the lock when its holder dies, however it dies: no stale lock to clean up."""
    if fcntl is None:
        return None
    handle = open(lock_path, "a+", encoding="ascii")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read(20).strip()
        handle.close()
        by = f"process {holder}" if holder.isdigit() else "another process"
        raise JournalInUse(f"{by} has the journal {lock_path.with_suffix('')} open (a daemon on the same data "
                           "directory): stop it first, or give each daemon a data directory of its own "
                           "(AUTORESPONSE_DATA_DIR)") from None
    handle.truncate(0)
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def check_journal(path: Path) -> list[str]:
    """SQLite's own integrity check of the journal at ``path``: the problems found, or [].
    JournalStorageFailed when the storage fails the check itself (a full disk, an I/O error,
    a file that cannot be opened): that is no corruption, and moving the journal aside
    would abandon every accepted request."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = db.execute("PRAGMA integrity_check").fetchall()
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        failure = _failure(exc, path, "checking it")
        if isinstance(failure, JournalStorageFailed):
            raise failure from None
        return [str(exc)]
    problems = [row[0] for row in rows]
    return [] if problems == ["ok"] else problems


def read_stored(text: Any, what: str) -> Any:
    """JSON a journal wrote, read back; None, with a warning, when a damaged row (or one
    of another version) holds something else: the rest are read as ever."""
    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError):
        log.warning("the journal's %s is unreadable, and left out", what)
        return None


def _names_one_of(key: str, correlations: set[str]) -> bool:
    """Whether the send ``key`` was made by a turn of one of ``correlations``."""
    return bool(correlations) and any(key[:at] in correlations for at, char in enumerate(key) if char == ":")


def _text(value: Any) -> str:
    """A column of an item as text, whatever a damaged row holds (a blob, a number): such an
    item then fails to rebuild on its own, and the rest resume."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else str(value)


class JournalItem(BaseModel):
    correlation: str
    actor: str
    type: str
    payload: str
    #: The W3C trace context of the span that published it (NATS: its ``traceparent``
    #: header, when OpenTelemetry is on), for the worker that runs it to continue.
    traceparent: str | None = None


#: Told how a write ended (in the journal's own thread): whether it changed a row, or its error.
Written = Callable[[bool, BaseException | None], None]
#: Told of what a distributed journal holds that is no work item at all: a name for it, its
#: data as text, and why it cannot be read.
Unreadable = Callable[[str, str, str], None]


class DeliveryJournal(Protocol):
    #: Why it cannot store new work now, and since when (wall clock); None while it can.
    failing: tuple[str, float] | None

    def accept(self, envelope: Envelope, *, actor: str, then: Written | None = None
               ) -> concurrent.futures.Future[bool] | None: ...
    def finish(self, correlation: str, state: str = "done", trace: Any = None) -> None: ...
    def was_sent(self, key: str, correlation: str | None = None) -> bool: ...
    def mark_sent(self, key: str, correlation: str | None = None) -> concurrent.futures.Future[bool]: ...
    def unfinished(self) -> list[JournalItem]: ...
    def record_dead_letter(self, summary: dict[str, Any]) -> concurrent.futures.Future[bool]: ...
    def dead_letters(self, limit: int) -> list[dict[str, Any]]: ...
    def dead_letter(self, letter_id: int) -> dict[str, Any] | None: ...
    def last_dead_letter_id(self) -> int: ...
    def dead_letter_counts(self) -> dict[str, int]: ...
    def record_trace(self, correlation: str, trace: Any) -> concurrent.futures.Future[bool]: ...
    def trace(self, correlation: str) -> Any: ...
    def compact(self, older_than: float, *, dead_letters_older_than: float | None = None,
                keep_dead_letters: int = ...) -> int: ...
    def close(self) -> None: ...


#: A queued write: its SQL, arguments, who waits on it (a future or a callback), the sent key it marks.
_Op = tuple[str, Sequence[Any], "concurrent.futures.Future[bool] | Written | None", "str | None"]

_ACCEPT = "INSERT OR IGNORE INTO items (correlation, actor, type, payload, created) VALUES (?, ?, ?, ?, ?)"
#: Closes an open item (a closed one keeps its state), and keeps its trace when one is given.
_FINISH = ("UPDATE items SET state = CASE state WHEN 'open' THEN ? ELSE state END, "
           "finished = CASE state WHEN 'open' THEN ? ELSE finished END, trace = COALESCE(?, trace) "
           "WHERE correlation = ?")
_MARK_SENT = "INSERT OR IGNORE INTO sent (key, time) VALUES (?, ?)"
_RECORD_TRACE = "INSERT OR REPLACE INTO traces (correlation, time, hops) VALUES (?, ?, ?)"
#: The writes of every delivery, each sent to SQLite as one statement per batch (``_rows``). Their
#: rows commute with every other write but one: a finish before the accept of its own correlation.
_GROUPED = (_FINISH, _MARK_SENT, _RECORD_TRACE)
#: Each grouped write as one statement of many rows: the statement with ``{rows}`` for its
#: rows, and the placeholders of a row. An insert is its single-row form, its VALUES repeated;
#: a finish joins its rows as a table of values (``column1``..``column4``: state, finished,
#: trace, correlation), with the same effect on each item as its single-row form.
_MANY_ROWS: dict[str, tuple[str, str]] = {
    **{sql: (sql.split(" VALUES ")[0] + " VALUES {rows}", sql.split(" VALUES ")[1])
       for sql in (_ACCEPT, _MARK_SENT, _RECORD_TRACE)},
    _FINISH: ("UPDATE items SET state = CASE items.state WHEN 'open' THEN v.column1 ELSE items.state END, "
              "finished = CASE items.state WHEN 'open' THEN v.column2 ELSE items.finished END, "
              "trace = COALESCE(v.column3, items.trace) FROM (VALUES {rows}) AS v "
              "WHERE items.correlation = v.column4", "(?, ?, ?, ?)"),
}
#: The writes nothing waits on to go on: tried again when the database fails them (``_retried``).
_LAZY = (_FINISH, _MARK_SENT)
#: The SQLite that first joins a table in an UPDATE (the multi-row finish).
_UPDATE_FROM = (3, 33, 0)
#: Rows per multi-row statement; each size is a statement SQLite prepares once and keeps.
_ROWS_PER_STATEMENT = 64
#: Statements each connection keeps prepared: the multi-row ones of every size, and the rest.
_CACHED_STATEMENTS = len(_MANY_ROWS) * _ROWS_PER_STATEMENT + 128
#: How long a connection waits for another's lock (sqlite3's default, made explicit).
BUSY_TIMEOUT_MS = 5000
#: How long the compaction's checkpoint waits for readers of the write-ahead log to finish.
CHECKPOINT_WAIT_MS = 50
#: The write-ahead log's file is cut back to this size as the log starts over from its
#: start, when a spell of commits that could not start it over (a reader held it, a copy
#: fell behind) left it larger: half again its usual size (WAL_RESET_FRAMES pages, and
#: what was committed during the last copy). Its usual size is left alone: cutting it at
#: every start had it grow back each time. At 16 MiB, one such spell in a soak left the
#: file 6 MiB larger for good (docs/benchmarks.md).
WAL_FILE_LIMIT_BYTES = WAL_RESET_FRAMES * 4096 * 3 // 2
#: How long an accept (or any write something waits on) waits for others to share its
#: commit, when the one before it came sooner than that (apart, each commits at once).
#: Each commit rewrites the pages its rows share (the tables' last leaves, their indexes)
#: and wakes the writer, and the pipeline after it, once: at a steady load a commit per
#: delivery cost as much CPU as the rest of the delivery (docs/benchmarks.md).
GROUP_COMMIT_SECONDS = 0.001
#: How long a write nothing waits on to go on (``finish``, ``mark_sent``) may wait for a
#: commit to carry it; at a steady load the next accept's comes first. What a kill can
#: lose: a sent key this recent, so its chunk may be sent again when the item resumes.
LAZY_WRITE_SECONDS = 0.005
#: A write nothing waits on (``finish``, ``mark_sent``) that the database failed (a full disk,
#: an I/O error) is tried again after this long, then twice as long each time up to
#: ``WRITE_RETRY_MAX_SECONDS``, until it commits or the journal closes: dropped, its item
#: would stay open and be answered again at the next start.
WRITE_RETRY_FIRST_SECONDS = 0.05
WRITE_RETRY_MAX_SECONDS = 5.0
#: Correlations looked up at once when a batch's accepts are checked for ones already known.
_LOOKUP_CHUNK = 500
#: Rows ``compact`` deletes per transaction. One DELETE of a whole compaction interval's rows
#: was one transaction of thousands of pages, all in the write-ahead log at once (the log grew
#: to the largest interval it had held); chunks commit one by one, and SQLite checkpoints the
#: log every 1,000 pages between them, so the log stays near 4.5 MiB at any rate and retention.
_COMPACT_CHUNK = 500


@functools.cache
def _many_rows(sql: str, count: int) -> str:
    """The statement writing ``count`` rows of the grouped write ``sql`` at once."""
    statement, row = _MANY_ROWS[sql]
    return statement.format(rows=", ".join([row] * count))


def _merged_finishes(rows: list[Sequence[Any]]) -> list[Sequence[Any]]:
    """One finish per correlation, with the effect of all of them in order: the first closes
    the item (the later ones find it closed), and the last trace given is the one kept."""
    merged: dict[str, list[Any]] = {}
    for state, finished, trace, correlation in rows:
        first = merged.get(correlation)
        if first is None:
            merged[correlation] = [state, finished, trace, correlation]
        elif trace is not None:
            first[2] = trace
    return list(merged.values())


class SqliteJournal:
    """The journal in one SQLite file. With ``retention_seconds``, its writer thread also
    compacts it every ``compact_every`` seconds while it runs, so a long-running daemon's
    file stops growing once the retention has passed (freed pages are reused).
    ``group_commit_seconds`` and ``lazy_write_seconds``: how long writes may wait to share
    a commit (the module's constants; a test sets them long to see who waits)."""

    def __init__(self, path: Path, *, retention_seconds: float | None = None,
                 compact_every: float = JOURNAL_COMPACT_SECONDS, group_commit_seconds: float = GROUP_COMMIT_SECONDS,
                 lazy_write_seconds: float = LAZY_WRITE_SECONDS) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = _hold(path.with_name(f"{path.name}.lock"))
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                       timeout=BUSY_TIMEOUT_MS / 1000, cached_statements=_CACHED_STATEMENTS)
        except sqlite3.Error as exc:
            self._release()
            raise _failure(exc, path, "opening it") from None
        except BaseException:
            self._release()
            raise
        try:
            # Pages freed by compaction go back to the file system at the next compaction
            # (``incremental_vacuum``), so the file follows the rows kept, not their highest
            # level since it was made. Takes effect in a new journal only (an older one keeps
            # its free pages for its own later rows, as before).
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(f"PRAGMA journal_size_limit={WAL_FILE_LIMIT_BYTES}")
            self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_RESET_FRAMES}")  # the checkpointer copies most first
            self._db.executescript(_SCHEMA)
            self._add_trace_column()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            self._release()
            raise _failure(exc, path, "opening it") from None
        self._db_lock = threading.Lock()
        self._checkpointer = WalCheckpointer(path)
        # A second connection answers ``was_sent``, on every delivery: under WAL it reads the
        # last commit while the writer holds ``_db_lock`` for a whole batch, where it waited.
        self._reader = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._reader_lock = threading.Lock()
        #: Keys queued by ``mark_sent`` and not yet committed: sent, though not yet readable.
        self._marking: set[str] = set()
        #: The correlations this journal accepted as new, until they finish, with the keys
        #: marked sent for them: nothing of theirs was sent before this run, so ``was_sent``
        #: answers them here, and a delivery reads no SQLite (a read hands the GIL away and
        #: waits to get it back: under load, the longest wait of a delivery).
        self._fresh: dict[str, set[str]] = {}
        self.retention_seconds = retention_seconds
        self.compact_every = compact_every
        self._compacted = time.monotonic()
        self._pending: list[_Op] = []
        self.group_commit_seconds = group_commit_seconds
        self.lazy_write_seconds = lazy_write_seconds
        self._due = math.inf  # when the next commit starts (``time.monotonic``)
        self._retry_wait = 0.0  # how long failed lazy writes wait to be tried again (0: none failed)
        self._last_eager = -math.inf  # when the last write that was not lazy came
        self._writer_sleeps_until: float | None = None  # the writer waits for that, or nothing
        self._cond = threading.Condition()
        self._closed = False
        self.commits = 0  # batches written, for the benchmark
        #: Why the database fails the journal's writes now, and since when (the wall clock);
        #: None while they commit. Written by the writer thread alone.
        self.failing: tuple[str, float] | None = None
        #: Since when (``failing``'s) work has failed to commit, till a batch commits again:
        #: the outage, logged once as it starts and once as it ends (a probe that commits
        #: clears the mark, not the outage: the work refused may still not fit).
        self._outage: tuple[str, float] | None = None
        self._writer = threading.Thread(target=self._write_loop, name="journal-writer", daemon=True)
        self._writer.start()

    def _add_trace_column(self) -> None:
        """A journal from before items kept their traces gains the column (another process
        opening the same old journal may add it first: that is no error)."""
        def has_it() -> bool:
            return "trace" in {row[1] for row in self._db.execute("PRAGMA table_info(items)")}
        if has_it():
            return
        try:
            self._db.execute("ALTER TABLE items ADD COLUMN trace TEXT")
        except sqlite3.OperationalError:
            if not has_it():
                raise

    # ---------------------------------------------------------------- writes

    def _queue(self, op: _Op, correlation: str | None = None, *, lazy: bool = False, at_once: bool = False) -> bool:
        """Queue ``op`` for the next commit (a ``lazy`` one waits for one to share, one
        ``at_once`` does not wait at all); False once the journal is closed. A key it marks
        is sent from now on, for ``correlation`` too (in the same lock: no reader sees it
        between the two)."""
        now = time.monotonic()
        with self._cond:
            if self._closed:
                return False
            if at_once:
                due = now
            elif lazy:
                due = now + self.lazy_write_seconds
            else:  # close behind the last one: the next is likely to come in time to share it
                window = self.group_commit_seconds
                due = now + window if now - self._last_eager < window else now
                self._last_eager = now
            self._pending.append(op)
            key = op[3]
            if key is not None:
                self._marking.add(key)
                fresh = self._fresh.get(correlation) if correlation is not None else None
                if fresh is not None:
                    fresh.add(key)
            if due < self._due:
                self._due = due
                sleeps_until = self._writer_sleeps_until
                if sleeps_until is not None and due < sleeps_until:  # it would wake too late
                    self._writer_sleeps_until = due
                    self._cond.notify()
        return True

    def _write(self, sql: str, args: Sequence[Any], marks: str | None = None,
               correlation: str | None = None, *, lazy: bool = False, at_once: bool = False
               ) -> concurrent.futures.Future[bool]:
        """Queue a write for the next group commit; resolves with whether it changed a row.
        ``marks``: the sent key it records, readable through ``was_sent`` from now on."""
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        if not self._queue((sql, args, done, marks), correlation, lazy=lazy, at_once=at_once):
            done.set_exception(RuntimeError("the journal is closed"))
        return done

    def _write_unwatched(self, sql: str, args: Sequence[Any]) -> None:
        """Queue a write nobody waits on (no future to make and resolve), lazily; a failure is logged."""
        self._queue((sql, args, None, None), lazy=True)

    def _next_batch(self) -> list[_Op] | None:
        """The writes to commit next, once the first of them is due (all of them at a
        close); none when a probe of a failing journal is due (``_probe``); None once
        closed with nothing left."""
        with self._cond:
            while not self._closed:
                left = self._due - time.monotonic()
                if left <= 0:
                    break
                self._writer_sleeps_until = self._due
                self._cond.wait(None if left == math.inf else left)
                self._writer_sleeps_until = None
            batch, self._pending, self._due = self._pending, [], math.inf
            return None if self._closed and not batch else batch

    def _write_loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if not batch:
                self._probe()
                continue
            try:
                with self._db_lock:
                    self._db.execute("BEGIN")
                    outcomes: list[tuple[bool, BaseException | None]] = [
                        (did, None) for did in self._apply(batch)]
                    self._db.execute("COMMIT")
                self.commits += 1
                self._checkpointer.written()
                self._retry_wait = 0.0
                if self._outage is not None:
                    self._writes_again()
            except Exception as exc:  # a bad write (or a full disk): the batch again, one by one
                log.log(logging.DEBUG if self._outage else logging.WARNING,
                        "journal batch failed (%s); writing its %d writes one by one", exc, len(batch))
                outcomes = self._storage_told(batch, self._one_by_one(batch))
                batch, outcomes = self._retried(batch, outcomes)  # only here: no cost for a batch that commits
            self._settled(batch, outcomes)
            for (_, _, done, _), (did, error) in zip(batch, outcomes, strict=True):
                _tell(done, did, error)
            if self.retention_seconds is not None and time.monotonic() - self._compacted >= self.compact_every:
                self._compacted = time.monotonic()
                try:
                    now = time.time()
                    self._compact(now - self.retention_seconds, now - DEAD_LETTER_RETENTION_SECONDS,
                                  DEAD_LETTERS_KEPT)
                    # The write-ahead log is copied back and reused from its start, at the size
                    # it has (at most journal_size_limit): truncating it only had it grow again,
                    # and the file's size swing by a WAL's worth at every compaction. RESTART,
                    # not PASSIVE: it waits (briefly) for a ``was_sent`` read that started before
                    # it (a point lookup) instead of leaving the log to grow on past its end.
                    with self._db_lock:
                        self._db.execute("PRAGMA incremental_vacuum").fetchall()  # a page a row
                        # Bounded: another connection's long read (a backup, a shell) must
                        # not hold every write for the 5 s busy timeout; it is tried again.
                        self._db.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
                        try:
                            self._db.execute("PRAGMA wal_checkpoint(RESTART)")
                        finally:
                            self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                except sqlite3.Error as exc:
                    log.warning("journal compaction failed: %s", exc)

    def _storage_told(self, batch: list[_Op], outcomes: list[tuple[bool, BaseException | None]]
                      ) -> list[tuple[bool, BaseException | None]]:
        """Mark the journal failing when the database failed writes of ``batch`` (an
        OperationalError: the disk full, an I/O error, the file locked by another process),
        and clear the mark once all of them committed. An accept it failed is told
        ``JournalFailing``: its source waits and asks again, as when the intake is full."""
        failed = next((error for _, error in outcomes if isinstance(error, sqlite3.OperationalError)), None)
        if failed is None:
            if self._outage is not None and all(error is None for _, error in outcomes):
                self._writes_again()
            return outcomes
        if self.failing is None:
            self.failing = self._outage or (f"its writes fail: {failed}", time.time())
        if self._outage is None:
            self._outage = self.failing
            log.error("journal %s: writes fail (%s); no new work is taken (the admin endpoint answers 503, "
                      "platforms wait) until they commit again", self.path, failed)
        self._probe_later()
        refused = JournalFailing(str(failed))
        return [(did, refused if op[0] is _ACCEPT and isinstance(error, sqlite3.OperationalError) else error)
                for op, (did, error) in zip(batch, outcomes, strict=True)]

    def _probe_later(self) -> None:
        """While writes fail: wake the writer to try one (``_probe``) a while from now,
        whatever comes meanwhile (an accept refused is not tried again by itself)."""
        with self._cond:
            self._due = min(self._due, time.monotonic() + WRITE_RETRY_MAX_SECONDS)

    def _probe(self) -> None:
        """Whether a write commits again (the header's ``user_version``, written as it is):
        the mark goes once one does, else it is tried again later. Without it, a journal
        whose failed writes were only refused accepts stayed failing, and ``/healthz`` at
        503, until new work came. The outage is over only once work commits (the work
        refused may still not fit where one page did): it is logged once either way."""
        if self.failing is None:
            return
        try:
            with self._db_lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
                    self._db.execute(f"PRAGMA user_version = {version}")
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            log.debug("journal probe failed: %s", exc)
            self._probe_later()
            return
        log.debug("journal probe committed: healthy, till work fails again")
        self.failing = None

    def _writes_again(self) -> None:
        """Work committed after writes failed: the mark and the outage go, said once."""
        assert self._outage is not None
        reason, since = self._outage
        self.failing = self._outage = None
        log.warning("journal %s writes again (they failed for %.0fs: %s)", self.path, time.time() - since, reason)

    def _retried(self, batch: list[_Op], outcomes: list[tuple[bool, BaseException | None]]
                 ) -> tuple[list[_Op], list[tuple[bool, BaseException | None]]]:
        """Queue again the lazy writes of ``batch`` the database failed (an OperationalError:
        full, an I/O error, busy; not a write it refuses as such), ahead of what came since,
        after a wait that doubles up to its limit; the rest, and their outcomes, are returned
        for their waiters. A key queued again stays sent (in ``_marking``). Once the journal
        is closed nothing is queued again: its last batch was their last try."""
        failed = {n for n, (op, (_, error)) in enumerate(zip(batch, outcomes, strict=True))
                  if op[0] in _LAZY and isinstance(error, sqlite3.OperationalError)}
        again = [batch[n] for n in sorted(failed)]
        if not again:
            if all(error is None for _, error in outcomes):
                self._retry_wait = 0.0
            return batch, outcomes
        with self._cond:
            if self._closed:
                log.error("journal closed with %d writes its database failed; their items resume", len(again))
                return batch, outcomes
            self._retry_wait = min(max(2 * self._retry_wait, WRITE_RETRY_FIRST_SECONDS), WRITE_RETRY_MAX_SECONDS)
            log.debug("journal: %d writes the database failed are tried again in %.2f s", len(again), self._retry_wait)
            self._pending[:0] = again
            self._due = min(self._due, time.monotonic() + self._retry_wait)
        kept = [n for n in range(len(batch)) if n not in failed]
        return [batch[n] for n in kept], [outcomes[n] for n in kept]

    def _apply(self, batch: list[_Op]) -> list[bool]:
        """Write ``batch`` inside the open transaction; whether each op changed a row.

        A statement per kind, not per op or per row: each step of a statement hands the GIL
        to other threads and waits to get it back (up to the interpreter's switch interval,
        5 ms, behind a busy thread), and a batch holds hundreds of deliveries' writes. The
        accepts go first (which of them are new is read in one query), then each grouped
        write as one statement of many rows (``_rows``; its ops resolve True: they are
        durable), then the rest in order. A batch where a finish comes before the accept
        of its own correlation would end differently that way, so it is written op by op,
        in order.
        """
        finished: set[str] = set()
        by_kind: dict[str, list[int]] = {}  # each statement's ops, in queue order
        for n, (sql, args, _, _) in enumerate(batch):
            if sql is _FINISH:
                finished.add(args[3])
            elif sql is _ACCEPT and args[0] in finished:
                return [self._db.execute(sql, args).rowcount > 0 for sql, args, _, _ in batch]
            by_kind.setdefault(sql, []).append(n)
        changed = [False] * len(batch)
        accepts = by_kind.pop(_ACCEPT, [])
        if accepts:
            known = self._known([batch[n][1][0] for n in accepts])
            for n in accepts:
                correlation = batch[n][1][0]
                changed[n] = correlation not in known
                known.add(correlation)  # a second accept in the same batch is a retry
            self._rows(_ACCEPT, [batch[n][1] for n in accepts])
        for grouped in _GROUPED:
            ops = by_kind.pop(grouped, [])
            if ops:
                rows = [batch[n][1] for n in ops]
                self._rows(grouped, _merged_finishes(rows) if grouped is _FINISH else rows)
                for n in ops:
                    changed[n] = True
        for n in sorted(n for ops in by_kind.values() for n in ops):  # the rest, in order
            changed[n] = self._db.execute(batch[n][0], batch[n][1]).rowcount > 0
        return changed

    def _rows(self, sql: str, rows: list[Sequence[Any]]) -> None:
        """Write ``rows`` of the grouped write ``sql`` in as few statements as it takes."""
        if sql is _FINISH and sqlite3.sqlite_version_info < _UPDATE_FROM:
            self._db.executemany(sql, rows)
            return
        for start in range(0, len(rows), _ROWS_PER_STATEMENT):
            chunk = rows[start:start + _ROWS_PER_STATEMENT]
            self._db.execute(_many_rows(sql, len(chunk)), [value for row in chunk for value in row])

    def _one_by_one(self, batch: list[_Op]) -> list[tuple[bool, BaseException | None]]:
        """Write ``batch`` in order, each write in a savepoint of its own: one that fails
        fails alone (its waiter is told why), and the rest are committed with it."""
        outcomes: list[tuple[bool, BaseException | None]] = []
        try:
            with self._db_lock:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._db.execute("BEGIN")
                for sql, args, _, _ in batch:
                    self._db.execute("SAVEPOINT op")
                    try:
                        outcomes.append((self._db.execute(sql, args).rowcount > 0, None))
                    except Exception as exc:
                        if not isinstance(exc, sqlite3.OperationalError):  # the storage's is said once
                            log.error("journal write failed: %s", exc)
                        self._db.execute("ROLLBACK TO op")
                        outcomes.append((False, exc))
                    self._db.execute("RELEASE op")
                self._db.execute("COMMIT")
            self.commits += 1
            self._checkpointer.written()
            return outcomes
        except Exception as exc:  # the database itself refuses (closed, full, gone)
            if not isinstance(exc, sqlite3.OperationalError):  # the storage's is said once
                log.error("journal write failed: %s", exc)
            try:
                with self._db_lock:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
            except Exception:
                pass
            return [(False, exc)] * len(batch)

    def _known(self, correlations: list[str]) -> set[str]:
        """Which of ``correlations`` the journal holds already."""
        known: set[str] = set()
        for start in range(0, len(correlations), _LOOKUP_CHUNK):
            chunk = correlations[start:start + _LOOKUP_CHUNK]
            marks = ", ".join("?" * len(chunk))
            known.update(row[0] for row in self._db.execute(
                f"SELECT correlation FROM items WHERE correlation IN ({marks})", chunk))
        return known

    def _settled(self, batch: list[_Op], outcomes: list[tuple[bool, BaseException | None]]) -> None:
        """The keys of a written (or failed) batch are the database's to answer for now; the
        correlations it accepted as new are fresh (before anyone is told: their work starts then)."""
        marked = [key for _, _, _, key in batch if key is not None]
        fresh = {args[0] for (sql, args, _, _), (did, error) in zip(batch, outcomes, strict=True)
                 if sql is _ACCEPT and did and error is None}
        if fresh:  # one finished in the same batch was over before its work began here
            fresh.difference_update(args[3] for sql, args, _, _ in batch if sql is _FINISH)
        if marked or fresh:
            with self._cond:
                self._marking.difference_update(marked)
                for correlation in fresh:
                    self._fresh.setdefault(correlation, set())

    def accept(self, envelope: Envelope, *, actor: str, then: Written | None = None
               ) -> concurrent.futures.Future[bool] | None:
        """Record the message that starts a correlation; resolves once committed, with
        False if that correlation was already known (a client's retry). With ``then``,
        that callback is told instead (in the writer thread), and nothing is returned."""
        body = envelope.body
        args = (envelope.correlation_id, actor, type(body).__name__, body.model_dump_json(), time.time())
        if then is None:
            return self._write(_ACCEPT, args)
        if not self._queue((_ACCEPT, args, then, None)):
            then(False, RuntimeError("the journal is closed"))
        return None

    def finish(self, correlation: str, state: str = "done", trace: Any = None) -> None:
        """Close an open item: ``done`` (delivered) or ``dead`` (a real failure); keep its
        ``trace`` (JSON-ready) with it, in the same row: one write where there were two."""
        self._write_unwatched(_FINISH, (state, time.time(), None if trace is None else dump_json(trace).decode(),
                                        correlation))
        with self._cond:  # its keys are the database's now (queued before this finish: committed first)
            self._fresh.pop(correlation, None)

    def record_dead_letter(self, summary: dict[str, Any]) -> concurrent.futures.Future[bool]:
        return self._write("INSERT OR REPLACE INTO dead_letters (id, time, reason, summary) VALUES (?, ?, ?, ?)",
                           (summary["id"], summary["time"], summary["reason"],
                            json.dumps(summary, default=str)))

    def mark_sent(self, key: str, correlation: str | None = None) -> concurrent.futures.Future[bool]:
        """Record ``key`` as sent (``correlation``: the one whose turn made it); lazily: it
        is readable through ``was_sent`` at once, durable within ``LAZY_WRITE_SECONDS``."""
        return self._write(_MARK_SENT, (key, time.time()), marks=key, correlation=correlation, lazy=True)

    # ---------------------------------------------------------------- reads

    def was_sent(self, key: str, correlation: str | None = None) -> bool:
        """Whether ``key`` was marked sent, by this run or an earlier one. ``correlation``
        (the one whose turn made the key): if this journal accepted it as new, the answer
        needs no read."""
        with self._cond:
            if key in self._marking:
                return True
            fresh = self._fresh.get(correlation) if correlation is not None else None
            if fresh is not None and key.startswith(f"{correlation}:"):  # a turn's key names its correlation
                return key in fresh
        with self._reader_lock:
            return self._reader.execute("SELECT 1 FROM sent WHERE key = ?", (key,)).fetchone() is not None

    def unfinished(self) -> list[JournalItem]:
        """The open items, in the order they were accepted (rowid: ``created`` is the wall
        clock's, which may step back between two accepts); JournalCorrupt or
        JournalStorageFailed when they cannot be read (at a start: what to resume)."""
        try:
            with self._db_lock:
                rows = self._db.execute(
                    "SELECT correlation, actor, type, payload FROM items WHERE state = 'open' ORDER BY rowid"
                ).fetchall()
        except sqlite3.DatabaseError as exc:
            raise _failure(exc, self.path, "reading the work to resume") from None
        return [JournalItem(correlation=_text(r[0]), actor=_text(r[1]), type=_text(r[2]), payload=_text(r[3]))
                for r in rows]

    def record_trace(self, correlation: str, trace: Any) -> concurrent.futures.Future[bool]:
        """Keep the trace of finished work that had no item (``finish`` keeps an item's),
        JSON-ready as the runtime's recorder hands it over (replaced if the work ran
        again); ``trace`` gives it back."""
        return self._write(_RECORD_TRACE, (correlation, time.time(), dump_json(trace).decode()))

    def trace(self, correlation: str) -> Any:
        """The kept trace of ``correlation``: its item's, or the table's, whichever is newer
        (a dead letter replayed after its item closed is traced in the table)."""
        self._barrier()  # a finish just queued (lazy) keeps the newest trace
        with self._db_lock:
            kept = self._db.execute("SELECT finished, trace FROM items WHERE correlation = ? AND trace IS NOT NULL",
                                    (correlation,)).fetchall()
            kept += self._db.execute("SELECT time, hops FROM traces WHERE correlation = ?",
                                     (correlation,)).fetchall()
        if not kept:
            return None
        return read_stored(max(kept, key=lambda row: row[0] or 0.0)[1], f"trace of {correlation}")

    def dead_letters(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` dead letters, oldest first."""
        with self._db_lock:
            rows = self._db.execute("SELECT summary FROM dead_letters ORDER BY id DESC LIMIT ?",
                                    (limit,)).fetchall()
        return [letter for r in reversed(rows) if (letter := read_stored(r[0], "a dead letter")) is not None]

    def dead_letter(self, letter_id: int) -> dict[str, Any] | None:
        with self._db_lock:
            row = self._db.execute("SELECT summary FROM dead_letters WHERE id = ?", (letter_id,)).fetchone()
        return None if row is None else read_stored(row[0], f"dead letter #{letter_id}")

    def last_dead_letter_id(self) -> int:
        with self._db_lock:
            row = self._db.execute("SELECT MAX(id) FROM dead_letters").fetchone()
        return row[0] or 0

    def dead_letter_counts(self) -> dict[str, int]:
        with self._db_lock:
            rows = self._db.execute("SELECT reason, COUNT(*) FROM dead_letters GROUP BY reason").fetchall()
        return dict(rows)

    def compact(self, older_than: float, *, dead_letters_older_than: float | None = None,
                keep_dead_letters: int = DEAD_LETTERS_KEPT) -> int:
        """Forget finished items and send keys older than ``older_than`` (a time.time()),
        but not the keys of an item still open (resumed, it must not send them again),
        dead letters older than ``dead_letters_older_than`` (default: the same), and all
        but the newest ``keep_dead_letters`` dead letters. Returns the items forgotten;
        JournalCorrupt or JournalStorageFailed when the journal cannot be compacted (at a
        start, before anything resumes)."""
        try:
            return self._compact(older_than, dead_letters_older_than, keep_dead_letters)
        except sqlite3.DatabaseError as exc:
            raise _failure(exc, self.path, "compacting it") from None

    def _compact(self, older_than: float, dead_letters_older_than: float | None, keep_dead_letters: int) -> int:
        letters_before = older_than if dead_letters_older_than is None else dead_letters_older_than
        forgotten = 0
        for table, where, args in (
            ("items", "state != 'open' AND finished < ?", (older_than,)),
            ("traces", "time < ?", (older_than,)),
            ("approvals", "state != 'pending' AND decided < ?", (older_than,)),
            ("dead_letters", "time < ? OR id <= (SELECT MAX(id) FROM dead_letters) - ?",
             (letters_before, keep_dead_letters)),
        ):
            # In chunks of _COMPACT_CHUNK rows, each its own transaction; the oldest rows come
            # first in rowid order, so each chunk's scan stops soon after the last one's.
            while True:
                with self._db_lock:
                    deleted = self._db.execute(
                        f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {where} LIMIT ?)",
                        (*args, _COMPACT_CHUNK)).rowcount
                self._checkpointer.written()
                if table == "items":
                    forgotten += deleted
                if deleted < _COMPACT_CHUNK:
                    break
        self._compact_sent(older_than)
        return forgotten

    def _compact_sent(self, older_than: float) -> None:
        """Forget the send keys older than ``older_than`` but those of open items: a key names
        the correlation whose turn made it, then ``:`` (``dispatcher.turn_key``), and a
        correlation may hold a ``:`` of its own (a client's), so each prefix before one is
        looked up. Items accepted from now on are not in ``open``: their keys are newer."""
        with self._db_lock:
            open_items = {row[0] for row in self._db.execute("SELECT correlation FROM items WHERE state = 'open'")}
        after = 0  # the rowid the last chunk ended at
        while True:
            with self._db_lock:
                rows = self._db.execute("SELECT rowid, key FROM sent WHERE rowid > ? AND time < ? ORDER BY rowid "
                                        "LIMIT ?", (after, older_than, _COMPACT_CHUNK)).fetchall()
                forget = [rowid for rowid, key in rows if not _names_one_of(_text(key), open_items)]
                if forget:
                    self._db.execute(f"DELETE FROM sent WHERE rowid IN ({', '.join('?' * len(forget))})", forget)
            self._checkpointer.written()
            if len(rows) < _COMPACT_CHUNK:
                return
            after = rows[-1][0]

    # ---------------------------------------------------------------- approvals

    def record_approval(self, *, approval_id: str, key: str, correlation: str, chat: str, request: str,
                        expires: float) -> concurrent.futures.Future[bool]:
        """An action that waits for approval; False if its ``key`` was known already."""
        return self._write(
            "INSERT OR IGNORE INTO approvals (id, key, correlation, chat, request, created, expires) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)", (approval_id, key, correlation, chat, request, time.time(), expires))

    def settle_approval(self, approval_id: str, state: str, *, by: str,
                        decision: str) -> concurrent.futures.Future[bool]:
        """Decide a pending approval (approved, denied, expired, cancelled); False when it
        was not pending any more."""
        return self._write("UPDATE approvals SET state = ?, decided = ?, decided_by = ?, decision = ? "
                           "WHERE id = ? AND state = 'pending'", (state, time.time(), by, decision, approval_id))

    def approvals(self, state: str | None = "pending") -> list[dict[str, Any]]:
        """The approvals in ``state`` (all when None), oldest first; the writes queued before
        are committed first."""
        self._barrier()
        where, args = ("WHERE state = ?", (state,)) if state is not None else ("", ())
        with self._db_lock:
            cursor = self._db.execute(f"SELECT * FROM approvals {where} ORDER BY created", args)
            names = [c[0] for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def approval(self, *, approval_id: str | None = None, key: str | None = None) -> dict[str, Any] | None:
        """One approval, by its id or its key."""
        self._barrier()
        column, value = ("id", approval_id) if approval_id is not None else ("key", key)
        with self._db_lock:
            cursor = self._db.execute(f"SELECT * FROM approvals WHERE {column} = ?", (value,))
            row = cursor.fetchone()
            names = [c[0] for c in cursor.description]
        return None if row is None else dict(zip(names, row, strict=True))

    def _barrier(self, timeout: float = 10.0) -> None:
        """Wait until the writes queued so far are committed (a read after them sees them)."""
        try:
            self._write("SELECT 1", (), at_once=True).result(timeout)
        except (RuntimeError, concurrent.futures.TimeoutError):
            pass  # closed, or slow: read what is there

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._writer.join(10)
        self._checkpointer.close()
        with self._reader_lock:
            self._reader.close()
        with self._db_lock:
            self._db.close()
        self._release()

    def _release(self) -> None:
        """Let another process open the journal (closing the lock's file drops the lock)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _tell(done: concurrent.futures.Future[bool] | Written | None, changed: bool,
          error: BaseException | None) -> None:
    """Resolve a write's future, or call its callback (whose failure must not stop the writer)."""
    if isinstance(done, concurrent.futures.Future):
        try:
            if error is None:
                done.set_result(changed)
            else:
                done.set_exception(error)
        except concurrent.futures.InvalidStateError:
            pass  # its waiter gave up on it (a delivery task cancelled at a restart)
    elif done is not None:
        try:
            done(changed, error)
        except Exception:
            log.exception("a journal write's callback failed")


class SendLedger:
    """What a sender asks of the journal: was this chunk of this reply sent already,
    and record that it now was. Without a journal nothing was ever sent before. The
    correlation it names to the journal is the one being handled (``current_correlation``,
    also in the delivery task the handler started): the one whose turn made the key.

    >>> from autoresponse.messages import OriginalContext
    >>> message = OutboundMessage.reply(OriginalContext(chat_id=1, interface_name="console"), "hi")
    >>> ledger = SendLedger(None)
    >>> ledger.already_sent(message, 0)
    False
    """

    def __init__(self, journal: DeliveryJournal | None) -> None:
        self.journal = journal

    def _key(self, message: OutboundMessage, chunk: int) -> str | None:
        if self.journal is None or message.key is None:
            return None  # notices and unjournaled replies carry no key
        return f"{message.key}#{chunk}"

    def already_sent(self, message: OutboundMessage, chunk: int) -> bool:
        """Whether the chunk was sent before; LedgerUnavailable when the journal cannot say."""
        key = self._key(message, chunk)
        if key is None:
            return False
        try:
            return self.journal.was_sent(key, current_correlation.get())  # type: ignore[union-attr]
        except Exception as exc:
            raise LedgerUnavailable(f"the journal cannot say whether it was sent: {type(exc).__name__}: {exc}") from exc

    def confirm(self, message: OutboundMessage, chunk: int) -> concurrent.futures.Future[bool]:
        """Record the chunk as sent; the future resolves once that is durable.

        The SQLite journal commits in order, so a caller need not wait: the key is durable
        before anything written after it, such as the item's ``finish``. On NATS the key
        and the finish are two writes: a sender of shared work waits for it.
        """
        key = self._key(message, chunk)
        if key is None:
            return _NOTHING_RECORDED
        return self.journal.mark_sent(key, current_correlation.get())  # type: ignore[union-attr]


#: What ``confirm`` answers when there is nothing to record: one future, resolved once
#: (a resolved future is never changed again; making one per delivery cost a lock's worth).
_NOTHING_RECORDED: concurrent.futures.Future[bool] = concurrent.futures.Future()
_NOTHING_RECORDED.set_result(False)
