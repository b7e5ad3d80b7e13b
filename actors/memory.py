"""Conversation memory: what each chat said, what the bot answered, what it ran.

One SQLite file in the data directory, keyed by the chat (interface, chat id,
thread): the user's messages, the replies confirmed delivered, and a compact
record of each action (the command, its exit status and the first lines of its
output, never whole megabytes). Each chat is bounded by a token budget; the
oldest entries are dropped first, and one entry longer than the whole budget is
cut to fit it. Tokens are counted approximately: four characters to a token,
plus four for each message's framing, which is close to what OpenAI-style
tokenizers give for English and errs long for code. What is older than the
retention is never read back, and goes when the store is compacted. A turn its user
cancels is forgotten, with all it left (``forget_turn``). A user's message names the turn
it started (its correlation), so a turn resumed from the journal finds it (``stored_for``)
and is not remembered twice; a file from before that column gains it at its open.

>>> from tempfile import TemporaryDirectory
>>> folder = TemporaryDirectory()
>>> store = ConversationStore(Path(folder.name) / "memory.sqlite3", max_tokens=2000)
>>> store.append("telegram:42:", "user", "run df -h")  # its id
1
>>> store.recent("telegram:42:")
[Turn(role='user', content='run df -h', tool_calls=(), tool_call_id=None)]
>>> store.close(); folder.cleanup()

It also remembers the chats it has seen (their titles and usernames), so a
message can name its target chat instead of giving its id.

Memory is an aid: a message the disk fails to store (full, read-only, an I/O error) is
left out, not raised, and the store is ``failing`` (in the status: ``memory``) until a
write commits again; replies go out meanwhile.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

# A damaged file told from a failing disk as the journal tells them.
from autoresponse.actors.journal.journal import damaged
from autoresponse.actors.limits import (
    MEMORY_MAX_TOKENS,
    MEMORY_OUTPUT_CHARS,
    MEMORY_OUTPUT_LINES,
    MEMORY_RETENTION_SECONDS,
)
from autoresponse.messages import ActionResult, OriginalContext, Turn

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memory (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    chat TEXT NOT NULL,
    role TEXT NOT NULL,                 -- user | assistant
    kind TEXT NOT NULL,                 -- message | reply | action
    content TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    time REAL NOT NULL,
    correlation TEXT                    -- the turn of a user's message (see ``stored_for``)
);
CREATE INDEX IF NOT EXISTS memory_chat ON memory (chat, id);
CREATE TABLE IF NOT EXISTS chats (
    interface TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    title TEXT,
    username TEXT,
    seen REAL NOT NULL,
    PRIMARY KEY (interface, chat_id)
);
"""

Role = Literal["user", "assistant"]
Kind = Literal["message", "reply", "action"]


#: The tokens of a message's framing (its role, its separators), counted with each entry.
_FRAMING_TOKENS = 4


def estimate_tokens(text: str) -> int:
    """About four characters to a token, plus the message's framing."""
    return _FRAMING_TOKENS + (len(text) + 3) // 4


def within_budget(text: str, budget: int) -> str:
    """``text``, cut so that it and its framing fit ``budget`` tokens."""
    return text[: max(0, budget - _FRAMING_TOKENS) * 4]


def storable(text: str) -> str:
    """``text`` as SQLite can store it: a lone surrogate (a broken emoji from a chat's
    JSON) cannot be encoded as UTF-8, so it becomes '?' instead of failing the write."""
    return text.encode("utf-8", "replace").decode("utf-8")


class Entry(BaseModel):
    """One remembered message."""

    id: int
    chat: str
    role: Role
    kind: Kind
    content: str
    tokens: int
    time: float
    #: The turn (its correlation) a user's message started; None for the rest.
    correlation: str | None = None


#: The columns of a memory row, in the order ``history`` selects them: an Entry's fields.
_ENTRY_COLUMNS = ("id", "chat", "role", "kind", "content", "tokens", "time", "correlation")


def newest_within(rows: Iterable[Any], limit: int, chat: str) -> list[Entry]:
    """The newest of ``rows`` (newest first, each an Entry's fields) that fit ``limit``
    tokens, oldest first. A damaged one is left out, with a warning: the chat goes on
    without it rather than failing on it at every request."""
    kept: list[Entry] = []
    total = 0
    for row in rows:
        try:
            entry = Entry.model_validate(row)
        except ValueError:  # a ValidationError
            log.warning("memory entry %s of chat %s is unreadable, and left out",
                        row.get("id") if isinstance(row, dict) else "?", chat)
            continue
        total += entry.tokens
        if total > limit:
            break
        kept.append(entry)
    return kept[::-1]


