"""The delivery journal: nothing accepted is lost, even across kill -9.

Real time: the kill -9 and clean-stop tests run the daemon as a real process and kill or
stop it at random real moments; the journal's own tests wait on no timer."""

from __future__ import annotations

import io
import json
import logging
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest
from conftest import Daemon, console_text, environment, free_port, send_chunks, wait_for

from autoresponse import Application
from autoresponse.actors.journal import JournalFailing, JournalInUse, JournalStorageFailed, SqliteJournal
from autoresponse.actors.routes import interface
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.actors.journal import journal as journal_module
from autoresponse.actors.journal._checkpointer import WalCheckpointer
from autoresponse.actors.limits import MALFORMED_KEPT
from autoresponse.testing.fake_llm import FakeLLMServer
from autoresponse.testing.fake_telegram import FakeTelegramServer
from autoresponse.messages import Envelope, OriginalContext, UserRequest

CTX = OriginalContext(chat_id=1, message_id=1, interface_name="telegram")


def request(n: int) -> UserRequest:
    return UserRequest(text=f"hello {n}", context=CTX)


def test_one_process_at_a_time_has_a_journal_and_a_killed_one_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from autoresponse.actors.journal import SqliteJournal; "
         "SqliteJournal(Path(sys.argv[1])); print('open', flush=True); time.sleep(600)", str(path)],
        stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        with pytest.raises(JournalInUse, match=f"process {holder.pid} has the journal {path} open"):
            SqliteJournal(path)
    finally:
        holder.kill()  # kill -9: no stale lock is left behind
        holder.wait(10)
    mine = SqliteJournal(path)
    try:
        with pytest.raises(JournalInUse):  # nor a second one in this process
            SqliteJournal(path)
    finally:
        mine.close()
    SqliteJournal(path).close()  # closed, it lets go