class KnownChat(BaseModel):
    """A chat this daemon has seen, to find it by name."""

    interface: str
    chat_id: str
    title: str | None = None
    username: str | None = None

    def describe(self) -> str:
        names = [f"'{self.title}'" if self.title else None, f"@{self.username}" if self.username else None]
        return f"{' '.join(n for n in names if n) or 'a chat'} (id {self.chat_id})"


def action_record(result: ActionResult) -> str:
    """A compact, bounded record of what an action did, for the memory."""
    what = result.command or result.action_type
    status = f"exit {result.exit_code}" if result.exit_code is not None else ("ok" if result.ok else "failed")
    lines = result.output.strip().splitlines()
    shown = "\n".join(lines[:MEMORY_OUTPUT_LINES])[:MEMORY_OUTPUT_CHARS]
    more = f"\n[{len(lines) - MEMORY_OUTPUT_LINES} more lines]" if len(lines) > MEMORY_OUTPUT_LINES else ""
    return f"[ran `{what}`: {status}]\n{shown}{more}".rstrip()


class StoreUnreadable(Exception):
    """A store's SQLite file is there but cannot be opened or read: not a database, or a
    directory in its place. As with the journal (``JournalCorrupt``), it is never replaced:
    the operator is told which file it is, and moves it aside."""

    def __init__(self, what: str, path: Path, why: object) -> None:
        super().__init__(f"the {what} {path} cannot be read ({why}); it was left as it is")
        self.what = what
        self.path = path


class StoreStorageFailed(ValueError):
    """The disk or the file system failed a store's SQLite file (full, an I/O error,
    read-only): the file is not damaged, and was left as it is; moving it aside would lose
    all it holds. A ValueError, as the journal's ``JournalStorageFailed``: the CLI shows a
    start's ValueError as one line (``cannot start: ...``)."""

    def __init__(self, what: str, path: Path, why: sqlite3.Error) -> None:
        name = getattr(why, "sqlite_errorname", None) or type(why).__name__
        super().__init__(f"the {what} {path} cannot be used: {name}: {why}; the disk or the file system failed "
                         "it (full, an I/O error, read-only), it is not damaged, and it was left intact: fix "
                         "the cause and start again")


def _failure(what: str, path: Path, exc: sqlite3.DatabaseError) -> StoreUnreadable | StoreStorageFailed:
    """What ``exc`` means to whoever opens the ``what`` at ``path``: a damaged file is
    StoreUnreadable (to move aside), anything else the storage's failure."""
    return StoreUnreadable(what, path, exc) if damaged(exc) else StoreStorageFailed(what, path, exc)


@contextmanager
def readable(what: str, path: Path) -> Iterator[None]:
    """StoreUnreadable naming ``what`` and its file for a damaged one (such as "database
    disk image is malformed": a damaged page shows only once a statement reads it, not at
    the open), StoreStorageFailed for a disk that fails it, as ``open_store`` does."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        raise _failure(what, path, exc) from None


def open_store(path: Path, what: str, setup: Callable[[sqlite3.Connection], None]) -> sqlite3.Connection:
    """The SQLite file of a thread-safe store (the memory, the reminders), in WAL mode and
    set up by ``setup``; StoreUnreadable naming ``what`` and the file if it is no database
    (or a directory), StoreStorageFailed if the disk fails it (full, an I/O error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():  # SQLite would only say "unable to open database file"
        raise StoreUnreadable(what, path, "it is a directory")
    db: sqlite3.Connection | None = None
    try:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")  # a file that is not a database fails here
        setup(db)
    except sqlite3.DatabaseError as exc:
        if db is not None:
            db.close()
        raise _failure(what, path, exc) from None
    return db


def _set_up_memory(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(memory)")}
    if "correlation" not in columns:  # a file of an older version: its entries have none
        db.execute("ALTER TABLE memory ADD COLUMN correlation TEXT")


def _fails_the_file(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is the storage's failure (full, read-only, an I/O error, locked by
    another process) or the file's damage, not a mistake of the call (a closed store)."""
    return isinstance(exc, sqlite3.OperationalError) or damaged(exc)


class ConversationStore:
    """Thread-safe; each write commits before it returns (they are small and few).

    Its times are the wall clock's (``time.time()``): they are kept across restarts.
    A file damaged past its first page is StoreUnreadable once ``compact``,
    ``chats_with_memory`` or ``history`` reads the damage.

    A write the file fails (``append``, ``seen``, ``forget_turn``; ``forget`` raises it, as
    its user must hear it) marks the store ``failing`` until one commits; the start and the
    end of that are logged, once each."""

    WHAT = "conversation memory"

    def __init__(self, path: Path, *, max_tokens: int = MEMORY_MAX_TOKENS,
                 retention_seconds: float = MEMORY_RETENTION_SECONDS) -> None:
        self.path = path
        self.max_tokens = max_tokens
        self.retention_seconds = retention_seconds
        self._lock = threading.Lock()
        self._db = open_store(path, self.WHAT, _set_up_memory)
        #: Why the file fails the store's writes now, and since when (the wall clock), as the
        #: journal's ``failing``; None while they commit. Written under the lock.
        self.failing: tuple[str, float] | None = None
        self._failed_size = 0  # the shortest write the file failed while ``failing``

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _writing(self, *, raising: bool = False, size: int = 0) -> Iterator[sqlite3.Connection]:
        """The database to write ``size`` characters, under the lock. A write the file fails
        marks the store ``failing``, and is raised only if ``raising``: else the mark and its
        log say it, and a caller would only lose a reply over it (a turn without memory beats
        none). A write at least as long as the shortest that failed clears the mark once it
        commits (the file takes what it refused): on a nearly full disk a shorter one (a
        chat's names updated in place, a short reply) may fit where the user's message did
        not, and the memory would look well while it lost them."""
        with self._lock:
            try:
                yield self._db
            except sqlite3.Error as exc:
                if not _fails_the_file(exc):
                    raise
                self._writes_fail(exc, size)
                if raising:
                    raise
                return
            if self.failing is not None and size >= self._failed_size:
                self._writes_again()

    def _writes_fail(self, error: sqlite3.Error, size: int) -> None:
        self._failed_size = min(self._failed_size, size) if self.failing is not None else size
        if self.failing is not None:
            log.debug("%s: a write failed again (%s)", self.WHAT, error)
            return
        self.failing = (f"its writes fail: {error}", time.time())
        log.error("%s %s: writes fail (%s); replies go out, but nothing new is remembered until "
                  "they commit again", self.WHAT, self.path, error)

    def _writes_again(self) -> None:
        assert self.failing is not None
        reason, since = self.failing
        self.failing = None
        log.warning("%s %s writes again (they failed for %.0fs: %s)", self.WHAT, self.path,
                    time.time() - since, reason)

    # ---------------------------------------------------------------- memory

    def append(self, chat: str, role: Role, content: str, kind: Kind = "message",
               correlation: str | None = None) -> int | None:
        """Remember one message (cut to fit the whole budget, were it longer); the chat's
        oldest entries go once it is over its budget. ``correlation``: the turn a user's
        message starts (``stored_for``). Its id (for ``forget_turn``), None if the disk
        failed it."""
        content = storable(within_budget(content, self.max_tokens))
        tokens = estimate_tokens(content)
        with self._writing(size=len(content)) as db:
            newest = db.execute("INSERT INTO memory (chat, role, kind, content, tokens, time, correlation) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                                (chat, role, kind, content, tokens, time.time(), correlation)).lastrowid
            self._trim(chat, newest)
            return newest
        return None

    def stored_for(self, chat: str, correlation: str) -> int | None:
        """The id of the user's message that started the turn ``correlation``, if the chat
        holds it: a turn resumed from the journal after a crash or a stop was remembered
        at its first start, and is not remembered again."""
        try:
            with self._lock:
                row = self._db.execute("SELECT id FROM memory WHERE chat = ? AND correlation = ? "
                                       "ORDER BY id LIMIT 1", (chat, correlation)).fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreUnreadable(self.WHAT, self.path, exc) from None
        return None if row is None else int(row[0])

    def _trim(self, chat: str, newest: int | None) -> None:
        """Drop the chat's oldest entries beyond its budget, never ``newest`` (the one just
        remembered: a budget below the framing alone would otherwise take it too)."""
        total, cutoff = 0, None
        for row_id, tokens in self._db.execute(
                # CAST: a damaged row counts as nothing, and goes with the older ones
                "SELECT id, CAST(tokens AS INTEGER) FROM memory WHERE chat = ? ORDER BY id DESC", (chat,)):
            total += tokens
            if total > self.max_tokens:
                cutoff = row_id if row_id != newest else row_id - 1
                break
        if cutoff is not None:
            self._db.execute("DELETE FROM memory WHERE chat = ? AND id <= ?", (chat, cutoff))

    def recent(self, chat: str, budget: int | None = None) -> list[Turn]:
        """The newest entries that fit ``budget`` tokens (default: the whole budget), oldest
        first, as chat messages."""
        return [Turn(role=e.role, content=e.content) for e in self.history(chat, budget)]

    def history(self, chat: str, budget: int | None = None) -> list[Entry]:
        """The newest entries within the retention that fit ``budget`` tokens, oldest first:
        a daemon that runs for months compacts only at its start, yet an entry past the
        retention is never read back."""
        limit = self.max_tokens if budget is None else budget
        try:  # not ``readable``: on every turn's path, a plain try costs nothing
            with self._lock:
                rows = self._db.execute(f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM memory "
                                        "WHERE chat = ? AND time >= ? ORDER BY id DESC",
                                        (chat, self._retained_since(time.time()))).fetchall()
        except sqlite3.DatabaseError as exc:
            raise StoreUnreadable(self.WHAT, self.path, exc) from None
        return newest_within((dict(zip(_ENTRY_COLUMNS, row)) for row in rows), limit, chat)

    def _retained_since(self, now: float) -> float:
        """The time of the oldest entry still within the retention at ``now``."""
        return now - self.retention_seconds

    def forget(self, chat: str) -> int:
        """Forget a chat's memory (a user's ``/forget``); how many entries went. A write the
        file fails is raised: its user is told the memory was not cleared."""
        with self._writing(raising=True) as db:
            return db.execute("DELETE FROM memory WHERE chat = ?", (chat,)).rowcount

    def forget_turn(self, chat: str, first: int) -> None:
        """Forget a turn its user cancelled: the chat's entries from ``first`` (its message)
        on, which are its replies and its actions' records (a chat runs one turn at a time;
        a reminder's reply stored meanwhile goes with them)."""
        with self._writing() as db:
            db.execute("DELETE FROM memory WHERE chat = ? AND id >= ?", (chat, first))

    def compact(self, now: float | None = None) -> int:
        """Forget what is older than the retention; how many entries went."""
        before = self._retained_since(time.time() if now is None else now)
        with self._lock, readable(self.WHAT, self.path):
            gone = self._db.execute("DELETE FROM memory WHERE time < ?", (before,)).rowcount
            self._db.execute("DELETE FROM chats WHERE seen < ?", (before,))
        return gone

    def chats_with_memory(self) -> list[tuple[str, int]]:
        """Every chat key with memory within the retention, and its number of entries."""
        with self._lock, readable(self.WHAT, self.path):
            return self._db.execute("SELECT chat, COUNT(*) FROM memory WHERE time >= ? "
                                    "GROUP BY chat ORDER BY chat", (self._retained_since(time.time()),)).fetchall()

    # ---------------------------------------------------------------- known chats

    def seen(self, context: OriginalContext) -> None:
        """Remember the chat a message came from, with its names, to find it by name later."""
        username = context.user_name if context.chat_type in (None, "private") else None
        with self._writing() as db:
            db.execute(
                "INSERT INTO chats (interface, chat_id, title, username, seen) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (interface, chat_id) DO UPDATE SET title = COALESCE(excluded.title, title), "
                "username = COALESCE(excluded.username, username), seen = excluded.seen",
                (context.interface_name, str(context.chat_id), _storable_or_none(context.chat_title),
                 _storable_or_none(username), time.time()))

    def find_chats(self, interface: str, name: str) -> list[KnownChat]:
        """Chats of ``interface`` whose title or username is ``name`` (case folded, a leading
        @ ignored); if none matches whole, those whose title contains it."""
        with self._lock:
            rows = self._db.execute("SELECT interface, chat_id, title, username FROM chats WHERE interface = ?",
                                    (interface,)).fetchall()
        return matching_chats([KnownChat(interface=r[0], chat_id=r[1], title=r[2], username=r[3])
                               for r in rows], name)


def _storable_or_none(text: str | None) -> str | None:
    return None if text is None else storable(text)


def matching_chats(known: list[KnownChat], name: str) -> list[KnownChat]:
    """The chats whose title or username is ``name`` (case folded, a leading @ ignored);
    if none matches whole, those whose title contains it."""
    wanted = name.strip().lstrip("@").strip().casefold()
    if not wanted:
        return []  # an empty name is in every title: it names no chat
    exact = [c for c in known if wanted in _names(c)]
    return exact or [c for c in known if c.title and wanted in c.title.casefold()]


def _names(chat: KnownChat) -> Iterable[str]:
    return [n.casefold() for n in (chat.title, chat.username) if n]