def test_accepted_work_stays_open_until_finished_and_then_compacts(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        first = Envelope.new(request(1), correlation_id="c1")
        assert journal.accept(first, actor="llm").result(5) is True
        assert journal.accept(first, actor="llm").result(5) is False  # a retry of the same work
        journal.accept(Envelope.new(request(2), correlation_id="c2"), actor="llm").result(5)
        assert [i.correlation for i in journal.unfinished()] == ["c1", "c2"]
        journal.finish("c1")
        journal.mark_sent("c2:chat#0").result(5)
        assert [i.correlation for i in journal.unfinished()] == ["c2"]
        assert journal.was_sent("c2:chat#0") and not journal.was_sent("c2:chat#1")
        assert UserRequest.model_validate_json(journal.unfinished()[0].payload).text == "hello 2"
        assert journal.compact(older_than=time.time() + 1) == 1  # only the finished one
        assert [i.correlation for i in journal.unfinished()] == ["c2"]
    finally:
        journal.close()
    reopened = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        assert [i.correlation for i in reopened.unfinished()] == ["c2"]
    finally:
        reopened.close()


def _one_batch(journal: SqliteJournal, queue: Callable[[], list[Future[bool]]]) -> list[bool]:
    """What ``queue`` queued, written as one batch: the writer is held at its lock
    (busy with an empty write) while it queues, so it takes them all at once."""
    with journal._db_lock:
        busy = journal._write("SELECT 1", ())
        while journal._pending:  # the writer has taken the empty write and waits for the lock
            time.sleep(0.001)
        futures = queue()
    busy.result(5)
    return [f.result(5) for f in futures]


def test_a_batch_is_written_as_if_in_the_order_it_was_queued(tmp_path: Path) -> None:
    """Each kind of write goes to SQLite once per batch, yet a batch ends as its writes
    would one by one: a retry in the same batch is known, and a finish queued before its
    own accept does not close it."""
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        def accepts_and_finishes() -> list[Future[bool]]:
            first = Envelope.new(request(1), correlation_id="c1")
            written = [journal.accept(first, actor="llm"), journal.accept(first, actor="llm")]
            journal.finish("c1")
            written.append(journal.mark_sent("c1:chat#0"))
            return written
        assert _one_batch(journal, accepts_and_finishes) == [True, False, True]
        assert journal.unfinished() == [] and journal.was_sent("c1:chat#0")

        def finish_then_accept() -> list[Future[bool]]:
            journal.finish("c2")  # nothing to close yet
            return [journal.accept(Envelope.new(request(2), correlation_id="c2"), actor="llm")]
        assert _one_batch(journal, finish_then_accept) == [True]
        assert [i.correlation for i in journal.unfinished()] == ["c2"]

        def a_retry_among_new_work() -> list[Future[bool]]:
            return [journal.accept(Envelope.new(request(n), correlation_id=f"c{n}"), actor="llm")
                    for n in (3, 1, 4)] + [journal.mark_sent("c3:chat#0")]
        assert _one_batch(journal, a_retry_among_new_work) == [True, False, True, True]  # c1: done before
        assert [i.correlation for i in journal.unfinished()] == ["c2", "c3", "c4"]
    finally:
        journal.close()


def test_a_batch_of_many_writes_of_each_kind_ends_as_they_would_one_by_one(tmp_path: Path) -> None:
    """A batch's writes of a kind go to SQLite as statements of many rows (more rows than
    one statement holds, here), and end as they would one by one: a second finish of an
    item leaves it as the first closed it, with the last trace given."""
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    count = 150
    try:
        earlier = [journal.accept(Envelope.new(request(n), correlation_id=f"old-{n}"), actor="llm")
                   for n in range(count)]
        assert all(f.result(5) for f in earlier)

        def many() -> list[Future[bool]]:
            written = [journal.accept(Envelope.new(request(n), correlation_id=f"new-{n}"), actor="llm")
                       for n in range(count)]
            written += [journal.mark_sent(f"old-{n}:chat#0") for n in range(count)]
            for n in range(count):
                journal.finish(f"old-{n}", "done", {"events": [["first", n]]} if n % 2 else None)
                journal.finish(f"old-{n}", "dead", {"events": [["second", n]]} if n % 3 else None)
            return written
        assert _one_batch(journal, many) == [True] * (2 * count)
        assert sorted(i.correlation for i in journal.unfinished()) == sorted(f"new-{n}" for n in range(count))
        assert all(journal.was_sent(f"old-{n}:chat#0") for n in range(count))
        db = sqlite3.connect(tmp_path / "j.sqlite3")
        try:
            rows = dict(((c, (s, t)) for c, s, t in db.execute(
                "SELECT correlation, state, trace FROM items WHERE correlation LIKE 'old-%'")))
        finally:
            db.close()
        for n in range(count):
            last = "second" if n % 3 else "first" if n % 2 else None
            state, trace = rows[f"old-{n}"]
            assert state == "done"  # the first finish closed it; the second found it closed
            assert (json.loads(trace)["events"][0][0] if trace else None) == last
    finally:
        journal.close()


def test_compaction_forgets_everything_old_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction deletes a chunk at a time (so the write-ahead log never holds a whole
    interval's deletions at once), until nothing old is left; what is open stays, and so do
    the send keys of what is open."""
    monkeypatch.setattr(journal_module, "_COMPACT_CHUNK", 7)
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        for n in range(50):
            journal.accept(Envelope.new(request(n), correlation_id=f"c{n}"), actor="llm")
            journal.mark_sent(f"c{n}:chat#0")
            if n % 10:
                journal.finish(f"c{n}")
        journal.mark_sent("flush").result(5)
        assert journal.compact(older_than=time.time() + 1) == 45
        assert sorted(i.correlation for i in journal.unfinished()) == ["c0", "c10", "c20", "c30", "c40"]
        # An open item's send keys stay: resumed, it must not send again what it sent.
        assert [n for n in range(50) if journal.was_sent(f"c{n}:chat#0")] == [0, 10, 20, 30, 40]
    finally:
        journal.close()


def test_a_finished_item_keeps_its_trace_and_an_older_journal_learns_to(tmp_path: Path) -> None:
    """An item's trace is kept in its own row by its finish; a journal written before
    that gains the column on open, and its open work is still there to resume."""
    path = tmp_path / "j.sqlite3"
    older = sqlite3.connect(path)
    older.executescript("""CREATE TABLE items (correlation TEXT PRIMARY KEY, actor TEXT NOT NULL,
        type TEXT NOT NULL, payload TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'open',
        created REAL NOT NULL, finished REAL);""")
    older.execute("INSERT INTO items (correlation, actor, type, payload, created) VALUES (?, ?, ?, ?, ?)",
                  ("old", "llm", "UserRequest", request(1).model_dump_json(), time.time()))
    older.commit()
    older.close()
    journal = SqliteJournal(path)
    try:
        assert [i.correlation for i in journal.unfinished()] == ["old"]
        trace = {"events": [["queued", "m1", 1, "UserRequest", 1.5, None, "llm"]]}
        journal.finish("old", trace=trace)
        journal.accept(Envelope.new(request(2), correlation_id="cancelled"), actor="llm")
        journal.finish("cancelled", "cancelled")  # by its user, before its work ended
        journal.finish("cancelled", "done", trace=trace)
        journal.mark_sent("flush").result(5)
        assert journal.unfinished() == [] and journal.trace("old") == trace == journal.trace("cancelled")
        with journal._db_lock:
            states = dict(journal._db.execute("SELECT correlation, state FROM items"))
        assert states == {"old": "done", "cancelled": "cancelled"}  # the first word stands
    finally:
        journal.close()


def test_a_bad_write_fails_alone_and_the_writer_goes_on(tmp_path: Path) -> None:
    """A write SQLite refuses (or that cannot even be bound) fails its own waiter only: the
    rest of its batch is committed, and a waiter that gave up does not stop the writer."""
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        def mixed() -> list[Future[bool]]:
            accepted = journal.accept(Envelope.new(request(1), correlation_id="c1"), actor="llm")
            refused = journal.record_dead_letter({"id": 1, "time": time.time(), "reason": None})
            unbindable = journal.record_dead_letter({"id": 2**70, "time": time.time(), "reason": "x"})
            journal.finish("c1")
            abandoned = journal.mark_sent("c1:chat#0")
            abandoned.cancel()  # its sender was stopped while it waited
            return [accepted, refused, unbindable]
        with journal._db_lock:
            busy = journal._write("SELECT 1", ())
            while journal._pending:
                time.sleep(0.001)
            accepted, refused, unbindable = mixed()
        assert accepted.result(5) is True
        with pytest.raises(sqlite3.IntegrityError):
            refused.result(5)
        with pytest.raises(OverflowError):
            unbindable.result(5)
        assert busy.result(5) is False
        assert journal.mark_sent("later").result(5) is True  # the writer is alive
        assert journal.unfinished() == [] and journal.was_sent("c1:chat#0")
    finally:
        journal.close()


def test_an_outside_reader_does_not_hold_the_writes_at_a_compaction(tmp_path: Path) -> None:
    """A backup or a shell reading the journal keeps the write-ahead log from being
    restarted; the compaction's checkpoint gives up on it at once and writes go on."""
    journal = SqliteJournal(tmp_path / "j.sqlite3", retention_seconds=0.0, compact_every=0.0)
    reader = sqlite3.connect(tmp_path / "j.sqlite3")
    try:
        journal.mark_sent("before").result(5)
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM sent").fetchone()  # a read transaction left open
        for n in range(5):  # each batch compacts, and checkpoints, after it is written
            assert journal.mark_sent(f"k{n}").result(2) is True  # not the 5 s busy timeout
    finally:
        reader.close()
        journal.close()


def test_the_write_ahead_log_is_copied_back_beside_the_writer_and_stays_small(tmp_path: Path) -> None:
    """The journal's checkpointer copies the write-ahead log back into the database soon
    after commits, long before the writer's own checkpoint would (at 1,000 pages), so
    that one finds little left to copy; the log keeps being started over while the journal
    is written to without a pause; nothing written is lost, and the checkpointer stops
    with the journal."""
    path = tmp_path / "j.sqlite3"
    journal = SqliteJournal(path)
    checkpointer = journal._checkpointer
    text = "x" * 4000  # a page each

    def write(group: int) -> None:
        assert all(f.result(30) for f in [
            journal.accept(Envelope.new(UserRequest(text=text, context=CTX), correlation_id=f"c{group}-{n}"),
                           actor="llm") for n in range(100)])
    try:
        write(0)
        until = time.monotonic() + 10
        while checkpointer.copied < 100 and time.monotonic() < until:
            time.sleep(0.01)
        assert checkpointer.copied >= 100  # pages, of about 100 written: a tenth of the writer's threshold
        largest = 0
        for group in range(1, 80):  # 8,000 items in all: 32 MB through the log
            write(group)
            largest = max(largest, path.with_name("j.sqlite3-wal").stat().st_size)
        assert largest < 8_000 * len(text) / 2, f"the log grew to {largest:,} bytes"
        assert len(journal.unfinished()) == 8000
    finally:
        journal.close()
    assert not any(t.name == "journal-checkpointer" for t in threading.enumerate())


def test_a_log_held_from_starting_over_is_cut_back_once_it_does(tmp_path: Path) -> None:
    """While a reader holds a snapshot the write-ahead log cannot start over, and it grows
    far past its usual size; once the reader lets go and it starts over, its file is cut
    back (a daemon's disk stays flat after such a spell, and does not keep its peak)."""
    from autoresponse.actors.journal._checkpointer import WAL_RESET_FRAMES

    usual = WAL_RESET_FRAMES * 4096  # the log's pages before it starts over

    path = tmp_path / "j.sqlite3"
    journal = SqliteJournal(path, retention_seconds=3600, compact_every=0.0)  # a restart after each commit
    wal = path.with_name("j.sqlite3-wal")
    text = "x" * 4000  # a page each

    def write(group: int) -> None:
        assert all(f.result(30) for f in [
            journal.accept(Envelope.new(UserRequest(text=text, context=CTX), correlation_id=f"c{group}-{n}"),
                           actor="llm") for n in range(100)])
    reader = sqlite3.connect(path)
    try:
        write(0)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM items").fetchone() == (100,)  # holds its snapshot
        group = 1
        while wal.stat().st_size <= 3 * usual and group < 100:
            write(group)
            group += 1
        held = wal.stat().st_size
        assert held > 3 * usual
        reader.rollback()
        until = time.monotonic() + 30
        while wal.stat().st_size > 2 * usual and time.monotonic() < until:  # it starts over, then is cut
            write(group)
            group += 1
        assert wal.stat().st_size <= 2 * usual  # about its usual size again, not its peak
        assert len(journal.unfinished()) == 100 * group
    finally:
        reader.close()
        journal.close()


def test_the_file_gives_back_what_compaction_frees(tmp_path: Path) -> None:
    """A spell of many large items, once compacted away, leaves the database file at the size
    of what is kept, not at its peak (free pages go back at the next compaction): a daemon's
    disk follows its load and does not keep the highest it ever had, across a restart too."""
    path = tmp_path / "j.sqlite3"
    text = "x" * 4000  # a page each

    def spell(journal: SqliteJournal, group: str, count: int, size: int) -> None:
        for n in range(count):
            accepted = journal.accept(Envelope.new(UserRequest(text=text[:size], context=CTX),
                                                   correlation_id=f"{group}-{n}"), actor="llm")
            assert accepted is not None and accepted.result(30)
            journal.finish(f"{group}-{n}", "done")

    # The spell is written under a retention it cannot outlast, however slow the machine:
    # under the short one, its first items went while its last were written (a smaller peak
    # on a busy machine, and a flaky test). The daemon is then restarted with the short one.
    kept_all = SqliteJournal(path, retention_seconds=3600.0, compact_every=0.0)
    try:
        spell(kept_all, "big", 500, 4000)
    finally:
        kept_all.close()
    peak = path.stat().st_size  # the spell's 2 MB, the log copied back at the close
    assert peak > 400 * 4000
    time.sleep(0.6)  # past the short retention: the next commits compact the spell away
    journal = SqliteJournal(path, retention_seconds=0.5, compact_every=0.0)
    try:
        until = time.monotonic() + 30
        group = 0
        while path.stat().st_size > peak // 4 and time.monotonic() < until:
            spell(journal, f"small{group}", 5, 10)
            group += 1
        assert path.stat().st_size <= peak // 4
    finally:
        journal.close()


def test_a_close_between_a_turns_pause_and_its_clear_still_stops_the_checkpointer(tmp_path: Path) -> None:
    """A close can land after a turn's pause and before the turn clears the wake-up it
    answers (close sets both events; the turn then clears one): the thread ends with the
    journal all the same, and does not sleep on waiting for a commit that never comes (in
    CI a daemon's stop waited its 10 s for it, and the thread outlived the daemon)."""
    path = tmp_path / "j.sqlite3"
    sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").connection.close()
    checkpointer = WalCheckpointer(path, every=0.01)
    first = checkpointer._wrote

    class ClosedJustBefore(threading.Event):
        def clear(self) -> None:  # what close() does, then the turn's own clear
            checkpointer._stopping.set()
            self.set()
            super().clear()
    checkpointer._wrote = ClosedJustBefore()
    try:
        first.set()  # a commit: the sleeping thread takes a turn
        checkpointer._thread.join(5)
        assert not checkpointer._thread.is_alive()
    finally:
        checkpointer.close()


def test_a_failing_checkpoint_is_logged_once_and_so_is_its_recovery(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A disk that refuses the copy (full, failing) is one warning, not one every turn
    while it lasts; writes go on meanwhile, and the log says when checkpoints work again."""
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    checkpointer = journal._checkpointer
    copy = checkpointer._checkpoint
    failed = threading.Semaphore(0)
    broken = threading.Event()
    broken.set()

    def checkpoint() -> tuple[int, int]:
        if broken.is_set():
            failed.release()
            raise sqlite3.OperationalError("database or disk is full")
        return copy()
    monkeypatch.setattr(checkpointer, "_checkpoint", checkpoint)
    try:
        with caplog.at_level(logging.INFO, logger="autoresponse.actors.journal"):
            for n in range(4):  # each commit is followed by a turn of the checkpointer
                assert journal.mark_sent(f"k{n}").result(5) is True
                assert failed.acquire(timeout=10)
            broken.clear()
            journal.mark_sent("after").result(5)
            until = time.monotonic() + 10
            while "journal checkpoints work again" not in caplog.messages and time.monotonic() < until:
                time.sleep(0.01)
        assert [m for m in caplog.messages if "checkpoint" in m] == [
            "journal checkpoint failed (tried again after each commit): database or disk is full",
            "journal checkpoints work again"]
    finally:
        journal.close()


def test_a_replayed_dead_letter_is_traced_anew(tmp_path: Path) -> None:
    """The trace kept is the newest: an item's, or that of its dead letter replayed later."""
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        journal.accept(Envelope.new(request(1), correlation_id="c1"), actor="llm")
        journal.finish("c1", "dead", trace={"events": ["the run that died"]})
        journal.mark_sent("flush").result(5)
        assert journal.trace("c1") == {"events": ["the run that died"]}
        journal.record_trace("c1", {"events": ["its replay"]}).result(5)
        assert journal.trace("c1") == {"events": ["its replay"]}
    finally:
        journal.close()


def test_writes_are_group_committed(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        futures = []
        threads = [threading.Thread(target=lambda k=k: futures.extend(
            journal.accept(Envelope.new(request(n), correlation_id=f"{k}-{n}"), actor="llm")
            for n in range(50))) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(f.result(10) for f in futures)
        assert len(journal.unfinished()) == 400
        assert journal.commits < 400  # many writes shared each commit
    finally:
        journal.close()



def test_an_accept_after_a_pause_commits_at_once_and_the_ones_close_behind_it_share_a_commit(
        tmp_path: Path) -> None:
    """Accepts closer together than the group-commit window wait (here, up to a minute) for
    one commit; the first after a pause does not wait; a read that needs them starts it."""
    journal = SqliteJournal(tmp_path / "j.sqlite3", group_commit_seconds=60.0)
    try:
        first = journal.accept(Envelope.new(request(0), correlation_id="c0"), actor="llm")
        assert first.result(10) is True and journal.commits == 1  # not held: nothing came just before
        close_behind = []
        for n in range(1, 10):
            close_behind.append(journal.accept(Envelope.new(request(n), correlation_id=f"c{n}"), actor="llm"))
            time.sleep(0.01)  # time enough to commit each alone, were it not held for the others
        assert not any(f.done() for f in close_behind) and journal.commits == 1
        assert journal.trace("c0") is None  # a read after them: their commit starts now
        assert all(f.result(10) for f in close_behind) and journal.commits == 2
        assert len(journal.unfinished()) == 10
    finally:
        journal.close()


def test_what_nothing_waits_on_goes_with_the_next_commit_or_alone_soon_after(tmp_path: Path) -> None:
    """A finish and a sent key start no commit of their own: the next accept's carries them
    (a sent key reads as sent meanwhile); with no accept coming, they are committed alone
    once their window has passed."""
    journal = SqliteJournal(tmp_path / "waits.sqlite3", lazy_write_seconds=60.0)
    try:
        journal.accept(Envelope.new(request(1), correlation_id="c1"), actor="llm").result(10)
        journal.finish("c1")
        marked = journal.mark_sent("c1:chat#0", "c1")
        assert journal.was_sent("c1:chat#0", "c1")  # readable at once, durable with the next commit
        assert not marked.done() and journal.commits == 1
        assert [i.correlation for i in journal.unfinished()] == ["c1"]
        journal.accept(Envelope.new(request(2), correlation_id="c2"), actor="llm").result(10)
        assert marked.result(0) is True and journal.commits == 2
        assert [i.correlation for i in journal.unfinished()] == ["c2"]
    finally:
        journal.close()
    alone = SqliteJournal(tmp_path / "alone.sqlite3", lazy_write_seconds=0.05)
    try:
        alone.accept(Envelope.new(request(3), correlation_id="c3"), actor="llm").result(10)
        alone.finish("c3")
        deadline = time.monotonic() + 10  # bounds a hang; it is committed 50 ms after it came
        while alone.unfinished() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert alone.unfinished() == [] and alone.commits == 2
    finally:
        alone.close()

def push(port: int, n: int, deadline: float) -> None:
    """Inject request n until the daemon acknowledges it (it may be down, or killed mid-way)."""
    body = {"text": f"hello {n}", "context": {"chat_id": 10_000 + n, "message_id": n,
                                              "interface_name": "telegram", "chat_type": "private"}}
    url = f"http://127.0.0.1:{port}/inject/llm?type=UserRequest&correlation=req-{n}"
    while time.monotonic() < deadline:
        try:
            post = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(post, timeout=5) as response:
                if response.status == 202:
                    return
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.05)
    raise AssertionError(f"request {n} was never acknowledged")


@pytest.mark.parametrize("inbound", ["inject", "telegram"])
def test_nothing_is_lost_across_kill_9(tmp_path: Path, inbound: str) -> None:
    requests, kills = 500, 3
    rng = random.Random(9)
    with FakeLLMServer(delay=0.2) as llm, FakeTelegramServer() as telegram:
        daemon = Daemon(
            tmp_path, AUTORESPONSE_LLM__BASE_URL=llm.base_url,
            AUTORESPONSE_TELEGRAM__TOKEN="1:TOKEN", AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url,
            AUTORESPONSE_TELEGRAM__POLL_TIMEOUT="1", AUTORESPONSE_CONSOLE__ENABLED="false",
            AUTORESPONSE_TELEGRAM__ALLOWED_USERS="[7]", AUTORESPONSE_EVENTS__ENABLED="false",
        ).start()
        deadline = time.monotonic() + 240
        if inbound == "inject":
            pusher = threading.Thread(target=lambda: [push(daemon.port, n, deadline) for n in range(requests)])
        else:  # updates wait at the fake Bot API until an offset acknowledges them
            pusher = threading.Thread(target=lambda: [
                telegram.push_text(f"hello {n}", chat_id=10_000 + n, user_id=7, message_id=n)
                for n in range(requests)])
        pusher.start()
        try:
            for _ in range(kills):
                time.sleep(rng.uniform(0.5, 3.0))
                daemon.kill()
                daemon.start()
            pusher.join(240)
            assert not pusher.is_alive()

            def replied() -> set[int]:
                return {int(c.params["chat_id"]) for c in telegram.sent()}

            until = time.monotonic() + 180
            while len(replied()) < requests and time.monotonic() < until:
                time.sleep(0.2)
        finally:
            code = daemon.stop()
    chats = [int(c.params["chat_id"]) - 10_000 for c in telegram.sent()]
    per_request = {n: chats.count(n) for n in range(requests)}
    lost = [n for n, count in per_request.items() if count == 0]
    duplicates = sum(count - 1 for count in per_request.values() if count > 1)
    print(f"\nkill -9 x{kills} ({inbound}): {requests} requests, {len(lost)} lost, "
          f"{duplicates} duplicate replies")
    assert lost == []
    # A duplicate is a send the kill caught before its confirmation was written: at most
    # one per chat and kill.
    assert max(per_request.values()) <= 1 + kills
    assert code == 0


def test_dead_letters_survive_a_restart_and_can_be_replayed_after_it(tmp_path: Path) -> None:
    from conftest import console_text

    from autoresponse import Application, Settings
    from autoresponse.testing.fake_llm import FakeResponse
    from autoresponse.interfaces.console import Console, ConsoleInput

    with FakeLLMServer() as llm:
        def start() -> Application:
            settings = Settings.load(llm={"base_url": llm.base_url, "max_attempts": 1},
                                     retry={"max_attempts": 0}, admin={"enabled": False},
                                     events={"enabled": False}, console={"read_stdin": False},
                                     data_dir=tmp_path / "data")
            return Application(settings, console=Console(io.StringIO())).start()

        llm.script(FakeResponse(content="no {JSON at all"))
        first = start()
        envelope = first.runtime.accept("interface.console", ConsoleInput(text="hello")).result(10)
        assert first.runtime.wait_idle(envelope.correlation_id, 15)
        [letter] = first.runtime.dead_letters.letters()
        assert letter.reason == "retries exhausted"
        first.stop()

        second = start()
        try:
            [kept] = second.runtime.dead_letters.letters()
            assert (kept.id, kept.reason, kept.correlation_id) == (letter.id, letter.reason, envelope.correlation_id)
            assert second.runtime.dead_letters.counts() == {"retries exhausted": 1}
            replayed = second.runtime.replay(kept.id)  # the LLM answers properly this time
            assert replayed is not None and second.runtime.wait_idle(timeout=15)
            assert "bot    ↳#1 │" in console_text(second)  # the replayed turn was answered
            assert second.runtime.dead_letters.get(kept.id) is not None
        finally:
            second.stop()


def test_dead_letters_are_bounded_in_the_journal(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        from autoresponse.actors.kernel import DeadLetterOffice

        office = DeadLetterOffice(store=journal)
        for n in range(30):
            office.post(Envelope.new(request(n)), "crash", actor="llm")
        journal.mark_sent("flush").result(5)  # writes are ordered: the letters are in
        journal.compact(time.time() - 3600, keep_dead_letters=10)
        kept = journal.dead_letters(100)
        assert [d["id"] for d in kept] == list(range(21, 31))
        journal.compact(time.time() - 3600, dead_letters_older_than=time.time() + 1)
        assert journal.dead_letters(100) == []
    finally:
        journal.close()


def test_a_clean_stop_is_a_pause_and_loses_nothing(tmp_path: Path) -> None:
    """SIGTERM while about 300 requests flow through a slow LLM drains what is under way; a second
    SIGTERM stops at once. Either way, what did not finish resumes on the next start."""
    requests = 300
    rng = random.Random(15)
    # The LLM is slower than the requests come in, so work queues up and a stop cuts some short.
    with FakeLLMServer(delay=0.5) as llm, FakeTelegramServer() as telegram:
        daemon = Daemon(
            tmp_path, AUTORESPONSE_LLM__BASE_URL=llm.base_url,
            AUTORESPONSE_TELEGRAM__TOKEN="1:TOKEN", AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url,
            AUTORESPONSE_TELEGRAM__POLL_TIMEOUT="1", AUTORESPONSE_CONSOLE__ENABLED="false",
            AUTORESPONSE_TELEGRAM__ALLOWED_USERS="[7]", AUTORESPONSE_EVENTS__ENABLED="false",
            AUTORESPONSE_RUNTIME__DRAIN_SECONDS="20", AUTORESPONSE_LLM__MAX_IN_FLIGHT="12",
        ).start()
        deadline = time.monotonic() + 240

        def pushing() -> None:
            for n in range(requests):
                push(daemon.port, n, deadline)
                time.sleep(0.03)  # a steady stream, so that every stop finds work under way

        pusher = threading.Thread(target=pushing)
        pusher.start()
        codes = []
        try:
            for cycle in range(3):
                time.sleep(rng.uniform(1.0, 2.5))
                daemon.signal(signal.SIGTERM)
                if cycle == 1:
                    time.sleep(0.2)
                    daemon.signal(signal.SIGTERM)  # the operator insists: stop now, not in 20 s
                    codes.append(daemon.wait(10))
                else:
                    codes.append(daemon.wait(60))  # drains what is under way
                daemon.start()
            pusher.join(240)
            assert not pusher.is_alive()
            until = time.monotonic() + 180
            while len({int(c.params["chat_id"]) for c in telegram.sent()}) < requests:
                assert time.monotonic() < until, "not every request was answered"
                time.sleep(0.2)
            listing = json.loads(daemon.cli("deadletters", "list", "--json").stdout)
        finally:
            codes.append(daemon.stop())
    chats = [int(c.params["chat_id"]) - 10_000 for c in telegram.sent()]
    per_request = {n: chats.count(n) for n in range(requests)}
    assert [n for n, count in per_request.items() if count == 0] == []
    assert max(per_request.values()) <= 2  # a duplicate only from a send its stop caught unconfirmed
    assert codes == [0, 0, 0, 0]
    assert listing["counts"] == {}, listing  # a stop is not a failure: no dead letters
    log = daemon.log()
    assert "did not finish; they stay open and resume on the next start" in log
    assert "resumed" in log


def test_work_accepted_as_new_is_answered_from_memory_and_an_earlier_runs_sends_from_disk(
        tmp_path: Path) -> None:
    """A delivery asks whether its reply went out already. For a correlation this journal
    accepted as new nothing can have, so the answer needs no read of SQLite (a read on every
    delivery was its longest wait under load); once it finishes, or in a later run, the
    database answers, and a send confirmed before a restart is never made again."""
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    reads: list[str] = []
    journal._reader.set_trace_callback(reads.append)
    key, other = "c1:chat:0:0123456789ab:0#0", "c2:chat:0:0123456789ab:0#0"
    try:
        assert journal.accept(Envelope.new(request(1), correlation_id="c1"), actor="llm").result(5)
        assert journal.mark_sent(other).result(5)  # c2 was never accepted here: its key is on disk
        assert not journal.was_sent(key, "c1")
        marked = journal.mark_sent(key, "c1")
        assert journal.was_sent(key, "c1")  # queued, not yet committed: sent all the same
        marked.result(5)
        assert journal.was_sent(key, "c1") and not journal.was_sent(key.replace("#0", "#1"), "c1")
        assert reads == []
        assert journal.was_sent(other, "c1")  # not c1's key: the database answers
        assert len(reads) == 1
        journal.finish("c1")
        assert journal.was_sent(key, "c1") and len(reads) == 2  # over: the database's to answer
    finally:
        journal.close()
    again = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        # A client retries c1 after a restart: known, so not new, and its send stands.
        assert again.accept(Envelope.new(request(1), correlation_id="c1"), actor="llm").result(5) is False
        assert again.was_sent(key, "c1") and not again.was_sent(key.replace("#0", "#1"), "c1")
    finally:
        again.close()


def test_the_replies_to_new_work_read_nothing_from_the_journal(make_app: Callable[..., Application]) -> None:
    """The daemon's path: a command, its output, and the reply about it, each sent once,
    and no delivery of new work waits on a read of SQLite."""
    app = make_app()
    assert isinstance(app.journal, SqliteJournal)
    reads: list[str] = []
    app.journal._reader.set_trace_callback(reads.append)
    envelope = app.runtime.accept(interface("console"), ConsoleInput(text="run uname -s")).result(5)
    assert app.runtime.wait_idle(envelope.correlation_id, 15)
    text = console_text(app)
    assert text.count("`uname -s` finished") == 1 and "Linux" in text
    assert reads == []


@pytest.mark.parametrize("payload", ['{"text": 42}', "not json at all", "[" * 100_000, b"\xff\xfe\x00binary"],
                         ids=["wrong type", "garbage", "deeply nested", "a blob"])
def test_an_unreadable_open_item_is_closed_and_the_rest_resumes(tmp_path: Path, payload: str | bytes) -> None:
    """A journal written by another version, or damaged: the item that cannot be read closes
    as dead, a dead letter with its reason and its payload as stored, and the daemon starts
    and answers the rest."""
    path = tmp_path / "data" / "journal.sqlite3"
    path.parent.mkdir()
    journal = SqliteJournal(path)
    try:
        for n, correlation in enumerate(["broken", "fine"]):
            envelope = Envelope.new(ConsoleInput(text=f"hello {n}"), correlation_id=correlation)
            assert journal.accept(envelope, actor=interface("console")).result(5)
    finally:
        journal.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE items SET payload = ? WHERE correlation = 'broken'", (payload,))
    daemon = Daemon(tmp_path, AUTORESPONSE_EVENTS__ENABLED="false").start()
    try:
        assert daemon.cli("status", "--json").returncode == 0
        listed = json.loads(daemon.cli("deadletters", "list", "--json").stdout)
        replayed = daemon.cli("deadletters", "replay", str(listed["letters"][0]["id"]))
    finally:
        assert daemon.stop() == 0
    assert replayed.returncode != 0 and "an input that could not be read" in replayed.stderr  # nothing can run it
    [letter] = listed["letters"]
    assert letter["reason"] == "unreadable work item" and letter["actor"] == interface("console")
    assert letter["detail"].startswith("ConsoleInput: cannot resume it: its payload is unreadable")
    assert letter["envelope"]["correlation_id"] == "broken"
    stored = payload.decode("utf-8", errors="replace") if isinstance(payload, bytes) else payload
    assert letter["envelope"]["body"] == {"raw": stored[:MALFORMED_KEPT]}
    log = daemon.log()
    assert "unreadable work item: ConsoleInput: cannot resume it" in log
    assert "resumed 1 unfinished work items" in log
    with sqlite3.connect(path) as db:
        states = dict(db.execute("SELECT correlation, state FROM items"))
    assert states == {"broken": "dead", "fine": "done"}


def test_the_chunks_an_open_item_sent_are_not_sent_again_after_its_retention(tmp_path: Path) -> None:
    """A long reply is stopped between its chunks (a kill), and the daemon starts again
    after the journal's retention has passed: its start compacts the journal, then resumes
    the item, and each chunk reaches the user once. Compaction forgets old send keys, but
    not an open item's."""
    path = tmp_path / "j.sqlite3"
    delivered: list[str] = []
    keys = [f"c1:user:0:0123456789ab:0#{chunk}" for chunk in range(3)]

    def deliver(journal: SqliteJournal, stop_after: int | None = None) -> None:
        send_chunks(journal, "c1", keys, delivered, stop_after)

    journal = SqliteJournal(path)
    try:
        assert journal.accept(Envelope.new(request(1), correlation_id="c1"), actor="llm").result(5)
        assert journal.accept(Envelope.new(request(2), correlation_id="c2"), actor="llm").result(5)
        journal.mark_sent("c2:user:0:0123456789ab:0#0").result(5)
        journal.finish("c2")
        journal.mark_sent("gone:user:0:0123456789ab:0#0").result(5)  # no item of its own
        deliver(journal, stop_after=1)  # then killed
    finally:
        journal.close()
    later = SqliteJournal(path)
    try:
        later.compact(older_than=time.time() + 1)  # the retention has passed
        assert [item.correlation for item in later.unfinished()] == ["c1"]
        deliver(later)  # resumed
        assert not later.was_sent("c2:user:0:0123456789ab:0#0") and not later.was_sent("gone:user:0:0123456789ab:0#0")
    finally:
        later.close()
    assert delivered == keys


def test_work_resumes_in_the_order_it_was_accepted_whatever_the_clock_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wall clock steps back an hour (NTP) between two messages of one chat, and the
    daemon is killed: after the restart they are answered in the order they came."""
    clock = [time.time()]
    monkeypatch.setattr(journal_module, "time", type("Clock", (), {
        "time": staticmethod(lambda: clock[0]), "monotonic": staticmethod(time.monotonic)}))
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        assert journal.accept(Envelope.new(request(1), correlation_id="first"), actor="llm").result(5)
        clock[0] -= 3600
        assert journal.accept(Envelope.new(request(2), correlation_id="second"), actor="llm").result(5)
    finally:
        journal.close()
    again = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        assert [item.correlation for item in again.unfinished()] == ["first", "second"]
    finally:
        again.close()


def _start_on(data: Path, *, file_size_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    """``autoresponse run`` on the data directory ``data``, to see it refuse to start; with
    ``file_size_limit``, no file may grow past that many bytes (a disk that is full)."""
    def limited() -> None:
        if file_size_limit is not None:
            import resource
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    env = environment(AUTORESPONSE_DATA_DIR=str(data), AUTORESPONSE_ADMIN__PORT=str(free_port()),
                      AUTORESPONSE_EVENTS__ENABLED="false")
    return subprocess.run([sys.executable, "-m", "autoresponse", "run"], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, preexec_fn=limited)


def _accepted(path: Path, count: int, padding: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    journal = SqliteJournal(path)
    try:
        for n in range(count):
            envelope = Envelope.new(UserRequest(text=f"hello {n} " + "p" * padding, context=CTX),
                                    correlation_id=f"req-{n}")
            assert journal.accept(envelope, actor="llm").result(5)
    finally:
        journal.close()


def test_a_full_disk_at_start_is_no_corrupt_journal(tmp_path: Path) -> None:
    """The disk is full as the daemon starts: it says so in one line and that the journal
    was left intact, and the work it holds waits for the next start; the advice to move a
    corrupt journal aside (abandoning all of it) is not given."""
    path = tmp_path / "data" / "journal.sqlite3"
    _accepted(path, 3)
    started = _start_on(path.parent, file_size_limit=16)  # the lock file's process id fits
    assert started.returncode == 1, started.stderr
    assert "cannot start: the journal" in started.stderr and "SQLITE_IOERR" in started.stderr
    assert "the journal was left intact" in started.stderr
    assert "move it aside" not in started.stderr and "Traceback" not in started.stderr
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM items WHERE state = 'open'").fetchone() == (3,)


def test_a_journal_that_cannot_be_opened_is_no_corrupt_one(tmp_path: Path) -> None:
    """A journal's path that is no file (a directory, made by mistake): the error names
    SQLite's cause, and is not the corrupt journal's."""
    path = tmp_path / "j.sqlite3"
    path.mkdir()
    with pytest.raises(JournalStorageFailed, match="SQLITE_CANTOPEN.*left intact"):
        SqliteJournal(path)
    assert path.is_dir() and not any(path.iterdir())


def test_a_garbage_page_in_the_journal_stops_the_start_with_the_clear_message(tmp_path: Path) -> None:
    """A page of the journal overwritten with garbage while the daemon was stopped: the
    start stops with the corrupt journal's one line (how to check it, how to move it
    aside), not a traceback."""
    path = tmp_path / "data" / "journal.sqlite3"
    _accepted(path, 300, padding=300)
    pages = path.stat().st_size // 4096
    with open(path, "r+b") as file:
        file.seek(4096 * (pages // 2))
        file.write(random.Random(0).randbytes(4096))
    started = _start_on(path.parent)
    assert started.returncode == 2, started.stderr
    assert f"the journal {path} cannot be read" in started.stderr and "move it aside" in started.stderr
    assert "Traceback" not in started.stderr


_BRIEFLY_FULL = """
import os, resource, signal, sys, time
from pathlib import Path
from autoresponse.actors.journal import SqliteJournal
from autoresponse.messages import Envelope, OriginalContext, UserRequest
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
journal = SqliteJournal(Path(sys.argv[1]))
context = OriginalContext(chat_id=1, message_id=1, interface_name="telegram")
journal.accept(Envelope.new(UserRequest(text="hi", context=context), correlation_id="c1"), actor="llm").result(5)
resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))  # the disk is full
journal.mark_sent("c1:user:0:0123456789ab:0#0", "c1")
journal.finish("c1")
time.sleep(0.5)  # their commits fail meanwhile
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # room again
deadline = time.monotonic() + 20
while journal.unfinished() and time.monotonic() < deadline:
    time.sleep(0.05)
os._exit(0)  # killed: no close to commit what is queued
"""


def test_a_finish_the_disk_failed_is_written_once_there_is_room_again(tmp_path: Path) -> None:
    """The disk is full for a moment as a reply is delivered: the commit of its finish and
    of its sent key fails, and they are tried again until there is room. A kill after that
    finds the item done: the next start does not answer it again."""
    path = tmp_path / "j.sqlite3"
    done = subprocess.run([sys.executable, "-c", _BRIEFLY_FULL, str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "writes fail (disk I/O error)" in done.stderr and "writes again" in done.stderr  # full indeed, then not
    journal = SqliteJournal(path)
    try:
        assert journal.unfinished() == [] and journal.was_sent("c1:user:0:0123456789ab:0#0")
    finally:
        journal.close()


def test_an_outage_is_logged_once_though_a_probe_finds_room_between_refusals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Writes fail, a probe finds a write commits (health back), and the work refused fails
    again (on a nearly full disk a page fits where a request does not): the journal is
    failing again, but the outage is one, logged once as it starts and once as work
    commits, not an ERROR every few seconds."""
    monkeypatch.setattr(journal_module, "BUSY_TIMEOUT_MS", 50)  # how long a write waits for the lock
    monkeypatch.setattr(journal_module, "WRITE_RETRY_MAX_SECONDS", 0.05)  # how often it probes
    caplog.set_level(logging.DEBUG, logger="autoresponse.actors.journal")
    path = tmp_path / "j.sqlite3"
    journal = SqliteJournal(path)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        for n in range(3):
            holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            with pytest.raises(JournalFailing, match="database is locked"):
                journal.accept(Envelope.new(request(n), correlation_id=f"c{n}"), actor="llm").result(5)
            assert journal.failing is not None
            holder.execute("ROLLBACK")
            wait_for(lambda: journal.failing is None, timeout=5)  # a probe committed
        assert journal.accept(Envelope.new(request(9), correlation_id="c9"), actor="llm").result(5)
    finally:
        holder.close()
        journal.close()
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "autoresponse.actors.journal" and r.levelno >= logging.WARNING]
    assert [level for level, _ in said] == ["WARNING", "ERROR", "WARNING"], said  # batch, outage, over
    assert "writes again" in said[-1][1]
